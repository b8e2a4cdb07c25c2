#!/usr/bin/python
"""Documentation of the action plugin sglang_bench (the bench stage's controller side; no code runs on hosts)."""

DOCUMENTATION = r"""
module: sglang_bench
short_description: Find or store benchmark runs under the controller's results tree (no remote call)
description:
  - The bench stage's controller side, run in the controller process by its action plugin. Formerly the module
    C(bench_record); that name still works.
  - O(state=query) looks for the newest complete run of this very server (the plan's server keys) at this very
    workload (O(points) and O(bench)) for the plan's model and topology fingerprint (across nodes its cluster
    fingerprint), and returns it as C(measured_run) (null when there is none). It changes nothing. The bench role
    measures again only when there is none or when forced.
  - O(state=record) writes C(<results_dir>/<model>/<topology_fingerprint>/<layout>/<run id>.jsonl) with
    bench_serving's lines untouched, and C(.meta.json) (the points asked for, O(meta), O(bench)), C(.plan.json),
    C(.topology.json), C(.versions.json) beside it. The run id is the UTC start time with seconds; C(-2), C(-3)...
    are appended when it is taken. Every file is created exclusively, so a result is never overwritten.
  - A point whose line is missing, whose client failed (O(client_error)) or whose C(completed) is below the prompts
    asked is a failure; failures (and O(error)) are written to C(<run id>.error.json) and returned in C(failures).
    It does not fail on them; the caller fails the stage with C(message).
  - O(state=tune) stores one tune (layout C(tune)) as C(<results_dir>/<model>/<topology_fingerprint>/tune-<run id>.json) -
    per layout the model's prediction when the tune chose, the measurement at the workload, what happened to it in
    this tune; the model's pick, the winner, this machine's fit. Created exclusively, never overwritten.
  - O(state=report) writes C(FINDINGS.md) and C(plots/) from the results tree into O(out_dir) (tools/report.py's
    code, in-process).
  - In check mode nothing is written; the result says which run id would be used.
options:
  state:
    description: C(query) finds a run of this server at this workload; C(record) stores one; C(tune) stores a tune;
      C(report) writes FINDINGS.md and the plots.
    type: str
    choices: [record, query, tune, report]
    default: record
  results_dir:
    description: Root of the results tree on the controller.
    type: path
    required: true
  model:
    description: Model name the run or tune is filed under; default the C(model_name) of O(plan) (O(state=tune)
      also C(tune.plan)). Needed for a layout without a plan (it failed at the plan stage).
    type: str
  topology_fingerprint:
    description: The fingerprint the run or tune is filed under; default the one of O(plan) (O(state=tune) also
      C(tune.plan)) - for a server across nodes its C(cluster_fingerprint) (every node's topology), else its
      C(topology_fingerprint). Needed for a layout without a plan; give it as
      C(plan | topolaunch.sglang.results_fingerprint), the same rule.
    type: str
  layout:
    description: Layout name, e.g. C(tp8), C(tp4pp2); O(state=record).
    type: str
  started:
    description: When the run started, ISO 8601 with a time zone (UTC preferred); O(state=record).
    type: str
  points:
    description: The points asked for, each with C(max_concurrency) and C(num_prompts). Empty for a layout that
      failed before benchmarking (then O(error) is required).
    type: list
    elements: dict
    default: []
  lines:
    description: The content of bench_serving's C(--output-file) (one JSON line per point).
    type: str
    default: ""
  meta:
    description: Anything else to keep in C(.meta.json) (host, finish time, client run times).
    type: dict
    default: {}
  bench:
    description: The client's settings (dataset, lengths, warmup, seed) - the workload; kept in C(.meta.json) as
      C(bench) and compared by O(state=query).
    type: dict
    default: {}
  plan:
    description: The plan the server ran (required by O(state=query)); for O(state=tune) the plan the tune started
      from. Its model and fingerprint file the run (O(model), O(topology_fingerprint)).
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
  tune:
    description:
      - O(state=tune) - C(selection) (sglang_plan's C(tune) when the tune chose), C(outcomes) (per layout measured in
        this tune - layout, status ok or failed, run_id, stage, message), C(candidates) and C(plan) (the plan made
        after measuring), C(workload), and anything else to keep (host, finished).
    type: dict
  out_dir:
    description: O(state=report) - where FINDINGS.md and plots/ go; default O(results_dir).
    type: path
  artifacts_dir:
    description: O(state=query) - also return the topology the plan was made for (C(topology)), the facts a run is
      recorded with - this run's gpu_topology facts of the host, else those the topology stage saved in
      C(<artifacts_dir>/<host>/topology.json); fail when they are missing or of another fingerprint than the plan's.
    type: path
  nodes:
    description: O(state=query) with O(artifacts_dir), a plan of a server across nodes - its inventory hosts in
      node-rank order (C(topolaunch_nodes)); each node's topology is returned under the cluster fingerprint.
    type: list
    elements: str
    default: []
author:
  - topolaunch project (@topolaunch)
"""

EXAMPLES = r"""
- name: Is this server already measured at this workload?
  topolaunch.sglang.sglang_bench:
    state: query
    results_dir: "{{ playbook_dir }}/results"
    plan: "{{ topolaunch_plan }}"
    points: [{max_concurrency: 1, num_prompts: 8}]
    bench: {dataset_name: random-ids, input_len: 1024, output_len: 1024}
  register: measured

- name: Store the run on the controller, filed under the plan's model and fingerprint
  topolaunch.sglang.sglang_bench:
    results_dir: "{{ playbook_dir }}/results"
    plan: "{{ topolaunch_plan }}"
    layout: tp8
    started: "2026-11-30T10:15:02Z"
    points: [{max_concurrency: 1, num_prompts: 8}]
    lines: "{{ bench_output.content | b64decode }}"

- name: Write FINDINGS.md and the plots
  topolaunch.sglang.sglang_bench:
    state: report
    results_dir: "{{ playbook_dir }}/results"

- name: Record a sweep layout that failed at launch
  topolaunch.sglang.sglang_bench:
    results_dir: results
    model: glm-5-nvfp4
    topology_fingerprint: a1b2c3d4e5f6
    layout: tp2pp4
    started: "2026-11-30T10:15:02Z"
    error: {stage: launch, message: "unit exited: CUDA out of memory"}
"""

RETURN = r"""
measured_run:
  description: O(state=query) - the run found (run_id, dir, points), or null.
  returned: state query
  type: dict
topology:
  description: O(state=query) with O(artifacts_dir) - the topology facts the plan was made for (a server across
    nodes - C(fingerprint), C(nnodes), C(nodes), C(node_fingerprints), C(gpu_count), C(gpus), versions).
  returned: state query with artifacts_dir
  type: dict
run_id:
  description: The run id used (or that would be used in check mode).
  returned: state record and tune
  type: str
  sample: 20261130T101502Z
files:
  description: Paths written (or that would be written).
  returned: state record, tune and report
  type: list
  elements: str
points:
  description: Each point parsed from the lines, with our metric names and C(status) ok, partial or failed.
  returned: state record
  type: list
  elements: dict
failures:
  description: Points that failed, each with C(max_concurrency), C(num_prompts), C(completed), C(reason).
  returned: state record
  type: list
  elements: dict
message:
  description: One line saying what failed; empty when nothing did.
  returned: state record
  type: str
stage:
  description: C(bench).
  returned: always
  type: str
"""
