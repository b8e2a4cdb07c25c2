"""filter_plugins/proxmox.py: the GPU VMs of a Proxmox node from the inventory, and the running VMs whose changes
wait for a restart, from the API's answers."""
import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.topolaunch.sglang.plugins.filter.proxmox import (FilterModule, proxmox_guests,
                                                                         proxmox_restart_guests, proxmox_restart_pending)

HOSTVARS = {"pve1": {"proxmox_node": "pve1"}, "gpu2": {"proxmox_vmid": 102, "proxmox_node": "pve1"},
            "gpu1": {"proxmox_vmid": "101", "proxmox_node": "pve1"}, "gpu3": {"proxmox_vmid": 103,
                                                                           "proxmox_node": "pve2"}, "other": {}}


def test_guests_of_a_node_by_vmid():
    assert proxmox_guests(list(HOSTVARS), HOSTVARS, "pve1") == [{"host": "gpu1", "vmid": 101},
                                                                 {"host": "gpu2", "vmid": 102}]
    assert proxmox_guests(list(HOSTVARS), HOSTVARS, "pve9") == []


@pytest.mark.parametrize("vmid", ["101; rm", "0", "-5", "99"])
def test_a_bad_vmid_is_refused_naming_the_host(vmid):
    hostvars = {"gpu1": {"proxmox_vmid": vmid, "proxmox_node": "pve1"}}
    with pytest.raises(AnsibleFilterError, match="inventory host gpu1: proxmox_vmid"):
        proxmox_guests(["gpu1"], hostvars, "pve1")


def answers(status, pending, host="gpu1", vmid=101):
    guest = {"host": host, "vmid": vmid}
    return [{"item": [guest, "pending"], "json": {"data": pending}},
            {"item": [guest, "status/current"], "json": {"data": {"status": status}}}]


def test_restart_pending_only_for_running_vms_with_pending_keys():
    pending = [{"key": "cores", "value": 64, "pending": 32}, {"key": "hostpci0", "value": "x", "delete": 1},
               {"key": "name", "value": "gpu-vm"}]
    assert proxmox_restart_pending(answers("running", pending)) == ["VM 101 (gpu1): cores, hostpci0"]
    assert proxmox_restart_pending(answers("stopped", pending)) == []
    assert proxmox_restart_pending(answers("running", [{"key": "name", "value": "gpu-vm"}])) == []
    assert proxmox_restart_pending(None) == []
    assert set(FilterModule().filters()) == {"proxmox_guests", "proxmox_restart_pending", "proxmox_restart_guests"}


def test_restart_guests_are_the_vms_a_restart_applies_changes_to():
    pending = [{"key": "numa0", "pending": "cpus=0-31"}, {"key": "name", "value": "gpu-vm"}]
    both = answers("running", pending) + answers("running", pending, host="gpu2", vmid=102) + answers(
        "stopped", pending, host="gpu3", vmid=103)
    assert proxmox_restart_guests(both) == [{"host": "gpu1", "vmid": 101, "keys": ["numa0"]},
                                            {"host": "gpu2", "vmid": 102, "keys": ["numa0"]}]
    assert proxmox_restart_guests(None) == []
