#!/usr/bin/python
"""Ansible module bench_record: store one benchmark run (or one failed sweep layout) on the controller."""

DOCUMENTATION = r"""
module: bench_record
short_description: Store a bench_serving run under results/ beside its plan, topology and versions, never overwriting
description:
  - Runs on the controller (C(delegate_to: localhost)). Writes
    C(<results_dir>/<model>/<topology_fingerprint>/<layout>/<run id>.jsonl) with bench_serving's lines untouched, and
    C(.meta.json) (the points asked for), C(.plan.json), C(.topology.json), C(.versions.json) beside it.
  - The run id is the UTC start time with seconds; C(-2), C(-3)... are appended when it is taken. Every file is
    created exclusively, so a result is never overwritten.
  - A point whose line is missing, whose client failed (I(client_error)) or whose C(completed) is below the prompts
    asked is a failure; failures (and I(error)) are written to C(<run id>.error.json) and returned in C(failures).
    The module itself does not fail on them: the caller fails the stage with C(message).
  - In check mode nothing is written; the result says which run id would be used.
options:
  results_dir:
    description: Root of the results tree on the controller.
    type: path
    required: true
  model:
    description: Model name (the plan's C(model_name)).
    type: str
    required: true
  topology_fingerprint:
    description: The topology fingerprint the plan was made for.
    type: str
    required: true
  layout:
    description: Layout name, e.g. C(tp8), C(tp4pp2).
    type: str
    required: true
  started:
    description: When the run started, ISO 8601 with a time zone (UTC preferred).
    type: str
    required: true
  points:
    description: The points asked for, each with C(max_concurrency) and C(num_prompts). Empty for a layout that
      failed before benchmarking (then I(error) is required).
    type: list
    elements: dict
    default: []
  lines:
    description: The content of bench_serving's C(--output-file) (one JSON line per point).
    type: str
    default: ""
  meta:
    description: Anything else to keep in C(.meta.json) (host, bench settings, finish time).
    type: dict
    default: {}
  plan:
    description: The plan the server ran.
    type: dict
  topology:
    description: The gpu_topology facts.
    type: dict
  versions:
    description: Versions (sglang, driver, CUDA, topolaunch commit).
    type: dict
  client_error:
    description: The client run that failed, with C(max_concurrency), C(rc), C(msg), C(stderr), C(stdout).
    type: dict
  error:
    description: A failure outside the client, with C(stage) and C(message) (a sweep layout that did not come up).
    type: dict
author: topolaunch
"""

EXAMPLES = r"""
- name: Store the run on the controller
  bench_record:
    results_dir: "{{ playbook_dir }}/../results"
    model: glm-5-nvfp4
    topology_fingerprint: a1b2c3d4e5f6
    layout: tp8
    started: "2026-11-30T10:15:02Z"
    points: [{max_concurrency: 1, num_prompts: 8}]
    lines: "{{ bench_output.content | b64decode }}"
  delegate_to: localhost

- name: Record a sweep layout that failed at launch
  bench_record:
    results_dir: results
    model: glm-5-nvfp4
    topology_fingerprint: a1b2c3d4e5f6
    layout: tp2pp4
    started: "2026-11-30T10:15:02Z"
    error: {stage: launch, message: "unit exited: CUDA out of memory"}
  delegate_to: localhost
"""

RETURN = r"""
run_id:
  description: The run id used (or that would be used in check mode).
  returned: always
  type: str
  sample: 20261130T101502Z
files:
  description: Paths written (or that would be written).
  returned: always
  type: list
  elements: str
points:
  description: Each point parsed from the lines, with our metric names and C(status) ok, partial or failed.
  returned: always
  type: list
  elements: dict
failures:
  description: Points that failed, each with C(max_concurrency), C(num_prompts), C(completed), C(reason).
  returned: always
  type: list
  elements: dict
message:
  description: One line saying what failed; empty when nothing did.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.topolaunch.sglang.plugins.plugin_utils.bench import ResultsError, failure_message, record_run


def main():
    module = AnsibleModule(
        argument_spec={
            "results_dir": {"type": "path", "required": True},
            "model": {"type": "str", "required": True},
            "topology_fingerprint": {"type": "str", "required": True},
            "layout": {"type": "str", "required": True},
            "started": {"type": "str", "required": True},
            "points": {"type": "list", "elements": "dict", "default": []},
            "lines": {"type": "str", "default": ""},
            "meta": {"type": "dict", "default": {}},
            "plan": {"type": "dict"},
            "topology": {"type": "dict"},
            "versions": {"type": "dict"},
            "client_error": {"type": "dict"},
            "error": {"type": "dict"},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        out = record_run(
            p["results_dir"], p["model"], p["topology_fingerprint"], p["layout"], p["started"], p["points"],
            lines=p["lines"], meta=p["meta"], plan=p["plan"], topology=p["topology"], versions=p["versions"],
            client_error=p["client_error"], error=p["error"], write=not module.check_mode)
    except (ResultsError, OSError) as exc:
        module.fail_json(msg="bench_record: %s" % exc)
    message = (p["error"] or {}).get("message") or failure_message(p["layout"], out["failures"])
    module.exit_json(changed=True, message=message, **out)


if __name__ == "__main__":
    main()
