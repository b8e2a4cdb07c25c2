#!/usr/bin/python
"""Ansible module bench_measured: the measured results the planner's auto mode ranks layouts by."""

DOCUMENTATION = r"""
module: bench_measured
short_description: Read benchmark results on the controller as records for sglang_plan's auto mode
description:
  - Runs on the controller (C(delegate_to: localhost)); reads the results tree the bench stage writes.
  - Returns one record per model x topology fingerprint x layout x concurrency x workload from the newest complete
    point. Partial points (completed below the prompts asked) and failed runs are left out.
  - Read-only; check mode safe.
options:
  results_dir:
    description: Root of the results tree. A missing directory gives no records.
    type: path
    required: true
  model:
    description: Only this model (the plan's C(model_name)); all models when omitted.
    type: str
  topology_fingerprint:
    description: Only this topology fingerprint; all when omitted.
    type: str
author: topolaunch
"""

EXAMPLES = r"""
- name: Load measured results for this topology
  bench_measured:
    results_dir: "{{ playbook_dir }}/../results"
    topology_fingerprint: "{{ ansible_facts.gpu_topology.fingerprint }}"
  delegate_to: localhost
  register: plan_measured
"""

RETURN = r"""
measured:
  description: Records with model, topology_fingerprint, layout, max_concurrency, output_throughput,
    total_throughput, ttft_p99_ms, itl_p99_ms, input_len, output_len, num_prompts, run_id, simulated, source.
  returned: always
  type: list
  elements: dict
  sample:
    - {model: glm-5-nvfp4, topology_fingerprint: a1b2c3d4e5f6, layout: tp8, max_concurrency: 128,
       output_throughput: 4180.0, source: measured}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.topolaunch.results import ResultsError, load_runs, measured_records


def main():
    module = AnsibleModule(
        argument_spec={
            "results_dir": {"type": "path", "required": True},
            "model": {"type": "str"},
            "topology_fingerprint": {"type": "str"},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        runs = load_runs(p["results_dir"], model=p["model"], fingerprint=p["topology_fingerprint"])
    except (ResultsError, OSError) as exc:
        module.fail_json(msg="bench_measured: %s" % exc)
    module.exit_json(changed=False, measured=measured_records(runs, p["model"], p["topology_fingerprint"]))


if __name__ == "__main__":
    main()
