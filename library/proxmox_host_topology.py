#!/usr/bin/python
"""Ansible module proxmox_host_topology: a Proxmox host's NUMA nodes and GPUs from sysfs."""

DOCUMENTATION = r"""
---
module: proxmox_host_topology
short_description: Read a Proxmox host's NUMA nodes (CPUs, memory) and its GPUs' PCI addresses and NUMA nodes
description:
  - Reads C(<sysfs_root>/devices/system/node/nodeN/cpulist) and C(meminfo) for every NUMA node, and every
    display-class PCI device (class C(0x03xxxx)) under C(<sysfs_root>/bus/pci/devices) with its C(numa_node).
  - This is the host side of the Proxmox VM config topolaunch computes (role proxmox_vm). Read-only; runs the same
    in check mode. Plain Python standard library (GPUs bound to vfio-pci have no driver to ask).
options:
  sysfs_root:
    description: Root of sysfs (a test gives a recorded tree).
    type: path
    default: /sys
author:
  - topolaunch project (@topolaunch)
"""

EXAMPLES = r"""
- name: Read the host topology
  topolaunch.sglang.proxmox_host_topology:
  register: proxmox_host
"""

RETURN = r"""
topology:
  description: nodes (node, cpus, memory_mib) and gpus (address, numa_node or null, vendor, class).
  returned: success
  type: dict
  sample:
    nodes: [{node: 0, cpus: [0, 1], memory_mib: 515625}]
    gpus: [{address: "0000:17:00.0", numa_node: 0, vendor: "0x10de", class: "0x030200"}]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.topolaunch.sglang.plugins.module_utils.proxmox_vm import read_host_topology

ARGUMENT_SPEC = {"sysfs_root": {"type": "path", "default": "/sys"}}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        topology = read_host_topology(module.params["sysfs_root"])
    except (OSError, ValueError) as exc:
        module.fail_json(msg="proxmox_host_topology: cannot read %s: %s" % (module.params["sysfs_root"], exc))
    if not topology["nodes"]:
        module.fail_json(msg="proxmox_host_topology: no NUMA node under %s/devices/system/node"
                         % module.params["sysfs_root"])
    module.exit_json(changed=False, topology=topology)


if __name__ == "__main__":
    main()
