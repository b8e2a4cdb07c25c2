"""proxmox_vm.py: the VM config the field spec's findings call for on the field's host topology, key by key; every
computed value passes the schema; a second computation on the written config changes nothing; what cannot be done is
refused in one line naming the key."""
import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import proxmox_vm as pv
from ansible_collections.topolaunch.sglang.plugins.module_utils.proxmox_config import ProxmoxConfigError, check
from proxmox_cases import FIELD_GPUS, naive_config, write_host_sysfs
from topology_cases import load_spec, read


@pytest.fixture
def host(tmp_path):
    return pv.read_host_topology(write_host_sysfs(str(tmp_path / "sys")))


@pytest.fixture
def field_findings(tmp_path):
    """What the topology stage finds in the field's VM (lab spec proxmox-8x-rtx-pro-6000-naive)."""
    return read(load_spec("proxmox-8x-rtx-pro-6000-naive"), tmp_path)["findings"]


def applied(config, change):
    out = dict(config)
    out.update(change["set"])
    for key in change["delete"]:
        out.pop(key)
    return out


def test_host_topology_from_sysfs(host):
    assert [(n["node"], len(n["cpus"]), n["memory_mib"]) for n in host["nodes"]] == [(0, 64, 515625), (1, 64, 515625)]
    assert [g["address"] for g in host["gpus"]] == FIELD_GPUS            # the NIC (class 0x02) is not a GPU
    assert [g["numa_node"] for g in host["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_field_findings_give_numa_affinity_bridges_and_clique(host, field_findings):
    assert {pv.FINDING_NUMA, pv.FINDING_CLIQUE} <= {f["id"] for f in field_findings}        # the ids the topology gives
    change = pv.changes(naive_config(), host, field_findings, vmid=101)
    s = change["set"]
    assert s["numa"] == 1 and s["sockets"] == 2 and s["cores"] == 32
    assert s["numa0"] == "cpus=0-31,hostnodes=0,memory=131072,policy=bind"
    assert s["numa1"] == "cpus=32-63,hostnodes=1,memory=131072,policy=bind"
    assert s["affinity"] == "0-127"
    args = s["args"].split(" -device ")
    assert args[0] == "-device pxb-pcie,id=tlpxb0,bus_nr=128,numa_node=0,bus=pcie.0"
    assert args[1] == "pcie-root-port,id=tlrp0,bus=tlpxb0,chassis=200"
    assert args[2] == "vfio-pci,host=0000:17:00.0,id=tlgpu0,bus=tlrp0,x-nv-gpudirect-clique=0"
    assert "pxb-pcie,id=tlpxb1,bus_nr=160,numa_node=1,bus=pcie.0" in args
    assert "pcie-root-port,id=tlrp4,bus=tlpxb1,chassis=204" in args       # GPU 4 (node 1) behind bridge 1
    assert sum("x-nv-gpudirect-clique=0" in a for a in args) == 8
    assert change["delete"] == ["hostpci%d" % i for i in range(8)]     # moved into args, not passed twice
    assert change["before"]["hostpci0"] == "17:00.0,pcie=1" and "hostpci0" not in change["after"]
    assert change["root_only"] == ["affinity", "args"] + ["hostpci%d" % i for i in range(8)]
    for key, value in s.items():
        assert check(key, value) is None, key
    assert pv.changes(applied(naive_config(), change), host, [], vmid=101)["changed"] is False


def test_operator_args_are_kept(host, field_findings):
    change = pv.changes(naive_config(args="-smbios 'type=0,vendor=FOO'"), host, field_findings)
    assert change["set"]["args"].startswith("-smbios 'type=0,vendor=FOO' -device pxb-pcie,")
    again = pv.changes(applied(naive_config(), change), host, field_findings)
    assert again["changed"] is False


def test_clique_only_keeps_hostpci_with_explicit_function(host):
    config = naive_config(gpus=FIELD_GPUS[:2])
    config["hostpci1"] = "2a:00,pcie=1"
    change = pv.changes(config, host, [{"id": "p2p-chipset-not-supported"}])
    assert change["set"] == {
        "hostpci0": "0000:17:00.0,pcie=1", "hostpci1": "0000:2a:00.0,pcie=1",
        "args": "-set device.hostpci0.x-nv-gpudirect-clique=0 -set device.hostpci1.x-nv-gpudirect-clique=0"}
    assert change["delete"] == []
    assert pv.changes(applied(config, change), host, [])["changed"] is False


def test_no_findings_no_change_and_hugepages_when_asked(host):
    assert pv.changes(naive_config(), host, [])["changed"] is False
    change = pv.changes(naive_config(), host, [], hugepages="1024")
    assert change["set"] == {"hugepages": "1024"} and change["root_only"] == ["hugepages"]


def test_one_socket_of_gpus_gives_one_node(host):
    change = pv.changes(naive_config(gpus=FIELD_GPUS[4:], cores=16), host, ["vm-no-numa"])
    assert change["set"]["numa0"] == "cpus=0-15,hostnodes=1,memory=262144,policy=bind"
    assert change["set"]["affinity"] == "32-63,96-127" and "sockets" not in change["set"]    # already 1


def test_stale_numa_nodes_are_deleted(host):
    config = naive_config(gpus=FIELD_GPUS[:4], cores=8)
    config.update({"numa": 1, "numa1": "cpus=4-7,hostnodes=1", "numa2": "cpus=8"})
    change = pv.changes(config, host, ["vm-no-numa"])
    assert change["delete"] == ["hostpci0", "hostpci1", "hostpci2", "hostpci3", "numa1", "numa2"]


@pytest.mark.parametrize("edit,findings,words", [
    ({"machine": "pc-i440fx-9.2"}, ["vm-no-numa"], "machine 'pc-i440fx-9.2': expander bridges (pxb-pcie) need q35"),
    ({"cores": 63}, ["vm-no-numa"], "63 vCPUs and memory 262144 MiB must split evenly over the 2 host sockets"),
    ({"cores": 160}, ["vm-no-numa"], "80 vCPUs per socket, host NUMA node 0 has 64 CPUs"),
    ({"cpu": "host,hidden=1"}, ["p2p-chipset-not-supported"], "cpu 'host,hidden=1': the GPU clique needs no hidden=1"),
    ({"memory": "lots"}, ["vm-no-numa"], "memory 'lots' is not a size in MiB"),
    ({"args": "-smbios 'type=0"}, [], "args \"-smbios 'type=0\": No closing quotation"),
])
def test_what_cannot_be_done_is_refused_naming_the_key(host, edit, findings, words):
    config = naive_config()
    config.update(edit)
    with pytest.raises(ProxmoxConfigError) as err:
        pv.changes(config, host, findings, vmid=101)
    assert words.replace("need q35", "need the q35 machine type") in str(err.value) and "\n" not in str(err.value)


def test_gpu_without_host_numa_node_is_refused(tmp_path):
    host = pv.read_host_topology(write_host_sysfs(str(tmp_path), numa={a: -1 for a in FIELD_GPUS}))
    with pytest.raises(ProxmoxConfigError, match="no NUMA node for GPU 0000:17:00.0"):
        pv.changes(naive_config(), host, ["vm-no-numa"])


def test_hostile_hugepages_is_refused_before_anything(host):
    with pytest.raises(ProxmoxConfigError, match=r"VM 7: hugepages '3' refused .*enumeration 'any, 2, 1024'"):
        pv.changes(naive_config(), host, [], hugepages="3", vmid=7)


def test_module_params_split_module_keys_from_api_keys(host, field_findings):
    params, api = pv.module_params(pv.changes(naive_config(), host, field_findings))
    assert params["numa_enabled"] is True and params["sockets"] == 2 and params["cores"] == 32
    assert sorted(params["numa"]) == ["numa0", "numa1"] and "args" in params
    assert api == {"affinity": "0-127"}


def test_renderers_are_what_the_findings_remedies_show(field_findings):
    remedy = {f["id"]: f["remedy"] for f in field_findings}
    assert " ".join(pv.pxb_args(1, 1) + pv.gpu_args("<bus>", 0, 1)) in remedy[pv.FINDING_NUMA]
    assert "-set device.hostpciN.x-nv-gpudirect-clique=K" in remedy[pv.FINDING_CLIQUE]
    assert pv.clique_set_arg("hostpci3", 1) == ["-set", "device.hostpci3.x-nv-gpudirect-clique=1"]
    assert pv.pxb_args(1, 1) == ["-device", "pxb-pcie,id=tlpxb1,bus_nr=160,numa_node=1,bus=pcie.0"]
    assert pv.pci_address("2A:00") == "0000:2a:00.0"
    with pytest.raises(ProxmoxConfigError, match="not a PCI address: 'gpu0'"):
        pv.pci_address("gpu0")
