"""The Proxmox stage against the lab's Proxmox API stand-in (lab/proxmox_standin): the real community.proxmox
proxmox_kvm and ansible.builtin.uri talk to it over HTTPS, from the controller; the "Proxmox host" is this machine
with a recorded sysfs. No GPU host is needed.

Check mode shows the diff and writes nothing; apply writes exactly the diff; a second apply changes nothing; a refused
value stops the play before any write; without proxmox_restart_allowed the play stops with "restart pending"."""
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import pytest
from proxmoxer import ProxmoxAPI
from proxmoxer.core import ResourceException

from proxmox_cases import naive_config, write_host_sysfs
from topology_cases import load_spec, read

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent
PORT = 35500                      # this file's port (h26's range 35500-35599)
TOKEN = ("topolaunch@pve", "tl", "token-secret-1")
ROOT_PASSWORD = "root-password-1"


@pytest.fixture
def pve(tmp_path):
    state = tmp_path / "state.json"
    state.write_text(json.dumps({
        "nodes": {"pve1": {"vms": {"101": {"config": naive_config(), "status": "running"}}}},
        "users": {"root@pam": ROOT_PASSWORD}, "tokens": {"%s!%s" % TOKEN[:2]: TOKEN[2]}}))
    log = open(tmp_path / "standin.log", "w")
    proc = subprocess.Popen([sys.executable, str(ROOT / "lab/proxmox_standin/standin.py"), "--state", str(state),
                             "--port", str(PORT), "--tls-dir", str(tmp_path / "tls")], stdout=log,
                            stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", PORT), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None, (tmp_path / "standin.log").read_text()
            time.sleep(0.2)
    (tmp_path / "artifacts" / "gpu1").mkdir(parents=True)
    facts = read(load_spec("proxmox-8x-rtx-pro-6000-naive"), tmp_path)           # the field VM's findings
    (tmp_path / "artifacts" / "gpu1" / "topology.json").write_text(json.dumps({"findings": facts["findings"]}))
    inventory = {"all": {"children": {
        "proxmox_hosts": {"hosts": {"pve1": {
            "ansible_connection": "local", "ansible_python_interpreter": sys.executable, "proxmox_node": "pve1",
            "proxmox_api_host": "127.0.0.1", "proxmox_api_port": PORT, "proxmox_api_user": TOKEN[0],
            "proxmox_api_token_id": TOKEN[1], "proxmox_ca_path": str(tmp_path / "tls" / "ca.pem"),
            "proxmox_sysfs_root": write_host_sysfs(str(tmp_path / "sys"))}}},
        "gpu_hosts": {"hosts": {"gpu1": {"proxmox_vmid": 101, "proxmox_node": "pve1"}}}}}}
    (tmp_path / "inventory.yml").write_text(json.dumps(inventory))
    secrets = tmp_path / "secrets.json"          # as ansible-vault would give them: never on the command line
    secrets.write_text(json.dumps({"proxmox_api_token_secret": TOKEN[2], "proxmox_root_password": ROOT_PASSWORD}))
    secrets.chmod(0o600)
    yield tmp_path
    proc.terminate()
    proc.wait(timeout=10)
    log.close()


def state(base):
    return json.loads((base / "state.json").read_text())


def play(base, *extra):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    argv = [str(BIN / "ansible-playbook"), "-i", str(base / "inventory.yml"), "-e", "@" + str(base / "secrets.json"),
            "-e", "topolaunch_artifacts_dir=" + str(base / "artifacts"), str(ROOT / "playbooks" / "proxmox.yml")]
    proc = subprocess.run(argv + list(extra), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    out = proc.stdout + proc.stderr
    assert TOKEN[2] not in out and ROOT_PASSWORD not in out          # secrets never in the output
    return proc.returncode, out


def effective(vm):
    conf = dict(vm["config"])
    for key, value in vm.get("pending", {}).items():
        if value is None:
            conf.pop(key, None)
        else:
            conf[key] = value
    return conf


def test_check_apply_again_and_restart_pending(pve):
    before = naive_config()
    rc, out = play(pve, "--check", "--diff")
    assert rc == 0, out
    assert "+numa0: cpus=0-31,hostnodes=0,memory=131072,policy=bind" in out
    assert "-hostpci0: 17:00.0,pcie=1" in out and "+affinity: 0-127" in out and "-cores: 64" in out
    assert state(pve)["writes"] == []                                      # check mode writes nothing

    rc, out = play(pve)                                                     # proxmox_apply not set: shows, writes not
    assert rc == 0 and "not written: set proxmox_apply=true" in out, out
    assert state(pve)["writes"] == []

    rc, out = play(pve, "-e", "proxmox_apply=true")
    assert rc != 0 and "restart pending: VM 101 (gpu1): " in out, out
    vm = state(pve)["nodes"]["pve1"]["vms"]["101"]
    assert vm["config"] == before                                           # running: all of it waits as pending
    after = effective(vm)
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)}
    assert changed == {"numa", "numa0", "numa1", "sockets", "cores", "affinity", "args"} | {
        "hostpci%d" % i for i in range(8)}                                 # exactly the diff, nothing else
    assert after["numa1"] == "cpus=32-63,hostnodes=1,memory=131072,policy=bind" and after["affinity"] == "0-127"
    assert after["sockets"] in (2, "2") and after["cores"] in (32, "32") and after["numa"] in (1, "1")
    assert "hostpci0" not in after and "vfio-pci,host=0000:17:00.0,id=tlgpu0" in after["args"]
    users = {w["user"] for w in state(pve)["writes"]}
    assert users <= {"root@pam", "%s!%s" % TOKEN[:2]}
    writes = len(state(pve)["writes"])

    rc, out = play(pve, "-e", "proxmox_apply=true")                         # again: nothing to change, still waiting
    assert rc != 0 and "restart pending" in out, out
    assert len(state(pve)["writes"]) == writes

    api = ProxmoxAPI("127.0.0.1", port=PORT, user="root@pam", password=ROOT_PASSWORD,
                     verify_ssl=str(pve / "tls" / "ca.pem"))
    api.nodes("pve1").qemu(101).status.reboot.post()                        # the operator restarts the VM
    rc, out = play(pve, "-e", "proxmox_apply=true")
    assert rc == 0, out
    assert len(state(pve)["writes"]) == writes + 1                          # the reboot only


def test_refused_value_stops_before_any_write(pve):
    rc, out = play(pve, "-e", "proxmox_apply=true", "-e", "proxmox_hugepages=3")
    assert rc != 0
    assert "hugepages '3' refused by the Proxmox API schema" in out and "enumeration 'any, 2, 1024'" in out, out
    assert state(pve)["writes"] == []


def test_standin_refuses_what_the_schema_refuses_with_proxmox_text(pve):
    api = ProxmoxAPI("127.0.0.1", port=PORT, user=TOKEN[0], token_name=TOKEN[1], token_value=TOKEN[2],
                     verify_ssl=str(pve / "tls" / "ca.pem"))
    config = api.nodes("pve1").qemu(101).config
    with pytest.raises(ResourceException) as err:
        config.set(numa0="cpus=0-,policy=strict", affinity="0-")
    assert err.value.status_code == 400 and err.value.content == "Parameter verification failed."
    assert err.value.errors == {
        "affinity": "invalid format - unable to parse cpuset option\n",
        "numa0": "invalid format - format error\nnuma0.cpus: value does not match the regex pattern\nnuma0.policy: "
                 "value 'strict' does not have a value in the enumeration 'preferred, bind, interleave'\n"}
    with pytest.raises(ResourceException, match="only root can set 'args' config"):
        config.set(args="-no-reboot")                                       # a token is never root@pam
    assert state(pve)["writes"] == []
    assert config.get()["hostpci0"] == "17:00.0,pcie=1"
