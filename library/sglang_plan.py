#!/usr/bin/python
"""Ansible module sglang_plan: plan the SGLang launch (layout, GPU order, PP split, memory, argv) from topology."""

DOCUMENTATION = r"""
---
module: sglang_plan
short_description: Plan an SGLang launch from GPU topology facts and a model directory
description:
  - Turns C(ansible_facts.gpu_topology), the model's C(config.json) and C(model.safetensors.index.json), a wanted
    layout and extra server arguments into the exact launch - CUDA_VISIBLE_DEVICES order, environment, canonical
    C(sglang.launch_server) arguments of the pinned SGLang version, PP layer split, memory fit - and explains it.
  - Every layout for the GPU count is a candidate, valid or not with all its reasons; C(auto) ranks valid ones by
    measured results for this model and topology fingerprint, else by the performance model's estimate at the workload.
  - Measurements of this model and topology also fit the model's efficiency constants to this machine (the fit
    corrects the estimates of the layouts not measured yet); the fit given in O(fits) is used while it was made from
    the same measurements, else a new one is made and returned as C(fit).
  - C(tune) plans as C(auto) and also returns which layouts could win and are to be measured (C(tune)), for the
    tune role.
  - An invalid explicit layout, or any bad input, fails with every reason before anything changes on a host.
  - Changes nothing on the host; runs the same in check mode. Reads the model directory on the target, and NVML
    there (like gpu_topology, so under the tools venv python) when neither O(topology) nor O(node_topologies) is
    given.
  - Returns the plan (C(plan)) and, beside it, the candidates table (C(candidates)); the plan is the one shape every
    stage keeps (the fact C(topolaunch_plan), C(plan.json), C(current_plan.json), C(last_good_plan.json)).
  - An action plugin of the same name handles O(results_dir) and O(save_to) on the controller.
options:
  topology:
    description:
      - The gpu_topology facts of this host (node 0 when O(node_topologies) is given).
      - Omitted (and no O(node_topologies)) - the module reads them through NVML and returns them as
        C(ansible_facts.gpu_topology).
    type: dict
  sysfs_root:
    description: sysfs root for the NUMA fallback when the module reads the topology itself.
    type: path
    default: /sys
  results_dir:
    description:
      - Controller-side (action plugin) - the bench stage's results tree on the controller; its measured records
        are added to O(measured). A missing directory adds none.
    type: path
  save_to:
    description:
      - Controller-side (action plugin) - write the plan there on the controller as pretty JSON, and the candidates
        table beside it as C(candidates.json) (directories made, 0644, only when changed), in check mode too.
    type: path
  node_topologies:
    description: One gpu_topology facts mapping per node, in node-rank order (multi-node).
    type: list
    elements: dict
  model_path:
    description: Model directory on the target; also the C(--model-path) of the launch.
    type: str
  model:
    description: The model given directly instead of read from O(model_path) - C(config) (config.json) and
      C(total_size) (weight bytes), optional C(name).
    type: dict
  layout:
    description:
      - C(auto), C(tune), a name (C(tp8), C(tp4pp2), C(tp2pp2ep2), C(tp4dp2)) or a mapping with tp, pp, dp, ep.
      - C(tune) plans as C(auto) and returns the layouts to measure as C(tune).
    type: raw
    default: auto
  sglang_version:
    description: The pinned SGLang version whose flags are used and checked.
    type: str
    default: "0.5.9"
  server_args:
    description: Extra server arguments, ServerArgs field names (or flag names in snake case) to values.
    type: dict
    default: {}
  host:
    description: Address the server listens on (one address without a port; anything else fails the plan, naming
      C(topolaunch_host)).
    type: raw
    default: 127.0.0.1
  port:
    description: Port the server listens on, 1024-65535 (the unit has no C(CAP_NET_BIND_SERVICE)); C(true) or
      anything but an integer fails the plan, naming C(topolaunch_port).
    type: raw
    default: 30000
  served_model_name:
    description: Name served by the API; default the model directory's name.
    type: str
  metrics:
    description:
      - SGLang's Prometheus metrics at GET /metrics - C(--enable-metrics), and for TP > 1
        C(--enable-metrics-for-all-schedulers) where the release has it (otherwise only each TP group's rank 0
        reports). false leaves both out.
    type: bool
    default: true
  api_key_set:
    description:
      - Whether the server will enforce an API key (topolaunch_api_key is set); the key itself never reaches the
        planner. With O(host) 0.0.0.0 or C(::) and no key the plan is refused unless O(listen_without_api_key).
    type: bool
    default: false
  listen_without_api_key:
    description:
      - The inventory's explicit opt-in to listening on every address without an API key
        (topolaunch_listen_without_api_key); the plan then says so in a warning.
    type: bool
    default: false
  speculative:
    description:
      - Speculative decoding (topolaunch_speculative) - C(off) never; C(on) NEXTN (MTP) where the checkpoint carries
        its draft layer, a layout the release refuses it for is refused; C(auto) per layout, when its estimate with
        NEXTN is higher at the workload's concurrency. A checkpoint without MTP weights never gets NEXTN.
    type: str
    choices: [auto, "on", "off"]
    default: "off"
  speculative_accept_length:
    description:
      - Tokens a request gains per verify step (> 1), for the estimate with speculative decoding
        (topolaunch_speculative_accept_length); unset - the default from the field's published figures
        (plan_speculative.DEFAULT_ACCEPT_LENGTH). A measured value replaces it.
    type: float
  nnodes:
    description: Number of nodes.
    type: int
    default: 1
  node_rank:
    description: This host's node rank; the top-level argv and env are this node's.
    type: int
    default: 0
  dist_init_addr:
    description: host:port of node 0 for C(--dist-init-addr) (needed with O(nnodes) > 1).
    type: str
  allow_cross_node_tp:
    description:
      - Several nodes - let a TP group span nodes (its two allreduces per layer then cross the network). By default
        such layouts are refused and TP stays inside a node.
    type: bool
    default: false
  node_servers:
    description:
      - Several nodes - where each node's SGLang listens, in node-rank order (node 0 serves the API, the others
        SGLang's health check server). Default O(host) and O(port) on every node.
    type: list
    elements: dict
    suboptions:
      host:
        description: C(--host) of that node.
        type: str
        required: true
      port:
        description: C(--port) of that node.
        type: int
        required: true
      address:
        description:
          - Where that node's replicas listen and the gateway reaches them (O(replica_nodes); default its O(host)).
            An address other than loopback needs the API key (O(api_key_set)) or O(listen_without_api_key).
        type: str
  replica_nodes:
    description:
      - Several nodes - a DP layout may be served as whole replicas on each node (each replica inside one node)
        behind one model gateway, ranked by the planner's replica model beside the layouts of one server across
        the nodes. The plan then has C(replica_nodes) (which node holds which GPUs) and C(gateway_node).
    type: bool
    default: false
  gateway_node:
    description: Several nodes - the node (rank) the gateway runs on, listening on its O(node_servers) host and port.
    type: int
    default: 0
  gateway:
    description:
      - Serve a DP layout as independent replicas behind the model gateway (smg) - C(auto) when dp > 1, C(always)
        (one replica too), C(never) (SGLang's own C(--dp-size) in one server, the plan as before). With the gateway
        the plan gains C(replicas) (which replica is where - unit, GPUs, port, C(--numa-node), env, argv) and
        C(gateway) (unit, release, host, port, policy, argv); a bad value or a missing pairing fails the plan.
    type: str
    default: never
  gateway_releases:
    description: The release table (role topolaunch, C(topolaunch_gateway_releases)) - per gateway release its
      package, pinned requirements and the SGLang releases it pairs with.
    type: dict
    default: {}
  gateway_version:
    description: The gateway release installed (C(topolaunch_gateway_version)); it must pair with the SGLang release.
    type: str
  gateway_policy:
    description: smg's routing policy (C(--policy)).
    type: str
    default: cache_aware
  gateway_health_interval:
    description: Seconds between the gateway's health checks of each replica.
    type: int
    default: 10
  gateway_args:
    description: More smg options (snake_case names, values; true for a switch).
    type: dict
    default: {}
  gateway_metrics_port:
    description: The port of the gateway's Prometheus metrics, on 127.0.0.1.
    type: int
    default: 29000
  replica_host:
    description: Where the replicas listen.
    type: str
    default: 127.0.0.1
  replica_ports:
    description: One port per replica (default the ports after O(port), the gateway's).
    type: list
    elements: int
    default: []
  measured:
    description: Measured records (model, topology_fingerprint, layout, output_throughput, max_concurrency).
    type: list
    elements: dict
    default: []
  fits:
    description:
      - Fits of the model to machines (C(results/<model>/<fingerprint>/fit.json)); the one of this model and topology
        replaces the committed efficiency constants in the estimates while it was made from the measurements given.
    type: list
    elements: dict
    default: []
  failures:
    description:
      - Layouts that failed to start on a machine (records with model, topology_fingerprint, layout, stage); with
        C(layout=tune) they are not measured again unless O(tune_remeasure).
    type: list
    elements: dict
    default: []
  tune_max:
    description: With C(layout=tune), how many layouts may be measured (measured ones count).
    type: int
    default: 3
  tune_remeasure:
    description: With C(layout=tune), measure again the layouts measured already (and those that failed).
    type: bool
    default: false
  tune_layouts:
    description: With C(layout=tune), measure these layouts instead of those the model picks.
    type: list
    elements: str
    default: []
  tune_backends:
    description:
      - With C(layout=tune), backends measured as extra candidates of the first layout chosen (topolaunch_tune_backends,
        module_utils/topolaunch/tune_backends.py) - a list of backend kinds (C(moe_runner_backend),
        C(attention_backend), C(fp4_gemm_backend), C(fp8_gemm_backend)) whose values the known-combinations table
        ranks close here, or a mapping kind to a list of values of the installed release's choices.
      - A kind or value the release lacks, or a kind set in O(server_args), fails the plan naming the field.
    type: raw
  backends:
    description:
      - Backends this plan runs with (a tune's backend candidate) - a mapping kind to value, each one of the installed
        release's choices. The plan records them (C(backends), C(layout.variant)).
      - Without it a plan that measured results decide runs the measured winner with the backends it was measured
        with.
    type: dict
  gpus:
    description: GPU indices the plan may use (default all).
    type: list
    elements: int
  pp_layer_partition:
    description: Layers per PP stage; default SGLang's own split, or one balanced by layer cost when faster.
    type: list
    elements: int
  workload:
    description:
      - What the server will serve, for the performance model's estimate and for which measurements rank
        (those at the same concurrency with lengths within 10%).
      - Keys C(input_len), C(output_len), C(concurrency), positive integers; default 1024, 1024, 128.
      - C(concurrency) C(max) is as many requests as every replica's KV room and request cap admit (at most 1024
        in all); measurements from that many requests in flight count.
      - C(slo) C({ttft_ms, tpot_ms}) (either or both, positive; C(ttft_percentile) default 99, C(tpot_percentile)
        default 50, each 50 or 99) plans each layout at the highest concurrency up to the workload's whose predicted
        TTFT and TPOT meet it and ranks by throughput there; measurements count at or below the workload's
        concurrency when their measured percentiles meet it.
    type: dict
  sglang_python:
    description: SGLang venv python for the printed command line (default /opt/sglang/venvs/<version>/bin/python).
    type: str
  installed_version_file:
    description:
      - The sglang role's record of the SGLang release installed and current on the host
        (C(/etc/topolaunch/sglang_version.json)). When it can be read, the plan is for that release instead of
        O(sglang_version), and the printed command line uses the venv it names. Read here, in the plan's own call, so
        that a relaunch without the provision stage costs no extra round trip.
      - A missing record leaves O(sglang_version); an unreadable one too, and the validate step refuses it, naming the
        file, before anything is stopped.
    type: path
  preflight_record:
    description:
      - The preflight stage's record on the host (C(/var/lib/topolaunch/preflight.json), module gpu_preflight).
        When it is for this host's topology fingerprint, its measured pair bandwidths and allreduce figures replace
        the table values, its plan_fixes (C(NCCL_P2P_DISABLE=1), C(disable_custom_all_reduce)) are applied,
        C(NCCL_P2P_LEVEL=SYS) is set where it proved P2P across the sockets, and the reason says so. A record that
        says the GPUs cannot be used safely refuses the plan. A missing file - table values.
    type: path
  nccl_topo_file:
    description:
      - The NCCL topology file the preflight stage writes for VMs (C(/etc/topolaunch/nccl_topo.xml)). When the
        file on the host was written for this host's topology, the plan's env sets C(NCCL_TOPO_FILE) to it.
    type: path
author:
  - topolaunch project (@topolaunch)
"""

EXAMPLES = r"""
- name: Plan on the host (reading its topology), rank by the controller's results, keep the plan there
  topolaunch.sglang.sglang_plan:
    model_path: /srv/models/glm-5-nvfp4
    layout: auto
    results_dir: "{{ playbook_dir }}/results"
    save_to: "{{ playbook_dir }}/artifacts/{{ inventory_hostname }}/plan.json"
  vars:
    ansible_python_interpreter: /opt/topolaunch/tools/bin/python

- name: Plan the field launch
  topolaunch.sglang.sglang_plan:
    topology: "{{ ansible_facts.gpu_topology }}"
    model_path: /srv/models/glm-5-nvfp4
    layout: tp4pp2
    server_args:
      mem_fraction_static: 0.92
      max_running_requests: 1024
      moe_runner_backend: flashinfer_cutlass
  register: plan_result
"""

RETURN = r"""
ansible_facts:
  description: C(gpu_topology), when the module read the topology itself.
  returned: when neither topology nor node_topologies was given
  type: dict
saved_to:
  description: Where the action plugin saved the plan on the controller.
  returned: when save_to was given
  type: str
plan:
  description: The plan (docs/DESIGN.md "sglang_plan result") - layout, gpu_indices, cuda_visible_devices, env, argv,
    pp_layer_partition, memory, reason, warnings, known_combinations (the known-bad combinations whose working values
    the plan set, with their sources), topology_fingerprint, model_name, per_node (multi-node).
  returned: success
  type: dict
  sample:
    layout: {tp: 4, pp: 2, dp: 1, ep: 1, nnodes: 1, name: tp4pp2}
    cuda_visible_devices: "0,1,2,3,4,5,6,7"
    argv: ["--model-path", "/srv/models/glm-5-nvfp4", "--tp-size", "4", "--pp-size", "2"]
fit:
  description: The fit of the model to this machine made in this call (to be saved as
    C(results/<model>/<fingerprint>/fit.json) - efficiency, constants, points, ratios, error_before, error_after,
    quality, why, basis); the plan's C(fit) says which fit its estimates use.
  returned: when the measurements of this machine changed since the fit given
  type: dict
tune:
  description: With C(layout=tune), which layouts could win - measure (to measure, best first), chosen, rows (one per
    valid layout - name, estimate, measured, figure, status, note), scale, error, max.
  returned: when layout is tune
  type: dict
candidates:
  description: The candidates table beside the plan - every layout considered, valid or not, with its reasons,
    score, source and estimate, best first. On failure, the table as readable lines, when it got that far.
  returned: success, and failure when candidates were evaluated
  type: list
stage:
  description: C(plan).
  returned: always
  type: str
report:
  description: Readable lines - chosen layout and why, stages, memory, the full launch command line, warnings, the
    candidates table.
  returned: success
  type: list
  elements: str
reasons:
  description: Every reason the plan failed.
  returned: failure
  type: list
  elements: str
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.topolaunch.sglang.plugins.module_utils import gateway
from ansible_collections.topolaunch.sglang.plugins.module_utils.launch import LaunchError, installed_record
from ansible_collections.topolaunch.sglang.plugins.module_utils.nccl_topo import written_for
from ansible_collections.topolaunch.sglang.plugins.module_utils.plan_fit import plan_with_fit
from ansible_collections.topolaunch.sglang.plugins.module_utils.planner import PlanError, PlanRequest, candidate_table, render_report
from ansible_collections.topolaunch.sglang.plugins.module_utils.tune import TUNE_OPTIONS, tune_plan
from ansible_collections.topolaunch.sglang.plugins.module_utils.topology import TopologyError, import_nvml, read_topology

ARGUMENT_SPEC = {
    "topology": {"type": "dict"},
    "node_topologies": {"type": "list", "elements": "dict"},
    "model_path": {"type": "str"},
    "model": {"type": "dict"},
    "layout": {"type": "raw", "default": "auto"},
    "sglang_version": {"type": "str", "default": "0.5.9"},
    "server_args": {"type": "dict", "default": {}},
    "host": {"type": "raw", "default": "127.0.0.1"},     # raw: type str made a list "['127.0.0.1']"
    "port": {"type": "raw", "default": 30000},           # raw: type int let true through as 1
    "served_model_name": {"type": "str"},
    "metrics": {"type": "bool", "default": True},
    "api_key_set": {"type": "bool", "default": False},
    "listen_without_api_key": {"type": "bool", "default": False},
    "speculative": {"type": "str", "choices": ["auto", "on", "off"], "default": "off"},
    "speculative_accept_length": {"type": "float"},
    "nnodes": {"type": "int", "default": 1},
    "node_rank": {"type": "int", "default": 0},
    "dist_init_addr": {"type": "str"},
    "allow_cross_node_tp": {"type": "bool", "default": False},
    "node_servers": {"type": "list", "elements": "dict", "options": {"host": {"type": "str", "required": True},
                                                                     "port": {"type": "int", "required": True},
                                                                     "address": {"type": "str"}}},
    "replica_nodes": {"type": "bool", "default": False},
    "gateway_node": {"type": "int", "default": 0},
    "gateway": {"type": "str", "default": "never"},
    "gateway_releases": {"type": "dict", "default": {}},
    "gateway_version": {"type": "str"},
    "gateway_policy": {"type": "str", "default": "cache_aware"},
    "gateway_health_interval": {"type": "int", "default": 10},
    "gateway_args": {"type": "dict", "default": {}},
    "gateway_metrics_port": {"type": "int", "default": 29000},
    "replica_host": {"type": "str", "default": "127.0.0.1"},
    "replica_ports": {"type": "list", "elements": "int", "default": []},
    "measured": {"type": "list", "elements": "dict", "default": []},
    "gpus": {"type": "list", "elements": "int"},
    "pp_layer_partition": {"type": "list", "elements": "int"},
    "workload": {"type": "dict"},
    "fits": {"type": "list", "elements": "dict", "default": []},
    "failures": {"type": "list", "elements": "dict", "default": []},
    "tune_max": {"type": "int", "default": 3},
    "tune_remeasure": {"type": "bool", "default": False},
    "tune_layouts": {"type": "list", "elements": "str", "default": []},
    "tune_backends": {"type": "raw"},
    "backends": {"type": "dict"},
    "sglang_python": {"type": "str"},
    "installed_version_file": {"type": "path"},
    "sysfs_root": {"type": "path", "default": "/sys"},
    "preflight_record": {"type": "path"},
    "nccl_topo_file": {"type": "path"},
    "results_dir": {"type": "path"},
    "save_to": {"type": "path"},
}
GATEWAY_OPTIONS = ("gateway", "gateway_releases", "gateway_version", "gateway_policy", "gateway_health_interval",
                   "gateway_args", "gateway_metrics_port", "replica_host", "replica_ports")
CONTROLLER_ONLY = ("sysfs_root", "results_dir", "save_to")


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = dict(module.params)
    python = p.pop("sglang_python")
    record_file = p.pop("installed_version_file")
    try:
        installed = installed_record(record_file) if record_file else None
    except LaunchError:
        installed = None            # the validate step refuses it, naming the file
    if installed:
        p["sglang_version"] = installed["sglang_version"]
        if isinstance(installed.get("venv"), str) and installed["venv"]:
            python = os.path.join(installed["venv"], "bin", "python")
    facts = {}
    if p["topology"] is None and p["node_topologies"] is None:
        try:
            p["topology"] = facts["gpu_topology"] = read_topology(import_nvml(), p["sysfs_root"])
        except TopologyError as exc:
            module.fail_json(msg="sglang_plan: reading the GPU topology: %s" % exc, stage="plan")
    for key in CONTROLLER_ONLY:
        p.pop(key)
    mine = p["node_topologies"][p["node_rank"]] if p["node_topologies"] and 0 <= p["node_rank"] < len(
        p["node_topologies"]) else p["topology"]
    fingerprint = (mine or {}).get("fingerprint")
    record_path = p.pop("preflight_record")
    if record_path:
        try:
            with open(record_path, encoding="utf-8") as f:
                p["preflight"] = json.load(f)
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            module.fail_json(msg="sglang_plan: preflight_record %s is unreadable: %s (run the preflight stage again: "
                             "ansible-playbook deploy.yml --tags preflight)" % (record_path, exc), stage="plan")
    topo_file = p.pop("nccl_topo_file")
    p["nccl_topo_file"] = topo_file if topo_file and written_for(topo_file, fingerprint) else None
    options = {key: p.pop(key) for key in TUNE_OPTIONS}
    served = {key: p.pop(key) for key in GATEWAY_OPTIONS}
    try:
        gateway.wanted(served["gateway"], 1)       # a bad mode fails before the planner runs
    except gateway.GatewayError as exc:
        module.fail_json(msg="sglang_plan: %s" % exc, stage="plan")
    tuning = p["layout"] == "tune"
    try:
        if tuning:
            result, fit, tune = tune_plan(PlanRequest(**dict(p, layout="auto")), **options)
        else:
            (result, fit), tune = plan_with_fit(PlanRequest(**p)), None
    except PlanError as exc:
        module.fail_json(msg="sglang_plan: %d problem(s): %s" % (len(exc.reasons), " | ".join(exc.reasons)),
                         reasons=exc.reasons, candidates=candidate_table(exc.partial.get("candidates", [])),
                         stage="plan")
    try:
        result = gateway.serve(result, mine, served["gateway"], served["gateway_releases"], served["gateway_version"],
                               served["gateway_policy"], served["gateway_health_interval"], served["replica_ports"],
                               served["replica_host"], served["gateway_args"], served["gateway_metrics_port"])
    except gateway.GatewayError as exc:
        module.fail_json(msg="sglang_plan: %s" % exc, stage="plan")
    report = render_report(result, python)
    candidates = result.pop("candidates")          # beside the plan, not inside it
    extra = {"fit": fit} if fit else {}
    if tune:
        extra["tune"] = tune
        report += tune["report"]
    module.exit_json(changed=False, plan=result, candidates=candidates, report=report, ansible_facts=facts,
                     stage="plan", **extra)


if __name__ == "__main__":
    main()
