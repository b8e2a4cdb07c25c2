#!/usr/bin/python
"""Documentation of the action plugin proxmox_vm_config (the Proxmox role's controller side; no code runs on hosts)."""

DOCUMENTATION = r"""
module: proxmox_vm_config
short_description: The Proxmox VM config changes the topology findings call for, validated, with a per-key diff
description:
  - Runs in the controller process (its action plugin). Writes nothing, anywhere; the role proxmox_vm writes what it
    returns, through community.proxmox.proxmox_kvm and (affinity) ansible.builtin.uri.
  - For each guest (a GPU VM of this Proxmox node, with its current config as the API gave it) takes the guest's
    topology findings (its C(ansible_facts.gpu_topology) when this run read them, else the controller's
    C(<artifacts_dir>/<guest>/topology.json)) and the host topology (module proxmox_host_topology), and computes
    the change key by key (module_utils proxmox_vm.changes).
  - Every value it returns passes the committed Proxmox API schema excerpt; anything else fails the task with one
    line naming the VM and the key, before any write task runs.
  - With C(--diff) shows the change per VM as config lines (before/after); C(changed) is true when any VM changes.
options:
  host_topology:
    description: The host's topology (proxmox_host_topology's C(topology)).
    type: dict
    required: true
  guests:
    description: The GPU VMs, each C(host) (inventory name), C(vmid), C(config) (GET .../config's data).
    type: list
    elements: dict
    required: true
  artifacts_dir:
    description: Controller directory with C(<guest>/topology.json) (topolaunch_artifacts_dir).
    type: path
  hugepages:
    description: Set C(hugepages) to this (C(2), C(1024), C(any)); unset leaves it alone.
    type: str
author:
  - topolaunch project (@topolaunch)
"""

EXAMPLES = r"""
- name: Compute the VM config changes
  topolaunch.sglang.proxmox_vm_config:
    host_topology: "{{ proxmox_host.topology }}"
    guests: "{{ guests_with_configs }}"
    artifacts_dir: "{{ topolaunch_artifacts_dir }}"
  register: proxmox_vm_planned
"""

RETURN = r"""
vms:
  description: >-
    Per guest: host, vmid, change (set, delete, before, after, root_only, changed), module_params (proxmox_kvm's
    keys), api_params (the keys proxmox_kvm lacks: affinity), findings (the ids used).
  returned: success
  type: list
  elements: dict
"""
