#!/usr/bin/python
"""Ansible module gpu_preflight: prove the GPUs can talk and measure their links (logic in module_utils)."""

DOCUMENTATION = r"""
---
module: gpu_preflight
short_description: Measure GPU pairs and NCCL allreduce groups with a hard timeout per step
description:
  - Runs the preflight worker under the SGLang venv's python (its torch and NCCL) in sessions, each in its own
    process group with a deadline that restarts at every measured pair or group; on the deadline the process
    group is killed and the item is recorded as a hang (a result, not a stall).
  - Measures every ordered GPU pair (P2P copy bandwidth and latency, each GPU's local copy) and an NCCL allreduce
    on each of I(groups) (bus bandwidth at I(bytes), latency at I(small_bytes), as nccl-tests reports them);
    then, where P2P misbehaved, the same with C(NCCL_P2P_DISABLE=1).
  - Returns findings with remedies (VM clique C(x-nv-gpudirect-clique), IOMMU passthrough, P2P off),
    I(plan_fixes) for the plan, the figures the planner uses and tables laid out like p2pBandwidthLatencyTest and
    nccl-tests. Writes the record to I(record_path).
  - A record for the same I(fingerprint) at I(record_path) is returned as it is, nothing is measured, unless
    I(force). Check mode lists the steps and measures nothing.
  - Runs under any python 3.9+ (stdlib only); the GPUs must be free (the caller stops our server first).
options:
  python:
    description: The SGLang venv's python (torch with CUDA and NCCL), e.g. C(/opt/sglang/current/bin/python).
    type: path
    required: true
  worker:
    description: The worker script on the host (C(roles/preflight/files/preflight_worker.py); the lab's stand-in).
    type: path
    required: true
  gpus:
    description: NVML indices of the GPUs to measure.
    type: list
    elements: int
    required: true
  groups:
    description:
      - GPU groups to measure an allreduce on, as the planner would use them (e.g. C([[0,1,2,3],[4,5,6,7],[0,1,2,3,4,5,6,7]])).
      - Default blocks of 2, 4, 8... of I(gpus), then all of them.
    type: list
    elements: list
  fingerprint:
    description: The topology fingerprint the record is keyed by (C(ansible_facts.gpu_topology.fingerprint)).
    type: str
    required: true
  record_path:
    description: Where the host keeps its record (JSON, 0644).
    type: path
    default: /var/lib/topolaunch/preflight.json
  force:
    description: Measure even when I(record_path) holds a record for I(fingerprint).
    type: bool
    default: false
  step_timeout:
    description: Seconds each pair or group may take (the first of a session also covers its start-up).
    type: float
    default: 30
  bytes:
    description: Large message in bytes (copy bandwidth, allreduce bus bandwidth).
    type: int
    default: 268435456
  small_bytes:
    description: Small message in bytes for the allreduce latency.
    type: int
    default: 8192
  iters:
    description: Timed iterations per figure.
    type: int
    default: 10
  warmup:
    description: Untimed iterations before each figure.
    type: int
    default: 3
  p2p_disable:
    description: When to measure again with C(NCCL_P2P_DISABLE=1) - C(auto) where P2P misbehaved, C(always), C(never).
    type: str
    choices: [auto, always, never]
    default: auto
  environment:
    description: Extra environment for the worker (e.g. C(NCCL_TOPO_FILE); the lab's C(FAKE_NVML_SPEC)).
    type: dict
    default: {}
  facts:
    description:
      - C(ansible_facts.gpu_topology), for the expectation of each pair's link (slow P2P findings), the groups
        that cross the sockets (measured once more with C(NCCL_P2P_LEVEL=SYS)) and the NCCL topology file.
    type: dict
  gpu_processes:
    description:
      - Processes on the GPUs (C({gpu, pid}), e.g. from the topology facts) - the preflight measures only free
        GPUs. With any on I(gpus) nothing is measured - a record for I(fingerprint) is returned as usual, else the
        module warns that the preflight was skipped; with I(force) it fails naming them.
    type: list
    elements: dict
    default: []
  nccl_topo_path:
    description:
      - Where the NCCL topology file for VMs goes (with I(facts)) - written (0644) when the guest's PCI tree is
        flat or NUMA is unknown while the facts' NUMA islands or the measured P2P groups show the real grouping,
        removed when no longer needed (only a file this module wrote). Empty - never.
      - A file the facts alone call for is written before the measurement and the worker runs with
        C(NCCL_TOPO_FILE) pointing at it.
    type: str
    default: /etc/topolaunch/nccl_topo.xml
author:
  - topolaunch project (@topolaunch)
"""

EXAMPLES = r"""
- name: Preflight the GPUs (once per topology)
  gpu_preflight:
    python: /opt/sglang/current/bin/python
    worker: /opt/topolaunch/preflight_worker.py
    gpus: "{{ range(ansible_facts.gpu_topology.gpu_count) | list }}"
    groups: [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3, 4, 5, 6, 7]]
    fingerprint: "{{ ansible_facts.gpu_topology.fingerprint }}"
    facts: "{{ ansible_facts.gpu_topology }}"
  register: preflight

- name: Show it
  ansible.builtin.debug:
    msg: "{{ preflight.report }}"
"""

RETURN = r"""
measured:
  description: Whether this call measured (false when the record for the fingerprint was reused, and in check mode).
  returned: always
  type: bool
in_use:
  description: The processes of I(gpu_processes) on I(gpus) with their names (C(pid 123 (python3) on GPU 0)), "" for none.
  returned: always
  type: str
reason:
  description: Why it measured or not.
  returned: always
  type: str
record_path:
  description: The record's path on the host.
  returned: always
  type: str
steps:
  description: The first pass's steps (name, argv, env); the P2P-off pass is decided from what it finds.
  returned: always
  type: list
record:
  description: >-
    The record (docs/preflight.md): version, fingerprint, created, settings, gpus, planned_groups, env (torch, CUDA,
    NCCL versions), pairs [{src, dst, gbps, latency_us, status, p2p_disabled, local, peer_access, wrong, seconds,
    error}], groups [{gpus, size, busbw_gbps, algbw_gbps, latency_us, bytes, small_bytes, call_us, status,
    p2p_disabled, seconds, init_seconds, wrong, error}], steps, timing, findings, plan_fixes, figures, ok, tables.
    Status: ok, hang, failed, wrong, skipped.
  returned: unless check mode had no record to reuse
  type: dict
findings:
  description: "[{id, severity, gpus, message, remedy}]"
  returned: when a record is returned
  type: list
plan_fixes:
  description: >-
    What the plan must apply, e.g. C({"env": {"NCCL_P2P_DISABLE": "1"}, "server_args": {"disable_custom_all_reduce": true}});
    empty env and server_args when nothing is to be fixed.
  returned: when a record is returned
  type: dict
figures:
  description: >-
    For the planner, measured with the P2P setting the plan will run: pairs [{src, dst, gbps, latency_us, status,
    p2p_disabled}], local, groups [{gpus, size, busbw_gbps, latency_us, status, p2p_disabled}], allreduce_by_size
    {size: {busbw_gbps (slowest group), latency_us (slowest), groups, p2p_disabled}}.
  returned: when a record is returned
  type: dict
ok:
  description: False when the GPUs cannot be used safely even with the fixes (or the worker could not run).
  returned: when a record is returned
  type: bool
report:
  description: Lines for a human (matrices, allreduce table, findings with fixes, timing).
  returned: when a record is returned
  type: list
nccl_topo:
  description: >-
    The NCCL topology file decision - needed, reason, groups, source (numa or measured), path, changed, env
    (C({"NCCL_TOPO_FILE": path}) when the file is there).
  returned: when I(nccl_topo_path) and I(facts) are given and a record is returned
  type: dict
seconds:
  description: Wall time of the measurement.
  returned: when measured
  type: float
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.topolaunch.sglang.plugins.module_utils.nccl_topo import sync
from ansible_collections.topolaunch.sglang.plugins.module_utils.preflight import PreflightError, module_run
from ansible_collections.topolaunch.sglang.plugins.module_utils.system import write_atomic


ARGUMENT_SPEC = {
    "python": {"type": "path", "required": True},
    "worker": {"type": "path", "required": True},
    "gpus": {"type": "list", "elements": "int", "required": True},
    "groups": {"type": "list", "elements": "list"},
    "fingerprint": {"type": "str", "required": True},
    "record_path": {"type": "path", "default": "/var/lib/topolaunch/preflight.json"},
    "force": {"type": "bool", "default": False},
    "step_timeout": {"type": "float", "default": 30},
    "bytes": {"type": "int", "default": 256 << 20},
    "small_bytes": {"type": "int", "default": 8192},
    "iters": {"type": "int", "default": 10},
    "warmup": {"type": "int", "default": 3},
    "p2p_disable": {"type": "str", "choices": ["auto", "always", "never"], "default": "auto"},
    "environment": {"type": "dict", "default": {}},
    "facts": {"type": "dict"},
    "gpu_processes": {"type": "list", "elements": "dict", "default": []},
    "nccl_topo_path": {"type": "str", "default": "/etc/topolaunch/nccl_topo.xml"},
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = module_run(dict(module.params), module.check_mode, write_atomic, topo_sync=sync)
    except PreflightError as exc:
        module.fail_json(msg=str(exc))
    for warning in result.pop("warnings", []):
        module.warn(warning)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
