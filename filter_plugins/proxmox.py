"""Filters of the Proxmox role (module_utils proxmox_vm holds the rules):

    groups['all'] | topolaunch.sglang.proxmox_guests(hostvars, proxmox_node)    # the GPU VMs of this node
    pending_results | topolaunch.sglang.proxmox_restart_pending                   # the VMs waiting for a restart
    pending_results | topolaunch.sglang.proxmox_restart_guests                    # the same as [{host, vmid, keys}]
"""
from ansible.errors import AnsibleFilterError

from ansible_collections.topolaunch.sglang.plugins.module_utils.proxmox_config import ProxmoxConfigError
from ansible_collections.topolaunch.sglang.plugins.module_utils.proxmox_vm import guests, restart_guests, restart_pending


def proxmox_guests(hosts, hostvars, node):
    """[{host, vmid}] of the inventory hosts that are VMs on Proxmox node `node`, by vmid."""
    try:
        return guests(hostvars, hosts, node)
    except ProxmoxConfigError as exc:
        raise AnsibleFilterError(str(exc))


def proxmox_restart_pending(vms):
    """["VM 101 (gpu1): args, numa0", ...] for running VMs with pending changes ([] when none)."""
    return restart_pending(vms or [])


def proxmox_restart_guests(vms):
    """[{host, vmid, keys}] of the running VMs with pending changes ([] when none): the VMs a restart applies them to."""
    return restart_guests(vms or [])


class FilterModule:
    def filters(self):
        return {"proxmox_guests": proxmox_guests, "proxmox_restart_pending": proxmox_restart_pending,
                "proxmox_restart_guests": proxmox_restart_guests}
