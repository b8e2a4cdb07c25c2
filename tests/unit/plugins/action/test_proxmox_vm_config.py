"""action_plugins/proxmox_vm_config.py: the change per guest from its findings (this run's facts or the saved
topology.json), the per-key diff, one-line failures before anything is written."""
import json

import pytest
from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.topolaunch.sglang.plugins.action import proxmox_vm_config as plugin
from ansible_collections.topolaunch.sglang.plugins.module_utils.proxmox_vm import read_host_topology
from actions import make_action
from proxmox_cases import naive_config, write_host_sysfs


@pytest.fixture
def host(tmp_path):
    return read_host_topology(write_host_sysfs(str(tmp_path / "sys")))


@pytest.fixture(autouse=True)
def no_base_run(monkeypatch):
    monkeypatch.setattr(ActionBase, "run", lambda self, tmp=None, task_vars=None: {})


def run(args, task_vars=None, check_mode=False):
    return make_action(plugin, args, check_mode).run(task_vars=task_vars or {})


def uri_result(config, host="gpu1", vmid=101):
    return {"item": {"host": host, "vmid": vmid}, "json": {"data": config}}


def test_findings_from_saved_topology_give_a_per_key_diff(tmp_path, host):
    (tmp_path / "a" / "gpu1").mkdir(parents=True)
    (tmp_path / "a" / "gpu1" / "topology.json").write_text(json.dumps({"findings": [{"id": "vm-no-numa"}]}))
    result = run({"host_topology": host, "guests": [uri_result(naive_config())], "artifacts_dir": str(tmp_path / "a")})
    assert result["changed"] is True and "warnings" not in result
    vm = result["vms"][0]
    assert vm["findings"] == ["vm-no-numa"] and vm["api_params"] == {"affinity": "0-127"}
    diff = result["diff"][0]
    assert diff["before_header"] == "/etc/pve/qemu-server/101.conf (gpu1)"
    assert "hostpci0: 17:00.0,pcie=1\n" in diff["before"] and "numa0: cpus=0-31,hostnodes=0," in diff["after"]
    assert "name:" not in diff["before"]                                    # only the keys that change
    checked = run({"host_topology": host, "guests": [uri_result(naive_config())], "artifacts_dir": str(tmp_path / "a")},
                  check_mode=True)
    assert checked == result                                                # check mode: the same answer


def test_this_runs_facts_win_and_no_topology_warns(tmp_path, host):
    facts = {"hostvars": {"gpu1": {"ansible_facts": {"gpu_topology": {"findings": []}}}}}
    result = run({"host_topology": host, "guests": [uri_result(naive_config())], "artifacts_dir": str(tmp_path)},
                 task_vars=facts)
    assert result["changed"] is False and "diff" not in result
    result = run({"host_topology": host, "guests": [uri_result(naive_config())]})
    assert "no topology read yet" in result["warnings"][0]


@pytest.mark.parametrize("args,words", [
    ({"guests": []}, "missing required arguments: host_topology"),
    ({"host_topology": {}, "guests": [{"item": {"host": "gpu1", "vmid": 1}, "json": {}}]},
     "'gpu1' has no host or no config"),
    ({"host_topology": {}, "guests": [], "bogus": 1}, "bogus"),
])
def test_bad_arguments_fail_in_one_line(args, words):
    with pytest.raises(AnsibleActionFail, match=words):
        run(args)


def test_a_refused_value_fails_naming_vm_and_key(host):
    with pytest.raises(AnsibleActionFail) as err:
        run({"host_topology": host, "guests": [uri_result(naive_config())], "hugepages": "3"})
    assert str(err.value).startswith("proxmox_vm_config: VM 101 (gpu1): hugepages '3' refused")
