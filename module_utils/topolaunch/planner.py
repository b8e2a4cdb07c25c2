"""The launch planner: topology + model + wishes -> the exact SGLang launch, and why.

Plain Python 3.9+ stdlib (runs on the target under topolaunch_tools_python). Entry point: `plan(PlanRequest(...))`,
which returns the plan dict of docs/DESIGN.md or raises PlanError with every reason found.

Inputs: the `gpu_topology` facts of each node; the model (config dict + total weight bytes, or a model
directory read by model_config.load_model_dir); the layout (`auto`, a name such as `tp8`, `tp4pp2`,
`tp2pp2ep2`, `tp4dp2`, or a mapping {tp, pp, dp, ep}); the pinned SGLang version; extra server args
(ServerArgs field names, e.g. mem_fraction_static); host, port, served model name; nnodes with one topology
per node; measured results.

Candidates: every (tp, pp, dp, ep) with tp*pp*dp = the GPUs available (all nodes), ep a divisor of tp for MoE
models (1 for dense ones), plus an explicitly asked layout. Each is checked against every rule below and all
failing rules are reported, not just the first:

  gpus        tp*pp*dp GPUs are present (on each node: tp*pp/nnodes)
  heads       num_attention_heads % tp == 0; KV heads: kv % tp == 0 or tp % kv == 0 (SGLang QKVParallelLinear
              splits or replicates KV heads)
  vocab       vocab padded to 64 divisible by tp (VocabParallelEmbedding divide())
  experts     MoE: tp <= routed experts (the model files raise "Tensor parallel size ... greater than the number
              of experts"); ep <= experts and experts % ep == 0; dense models: ep == 1
  ep          tp % ep == 0 (parallel_state: moe_tp_size = tp // ep; model_runner raises otherwise);
              moe_runner_backend flashinfer_cutlass: ep in {1, tp} (server_args._handle_moe_kernel_config);
              cutlass with fp8/mxfp8 quantization: ep == 1; an all-to-all backend (deepep, mooncake, mori,
              ascend_fuseep, flashinfer) forces ep = tp (server_args._handle_a2a_moe), so another ep is refused
              rather than silently changed; flashinfer all-to-all needs moe_runner_backend flashinfer_cutlass
  fp8 blocks  block-quantized MoE: moe_intermediate_size % (tp/ep) == 0 and (moe_intermediate_size/(tp/ep))
              % block_n == 0 (model_runner.check_quantized_moe_compatibility)
  pp          num_hidden_layers >= pp; a given partition has pp entries >= 1 summing to the layers (each layer
              exactly once, as SGLang's get_pp_indices requires); pp > 1 refuses speculative decoding and mixed
              chunked prefill (server_args.check_server_args)
  nodes       (tp*pp) % nnodes == 0; SGLang's node mapping (engine._launch_scheduler_processes) must give every
              pp rank a node: pp % nnodes == 0, or nnodes % pp == 0 and tp % (nnodes/pp) == 0; dp == 1 with
              nnodes > 1 ("multi-node data parallel is not supported unless dp attention"), except replicas on
              several nodes (replica_nodes: the model gateway serves the layout): dp % nnodes == 0, every node
              holds dp/nnodes whole replicas of tp*pp GPUs, and a node whose replicas listen on an address the
              network reaches follows the exposure rule (replica_exposure_problem)
  memory      weights per GPU + KV reserve (4096 tokens) <= usable memory (see below)
  flags       every server arg is a flag of the pinned version with a valid value and choice (plan_args)

Memory, per GPU of the fullest stage: weights = layers of the stage x (total_size - embeddings) /
(layers + MTP layers) + the input embedding (first stage) / output head (last stage), divided by tp
(MTP/nextn layers are in the checkpoint but loaded only for speculative decoding). Usable = (GPU memory -
1 GiB CUDA context) x mem_fraction_static; mem_fraction_static is the server arg, else what SGLang 0.5.9
computes for that GPU (server_args._handle_gpu_memory_settings: reserved = 512 MiB + chunked_prefill_size x
1.5 + cuda_graph_max_bs x 2 + tp*pp/8 GiB, at least 10 GiB on GPUs over 60 GiB, fraction = (memory -
reserved) / memory). KV room = usable - weights; KV tokens = room / bytes per token per GPU
(model_config.kv_bytes_per_token). Activations and CUDA graphs live in the remaining (1 - fraction).

Known combinations (known_combinations.RULES): launches that fail or serve wrong output on the GPUs' architecture
for the model's attention kind, quantization and the SGLang version get the working server args (where the operator
set none) and env, or are refused; the reason names each rule's source.

Placement: plan_topology (islands, TP groups, PP stage order, NCCL settings). Estimate: plan_score (output
tok/s at the request's workload, with its parts; constants in plan_perf, fitted to tests/calibration/).
A preflight record of the node's topology (plan_preflight) gives both this machine's measured links and the
fixes the plan applies (NCCL_P2P_DISABLE=1, disable_custom_all_reduce); an NCCL topology file written for the
topology (nccl_topo) goes into the env as NCCL_TOPO_FILE.

Auto: measured results (records {model, topology_fingerprint, layout, output_throughput, max_concurrency,
input_len, output_len}) for this model and topology fingerprint, taken at a comparable workload (the same
concurrency, input and output lengths within 10%), rank the layouts they cover ahead of every unmeasured one;
without them the model's estimate ranks the valid layouts, and the reason says whether the margin between the
top two is inside the model's error on the calibration set (then: measure, layout: tune; which layouts to measure is
the tune's own rule, tune.select through tune_selection). An explicit layout is
honoured when valid and refused with every reason when not.
"""
import copy
import hashlib
import math
import os
import re

from . import (constants, known_combinations, model_config, numa_bind, plan_nodes, plan_perf, plan_preflight,
               plan_speculative, sglang_facts_0_5_9, sglang_facts_0_5_23, tune_backends)
from .constants import base_version
from .plan_args import FlagIndex, PLANNER_FLAGS, check_server_args, metrics_argv, supported_versions, text_problem
from .plan_score import (MAX_IN_FLIGHT, SATURATING, Links, Shape, check_workload, estimate, estimate_at_slo, gemm_peak,
                         interactivity_curve, measured_slo_misses, stage_time)
from .plan_topology import NodeTopology, nccl_env

GIB = 1 << 30
MIB = 1 << 20
CUDA_CONTEXT_BYTES = 1 * GIB
MIN_KV_TOKENS = 4096
A2A_BACKENDS = ("deepep", "mooncake", "mori", "ascend_fuseep", "flashinfer")
KV_DTYPE_BYTES = {"fp8_e5m2": 1, "fp8_e4m3": 1, "bf16": 2, "bfloat16": 2, "fp4_e2m1": 0.5625}
# Layouts (best first) whose interactivity curve (plan_score.interactivity_curve) the plan gives, besides measured ones
CURVE_LAYOUTS = 4
MEASURE_HINT = "layout: tune or playbooks/sweep.yml measures them on this machine; measured results then decide"

_LAYOUT_PART = re.compile(r"(tp|pp|dp|ep)(\d+)")
# What each supported SGLang version does when the server args leave it to SGLang (memory defaults, CUDA graph
# sizes and their names, the request cap, what PP turns off), extracted from its wheel by tools/sglang_facts.py.
SGLANG_FACTS = {m.VERSION: m for m in (sglang_facts_0_5_9, sglang_facts_0_5_23)}


def sglang_facts(version):
    """The facts table of a version (a local label is ignored: 0.5.9+sim is 0.5.9); KeyError when none."""
    return SGLANG_FACTS[base_version(str(version))]


class PlanError(ValueError):
    """The launch cannot be planned; `reasons` lists every problem, `partial` what was computed."""

    def __init__(self, reasons, partial=None):
        self.reasons = list(reasons)
        self.partial = partial or {}
        super().__init__("; ".join(self.reasons))


# ----------------------------------------------------------------------------------------------------- layouts


def layout_name(tp, pp=1, dp=1, ep=1):
    """tp4pp2, tp2pp2ep2, tp4dp2: tp always, the others when > 1 (order tp, pp, dp, ep)."""
    return "tp%d" % tp + "".join("%s%d" % (k, v) for k, v in (("pp", pp), ("dp", dp), ("ep", ep)) if v > 1)


def parse_layout(value):
    """'auto', a name ('tp4pp2', 'TP4+PP2') or a mapping {tp, pp, dp, ep} -> 'auto' or {tp, pp, dp, ep}."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto")):
        return "auto"
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"tp", "pp", "dp", "ep", "name", "nnodes"}, key=str)
        if unknown:
            raise PlanError(["layout mapping has unknown keys %s (allowed: tp, pp, dp, ep)" % ", ".join(map(str, unknown))])
        out, reasons = {}, []
        for key in ("tp", "pp", "dp", "ep"):
            raw = value.get(key, 1)
            try:
                number = int(raw) if not isinstance(raw, bool) and str(raw).strip().isdigit() else None
            except (TypeError, ValueError):
                number = None
            if number is None or number < 1:
                reasons.append("layout %s must be a positive integer, got %r" % (key, raw))
            out[key] = number
        if reasons:
            raise PlanError(reasons)
        return out
    if not isinstance(value, str):
        raise PlanError(["layout must be 'auto', a name like tp4pp2, or a mapping {tp, pp, dp, ep}; got %r" % (value,)])
    text = re.sub(r"[\s+_\-,x*]", "", value.strip().lower())
    parts = _LAYOUT_PART.findall(text)
    if not parts or "".join(k + v for k, v in parts) != text:
        raise PlanError(["layout %r is not 'auto' or a name made of tpN, ppN, dpN, epN (e.g. tp8, tp4pp2, tp2pp2ep2, "
                         "tp4dp2)" % value])
    out = {"tp": 1, "pp": 1, "dp": 1, "ep": 1}
    seen = set()
    for key, number in parts:
        if key in seen:
            raise PlanError(["layout %r names %s twice" % (value, key)])
        seen.add(key)
        if int(number) < 1:
            raise PlanError(["layout %r: %s must be at least 1" % (value, key)])
        out[key] = int(number)
    return out


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_layouts(total_gpus, moe, nnodes=1, replica_nodes=False):
    """Every (tp, pp, dp, ep) with tp*pp*dp == total_gpus; ep | tp for MoE models; dp == 1 across nodes, unless
    the replicas are served on several nodes (replica_nodes): then also dp % nnodes == 0 (whole replicas on each
    node)."""
    out = []
    for tp in divisors(total_gpus):
        for pp in divisors(total_gpus // tp):
            dp = total_gpus // tp // pp
            if nnodes > 1 and dp > 1 and not (replica_nodes and dp % nnodes == 0):
                continue
            for ep in (divisors(tp) if moe else [1]):
                out.append({"tp": tp, "pp": pp, "dp": dp, "ep": ep})
    return out


def default_partition(layers, pp):
    """SGLang 0.5.9's split (distributed/utils.get_pp_indices): base = n // pp, the last n % pp stages +1."""
    base, rem = divmod(layers, pp)
    return [base + (1 if k >= pp - rem else 0) for k in range(pp)]


# ----------------------------------------------------------------------------------------------------- memory


def capture_sizes(capture, max_bs):
    """A CUDA graph's captured sizes up to max_bs from the table's {explicit, ranges} (a range stop of None runs to
    max_bs)."""
    sizes = list(capture["explicit"])
    for start, stop, step in capture["ranges"]:
        sizes.extend(range(start, stop if stop is not None else max_bs + 1, step))
    sizes = [x for x in sizes if x <= max_bs]
    if capture.get("appends_max_bs") and max_bs not in sizes:
        sizes.append(max_bs)
    return sizes


def sglang_memory_defaults(gpu_bytes, tp, pp, values, facts=None, mla=False):
    """What the SGLang version of `facts` (default 0.5.9) sets when the server args leave them unset
    (MEMORY: its _handle_gpu_memory_settings / handle_gpu_memory_settings), for the cases the planner supports
    (no DP attention; VLM adjustments not modelled): {mem_fraction_static, chunked_prefill_size,
    cuda_graph_max_bs (the decode graph's; 0 without one), decode_graph_sizes and prefill_graph_sizes (the batch
    sizes / token counts each CUDA graph captures at start; [] without that graph)}. Server args that are set win, under the version's
    names (CUDA_GRAPH: cuda_graph_max_bs in 0.5.9, cuda_graph_max_bs_decode in 0.5.23)."""
    facts = facts or sglang_facts_0_5_9
    memory, graph, reserve = facts.MEMORY, facts.CUDA_GRAPH, facts.MEMORY["reserve"]
    gpu_mem = gpu_bytes / float(MIB)  # SGLang reads the device memory in MiB
    row = next(b for b in memory["brackets"] if b["below_mib"] is None or gpu_mem < b["below_mib"])
    chunk, graph_bs = row["chunked_prefill_size"], row["cuda_graph_max_bs"]
    if row["small_tp_below"] is not None and tp < row["small_tp_below"]:
        graph_bs = row["small_tp_cuda_graph_max_bs"]
    chunk = values.get("chunked_prefill_size", chunk)
    if values.get(graph["bs_arg"]):
        graph_bs = max(values[graph["bs_arg"]])
    elif values.get(graph["max_bs_arg"]) is not None:
        graph_bs = values[graph["max_bs_arg"]]
    elif graph["max_bs_capped_by_max_running_requests"] and values.get("max_running_requests"):
        graph_bs = min(graph_bs, values["max_running_requests"])
    decode_off = any(values.get(name) for name in graph["disable_args"]) or \
        (graph["backend_arg"] is not None and values.get(graph["backend_arg"]) == "disabled")
    # the prefill graph (0.5.23: on by default; PP turns it off unless a backend is asked for)
    prefill = graph["prefill"]
    backend = values.get(prefill["backend_arg"]) if prefill["backend_arg"] else None
    if backend is None and pp > 1 and facts.PP["sets"].get(prefill["backend_arg"]) == "disabled":
        backend = "disabled"
    prefill_on = prefill["default_on"] and backend != "disabled" and \
        not any(values.get(name) for name in prefill["disable_args"])
    reserved = float(reserve["base_mib"])
    tokens = chunk if chunk > 0 else values.get("max_prefill_tokens", 16384)
    reserved += max(tokens, reserve["activation_min_tokens"]) * reserve["activation_mib_per_token"]
    if reserve["graph_reserve_when_disabled"] or not decode_off:
        reserved += graph_bs * reserve["graph_mib_per_bs"]
    reserved += tp * pp * reserve["parallel_mib_per_gpu"]
    if prefill_on and chunk > 0:
        if mla:
            reserved += reserve["prefill_graph_mla_mib"]
        else:
            reserved += len(capture_sizes(graph["prefill"]["capture_sizes"], chunk)) * \
                reserve["prefill_graph_mib_per_size"]
    if gpu_mem > reserve["floor_above_mib"]:
        reserved = max(reserved, reserve["floor_mib"])
    algo, spec = values.get("speculative_algorithm"), memory["speculative_reserve_mib"]
    if algo is not None and spec:
        reserved += spec.get(algo, 0 if algo in spec.get("except", []) else spec.get("*", 0))
    given = values.get("mem_fraction_static")
    # a value outside (0, 1) is refused (_arg_reasons): the estimates made beside that reason use SGLang's default
    fraction = given if isinstance(given, (int, float)) and 0.0 < given < 1.0 else \
        round((gpu_mem - reserved) / gpu_mem, 3)
    decode_sizes = [] if decode_off else (list(values[graph["bs_arg"]]) if values.get(graph["bs_arg"])
                                          else capture_sizes(graph["capture_bs"], graph_bs))
    prefill_sizes = capture_sizes(prefill["capture_sizes"], chunk) if prefill_on and chunk > 0 else []
    return {"mem_fraction_static": fraction, "chunked_prefill_size": chunk if chunk > 0 else 8192,
            "cuda_graph_max_bs": 0 if decode_off else graph_bs, "decode_graph_sizes": decode_sizes,
            "prefill_graph_sizes": prefill_sizes}


def sglang_default_mem_fraction(gpu_bytes, tp, pp, values, facts=None, mla=False):
    """mem_fraction_static as the SGLang version of `facts` (default 0.5.9) computes it when unset."""
    return sglang_memory_defaults(gpu_bytes, tp, pp, dict(values, mem_fraction_static=None), facts,
                                  mla)["mem_fraction_static"]


def sglang_max_running_requests(kv_tokens, context_len, values, attn_dp=1, facts=None):
    """SGLang's cap on the running requests of one replica (a --dp-size replica is its own scheduler), as the
    version of `facts` (default 0.5.9; RUNNING: 0.5.23 kv_cache_configurator.resolve_max_num_reqs, 0.5.9
    init_memory_pool and model_runner) computes it per scheduler: the server arg divided by the attention-DP size
    only (a plain --dp-size replica gets the whole value), else the request pool max(min(tokens / context_len x
    512, 4096), 2048); capped at half the scheduler's KV tokens (0.5.9 caps only its own pool so). With attention
    DP (attn_dp > 1) each of the replica's attn_dp schedulers holds kv_tokens / attn_dp tokens and its own cap;
    the replica admits their sum."""
    running = (facts or sglang_facts_0_5_9).RUNNING
    workers = max(1, attn_dp) if running["server_arg_divided_by"] == "attention_dp_size" else 1
    tokens = kv_tokens // workers
    if values.get("max_running_requests"):
        per_worker = max(1, values["max_running_requests"] // workers)
        if not running["server_arg_capped_by_kv_tokens"]:   # 0.5.9: the server arg is not held to tokens / 2
            return workers * per_worker
    else:
        per_worker = max(min(int(tokens / float(context_len or 4096) * running["pool_per_context_len"]),
                             running["pool_max"]), running["pool_min"])
    return workers * max(1, min(per_worker, tokens // running["kv_tokens_divisor"]))


def kv_dtype_bytes(model, values, compute_capability):
    dtype = values.get("kv_cache_dtype", "auto")
    if dtype in KV_DTYPE_BYTES:
        return KV_DTYPE_BYTES[dtype]
    # auto: a ModelOpt checkpoint whose kv_cache_quant_algo is FP8 gets an FP8 cache
    # (model_runner.configure_kv_cache_dtype); DSA models default to fp8_e4m3 on SM >= 10
    # (server_args._set_default_nsa_kv_cache_dtype)
    if model.get("kv_cache_quant") == "FP8":
        return 1
    major = int(str(compute_capability or "0").split(".", maxsplit=1)[0] or 0)
    if model["nsa"] and major >= 10:
        return 1
    return model["dtype_bytes"]


def stage_weights(model, partition):
    """Weight bytes of each PP stage (all its TP ranks together): its dense and MoE layers (dense layers first, as
    first_k_dense_replace puts them), the input embedding on the first stage and the LM head on the last (a tied
    head is the embedding again when the stages differ). `attention` is the attention part of those layers."""
    b = model["bytes"]
    out = []
    for stage in stage_shapes(model, partition):
        layers = stage["dense_layers"] * b["dense_layer"] + stage["moe_layers"] * b["moe_layer"]
        size = layers
        if stage["index"] == 0:
            size += b["embed"]
        if stage["last"]:
            size += b["head"] if (b["head"] or len(partition) == 1) else b["embed"]
        out.append({"layers": stage["layers"], "layer_bytes": layers, "bytes": size,
                    "attention": stage["layers"] * b["attention"]})
    return out


def memory_estimate(model, tp, partition, gpu_bytes, fraction, kv_bytes, attn_dp=1, draft_layers=0):
    """Per GPU of the fullest stage: weights, usable memory, KV room and the KV tokens a replica holds.

    attn_dp > 1 (attention data parallel, SGLang --enable-dp-attention): attention weights are split over only
    tp/attn_dp GPUs (replicated across the attention DP ranks), each rank keeps the KV of its own requests, so
    the replica holds attn_dp times the tokens of one GPU. draft_layers (speculative decoding's MTP layers) add
    their weights (plan_speculative.draft_bytes) and their KV cache to the last stage."""
    stages = stage_weights(model, partition)
    if draft_layers:
        stages[-1] = dict(stages[-1], bytes=stages[-1]["bytes"] + plan_speculative.draft_bytes(model),
                          layers=stages[-1]["layers"] + draft_layers)
    available = gpu_bytes - CUDA_CONTEXT_BYTES
    usable = available * fraction
    attn_tp = max(1, tp // attn_dp)
    per_stage = []
    for stage in stages:
        weights = (stage["bytes"] - stage["attention"]) / tp + stage["attention"] / attn_tp
        cell = model_config.kv_bytes_per_token(model, attn_tp, stage["layers"], kv_bytes)
        room = usable - weights
        per_stage.append({"weights": weights, "room": room, "cell": cell,
                          "tokens": int(room // cell) * attn_dp if room > 0 and cell > 0 else 0})
    worst = min(per_stage, key=lambda s: s["room"] - MIN_KV_TOKENS * s["cell"])
    reserve = MIN_KV_TOKENS * worst["cell"]
    return {
        "weights_per_gpu_bytes": int(max(s["weights"] for s in per_stage)),
        "gpu_memory_bytes": int(gpu_bytes),
        "mem_fraction_static": fraction,
        "usable_bytes": int(usable),
        "kv_room_bytes": int(min(s["room"] for s in per_stage)),
        "kv_reserve_bytes": int(reserve),
        "kv_bytes_per_token": int(max(s["cell"] for s in per_stage)),
        "kv_tokens": min(s["tokens"] for s in per_stage),
        "fits": worst["room"] >= reserve,
    }, stages


# ----------------------------------------------------------------------------------------------------- helpers


def _gb(value):
    return "%.1f GB" % (value / 1e9)


def _fingerprint(nodes):
    """Several nodes: 12 hex digits of sha256 over the nodes' fingerprints in rank order (cluster_fingerprint)."""
    if len(nodes) == 1:
        return nodes[0].fingerprint
    joined = "+".join(n.fingerprint for n in nodes)
    return hashlib.sha256(joined.encode()).hexdigest()[:12]


# SGLang 0.5.9's per-node share (engine._launch_scheduler_processes): (tp per node, pp per node, nodes per pp rank)
_node_mapping = plan_nodes.node_mapping


def _int_input(value, name, reasons, low=None, high=None):
    if isinstance(value, bool):
        reasons.append("%s must be an integer, got %r" % (name, value))
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        reasons.append("%s must be an integer, got %r" % (name, value))
        return None
    if (low is not None and number < low) or (high is not None and number > high):
        reasons.append("%s must be between %s and %s, got %r" % (name, low, high, value))
        return None
    return number


# ----------------------------------------------------------------------------------------------------- rules


def _model_rules(model, c, values, partition, facts, spec_planned=False):
    tp, pp, ep = c["tp"], c["pp"], c["ep"]
    reasons = []
    if model["num_heads"] % tp:
        reasons.append("attention heads %d are not divisible by tp %d" % (model["num_heads"], tp))
    kv = model["num_kv_heads"]
    if not model["mla"] and kv % tp and tp % kv:
        reasons.append("KV heads %d can be neither split nor replicated over tp %d" % (kv, tp))
    padded = -(-model["vocab_size"] // 64) * 64
    if padded % tp:
        reasons.append("vocabulary %d (padded to %d) is not divisible by tp %d" % (model["vocab_size"], padded, tp))
    if model["moe"]:
        experts = model["num_experts"]
        if tp > experts:
            reasons.append("tp %d is greater than the %d routed experts" % (tp, experts))
        if ep > experts or experts % ep:
            reasons.append("%d routed experts cannot be split over ep %d" % (experts, ep))
    elif ep > 1:
        reasons.append("ep %d needs a mixture-of-experts model; this one is dense" % ep)
    if tp % ep:
        reasons.append("ep %d does not divide tp %d (SGLang's MoE TP size is tp / ep)" % (ep, tp))
    runner = values.get("moe_runner_backend", "auto")
    a2a = values.get("moe_a2a_backend", "none")
    quant = values.get("quantization")
    if model["moe"]:
        if runner == "flashinfer_cutlass" and ep not in (1, tp):
            reasons.append("moe_runner_backend flashinfer_cutlass needs ep 1 or ep = tp %d, not %d" % (tp, ep))
        if runner == "cutlass" and quant in ("fp8", "mxfp8") and ep != 1:
            reasons.append("moe_runner_backend cutlass with %s quantization needs ep 1, not %d" % (quant, ep))
        if a2a in A2A_BACKENDS and ep != tp:
            reasons.append("moe_a2a_backend %s makes SGLang set ep = tp %d; ask for ep %d (layout %s)"
                           % (a2a, tp, tp, layout_name(tp, pp, c["dp"], tp)))
        block = model["weight_block_n"]
        width = model["moe_intermediate_size"]
        if block and width and tp % ep == 0:
            moe_tp = tp // ep
            if width % moe_tp or (width // moe_tp) % block:
                reasons.append("FP8 block-quantized experts: moe_intermediate_size %d / (tp/ep = %d) must be a "
                               "multiple of the block size %d" % (width, moe_tp, block))
    if values.get("enable_eplb") and ep <= 1:
        reasons.append("enable_eplb needs ep > 1")
    if model["num_layers"] < pp:
        reasons.append("pp %d is larger than the %d layers" % (pp, model["num_layers"]))
    if partition is not None:
        if len(partition) != pp:
            reasons.append("pp_layer_partition has %d entries for pp %d" % (len(partition), pp))
        elif any(p < 1 for p in partition) or sum(partition) != model["num_layers"]:
            reasons.append("pp_layer_partition %s must give every stage >= 1 layer and sum to %d layers"
                           % (partition, model["num_layers"]))
    if pp > 1:   # what the version refuses with PP in ordinary (not disaggregated) serving: its PP facts
        for name in facts.PP["refuses"]:
            if values.get(name) and name == "speculative_algorithm":
                why = plan_speculative.pp_reason(facts, pp) if spec_planned else None
                if why or not spec_planned:
                    reasons.append(why or "pp > 1 cannot run speculative decoding (%s)" % values[name])
            elif values.get(name) is not None and values.get(name) is not False:
                reasons.append("pp > 1 cannot run %s" % name)
    return reasons


def _global_rules(model, values, facts=None):
    reasons = []
    graph = (facts or sglang_facts_0_5_9).CUDA_GRAPH   # the decode graph's sizes under the version's names
    size = values.get(graph["max_bs_arg"])
    if size is not None and size < 1:
        reasons.append("server_args.%s must be at least 1, got %s" % (graph["max_bs_arg"], size))
    sizes = values.get(graph["bs_arg"])
    if sizes is not None and (not sizes or any(b < 1 for b in sizes)):
        reasons.append("server_args.%s must list batch sizes of at least 1, got %s" % (graph["bs_arg"], sizes))
    if values.get("moe_a2a_backend") == "flashinfer" and values.get("moe_runner_backend", "auto") != "flashinfer_cutlass":
        reasons.append("moe_a2a_backend flashinfer needs moe_runner_backend flashinfer_cutlass")
    runner = values.get("moe_runner_backend", "auto")
    quant = values.get("quantization")
    if runner == "flashinfer_cutlass" and quant not in (None, "modelopt_fp4", "modelopt_fp8"):
        reasons.append("moe_runner_backend flashinfer_cutlass supports quantization modelopt_fp4, modelopt_fp8 or "
                       "none, not %s" % quant)
    if runner == "flashinfer_trtllm" and quant not in (None, "modelopt_fp4", "fp8", "modelopt_fp8",
                                                       "compressed-tensors"):
        reasons.append("moe_runner_backend flashinfer_trtllm does not support quantization %s" % quant)
    fraction = values.get("mem_fraction_static")
    if fraction is not None and not 0.0 < fraction < 1.0:
        reasons.append("server_args.mem_fraction_static must be between 0 and 1, got %s" % fraction)
    running = values.get("max_running_requests")
    if running is not None and running < 1:
        reasons.append("server_args.max_running_requests must be at least 1, got %s" % running)
    return reasons


def _model_warnings(model, values, facts):
    warnings = []
    if not model["moe"] and (values.get("moe_runner_backend", "auto") != "auto"
                             or values.get("moe_a2a_backend", "none") != "none"):
        warnings.append("moe_runner_backend / moe_a2a_backend are set but the model has no experts")
    sparse = [name for name in facts.SPARSE_ATTENTION_BACKENDS if values.get(name)]
    if not model["nsa"] and sparse:
        warnings.append("%s only apply to models with DSA (NSA) sparse attention; this model has none" % " / ".join(sparse))
    return warnings


# ----------------------------------------------------------------------------------------------------- candidates


class _Context:
    """Everything a candidate evaluation reads."""

    def __init__(self, model, nodes, values, nnodes, partition, workload):
        self.model = model
        self.nodes = nodes
        self.values = values
        self.nnodes = nnodes
        self.partition = partition
        self.workload = workload
        self.cross_socket_p2p = False   # proven by a preflight record (plan_preflight); never assumed
        self.preflight = None           # the preflight record applied to the nodes of its topology
        self.p2p_off = False            # its plan_fixes turn P2P off: every link is the host path
        self.fix_env = {}
        self.topo_file = None
        # The efficiency constants of the estimates: plan_perf's, or this machine's fit (plan_fit.py) over them.
        self.eff, self.fit = plan_perf.EFFICIENCY, None
        self.allow_cross_node_tp = False  # several nodes: TP groups spanning nodes only when asked for
        self.known = None                 # known_combinations.apply's result: env, applied rules, reasons
        self.node_servers = None          # several nodes: [{host, port}] per node (default: host and port)
        self.replica_nodes = False        # several nodes: a DP layout may be whole replicas on each node
        self.exposure = (False, False)    # (api_key_set, listen_without_api_key): the exposure rule's inputs
        names = {n.gpus[i]["name"] for n in nodes for i in n.indices} or {"unknown"}
        self.gpu_names = sorted(names)
        first = next((n.gpus[i] for n in nodes for i in n.indices), {})
        self.compute_capability = first.get("compute_capability")
        self.gpu = plan_perf.gpu_perf(self.gpu_names[0], self.compute_capability)
        self.overlap = not values.get("disable_overlap_schedule", False)
        self.sglang = sglang_facts_0_5_9   # the installed version's facts (_prepare sets them)
        self.speculative = None           # plan_speculative's choice: {mode, available, why, ctx (NEXTN's), settings}
        self.spec = None                  # on the NEXTN context: plan_speculative.settings()
        self.kv_bytes = kv_dtype_bytes(model, values, self.compute_capability)
        self.shape = Shape(model, self.kv_bytes)


def stage_shapes(model, partition):
    """Per PP stage: {index, layers, dense_layers, moe_layers, last}; dense layers are the first ones
    (first_k_dense_replace), as in DeepSeek/GLM MoE models."""
    out, first = [], 0
    dense = model["dense_layers"] if model["moe"] else model["num_layers"]
    for k, count in enumerate(partition):
        d = max(0, min(count, dense - first))
        out.append({"index": k, "layers": count, "dense_layers": d, "moe_layers": count - d,
                    "last": k == len(partition) - 1})
        first += count
    return out


def _estimate_tps(candidate):
    """A candidate's estimated tokens/s (0 when it has none)."""
    return (candidate.get("estimate") or {}).get("tokens_per_s") or 0.0


def _measured_tps(measured):
    """A measurement's output throughput, or None without one."""
    return measured["output_throughput"] if measured else None


def evaluate(ctx, c):
    """One candidate: validity with every reason, placement per node, memory, score estimate; where speculative
    decoding is asked for and the checkpoint allows it (ctx.speculative), with it (on) or both ways, keeping the
    faster estimate (auto). `speculative` says {on, estimate_on, estimate_off, reason}."""
    plan = ctx.speculative
    if not plan or not plan["available"] or plan["mode"] == "off":
        return _evaluate(ctx, c)
    on = _evaluate(plan["ctx"], c)
    off = _evaluate(ctx, c) if plan["mode"] == "auto" else None
    figure = _estimate_tps
    keep_on = off is None or (on["valid"] and (not off["valid"] or figure(on) > figure(off)))
    out = on if keep_on else off
    if off is not None and on["valid"]:
        out["_variants"] = {True: on, False: off}   # the tune measures both; a measurement then picks (plan)
    why = None if on["valid"] else "; ".join(on["reasons"])
    out["speculative"] = {
        "on": keep_on and on["valid"], "algorithm": plan_speculative.ALGORITHM,
        "accept_length": plan["settings"]["accept_length"], "accept_length_source": plan["accept_length_source"],
        "estimate_on": figure(on) if on["valid"] else None, "estimate_off": figure(off) if off else None,
        "reason": ("%s: with it %s tok/s, without %s" % ("kept" if keep_on else "left off", figure(on), figure(off))
                   if off is not None and on["valid"] else (why and "not with it: %s" % why) or "on (asked for)")}
    return out


def _evaluate(ctx, c):
    """One candidate as the values of ctx run it: validity with every reason, placement, memory, estimate."""
    tp, pp, dp, ep = c["tp"], c["pp"], c["dp"], c["ep"]
    model, nnodes = ctx.model, ctx.nnodes
    out = {"name": layout_name(tp, pp, dp, ep), "tp": tp, "pp": pp, "dp": dp, "ep": ep, "valid": False,
           "reasons": [], "warnings": [], "score": None, "source": None, "estimate": None}
    reasons = out["reasons"]
    partition = default_partition(model["num_layers"], min(pp, model["num_layers"]))
    if ctx.partition is not None and len(ctx.partition) == pp and all(p >= 1 for p in ctx.partition) \
            and sum(ctx.partition) == model["num_layers"]:
        partition = ctx.partition
    reasons.extend(_model_rules(model, c, ctx.values, ctx.partition, ctx.sglang, ctx.spec is not None))
    if pp > 1 and ep > 1 and ctx.values.get("moe_a2a_backend") == "flashinfer":
        # sglang/srt/layers/moe/token_dispatcher/flashinfer.py builds its Mapping with pp_size=1
        out["warnings"].append("pp > 1 with ep > 1 through the flashinfer all-to-all: its dispatcher is built with "
                               "pp_size=1 (token_dispatcher/flashinfer.py); measure before relying on it")
    # GPUs and nodes
    node_reasons = []
    replicas_across = replicas_across_nodes(ctx, dp)
    if replicas_across:
        # Independent servers behind the gateway, each inside one node: nothing of a replica crosses the network
        if dp % nnodes:
            node_reasons.append("dp %d replicas cannot be spread evenly over %d nodes (whole replicas on each node)"
                                % (dp, nnodes))
        for rank, server in enumerate(ctx.node_servers or []):
            problem = replica_exposure_problem(server.get("address") or server["host"], rank, *ctx.exposure)
            if problem:
                (out["warnings"] if ctx.exposure[1] is True else reasons).append(problem)
        if not node_reasons:
            out["network"] = "%d replica%s on each of %d nodes: only the gateway's hop crosses the network" % (
                dp // nnodes, "" if dp // nnodes == 1 else "s", nnodes)
    elif nnodes > 1:
        if (tp * pp) % nnodes:
            node_reasons.append("tp*pp = %d is not divisible by nnodes %d" % (tp * pp, nnodes))
        if dp > 1:
            node_reasons.append("dp %d across %d nodes: SGLang supports multi-node data parallel only with DP "
                                "attention" % (dp, nnodes))
        if pp >= nnodes and pp % nnodes:
            node_reasons.append("pp %d cannot be spread evenly over %d nodes" % (pp, nnodes))
        if pp < nnodes and (nnodes % pp or tp % (nnodes // pp)):
            node_reasons.append("SGLang would split each pp rank over %d nodes, which needs nnodes %% pp == 0 and "
                                "tp %% (nnodes/pp) == 0" % max(nnodes // pp, 1))
        elif not ctx.allow_cross_node_tp and plan_nodes.cross_node_tp_reason(tp, pp, nnodes):
            reasons.append(plan_nodes.cross_node_tp_reason(tp, pp, nnodes))
        if not node_reasons:
            out["network"] = "; ".join(short for short, _sentence in plan_nodes.crossings(tp, pp, nnodes))
    reasons.extend(node_reasons)
    tp_local, pp_local, nodes_per_pp = _node_mapping(tp, pp, nnodes)
    if nnodes == 1:
        tp_local, groups_local = tp, pp * dp
    elif replicas_across:
        tp_local, groups_local, nodes_per_pp = tp, pp * dp // nnodes, 1
    else:
        groups_local = pp_local
    placements = []
    if not node_reasons:
        for rank, node in enumerate(ctx.nodes):
            need, have = tp_local * groups_local, len(node.indices)
            if need > have:
                where = " on node %d" % rank if nnodes > 1 else ""
                reasons.append("%s needs %d GPUs%s, %d available" % (out["name"], need, where, have))
                placements = []
                break
            placements.append(node.place(tp_local, groups_local))
    # memory (the smallest GPU of the nodes decides)
    used = [(node, g) for node, groups in zip(ctx.nodes, placements) for grp in (groups or []) for g in grp]
    if used:
        gpu_bytes = min(node.memory_total(g) for node, g in used)
        cc = used[0][0].gpus[used[0][1]].get("compute_capability")
    else:
        gpu_bytes = min(node.memory_total(g) for node in ctx.nodes for g in node.indices) if ctx.nodes[0].indices else 0
        cc = None
    if gpu_bytes and model["num_layers"] >= pp:
        defaults = sglang_memory_defaults(gpu_bytes, tp, pp, ctx.values, ctx.sglang, model["mla"])
        fraction = defaults["mem_fraction_static"]
        memory, stages = memory_estimate(model, tp, partition, gpu_bytes, fraction, ctx.kv_bytes,
                                         c.get("attn_dp", 1), ctx.spec["draft_layers"] if ctx.spec else 0)
        memory["mem_fraction_source"] = "server_args" if ctx.values.get("mem_fraction_static") else \
            "sglang_%s_default" % ctx.sglang.VERSION
        out["memory"] = memory
        if not memory["fits"]:
            reasons.append("does not fit: %s of weights per GPU + %s KV reserve (%d tokens) > %s usable (%s GPU x "
                           "mem_fraction_static %s)" % (
                               _gb(memory["weights_per_gpu_bytes"]), _gb(memory["kv_reserve_bytes"]), MIN_KV_TOKENS,
                               _gb(memory["usable_bytes"]), _gb(gpu_bytes), fraction))
    else:
        stages = None
    if placements and all(placements):
        out["placement"] = _placement_facts(ctx, placements, tp, pp, dp, nodes_per_pp)
        out["gpu_indices"] = [g for grp in placements[0] for g in grp]
    out["valid"] = not reasons
    out["partition"] = partition
    # Estimated whenever it fits and has a placement, also when a rule of the pinned SGLang refuses it: the
    # calibration replays layouts that other engines or versions ran (the plan shows estimates of valid ones).
    if stages is not None and out.get("placement") and memory["fits"]:
        out["estimate"] = _estimate(ctx, c, partition, memory, defaults, out["placement"]["links"])
        if pp > 1 and ctx.partition is None and out["valid"]:
            _try_balanced_partition(ctx, c, out, gpu_bytes, defaults)
    return out


def _estimate(ctx, c, partition, memory, defaults, links):
    settings = {
        "cuda_graph_max_bs": defaults["cuda_graph_max_bs"],
        "chunked_prefill_size": defaults["chunked_prefill_size"],
        "max_running_requests": sglang_max_running_requests(memory["kv_tokens"], ctx.model["context_length"],
                                                            ctx.values, c.get("attn_dp", 1), ctx.sglang),
        "overlap": ctx.overlap,
        "kv_bytes": ctx.kv_bytes,
    }
    if ctx.spec:
        settings["speculative"] = ctx.spec
    stages = stage_shapes(ctx.model, partition)
    result = estimate_at_slo(ctx.model, c, stages, links, ctx.gpu, ctx.workload, memory["kv_tokens"], settings,
                             shape=ctx.shape, eff=ctx.eff)
    if ctx.fit:   # what the committed constants say, beside the fitted estimate
        result["unfitted_tokens_per_s"] = estimate(ctx.model, c, stages, links, ctx.gpu, ctx.workload,
                                                   memory["kv_tokens"], settings, shape=ctx.shape,
                                                   concurrency=result["concurrency"])["tokens_per_s"]
    result["inputs"] = {"model": ctx.model, "layout": c, "stages": stages, "links": links, "gpu": ctx.gpu,
                        "workload": ctx.workload, "kv_tokens": memory["kv_tokens"], "settings": settings,
                        "shape": ctx.shape, "eff": ctx.eff}
    return result


def balanced_partition(layer_costs, last_extra, pp):
    """Contiguous split of the layers into pp stages (each >= 1 layer) that minimises the largest stage cost;
    the last stage also carries last_extra (the LM head). Binary search on the bottleneck with a greedy fill from
    the last layer; a fill that needs fewer stages is split further (smaller stages never cost more)."""
    n = len(layer_costs)
    if pp < 1 or n < pp:
        return None

    def fill(limit):
        counts, total = [0], last_extra
        for cost in reversed(layer_costs):
            if counts[-1] and total + cost > limit:
                counts.append(0)
                total = 0.0
            if total + cost > limit:
                return None
            counts[-1] += 1
            total += cost
        return counts[::-1] if len(counts) <= pp else None

    lo, hi = max(layer_costs), sum(layer_costs) + last_extra
    best = fill(hi)
    for _step in range(50):
        mid = (lo + hi) / 2.0
        counts = fill(mid)
        if counts:
            best, hi = counts, mid
        else:
            lo = mid
    while len(best) < pp:                      # split the stage with the most layers
        k = max(range(len(best)), key=lambda i: best[i])
        best[k:k + 1] = [best[k] - best[k] // 2, best[k] // 2]
    even = _even_fill(layer_costs, last_extra, pp)
    return even if max(_stage_costs(even, layer_costs, last_extra)) <= hi * (1 + 1e-9) else best


def _stage_costs(counts, layer_costs, last_extra):
    out, first = [], 0
    for count in counts:
        out.append(sum(layer_costs[first:first + count]))
        first += count
    out[-1] += last_extra
    return out


def _even_fill(layer_costs, last_extra, pp):
    """Front to back, each stage takes layers while that brings it nearer to an equal share of what is left."""
    counts, k, n = [], 0, len(layer_costs)
    for s in range(pp - 1):
        target = (sum(layer_costs[k:]) + last_extra) / float(pp - s)
        taken, count = 0.0, 0
        while n - (k + count) > pp - 1 - s and (
                count == 0 or abs(taken + layer_costs[k + count] - target) < abs(taken - target)):
            taken += layer_costs[k + count]
            count += 1
        counts.append(count)
        k += count
    counts.append(n - k)
    return counts


def _try_balanced_partition(ctx, c, out, gpu_bytes, defaults):
    """SGLang's own split gives every stage the same number of layers; when layers differ in cost (dense and
    MoE layers, the LM head on the last stage) a split balanced by the model's per-layer decode cost can be
    faster. Keep it when it fits and its estimate is higher (the plan then sets SGLANG_PP_LAYER_PARTITION)."""
    model, pp = ctx.model, c["pp"]
    micro = max(1.0, out["estimate"]["batch"] / float(c["dp"] * pp))
    layer = {"index": 0, "layers": 1, "last": False}
    ctx_len = ctx.workload["input_len"] + ctx.workload["output_len"] / 2.0
    peak = gemm_peak(model, ctx.gpu)
    links = out["placement"]["links"]
    costs = {}
    for kind, stage in (("dense", dict(layer, dense_layers=1, moe_layers=0)),
                        ("moe", dict(layer, dense_layers=0, moe_layers=1))):
        costs[kind] = stage_time(ctx.shape, c, stage, micro, ctx_len, links, ctx.gpu, peak, ctx.eff,
                                 defaults["cuda_graph_max_bs"])[0]
    empty_last = {"index": pp - 1, "layers": 0, "dense_layers": 0, "moe_layers": 0, "last": True}
    last_extra = stage_time(ctx.shape, c, empty_last, micro, ctx_len, links, ctx.gpu, peak, ctx.eff,
                            defaults["cuda_graph_max_bs"])[0]
    dense = model["dense_layers"] if model["moe"] else model["num_layers"]
    layer_costs = [costs["dense"] if k < dense else costs["moe"] for k in range(model["num_layers"])]
    split = balanced_partition(layer_costs, last_extra, pp)
    if not split or split == out["partition"]:
        return
    memory = memory_estimate(model, c["tp"], split, gpu_bytes, defaults["mem_fraction_static"], ctx.kv_bytes,
                             c.get("attn_dp", 1))[0]
    if not memory["fits"]:
        return
    memory["mem_fraction_source"] = out["memory"]["mem_fraction_source"]
    est = _estimate(ctx, c, split, memory, defaults, links)
    if est["tokens_per_s"] > out["estimate"]["tokens_per_s"] * 1.005:
        out.update({"partition": split, "memory": memory, "estimate": est})


def _placement_facts(ctx, placements, tp, pp, dp, nodes_per_pp):
    """Groups, boundaries and the links the score uses, over all nodes.

    One node: groups are [replica 0 stage 0, replica 0 stage 1, ..., replica 1 stage 0, ...]. Several nodes:
    each node holds pp_local consecutive stages (of its tp slice); a boundary between stages on different node
    groups crosses the network."""
    groups = [[node.group_facts(g) for g in here] for node, here in zip(ctx.nodes, placements)]
    boundaries = []
    stages_here = pp if ctx.nnodes == 1 else max(pp // ctx.nnodes, 1)
    replicas_here = dp if ctx.nnodes == 1 else 1
    if replicas_across_nodes(ctx, dp):
        stages_here, replicas_here = pp, dp // ctx.nnodes
    for node, here in zip(ctx.nodes, placements):
        boundaries.append([node.boundary_facts(here[d * stages_here + k], here[d * stages_here + k + 1])
                           for d in range(replicas_here) for k in range(stages_here - 1)])
    speeds = []
    for k in range(pp - 1):
        if (k + 1) % stages_here == 0:
            speeds.append((plan_perf.INTER_NODE_GBPS, "net"))  # next stage lives on the next node group
        else:
            node = (k // stages_here) * nodes_per_pp
            facts = boundaries[node][k % stages_here]
            speeds.append((facts["bandwidth_gbps"], "pcie"))
    all_groups = [g for node in groups for g in node]
    tp_bw = min((g["bandwidth_gbps"] for g in all_groups if g["bandwidth_gbps"]), default=None)
    if nodes_per_pp > 1:
        kind, tp_bw = "net", min(tp_bw or plan_perf.INTER_NODE_GBPS, plan_perf.INTER_NODE_GBPS)
    elif all(g["nvlink"] for g in all_groups):
        kind = "nvlink"
    elif ctx.p2p_off or not all(g["p2p_ok"] for g in all_groups):
        kind = "host"
    else:
        kind = "pcie"
    # nccl_env sets NCCL_P2P_LEVEL=SYS for a PCIe TP group that crosses sockets only when a preflight proved it
    p2p_sys = ctx.cross_socket_p2p and kind == "pcie" and any("SYS" in g["levels"] for g in all_groups)
    measured = None
    if kind != "net" and tp > 1:
        # this machine's allreduce (preflight), the slowest TP group deciding; all groups must have figures
        figures = [node.allreduce_figures(g["gpus"], "SYS" if p2p_sys and "SYS" in g["levels"] else "")
                   for node, node_groups in zip(ctx.nodes, groups) for g in node_groups]
        if figures and all(figures):
            measured = (min(f[0] for f in figures), max(f[1] for f in figures))
    return {
        "groups": groups,
        "boundaries": boundaries,
        "links": Links(tp, kind, tp_bw, p2p_sys, speeds, measured),
    }


# ----------------------------------------------------------------------------------------------------- measured


def comparable_workload(record, workload, saturating=None):
    """A measurement counts for a workload when it ran with input and output lengths within 10% (issue: tune), at
    the workload's concurrency; with an SLO at any concurrency up to it (the SLO then judges the measurement);
    with concurrency max at `saturating` requests in flight or more (the layout's saturating concurrency; any with
    an SLO)."""
    def near(a, b):
        return isinstance(a, (int, float)) and not isinstance(a, bool) and abs(a - b) <= 0.1 * b

    conc = record.get("max_concurrency")
    if isinstance(conc, bool) or not isinstance(conc, int) or conc < 1:
        return False
    if workload["concurrency"] == SATURATING:
        at = workload.get("slo") or conc >= (saturating or 1)
    elif workload.get("slo"):
        at = conc <= workload["concurrency"]
    else:
        at = conc == workload["concurrency"]
    return bool(at) and near(record.get("input_len"), workload["input_len"]) \
        and near(record.get("output_len"), workload["output_len"])


def _records_of_machine(records, what, model_names, fingerprints, reasons):
    """[(index, record)] of the records (a list of mappings: measured results, fits) of this model and fingerprint;
    a bad shape is a reason naming `what`."""
    if not records:
        return []
    if not isinstance(records, list):
        reasons.append("%s must be a list of records, got %s" % (what, type(records).__name__))
        return []
    found = []
    for k, rec in enumerate(records):
        if not isinstance(rec, dict):
            reasons.append("%s[%d] must be a mapping, got %r" % (what, k, rec))
        elif rec.get("model") in model_names and rec.get("topology_fingerprint") in fingerprints:
            found.append((k, rec))
    return found


def _measured_by_layout(measured, model_names, fingerprints, workload, reasons, warnings, saturating=None):
    """{layout name: {output_throughput, max_concurrency, simulated}} for this model and fingerprint at a
    comparable workload; measurements of this model and box at other workloads are named in a warning.
    saturating: {layout name: its saturating concurrency} (concurrency max). With an SLO, the fastest measurement
    that met it (slo_met True), else the fastest (slo_met False, slo_misses: how it missed)."""
    best, elsewhere, variants = {}, set(), {}
    slo = workload.get("slo")
    for k, rec in _records_of_machine(measured, "measured", model_names, fingerprints, reasons):
        base, spec = plan_speculative.split_name(rec.get("layout"))
        base, backends = tune_backends.split_variant(base)
        try:
            layout = parse_layout(base)
        except PlanError as exc:
            reasons.append("measured[%d]: %s" % (k, exc))
            continue
        tput = rec.get("output_throughput")
        if isinstance(tput, bool) or not isinstance(tput, (int, float)) or layout == "auto":
            continue
        plain = layout_name(layout["tp"], layout["pp"], layout["dp"], layout["ep"])
        name = plain + spec
        if not comparable_workload(rec, workload, (saturating or {}).get(plain)):
            elsewhere.add("%s at %s/%s concurrency %s" % (name, rec.get("input_len"), rec.get("output_len"),
                                                          rec.get("max_concurrency")))
            continue
        entry = {"output_throughput": float(tput), "max_concurrency": rec.get("max_concurrency"),
                 "simulated": bool(rec.get("simulated"))}
        if backends:
            entry["backends"] = backends
        if slo:
            misses = measured_slo_misses(slo, rec)
            entry.update(slo_met=not misses, slo_misses=misses)
        # every backend variant of a layout measured (tune_backends.py): the layout's figure is its best one's
        variant = tune_backends.variant_name(name, backends)
        seen = variants.setdefault(name, {})
        seen[variant] = max(seen.get(variant, 0.0), round(float(tput), 1))
        old = best.get(name)
        if old is None or (entry.get("slo_met", True), tput) > (old.get("slo_met", True), old["output_throughput"]):
            best[name] = entry
    for name, entry in best.items():
        if len(variants[name]) > 1 or entry.get("backends"):
            entry["variants"] = dict(sorted(variants[name].items()))
    if elsewhere and not best:
        warnings.append("measured results of this model on this topology are at other workloads than %d/%d at "
                        "concurrency %s, so they do not rank the layouts: %s" % (
                            workload["input_len"], workload["output_len"], workload["concurrency"],
                            ", ".join(sorted(elsewhere)[:6]) + (" ..." if len(elsewhere) > 6 else "")))
    return best


def slo_missed(c):
    """Why a valid candidate misses the workload's SLO (measured, or predicted at concurrency 1), or None."""
    if c.get("source") == "measured":
        misses = c["measured"].get("slo_misses")
        return ("measured: " + ", ".join(misses)) if misses else None
    verdict = (c.get("estimate") or {}).get("slo") or {}
    return verdict["reason"] if verdict.get("met") is False else None


def _speculative_measured(candidates, measured):
    """Where a layout was measured with speculative decoding (its records' layout: name + plan_speculative.SUFFIX)
    and/or without it, the faster measured variant is the one planned (a layout evaluated both ways), or the
    measurement of the variant it runs counts (speculative decoding on). `measured` is keyed by plain name after."""
    out = []
    for c in candidates:
        name, spec = c["name"], c.get("speculative") or {}
        on_m, off_m = measured.pop(name + plan_speculative.SUFFIX, None), measured.get(name)
        if c.get("_variants"):
            figure = _measured_tps
            if on_m or off_m:
                keep_on = bool(on_m) and (not off_m or on_m["output_throughput"] > off_m["output_throughput"])
                variant = dict(c["_variants"][keep_on])
                variant["speculative"] = dict(spec, on=keep_on, measured_on=figure(on_m), measured_off=figure(off_m),
                                              reason="measured %s: with it %s tok/s, without %s" % (
                                                  "faster with it" if keep_on else "faster without it",
                                                  figure(on_m), figure(off_m)))
                measured[name] = on_m if keep_on else off_m
                c = variant
        elif spec.get("on"):
            if on_m:
                measured[name] = on_m
            else:
                measured.pop(name, None)   # a measurement without speculative decoding is not of this launch
        out.append(c)
    return out


def rank(candidates, measured):
    """Order candidates: measured valid ones by throughput, then valid ones by the model's estimate, then those
    that miss the workload's SLO (measured, or predicted at concurrency 1) by throughput, then invalid ones."""
    heur = [c["estimate"]["tokens_per_s"] for c in candidates if c["valid"] and c["estimate"]]
    top_heur = max(heur) if heur else None
    top_meas = max((m["output_throughput"] for n, m in measured.items()
                    if any(c["name"] == n and c["valid"] for c in candidates)), default=None)
    for c in candidates:
        if not c["valid"]:
            c["score"], c["source"] = None, None
            continue
        if c["name"] in measured and top_meas:
            c["measured"] = measured[c["name"]]
            c["score"] = round(measured[c["name"]]["output_throughput"] / top_meas, 3)
            c["source"] = "measured"
        elif c["estimate"] and top_heur:
            c["score"] = round(c["estimate"]["tokens_per_s"] / top_heur, 3)
            c["source"] = "model"

    def key(c):
        if not c["valid"]:
            return (3, 0.0, c["name"])
        tput = c["measured"]["output_throughput"] if c["source"] == "measured" else \
            (c["estimate"] or {}).get("tokens_per_s", 0.0)
        if slo_missed(c):
            return (2, -tput, c["name"])
        return (0 if c["source"] == "measured" else 1, -tput, c["name"])

    return sorted(candidates, key=key)


def _machine_fit(fits, model_names, fingerprints, reasons):
    """This model's and topology's fit (plan_fit.py, kept in results/<model>/<fingerprint>/fit.json): the record, or
    None. Its efficiency constants must be plan_perf's names with positive numbers."""
    for k, rec in _records_of_machine(fits, "fits", model_names, fingerprints, reasons):
        eff = rec.get("efficiency")
        bad = ["%s=%r" % (key, v) for key, v in (eff.items() if isinstance(eff, dict) else [("efficiency", eff)])
               if key not in plan_perf.EFFICIENCY or isinstance(v, bool) or not isinstance(v, (int, float))
               or not math.isfinite(v) or v <= 0]
        if bad:
            reasons.append("fits[%d] (%s on %s): efficiency needs plan_perf.EFFICIENCY names with positive numbers, "
                           "got %s" % (k, rec.get("model"), rec.get("topology_fingerprint"), ", ".join(bad)))
            continue
        return rec
    return None


def public_fit(fit):
    """The fit as the plan shows it (what it was made from stays in fit.json)."""
    keys = ("quality", "why", "constants", "efficiency", "points", "ratios", "error_before", "error_after", "basis")
    return {k: fit.get(k) for k in keys if k in fit}


# ----------------------------------------------------------------------------------------------------- plan


class PlanRequest:
    """What the planner is asked: one object instead of a long parameter list (sglang_plan builds it from its
    arguments, tests and perf/plan_speed.py directly). Every field is optional; plan() checks them all.

    topology: this host's gpu_topology facts; node_topologies: one per node in node-rank order (multi-node).
    model: {"config": config.json dict, "total_size": bytes, "name": optional}, or None to read model_path.
    model_path: the model directory on the target (always the launch's --model-path).
    layout: 'auto', a name (tp4pp2) or a mapping {tp, pp, dp, ep}. sglang_version: whose flag table applies.
    server_args: ServerArgs field names to values. host, port, served_model_name: where and as what it serves.
    nnodes, node_rank, dist_init_addr: multi-node. allow_cross_node_tp: let TP groups span nodes (multi-node;
    refused by default). node_servers: [{host, port}] per node in node-rank order, where each node's SGLang listens
    (node 0 the API, the others SGLang's health check server; default host and port on every node), and
    `address`: where that node's replicas listen and the gateway reaches them (replica_nodes; default its host).
    replica_nodes: several nodes may serve a DP layout as whole replicas on each node behind the model gateway
    (gateway.py), ranked by the same replica model as replicas on one node; gateway_node: the node whose host and
    port (node_servers) the gateway listens on.
    measured: measured records (results.measured_records).
    gpus: the GPU indices the plan may use (None = all). pp_layer_partition: layers per PP stage (None = SGLang's
    split, or one balanced by layer cost when the model estimates it faster). workload: {input_len, output_len,
    concurrency} the estimate is made for. preflight: a preflight record (preflight.py) of a node's topology: its
    measured links and its plan_fixes (plan_preflight). nccl_topo_file: the NCCL topology file the preflight stage
    wrote for this host's topology (nccl_topo.written_for), set as NCCL_TOPO_FILE. fits: machine fits
    (plan_fit.py); the one of this model and topology replaces plan_perf's efficiency constants in the estimates.
    metrics: SGLang's Prometheus metrics on (plan_args.metrics_argv: --enable-metrics, and for TP > 1
    --enable-metrics-for-all-schedulers where the release has it). api_key_set: an API key will be enforced
    (topolaunch_api_key is set); listen_without_api_key: the inventory's explicit opt-in to listening on every
    address without one (exposure_problem). speculative: auto | on | off (topolaunch_speculative, plan_speculative),
    speculative_accept_length: the accept length its estimate uses (None: plan_speculative's default).
    model may carry weight_names (the checkpoint's tensor names) for the MTP-weights check; read from model_path
    otherwise.
    """

    FIELDS = {"topology": None, "node_topologies": None, "model": None, "model_path": None, "layout": "auto",
              "sglang_version": "0.5.9", "server_args": None, "host": "127.0.0.1", "port": 30000,
              "served_model_name": None, "nnodes": 1, "node_rank": 0, "dist_init_addr": None, "measured": None,
              "gpus": None, "pp_layer_partition": None, "workload": None, "preflight": None,
              "nccl_topo_file": None, "fits": None, "allow_cross_node_tp": False, "node_servers": None,
              "metrics": True, "api_key_set": False, "listen_without_api_key": False, "backends": None,
              "speculative": "off", "speculative_accept_length": None, "replica_nodes": False, "gateway_node": 0}

    def __init__(self, **fields):
        unknown = sorted(set(fields) - set(self.FIELDS))
        if unknown:
            raise PlanError(["unknown plan request field(s) %s (known: %s)"
                             % (", ".join(unknown), ", ".join(sorted(self.FIELDS)))])
        for name, default in self.FIELDS.items():
            setattr(self, name, fields.get(name, default))


WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]", "*")
LOOPBACK_HOSTS = ("localhost", "::1", "[::1]")


def replicas_across_nodes(ctx, dp):
    """Whether a layout of `dp` replicas is served as whole replicas on each of several nodes (behind the gateway)
    rather than one server across them."""
    return ctx.nnodes > 1 and dp > 1 and ctx.replica_nodes


def replica_exposure_problem(address, rank, api_key_set, allowed):
    """The exposure rule (exposure_problem) for the replicas of node `rank` on several nodes: they listen on
    `address`, where the gateway on another node reaches them, so anyone else on that network does too unless the
    API key (passed to every replica) is set. None for a loopback address or with the key."""
    text = str(address).strip()
    if api_key_set is True or text in LOOPBACK_HOSTS or text.startswith("127."):
        return None
    if allowed is True:
        return ("node %d's replicas listen on %s without an API key: anyone who reaches that address can use them "
                "(topolaunch_listen_without_api_key is true)" % (rank, text))
    return ("node %d's replicas listen on %s (topolaunch_replica_address), where the gateway reaches them, without "
            "an API key: set topolaunch_api_key (ansible-vault), or topolaunch_listen_without_api_key: true to serve "
            "everyone who reaches that address" % (rank, text))


# The unit runs the server as the service user with an empty capability set (no CAP_NET_BIND_SERVICE): it cannot
# bind a port below this.
FIRST_UNPRIVILEGED_PORT = 1024
_HOST_PORT = re.compile(r"^(\[[^\]]*\]|[^:\[\]]*):\d+$")


def host_problem(host, where):
    """Why `host` is not one address the server can listen on (--host), or None: not a string (a list became
    "['127.0.0.1']"), empty, blanks inside, or an address with a port (127.0.0.1:30000, [::1]:30000)."""
    if not isinstance(host, str) or not host.strip():
        return "%s must be one address (a non-empty string), got %r" % (where, host)
    if any(ch.isspace() for ch in host.strip()):
        return "%s %r contains a blank: give one address" % (where, host)
    if _HOST_PORT.match(host.strip()):
        return "%s %r is an address with a port: give the address alone (the port is topolaunch_port)" % (where, host)
    return None


def listen_port(value, where, reasons):
    """The port number the server may listen on, or None with the reason in `reasons` (true is no port: a bool is
    an int in Python; below FIRST_UNPRIVILEGED_PORT the capability-less unit cannot bind)."""
    number = _int_input(value, where, reasons, 1, 65535)
    if number is not None and number < FIRST_UNPRIVILEGED_PORT:
        reasons.append("%s %r is below %d: the unit runs the server as the service user without "
                       "CAP_NET_BIND_SERVICE, which cannot bind it (put a proxy in front for a low port)"
                       % (where, value, FIRST_UNPRIVILEGED_PORT))
        return None
    return number


def exposure_problem(host, api_key_set, allowed):
    """Issue 25 item 2: a server listening on every address (0.0.0.0, ::) with no API key serves anyone who can
    reach the box. The reason (or, with the inventory's opt-in, the warning the plan shows), or None."""
    if not isinstance(host, str) or host.strip() not in WILDCARD_HOSTS or api_key_set is True:
        return None
    if allowed is True:
        return ("host %s listens on every address without an API key: anyone who reaches this box's port can use "
                "the server (topolaunch_listen_without_api_key is true)" % host.strip())
    return ("host %s (topolaunch_host) listens on every address without an API key: set topolaunch_api_key "
            "(ansible-vault), listen on 127.0.0.1 behind a proxy, or set topolaunch_listen_without_api_key: true to "
            "serve everyone who reaches the port" % host.strip())


def plan(request):
    """The launch plan (docs/DESIGN.md "sglang_plan result") for a PlanRequest; PlanError with every reason when
    there is none. A plan that measured results decide (auto) runs the measured winner with the backends it was
    measured with (a tune's backend variant, tune_backends.py), unless the request names backends itself."""
    result = _plan_once(request)
    won = next(((c.get("measured") or {}).get("backends") for c in result["candidates"]
                if c["name"] == result["layout"]["name"]), None)
    if won and result["requested_layout"] == "auto" and result["source"] == "measured" and \
            isinstance(request, PlanRequest) and request.backends in (None, {}):
        result = _plan_once(PlanRequest(**dict(vars(request), backends=dict(won))))
    return result


def _plan_once(request):
    p = _prepare(request)
    ctx, candidates, reasons, wanted = p["ctx"], p["candidates"], p["reasons"], p["wanted"]
    fingerprint = _fingerprint(ctx.nodes)
    model_names = {ctx.model["name"], p["served"],
                   os.path.basename(str(request.model_path).rstrip("/")) if request.model_path else None} - {None}
    # a multi-node run is filed under the cluster fingerprint only: one node's fingerprint names that node alone,
    # whose own measurements (a one-node server) say nothing about the server across nodes
    saturating = {c["name"]: c["estimate"]["concurrency"] for c in candidates if c.get("estimate")}
    measured_best = _measured_by_layout(request.measured, model_names, {fingerprint}, ctx.workload, reasons,
                                        p["warnings"], saturating)
    candidates = _speculative_measured(candidates, measured_best)
    candidates = rank(candidates, measured_best)
    # the interactivity curve of the layouts a tune or a report looks at: the top ones and the measured ones
    top = [c for c in candidates if c["valid"] and c.get("estimate")]
    for c in top[:CURVE_LAYOUTS] + [c for c in top[CURVE_LAYOUTS:] if c.get("measured")]:
        workload_top = ctx.workload["concurrency"] if ctx.workload["concurrency"] != SATURATING else 0
        c["estimate"]["curve"] = interactivity_curve(c["estimate"]["inputs"],
                                                     max(workload_top, c["estimate"]["concurrency"]))
    if ctx.workload.get("slo") and not any(c["valid"] and not slo_missed(c) for c in candidates):
        p["warnings"].append("no valid layout meets the SLO %s; the plan is the fastest of those that miss it"
                             % describe_slo(ctx.workload["slo"]))

    if wanted == "auto":
        chosen = next((c for c in candidates if c["valid"]), None)
        if chosen is None:
            reasons.append(no_valid_layout(p["total"], candidates))
    else:
        name = layout_name(wanted["tp"], wanted["pp"], wanted["dp"], wanted["ep"])
        chosen = next(c for c in candidates if c["name"] == name)
        if not chosen["valid"]:
            reasons.extend("layout %s: %s" % (name, r) for r in chosen["reasons"])
            chosen = None
    if reasons:
        raise PlanError(reasons, {"candidates": [_public(c) for c in candidates], "topology_fingerprint": fingerprint})
    return _result(ctx, chosen, candidates, wanted, p["items"], measured_best, fingerprint, p["warnings"],
                   request.model_path, p["served"], request.host, p["port"], str(request.sglang_version), p["rank"],
                   request.dist_init_addr, ctx.partition, request.gateway_node)


def no_valid_layout(total, candidates):
    """The one-line reason when no candidate is valid: how many were refused for what (each reason's words before
    its figures), the candidates table (candidate_table) saying why each one."""
    kinds = {}
    for c in candidates:
        for r in c["reasons"] or ["refused"]:
            kind = r.split(":")[0].strip()
            kinds[kind] = kinds.get(kind, 0) + 1
    return "no valid layout for %d GPUs: %d candidate(s) refused (%s); the candidates table says why each" % (
        total, len(candidates), ", ".join("%s: %d" % kv for kv in sorted(kinds.items(), key=lambda kv: -kv[1])))


def evaluate_layouts(request, layouts=None):
    """Every candidate layout of a request as the planner evaluates it (validity, placement, memory, estimate and
    the estimate's inputs under `inputs`), before any ranking: what tools/calibration.py replays. `layouts`
    ({tp, pp, dp, ep, attn_dp}) evaluates those instead, attention data parallelism (attn_dp) included, which the
    planner models but does not propose."""
    p = _prepare(request)
    if layouts is None:
        return p["candidates"]
    out = []
    for layout in layouts:
        c = evaluate(p["ctx"], dict(layout))
        if layout.get("attn_dp", 1) > 1:
            c["name"] += "adp%d" % layout["attn_dp"]
        out.append(c)
    return out


def _prepare(request):
    """Check every input of a request (PlanError with every reason) and evaluate every candidate layout."""
    if not isinstance(request, PlanRequest):
        raise PlanError(["plan() takes a PlanRequest, got %s" % type(request).__name__])
    r = request
    topology, model, model_path, layout = r.topology, r.model, r.model_path, r.layout
    sglang_version, server_args, host, port = r.sglang_version, r.server_args, r.host, r.port
    served_model_name, nnodes, node_rank, node_topologies = r.served_model_name, r.nnodes, r.node_rank, r.node_topologies
    dist_init_addr, measured, gpus, pp_layer_partition = r.dist_init_addr, r.measured, r.gpus, r.pp_layer_partition
    workload = r.workload
    reasons, warnings = [], []
    # version and its flags
    index = None
    try:
        index = FlagIndex(str(sglang_version))
    except KeyError:
        reasons.append("sglang_version %s has no flag table (supported: %s); extract one with "
                       "tools/sglang_flags.py --version %s"
                       % (sglang_version, ", ".join(supported_versions()), sglang_version))
    version_facts = None
    if index is not None:
        try:
            version_facts = sglang_facts(index.version)
        except KeyError:
            reasons.append("sglang_version %s has no facts table (supported: %s); extract one with "
                           "tools/sglang_facts.py --all after adding its wheel" % (
                               sglang_version, ", ".join(sorted(SGLANG_FACTS))))
    if index is not None:
        missing = [f for f in PLANNER_FLAGS if not index.has(f)]
        if missing:
            reasons.append("SGLang %s lacks flags the planner writes: %s" % (sglang_version, ", ".join(missing)))
    # model
    if not model_path and not model:
        reasons.append("give model_path (a model directory on the target) or model (config + total_size)")
    facts = None
    try:
        if model:
            if not isinstance(model, dict) or "config" not in model or "total_size" not in model:
                raise model_config.ModelError("model must be a mapping with config (config.json) and total_size")
            name = model.get("name") or (os.path.basename(str(model_path).rstrip("/")) if model_path else None)
            facts = model_config.model_facts(model["config"], model["total_size"], name)
            facts["draft_weights"] = model_config.has_draft_weights(model.get("weight_names") or [],
                                                                    facts["num_layers"])
        elif model_path:
            config, total = model_config.load_model_dir(model_path)
            facts = model_config.model_facts(config, total, os.path.basename(str(model_path).rstrip("/")))
            facts["draft_weights"] = bool(facts["nextn_layers"]) and model_config.has_draft_weights(
                model_config.weight_names(model_path), facts["num_layers"])
    except model_config.ModelError as exc:
        reasons.append("model %s: %s" % (model_path, exc) if model_path and not model else "model: %s" % exc)
    if not model_path:
        reasons.append("model_path is needed: it is the --model-path of the launch")
    # a preflight record: checked here, applied to its nodes below; its fixed server args join the user's
    record, record_reasons = plan_preflight.check_record(r.preflight)
    reasons.extend(record_reasons)
    if r.nccl_topo_file is not None and (not isinstance(r.nccl_topo_file, str) or not r.nccl_topo_file.startswith("/")
                                         or text_problem(r.nccl_topo_file, "nccl_topo_file")):
        reasons.append("nccl_topo_file: %r is not an absolute path" % (r.nccl_topo_file,))
    # server args
    items, values = [], {}
    known = None
    backends = {}
    if index is not None and version_facts is not None and r.backends not in (None, {}):
        # a tune candidate's backends, or the measured winner's (tune_backends.py): they join the operator's args
        backends, backend_reasons, backend_warnings = tune_backends.merge(r.backends, version_facts, index,
                                                                          server_args)
        reasons.extend(backend_reasons)
        warnings.extend(backend_warnings)
        if backends and isinstance(server_args, (dict, type(None))):
            server_args = dict(server_args or {}, **backends)
    if index is not None:
        fixed_args = plan_preflight.server_args_with_fixes(server_args, record, warnings) if record else server_args
        # known combinations of this GPU, model and release: their working values join the args nobody set
        known = known_combinations.apply(facts, _compute_capabilities(r), index, fixed_args, server_args)
        warnings.extend(known["warnings"])
        reasons.extend(known["refusals"])
        fixed_args = known["server_args"]
        items, values, arg_reasons, arg_warnings = check_server_args(fixed_args, index)
        reasons.extend(arg_reasons)
        warnings.extend(arg_warnings)
    # host, port, names
    port_number = listen_port(port, "port (topolaunch_port)", reasons)
    if not isinstance(r.metrics, bool):
        reasons.append("metrics (topolaunch_metrics) must be true or false, got %r" % (r.metrics,))
    problem = host_problem(host, "host (topolaunch_host)")
    if problem:
        reasons.append(problem)
        host = None
    if isinstance(model_path, str) and model_path and not model_path.startswith("/"):
        reasons.append("model_path (topolaunch_model_path) %r is not an absolute path: the unit runs the server "
                       "with no working directory" % model_path)
    exposure = exposure_problem(host, r.api_key_set, r.listen_without_api_key)
    if exposure:
        (warnings if r.listen_without_api_key is True else reasons).append(exposure)
    served = served_model_name or (facts["name"] if facts else None) or \
        (os.path.basename(str(model_path).rstrip("/")) if model_path else None)
    if served is not None and ":" in str(served):
        reasons.append("served_model_name %r contains ':', which SGLang reserves for LoRA adapters" % served)
    for where, text in (("served_model_name", served), ("host", host), ("model_path", model_path),
                        ("dist_init_addr", dist_init_addr)):
        problem = text_problem(text, where) if isinstance(text, str) else None
        if problem:
            reasons.append(problem)
    # nodes
    nnodes_n = _int_input(nnodes, "nnodes", reasons, 1, 1024) or 1
    rank_n = _int_input(node_rank, "node_rank", reasons, 0, max(0, nnodes_n - 1))
    rank_n = rank_n if rank_n is not None else 0
    topologies = list(node_topologies) if node_topologies else ([topology] if topology else [])
    if not topologies:
        reasons.append("give topology (ansible_facts.gpu_topology) or node_topologies (one per node)")
    elif len(topologies) != nnodes_n:
        reasons.append("nnodes is %d but %d node topologies were given" % (nnodes_n, len(topologies)))
    if nnodes_n > 1 and not (isinstance(dist_init_addr, str) and re.match(r"^\[?[\w.:-]+\]?:\d{1,5}$", dist_init_addr)):
        reasons.append("nnodes %d needs dist_init_addr as host:port (node 0's address), got %r" % (nnodes_n, dist_init_addr))
    if len(topologies) > 1 and all(isinstance(t, dict) for t in topologies):
        node_reasons, node_warnings = plan_nodes.check_nodes(topologies)
        reasons.extend(node_reasons)
        warnings.extend(node_warnings)
    node_servers, server_reasons = plan_nodes.check_node_servers(r.node_servers, nnodes_n)
    reasons.extend(server_reasons)
    if not isinstance(r.replica_nodes, bool):
        reasons.append("replica_nodes must be true or false, got %r" % (r.replica_nodes,))
    _int_input(r.gateway_node, "gateway_node", reasons, 0, max(0, nnodes_n - 1))
    allowed = None
    if gpus is not None:
        if not isinstance(gpus, list) or not all(isinstance(g, int) and not isinstance(g, bool) for g in gpus):
            reasons.append("gpus must be a list of GPU indices, got %r" % (gpus,))
        elif len(set(gpus)) != len(gpus):
            reasons.append("gpus %r names GPU %s more than once" % (gpus, sorted({g for g in gpus if gpus.count(g) > 1})))
        else:
            allowed = gpus
    nodes = []
    for k, topo in enumerate(topologies):
        try:
            node = NodeTopology(topo, allowed)
        except (ValueError, KeyError, TypeError) as exc:
            reasons.append("topology of node %d: %s" % (k, exc))
            continue
        if allowed is not None:
            absent = sorted(set(allowed) - set(node.gpus))
            if absent:
                reasons.append("gpus %s are not present on node %d (GPUs %s)" % (absent, k, sorted(node.gpus)))
        nodes.append(node)
    partition = None
    if pp_layer_partition is not None:
        if not isinstance(pp_layer_partition, list) or not all(
                isinstance(p, int) and not isinstance(p, bool) for p in pp_layer_partition):
            reasons.append("pp_layer_partition must be a list of layer counts, got %r" % (pp_layer_partition,))
        else:
            partition = pp_layer_partition
    reasons.extend(plan_speculative.check_inputs(r.speculative, r.speculative_accept_length))
    workload, workload_reasons = check_workload(workload)
    reasons.extend(workload_reasons)
    try:
        wanted = parse_layout(layout)
    except PlanError as exc:
        reasons.extend(exc.reasons)
        wanted = None
    if facts is not None:
        reasons.extend(_global_rules(facts, values, version_facts))
        warnings.extend(_model_warnings(facts, values, version_facts or sglang_facts_0_5_9))
    if facts is None or not nodes or len(nodes) != len(topologies) or len(nodes) != nnodes_n or wanted is None:
        raise PlanError(reasons)

    ctx = _Context(facts, nodes, values, nnodes_n, partition, workload)
    ctx.known = known
    ctx.backends = backends
    ctx.sglang = version_facts or sglang_facts_0_5_9   # an unknown version is refused above
    _use_preflight(ctx, record, r.nccl_topo_file, reasons, warnings)
    ctx.fit = _machine_fit(r.fits, {facts["name"], served, os.path.basename(str(model_path).rstrip("/"))
                                    if model_path else None} - {None},
                           {_fingerprint(nodes)} | {n.fingerprint for n in nodes}, reasons)
    if ctx.fit:
        ctx.eff = dict(plan_perf.EFFICIENCY, **ctx.fit["efficiency"])
    ctx.allow_cross_node_tp = bool(r.allow_cross_node_tp)
    ctx.index = index
    ctx.metrics = r.metrics
    ctx.node_servers = node_servers
    ctx.replica_nodes = r.replica_nodes is True
    ctx.exposure = (r.api_key_set, r.listen_without_api_key)
    _plan_speculative(ctx, r, reasons, warnings)   # last: its NEXTN context copies this one
    total = sum(len(n.indices) for n in nodes) if nnodes_n == 1 else nnodes_n * min(len(n.indices) for n in nodes)
    layouts = enumerate_layouts(total, facts["moe"], nnodes_n, ctx.replica_nodes) if total else []
    if wanted != "auto" and not any(all(l[k] == wanted[k] for k in ("tp", "pp", "dp", "ep")) for l in layouts):
        layouts.append(wanted)
    return {"ctx": ctx, "candidates": [evaluate(ctx, c) for c in layouts], "reasons": reasons, "wanted": wanted,
            "warnings": warnings, "items": items, "served": served, "port": port_number, "rank": rank_n,
            "total": total}


def _plan_speculative(ctx, request, reasons, warnings):
    """ctx.speculative: whether and how the candidates are evaluated with NEXTN (plan_speculative)."""
    mode = request.speculative if request.speculative in plan_speculative.MODES else "off"
    if mode == "off":
        return
    if ctx.values.get("speculative_algorithm") is not None:
        warnings.append("server_args.speculative_algorithm %s is set: topolaunch_speculative %s plans nothing of its "
                        "own" % (ctx.values["speculative_algorithm"], mode))
        return
    available, why = plan_speculative.availability(ctx.model, ctx.sglang)
    if not available:
        (reasons if mode == "on" else warnings).append("speculative decoding (topolaunch_speculative %s): %s"
                                                       % (mode, why))
        return
    spec_ctx = copy.copy(ctx)
    spec_ctx.values = plan_speculative.model_values(ctx.sglang, ctx.values)
    spec_ctx.overlap = True   # spec v2 (0.5.9: the env it gets; 0.5.23 always) keeps the overlap scheduler
    spec_ctx.spec = plan_speculative.settings(ctx.sglang, ctx.model, request.speculative_accept_length)
    spec_ctx.speculative = None
    ctx.speculative = {"mode": mode, "available": True, "why": why, "ctx": spec_ctx, "settings": spec_ctx.spec,
                       "accept_length_source": "topolaunch_speculative_accept_length"
                       if request.speculative_accept_length else "default (plan_speculative.DEFAULT_ACCEPT_LENGTH)"}


def _compute_capabilities(request):
    """The compute capabilities of the GPUs the plan may use, from the request's topology facts (raw: the checked
    NodeTopology comes later; a malformed topology is reported there)."""
    topologies = request.node_topologies or ([request.topology] if request.topology else [])
    gpus = request.gpus
    allowed = [g for g in gpus if isinstance(g, int)] if isinstance(gpus, list) else None
    out = set()
    for topo in topologies if isinstance(topologies, list) else []:
        listed = topo.get("gpus") if isinstance(topo, dict) else None
        for k, gpu in enumerate(listed if isinstance(listed, list) else []):
            if not isinstance(gpu, dict) or not gpu.get("compute_capability"):
                continue
            if allowed is None or gpu.get("index", k) in allowed:
                out.add(str(gpu["compute_capability"]))
    return sorted(out)


def _use_preflight(ctx, record, topo_file, reasons, warnings):
    """Apply a preflight record to the nodes of its topology (their measured links), take its fixes, and refuse a
    record that says the GPUs are not safe to use even with them."""
    ctx.topo_file = topo_file
    if record is None:
        return
    nodes = plan_preflight.applies_to(record, ctx.nodes)
    if not nodes:
        warnings.append("the preflight record is for topology %s, not %s: link figures from tables (a full deploy "
                        "measures this topology)" % (record["fingerprint"], ", ".join(n.fingerprint for n in ctx.nodes)))
        return
    if not record.get("ok", True):
        errors = [f for f in record.get("findings") or [] if isinstance(f, dict) and f.get("severity") == "error"]
        reasons.append("the preflight of %s found GPUs that cannot be used safely, even with P2P off: %s; fix it and "
                       "run the preflight again (ansible-playbook deploy.yml --tags preflight), or plan without it "
                       "(plan_use_preflight: false)" % (record.get("created") or "?", "; ".join(
                           "%s: %s" % (f.get("id"), f.get("message")) for f in errors) or "ok is false"))
        return
    for node in nodes:
        node.use_preflight(record["figures"])
    ctx.preflight = record
    ctx.fix_env = dict((record.get("plan_fixes") or {}).get("env") or {})
    ctx.p2p_off = ctx.fix_env.get("NCCL_P2P_DISABLE") == "1"
    ctx.cross_socket_p2p = bool((record["figures"].get("cross_socket_p2p") or {}).get("proven")) and not ctx.p2p_off


def public_estimate(est):
    """An estimate without the model's inputs (kept for tools/calibration.py only)."""
    return {k: v for k, v in est.items() if k != "inputs"} if est else est


def _public(c):
    """A candidate as the plan shows it (placement internals left out)."""
    out = {k: c[k] for k in ("name", "tp", "pp", "dp", "ep", "valid", "reasons", "score", "source")}
    out["estimate"] = public_estimate(c.get("estimate")) if c["valid"] else None
    if c.get("measured"):
        out["measured"] = c["measured"]
    if c.get("memory"):
        out["weights_per_gpu_bytes"] = c["memory"]["weights_per_gpu_bytes"]
        out["fits"] = c["memory"]["fits"]
    if c.get("gpu_indices"):
        out["cuda_visible_devices"] = ",".join(str(g) for g in c["gpu_indices"])
    if c.get("network"):
        out["network"] = c["network"]
    if c.get("speculative"):
        out["speculative"] = c["speculative"]
    return out


def describe_estimate(est, workload):
    """One line: the estimate and the parts that make it up."""
    parts = ", ".join("%s %.1f" % (label, est.get(key + "_ms", 0.0)) for key, label in (
        ("weights", "weight reads"), ("kv", "KV reads"), ("comm", "communication"), ("compute", "compute"),
        ("overhead", "fixed per-layer"), ("cpu", "scheduler CPU")) if est.get(key + "_ms"))
    limit = "KV room" if est.get("limit") == "kv" else "the concurrency"
    conc = est.get("concurrency") or workload["concurrency"]
    text = "%.0f output tok/s at input %d / output %d / concurrency %s%s (batch %d, limited by %s" % (
        est.get("tokens_per_s", 0), workload["input_len"], workload["output_len"], conc,
        " (max: what every replica admits, at most %d)" % MAX_IN_FLIGHT if workload["concurrency"] == SATURATING
        else "", est.get("batch", 0), limit)
    if est.get("ttft_ms") is not None:
        text += "; predicted TTFT %.0f ms, TPOT %.1f ms" % (est["ttft_ms"], est["tpot_ms"])
    if est.get("slo"):
        text += "; SLO %s: %s" % (describe_slo(workload.get("slo")), est["slo"]["reason"])
    if est.get("pp_bubble"):
        text += "; pipeline bubble %.0f%%" % (est["pp_bubble"] * 100)
    return text + "; decode step %.1f ms: %s; prefill %.1f ms per request)" % (
        est.get("step_ms", 0), parts or "-", est.get("prefill_ms_per_request", 0))


def describe_slo(slo):
    """'p99 TTFT <= 500 ms, p50 TPOT <= 50 ms'."""
    return ", ".join("p%d %s <= %g ms" % (slo[kind + "_percentile"], kind.upper(), slo[kind + "_ms"])
                     for kind in ("ttft", "tpot") if (slo or {}).get(kind + "_ms") is not None)


def tune_selection(candidates, max_count=3):
    """What a tune of these candidates would measure: tune.select, the one rule for "could win" that the plan's
    advice and the tune share (tune imports this module, hence the late import)."""
    from .tune import select  # pylint: disable=import-outside-toplevel,cyclic-import
    return select(candidates, max_count)


def margin_note(first, second, candidates):
    """How far the top estimate is ahead of the runner-up, and what a tune would measure (tune_selection, the
    tune's own rule): the layouts that could win, and why the runner-up is not one of them when it is not."""
    a, b = first["estimate"]["tokens_per_s"], second["estimate"]["tokens_per_s"]
    if a <= 0 or b <= 0:
        return ""
    selection = tune_selection(candidates)
    row = next((r for r in selection["rows"] if r["name"] == second["name"]), {})
    why = "" if second["name"] in selection["chosen"] else ", %s%s" % (
        row.get("status") or "cannot win", ": " + row["note"] if row.get("note") else "")
    text = "runner-up %s estimated %.0f tok/s (%.0f%% lower%s); " % (second["name"], b, (1 - b / a) * 100, why)
    error = (math.exp(plan_perf.MODEL_ERROR) - 1) * 100
    if len(selection["chosen"]) > 1:
        return text + "the layouts that could win, inside the model's error on the calibration set (%.0f%%): %s: " \
            "measure them (%s)" % (error, ", ".join(selection["chosen"]), MEASURE_HINT)
    return text + "no other layout could win, given the model's error on the calibration set (%.0f%%)" % error


def _reason(chosen, candidates, wanted, measured_best, fingerprint, model_name, workload):
    valid = [c for c in candidates if c["valid"]]
    est = chosen.get("estimate") or {}
    others = [c for c in valid if c is not chosen]
    runner = others[0] if others else None
    if chosen["source"] == "measured":
        m = chosen["measured"]
        text = "%s has the best measured output throughput for %s on topology %s: %.0f tok/s at concurrency %s" % (
            chosen["name"], model_name, fingerprint, m["output_throughput"], m["max_concurrency"])
        if runner and runner.get("measured"):
            text += " (%s: %.0f tok/s)" % (runner["name"], runner["measured"]["output_throughput"])
        unmeasured = tune_selection(candidates)["measure"]    # could win, not measured: the tune's rule
        if unmeasured:
            text += "; could win, not measured yet: %s (%s)" % (", ".join(unmeasured), MEASURE_HINT)
        if m.get("simulated"):
            text += "; note: these measurements come from the lab simulator"
        return ("measured results decide: " if wanted == "auto" else "") + text + "."
    position = valid.index(chosen) + 1
    if wanted == "auto":
        text = "%s ranks first of %d valid layouts by the performance model: %s" % (
            chosen["name"], len(valid), describe_estimate(est, workload))
        if runner and runner.get("estimate") and est.get("tokens_per_s"):
            text += "; " + margin_note(chosen, runner, candidates)
    else:
        text = "layout %s was asked for and is valid; the performance model ranks it %d of %d valid layouts: %s" % (
            chosen["name"], position, len(valid), describe_estimate(est, workload))
        if position > 1:
            text += "; %s is estimated first at %.0f tok/s" % (valid[0]["name"], valid[0]["estimate"]["tokens_per_s"])
    text += ". An estimate, not a measurement: no measured results for %s on topology %s." % (model_name, fingerprint)
    return text


def numa_argv(node, order, values):
    """--numa-node with one NUMA node per GPU in CUDA_VISIBLE_DEVICES order (SGLang binds scheduler i to entry i:
    managers/scheduler.py numa_bind_to_node(numa_node[gpu_id])), from NVML's NUMA facts. Inside a VM sysfs often
    reads -1, so SGLang finds nothing itself. Left out when a GPU's node is unknown or server_args set it."""
    if values.get("numa_node") is not None:
        return []
    nodes = [node.numa(g) for g in order]
    if not nodes or any(n is None for n in nodes) or len(set(nodes)) < 2:
        return []
    return ["--numa-node"] + [str(n) for n in nodes]


def _result(ctx, chosen, candidates, wanted, items, measured_best, fingerprint, warnings, model_path, served,
            host, port, version, node_rank, dist_init_addr, partition, gateway_node=0):
    model = ctx.model
    tp, pp, dp, ep = chosen["tp"], chosen["pp"], chosen["dp"], chosen["ep"]
    nnodes = ctx.nnodes
    split = chosen["partition"]
    default_split = default_partition(model["num_layers"], pp)
    placement = chosen["placement"]
    # per-node GPU order: dp replicas x stages x TP groups, as SGLang maps ranks to devices
    per_node_order = [[g for grp in grp_facts for g in grp["gpus"]] for grp_facts in placement["groups"]]
    all_groups = [grp for node in placement["groups"] for grp in node]
    all_bounds = [b for node in placement["boundaries"] for b in node]
    in_vm = any(node.facts.get("in_vm")
                or any(g.get("virtualization_mode") in ("passthrough", "vgpu") for g in node.facts["gpus"])
                for node in ctx.nodes)
    numa_known = all(node.numa(i) is not None for node in ctx.nodes for i in node.indices)
    nccl, nccl_notes = nccl_env(all_groups, all_bounds, in_vm, numa_known, ctx.cross_socket_p2p, ctx.topo_file)
    if ctx.fix_env:
        nccl.update(ctx.fix_env)
        nccl_notes.append("%s and --disable-custom-all-reduce: the preflight of %s measured P2P misbehaving on this "
                          "topology and these settings working (its plan_fixes; its findings say how to fix P2P)" % (
                              " ".join("%s=%s" % kv for kv in sorted(ctx.fix_env.items())),
                              ctx.preflight.get("created") or "?"))
    warnings = list(warnings) + nccl_notes + chosen.get("warnings", [])
    warnings.extend(_placement_warnings(ctx, chosen, placement))
    across = replicas_across_nodes(ctx, dp)
    if not across:
        warnings.extend("across nodes: " + sentence for _short, sentence in plan_nodes.crossings(tp, pp, nnodes))
    servers = ctx.node_servers or [{"host": host, "port": port}] * nnodes
    gateway_node = int(gateway_node or 0)

    base_argv = ["--model-path", str(model_path), "--served-model-name", str(served), "--host", str(host),
                 "--port", str(port), "--tp-size", str(tp), "--pp-size", str(pp)]
    if dp > 1:
        base_argv += ["--dp-size", str(dp)]
    if ep > 1:
        base_argv += ["--ep-size", str(ep)]
    base_argv += metrics_argv(ctx.index, ctx.metrics, tp)
    for _arg, words in items:
        base_argv.extend(words)
    speculative = chosen.get("speculative") or {}
    spec_env = {}
    if speculative.get("on"):
        for _arg, words in check_server_args(plan_speculative.server_args(ctx.sglang), ctx.index)[0]:
            base_argv.extend(words)
        spec_env = plan_speculative.env(ctx.sglang, pp)

    def node_env(order):
        env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in order)}
        if split != default_split:
            env["SGLANG_PP_LAYER_PARTITION"] = ",".join(str(n) for n in split)
        env.update(nccl)
        env.update((ctx.known or {}).get("env") or {})
        env.update(spec_env)
        return env

    def node_argv(rank, order):
        argv = list(base_argv)
        argv[argv.index("--host") + 1] = str(servers[rank]["host"])
        argv[argv.index("--port") + 1] = str(servers[rank]["port"])
        if nnodes > 1 and not across:
            argv += ["--nnodes", str(nnodes), "--node-rank", str(rank), "--dist-init-addr", str(dist_init_addr)]
        return argv + numa_argv(ctx.nodes[rank], order, ctx.values)

    per_node = [{"node_rank": r, "argv": node_argv(r, order), "env": node_env(order), "gpu_indices": order,
                 "cuda_visible_devices": ",".join(str(g) for g in order),
                 "topology_fingerprint": ctx.nodes[r].fingerprint, "host": servers[r]["host"],
                 "port": servers[r]["port"], "processes": plan_nodes.scheduler_titles(tp, pp, ep, nnodes, r)}
                for r, order in enumerate(per_node_order)]
    numa_facts = getattr(sglang_facts(version), "NUMA", None)
    for entry in per_node:      # --numa-node: a failed bind fatal where the release has the switch (numa_bind)
        record, numa_env = numa_bind.plan_record(entry["argv"], ctx.nodes[entry["node_rank"]].gpus.values(),
                                                 numa_facts)
        if record:
            entry["numa_bind"] = record
            entry["env"].update(numa_env)
    mine = per_node[node_rank]
    if across:
        # whole replicas on each node behind the gateway (gateway.serve splits them): the gateway listens on its
        # node's host and port, each replica at its node's address
        mine = dict(mine, host=servers[gateway_node]["host"], port=servers[gateway_node]["port"])
        mine["argv"] = list(mine["argv"])
        mine["argv"][mine["argv"].index("--host") + 1] = str(mine["host"])
        mine["argv"][mine["argv"].index("--port") + 1] = str(mine["port"])
    if ctx.topo_file:
        mine["env"]["NCCL_TOPO_FILE"] = ctx.topo_file      # written on this host for its topology
    # stage -> layers -> GPUs
    tp_local, pp_local, nodes_per_pp = _node_mapping(tp, pp, nnodes)
    stages, first = [], 0
    for k, count in enumerate(split):
        entry = {"stage": k, "first_layer": first, "last_layer": first + count - 1, "layers": count}
        if nnodes == 1 or across:
            groups = placement["groups"][node_rank]
            entry["gpus"] = [g for d in range(len(groups) // pp) for g in groups[d * pp + k]["gpus"]]
        else:
            ranks = [r for r in range(nnodes) if pp_local * (r // nodes_per_pp) <= k < pp_local * (r // nodes_per_pp + 1)]
            entry["node_ranks"] = ranks
            local = k - pp_local * (node_rank // nodes_per_pp)
            entry["gpus"] = placement["groups"][node_rank][local]["gpus"] if node_rank in ranks else []
        stages.append(entry)
        first += count
    result = {
        "layout": {"tp": tp, "pp": pp, "dp": dp, "ep": ep, "nnodes": 1 if across else nnodes,
                   "name": chosen["name"] + (plan_speculative.SUFFIX if speculative.get("on") else "")},
        "gpu_indices": mine["gpu_indices"],
        "cuda_visible_devices": mine["cuda_visible_devices"],
        "env": mine["env"],
        "argv": mine["argv"],
        "host": mine["host"],
        "port": mine["port"],
        "model_path": str(model_path),
        "served_model_name": str(served),
        "sglang_version": version,
        "pp_layer_partition": stages,
        "memory": dict(chosen["memory"]),
        "candidates": [_public(c) for c in candidates],
        "reason": " ".join(filter(None, [
            _reason(chosen, candidates, wanted, measured_best, fingerprint, model["name"], ctx.workload),
            plan_preflight.describe(ctx.preflight, ctx.preflight is not None)]
            + list((ctx.known or {}).get("reasons") or []) + _speculative_reason(ctx, speculative, spec_env))),
        "speculative": dict(speculative, env=spec_env) if speculative else {"on": False},
        "known_combinations": list((ctx.known or {}).get("applied") or []),
        "link_figures": {"source": "preflight" if ctx.preflight else "tables",
                         "created": (ctx.preflight or {}).get("created"),
                         "cross_socket_p2p": ctx.cross_socket_p2p},
        "workload": dict(ctx.workload),
        # the requests in flight the chosen layout is planned (and benchmarked) at: the workload's concurrency, what
        # every replica admits (concurrency max) or the highest that meets the SLO
        "concurrency": (chosen.get("measured") or {}).get("max_concurrency") or
        (chosen.get("estimate") or {}).get("concurrency") or ctx.workload["concurrency"],
        "warnings": warnings,
        "topology_fingerprint": ctx.nodes[node_rank].fingerprint,
        "model_name": model["name"],
        "requested_layout": "auto" if wanted == "auto" else layout_name(
            wanted["tp"], wanted["pp"], wanted["dp"], wanted["ep"]),
        "source": chosen["source"],
        "estimate": public_estimate(chosen.get("estimate")),
        "tp_groups": [g["gpus"] for g in placement["groups"][node_rank]],
        "node_rank": node_rank,
    }
    if mine.get("numa_bind"):
        result["numa_bind"] = mine["numa_bind"]
    if ctx.fit:
        result["fit"] = public_fit(ctx.fit)
    if ctx.backends:
        # the backends this plan runs with besides the release's defaults: a tune's candidate, or the winner's
        result["backends"] = dict(ctx.backends)
        result["layout"]["variant"] = tune_backends.variant_name(chosen["name"], ctx.backends)
        result["reason"] += " Backends: %s (%s)." % (", ".join("--%s %s" % (k.replace("_", "-"), v) for k, v in sorted(
            ctx.backends.items())), "measured fastest with them" if chosen.get("source") == "measured" and (
                chosen.get("measured") or {}).get("backends") == ctx.backends else "a tune's backend candidate")
    if across:
        # which node holds which replicas: gateway.serve makes replica r * (dp / nnodes) + j of node r's group j
        result["layout"]["replica_nodes"] = nnodes
        result["replica_nodes"] = [
            {"node_rank": r, "address": str(servers[r].get("address") or servers[r]["host"]),
             "gpu_indices": node["gpu_indices"], "tp_groups": [g["gpus"] for g in placement["groups"][r]],
             "numa_nodes": numa_bind.planned_nodes(node["argv"]) or None, "topology_fingerprint": node["topology_fingerprint"]}
            for r, node in enumerate(per_node)]
        result["gateway_node"] = gateway_node
        result["cluster_fingerprint"] = fingerprint
    elif nnodes > 1:
        result["per_node"] = per_node
        result["cluster_fingerprint"] = fingerprint
        result["dist_init_addr"] = str(dist_init_addr)
    return result


def _speculative_reason(ctx, speculative, spec_env):
    """The plan's sentence on speculative decoding (none when it was not asked for)."""
    plan = ctx.speculative
    if not speculative:
        return []
    if not speculative.get("on"):
        return ["Speculative decoding (topolaunch_speculative %s) is off: %s." % (plan["mode"], speculative["reason"])]
    steps, topk, draft = ctx.sglang.SPECULATIVE["default_params"]
    return ["Speculative decoding NEXTN (%s; %s) with SGLang %s's defaults num_steps %d, eagle_topk %d, "
            "num_draft_tokens %d, accept length %.2f (%s)%s; SGLang caps max_running_requests at %d where unset." % (
                plan["why"], speculative["reason"], ctx.sglang.VERSION, steps, topk, draft,
                speculative["accept_length"], speculative["accept_length_source"],
                ", env %s" % " ".join("%s=%s" % kv for kv in sorted(spec_env.items())) if spec_env else "",
                ctx.sglang.SPECULATIVE["max_running_requests"])]


def _placement_warnings(ctx, chosen, placement):
    warnings = []
    for rank, (node, groups) in enumerate(zip(ctx.nodes, placement["groups"])):
        where = "" if ctx.nnodes == 1 else " on node %d" % rank
        for g in groups:
            numa = [n for n in g["numa_nodes"] if n is not None]
            if len(numa) > 1:
                warnings.append("TP group %s%s spans NUMA nodes %s: its 2 allreduces per layer cross the socket "
                                "interconnect" % (g["gpus"], where, ",".join(map(str, numa))))
        used = {i for g in groups for i in g["gpus"]}
        idle = [i for i in node.indices if i not in used]
        if idle:
            warnings.append("GPUs %s%s stay idle with layout %s" % (idle, where, chosen["name"]))
        held = ["GPU %d: %s" % (i, ", ".join(str(p.get("pid")) for p in node.gpus[i].get("processes") or []))
                for i in sorted(used) if node.gpus[i].get("processes")]
        if held:                                        # one line: often the running server, one pid per GPU
            warnings.append("%s%s %s processes (%s): the cleanup stage stops them before a launch (the running "
                            "server's, when the plan replaces it)" % (
                                "GPUs" if len(held) > 1 else held[0].split(":")[0], where,
                                "hold" if len(held) > 1 else "holds", "; ".join(held)))
    for rank, node in enumerate(ctx.nodes):
        by_bus = sorted(node.gpus, key=lambda i: str(node.gpus[i].get("pci_bus_id", "")).lower())
        if by_bus != sorted(node.gpus):
            warnings.append("NVML index order %s differs from PCI bus order%s: with CUDA_DEVICE_ORDER=PCI_BUS_ID, "
                            "CUDA device numbers follow the bus order, so CUDA_VISIBLE_DEVICES would name other GPUs "
                            "than planned; check nvidia-smi -q | grep 'Bus Id'" % (
                                by_bus, "" if ctx.nnodes == 1 else " on node %d" % rank))
    names = ctx.gpu_names
    if len(names) > 1:
        warnings.append("mixed GPU models %s: the smallest memory and the first model's speed are used" % names)
    memory = chosen["memory"]
    if ctx.values.get("max_running_requests") and memory["kv_tokens"] < ctx.values["max_running_requests"] * 256:
        warnings.append("KV cache holds about %d tokens per GPU set: max_running_requests %d leaves ~%d tokens "
                        "per request" % (memory["kv_tokens"], ctx.values["max_running_requests"],
                                         memory["kv_tokens"] // ctx.values["max_running_requests"]))
    return warnings


# ----------------------------------------------------------------------------------------------------- report


def _shell_word(word):
    text = str(word)
    if re.match(r"^[A-Za-z0-9_@%+=:,./-]+$", text):
        return text
    return "'" + text.replace("'", "'\"'\"'") + "'"


def sglang_python(version):
    """The SGLang venv's python on the target (docs/DESIGN.md: /opt/sglang/venvs/<version>)."""
    return constants.sglang_python(version)


def command_line(env, argv, python):
    """The launch as one shell line: env, then <venv python> -m sglang.launch_server <argv>."""
    assigns = " ".join("%s=%s" % (k, _shell_word(v)) for k, v in sorted(env.items()))
    words = [python, "-m", "sglang.launch_server"] + list(argv)
    return (assigns + " " if assigns else "") + " ".join(_shell_word(w) for w in words)


def candidate_table(candidates):
    """Readable lines: one per candidate, valid ones first in rank order."""
    lines = ["%-14s %-5s %-6s %-9s %9s %11s  %s"
             % ("layout", "valid", "score", "source", "est tok/s", "weights/GPU", "GPUs / reasons")]
    for c in candidates:
        est = c.get("estimate") or {}
        weights = c.get("weights_per_gpu_bytes")
        tail = c.get("cuda_visible_devices", "") if c["valid"] else "; ".join(c["reasons"])
        if c.get("measured"):
            tail = "measured %.0f tok/s at concurrency %s; GPUs %s" % (
                c["measured"]["output_throughput"], c["measured"]["max_concurrency"], c.get("cuda_visible_devices", ""))
        if c["valid"] and c.get("network"):
            tail += "; network: " + c["network"]
        lines.append("%-14s %-5s %-6s %-9s %9s %11s  %s" % (
            c["name"], "yes" if c["valid"] else "no", "%.3f" % c["score"] if c["score"] is not None else "-",
            c["source"] or "-", "%.0f" % est["tokens_per_s"] if est.get("tokens_per_s") else "-",
            _gb(weights) if weights else "-", tail))
    return lines


def render_report(result, python=None):
    """What the plan stage prints: the chosen launch (env + command line), why, warnings, the candidates."""
    how = ("%s, %s" % (result["requested_layout"], result["source"]) if result["requested_layout"] in ("auto", "tune")
           else "asked for")
    lines = ["layout %s (%s): %s" % (result["layout"]["name"], how, result["reason"]),
             "GPUs in CUDA_VISIBLE_DEVICES order: %s" % result["cuda_visible_devices"]]
    for stage in result["pp_layer_partition"]:
        lines.append("  stage %d: layers %d-%d on GPUs %s"
                     % (stage["stage"], stage["first_layer"], stage["last_layer"], stage.get("gpus")))
    mem = result["memory"]
    lines.append("memory per GPU: weights %s, usable %s (mem_fraction_static %s, %s), KV room %s (~%d tokens), "
                 "fits: %s" % (_gb(mem["weights_per_gpu_bytes"]), _gb(mem["usable_bytes"]), mem["mem_fraction_static"],
                               mem["mem_fraction_source"], _gb(mem["kv_room_bytes"]), mem["kv_tokens"],
                               "yes" if mem["fits"] else "no"))
    python = python or sglang_python(result["sglang_version"])
    nodes = result.get("per_node") or [{"node_rank": 0, "env": result["env"], "argv": result["argv"]}]
    for node in nodes:
        prefix = "launch: " if len(nodes) == 1 else "launch on node %d: " % node["node_rank"]
        lines.append(prefix + command_line(node["env"], node["argv"], python))
    lines.extend("warning: " + w for w in result["warnings"])
    lines.append("candidates:")
    lines.extend("  " + line for line in candidate_table(result["candidates"]))
    return lines
