#!/usr/bin/python
"""Ansible module gpu_topology: read GPU topology through NVML and return it as ansible_facts.gpu_topology."""

DOCUMENTATION = r"""
---
module: gpu_topology
short_description: Read GPU topology through NVML (nvidia-ml-py)
description:
  - Reads every GPU, every GPU pair (nvidia-smi topo -m link, P2P status for read/write/nvlink/atomics/pci),
    NVLink counts (also on NVSwitch machines), NUMA placement, processes and modes through NVML.
  - Derives NUMA/P2P/NVLink islands, a stable topology fingerprint, findings with remedies, and text tables
    laid out as C(nvidia-smi topo -m) and C(nvidia-smi topo -p2p r).
  - Read-only; runs the same in check mode.
  - An action plugin of the same name handles O(save_to) on the controller.
  - Needs nvidia-ml-py in the interpreter that runs it; topolaunch runs it with the tools venv
    (C(topolaunch_tools_python), default C(/opt/topolaunch/tools/bin/python)), so the system Python is untouched.
options:
  sysfs_root:
    description:
      - Root of sysfs for the fallback NUMA lookup C(<sysfs_root>/bus/pci/devices/<bus id>/numa_node).
      - The lab serves a fake sysfs under C(/etc/fake-nvml/sysfs).
    type: path
    default: /sys
  save_to:
    description:
      - Controller-side (action plugin) - write the facts there on the controller as pretty JSON (directories made,
        0644, only when they changed), in check mode too (it changes nothing on the host). Not a change of the host
        either way; the result's C(saved) says whether the file was written.
    type: path
author:
  - topolaunch project (@topolaunch)
"""

EXAMPLES = r"""
- name: Read the GPU topology
  topolaunch.sglang.gpu_topology:
  vars:
    ansible_python_interpreter: /opt/topolaunch/tools/bin/python

- name: Read it in the lab (fake sysfs) and keep it on the controller
  topolaunch.sglang.gpu_topology:
    sysfs_root: /etc/fake-nvml/sysfs
    save_to: "{{ playbook_dir }}/artifacts/{{ inventory_hostname }}/topology.json"
"""

RETURN = r"""
ansible_facts:
  description: Facts, under the key gpu_topology (see docs/DESIGN.md).
  returned: success
  type: dict
  contains:
    gpu_topology:
      description: >-
        driver_version, cuda_driver_version, gpu_count, gpus (per GPU), links, pcie_levels, nvlink_counts,
        nvlink_fabric, p2p, islands, in_vm, fingerprint, findings, rendered (matrix, p2p_read).
      type: dict
      sample:
        gpu_count: 2
        links: [["X", "NV18"], ["NV18", "X"]]
        fingerprint: 1a2b3c4d5e6f
        findings: []
query_seconds:
  description: Wall time of the NVML query and the derived facts in the module (import of nvidia-ml-py included).
  returned: success
  type: float
  sample: 0.0123
saved_to:
  description: Where the action plugin saved the facts on the controller.
  returned: when save_to was given
  type: str
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.topolaunch.sglang.plugins.module_utils.topology import TopologyError, import_nvml, read_topology

ARGUMENT_SPEC = {
    "sysfs_root": {"type": "path", "default": "/sys"},
    "save_to": {"type": "path"},          # handled by the action plugin on the controller
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    start = time.monotonic()
    try:
        facts = read_topology(import_nvml(), module.params["sysfs_root"])
    except TopologyError as exc:
        module.fail_json(msg=str(exc), stage="topology")
    module.exit_json(changed=False, stage="topology", ansible_facts={"gpu_topology": facts},
                     query_seconds=round(time.monotonic() - start, 4))


if __name__ == "__main__":
    main()
