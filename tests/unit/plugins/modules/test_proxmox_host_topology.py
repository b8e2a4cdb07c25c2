"""library/proxmox_host_topology.py: a Proxmox host's NUMA nodes and display-class PCI devices from sysfs; read-only
(check mode the same); a tree without NUMA nodes fails naming the path."""
from ansible_collections.topolaunch.sglang.plugins.modules import proxmox_host_topology as module
from proxmox_cases import FIELD_GPUS, write_host_sysfs


def test_reads_the_recorded_sysfs_in_check_mode_too(run_module, tmp_path):
    root = write_host_sysfs(str(tmp_path))
    for check in (False, True):
        code, result, _ = run_module(module, {"sysfs_root": root}, check_mode=check)
        assert code == 0 and result["changed"] is False
        assert [g["address"] for g in result["topology"]["gpus"]] == FIELD_GPUS
        assert [n["node"] for n in result["topology"]["nodes"]] == [0, 1]


def test_no_numa_nodes_fails_naming_the_path(run_module, tmp_path):
    code, result, _ = run_module(module, {"sysfs_root": str(tmp_path)})
    assert code == 1 and result["msg"] == "proxmox_host_topology: no NUMA node under %s/devices/system/node" % tmp_path
