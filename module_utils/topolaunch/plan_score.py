"""The planner's heuristic score: estimated decode throughput of a layout, with its terms shown.

Plain Python 3.9+ stdlib. Used only to rank valid layouts when no measured results exist for the model and
topology; measured results always win (see planner.py).

Model of one decode step, per replica (tp*pp GPUs), at B concurrent requests (server_args
max_running_requests, else 256), B/dp per replica:

  per layer and GPU:  max(compute, weights) + allreduce
    compute   = b * 2 * active params per layer / tp / (GPU bf16 dense peak * 0.5)
    weights   = bytes of the layer's weights on this GPU that b tokens touch / HBM bandwidth
                (MoE: an expert is read when at least one of the b tokens routes to it:
                 1 - (1 - top_k/experts)^b of the expert bytes)
    allreduce = 2 per layer (attention out, MLP out), ring: latency(tp) + 2*(tp-1)/tp * b*hidden*2 bytes
                / slowest link of the TP group (plan_topology: NV# 25/link, PIX/PXB 54, PHB/NODE 50,
                SYS 40, no P2P 12 GB/s; latency ~3.4 us per GPU on PCIe)
  PP: SGLang 0.5.9 keeps pp micro-batches in flight (scheduler_pp_mixin: pp_loop_size = pp_size +
      pp_async_batch_depth, default 0), so b = B/pp tokens per micro-batch and every micro-batch streams the
      stage's weights again. The slowest stage sets the pace; the pipeline bubble is counted as
      m / (m + pp - 1) efficiency with m = pp micro-batches; each boundary sends hidden states and residual
      (2 * b * hidden * 2 bytes, 1/tp per TP rank) over the boundary link; pp > 1 turns SGLang's overlap
      schedule off (server_args._handle_pipeline_parallelism), so CPU scheduling (~1 ms + 2 us per request,
      an assumption) is paid per micro-batch step.
  EP > 1 (no all-to-all backend): expert load imbalance adds 10% to MoE compute (an assumption; no EPLB).
  DP: replicas are independent: throughput = dp * replica throughput.

Limits: no prefill (long prompts favour more TP), no attention-score FLOPs or KV reads (long contexts), no
KV-capacity limit on concurrency (PP halves the MLA cache per GPU, which this score ignores), fixed
efficiency 0.5 whatever the kernels and quantization, link speeds by level rather than measured, the
allreduce of a TP group that spans nodes at an assumed 12.5 GB/s. It ranks; it does not predict. The field
case it is calibrated on: GLM-5-NVFP4 on 8 RTX PRO 6000 measured TP8 ahead of TP4+PP2 (compute- and
weight-bound MoE: PP's extra weight streaming and bubbles cost more than the allreduce it saves); the score
agrees. A sweep (playbooks/sweep.yml) measures the layouts, and measured results then decide.
"""
from .plan_topology import allreduce_latency_us

EFFICIENCY = 0.5
DEFAULT_BATCH = 256
EP_IMBALANCE = 0.10
SCHED_MS_PER_STEP = 1.0
SCHED_MS_PER_REQUEST = 0.002
PP_SEND_LATENCY_US = 10.0

# name substring -> (bf16 dense TFLOPS, HBM GB/s); first match wins, so specific names come first.
GPU_PERF = (
    ("GB200", (2500.0, 8000.0)),
    ("B300", (2250.0, 8000.0)),
    ("B200", (2250.0, 8000.0)),
    ("H200", (989.0, 4800.0)),
    ("H100 PCIe", (756.0, 2000.0)),
    ("H100 NVL", (835.0, 3900.0)),
    ("H100", (989.0, 3350.0)),
    ("H800", (989.0, 3350.0)),
    ("H20", (148.0, 4000.0)),
    ("A100", (312.0, 2039.0)),
    ("A800", (312.0, 2039.0)),
    ("RTX PRO 6000", (500.0, 1792.0)),
    ("RTX 6000 Ada", (364.0, 960.0)),
    ("L40S", (362.0, 864.0)),
    ("L40", (181.0, 864.0)),
    ("RTX 5090", (210.0, 1792.0)),
    ("RTX 4090", (165.0, 1008.0)),
    ("A6000", (155.0, 768.0)),
    ("A10", (125.0, 600.0)),
    ("L4", (121.0, 300.0)),
)
DEFAULT_PERF = (300.0, 1500.0)


def gpu_perf(name):
    """(peak bf16 dense FLOP/s, HBM bytes/s, matched table name or None)."""
    for key, (tflops, gbps) in GPU_PERF:
        if key.lower() in str(name).lower():
            return tflops * 1e12, gbps * 1e9, key
    return DEFAULT_PERF[0] * 1e12, DEFAULT_PERF[1] * 1e9, None


def expert_fraction(model):
    """Share of the weight bytes that are routed experts (read only when a token routes there)."""
    p = model["params"]
    if not model["moe"] or not p["expert"]:
        return 0.0
    expert_params = p["moe_layers"] * model["num_experts"] * p["expert"]
    other = p["attention_per_layer"] * model["num_layers"] + p["dense_mlp_per_layer"] * model["dense_layers"] \
        + p["embedding"] + p["moe_layers"] * model["shared_experts"] * p["expert"]
    return min(0.98, expert_params / float(expert_params + other))


def touched(model, tokens):
    """Fraction of routed experts at least one of `tokens` tokens uses."""
    if not model["moe"] or not model["num_experts"]:
        return 1.0
    k = min(model["experts_per_token"] or 1, model["num_experts"])
    return 1.0 - (1.0 - float(k) / model["num_experts"]) ** max(1, tokens)


def estimate(model, layout, stages, replica, perf, batch, overlap=True):
    """Estimated output tokens/s of a layout and the terms behind it.

    stages: per PP stage {layers, weight_bytes_per_gpu (layers only, no embeddings)}.
    replica: {"tp_bandwidth_gbps", "tp_nvlink", "tp_p2p_ok", "tp_inter_node", "boundaries": [gbps, ...]}.
    perf: (flops, hbm bytes/s). batch: concurrent requests over all replicas.
    """
    tp, pp, dp, ep = layout["tp"], layout["pp"], layout["dp"], layout["ep"]
    flops, hbm = perf[0], perf[1]
    h = model["hidden_size"]
    per_replica = max(1, batch // dp)
    micro = pp  # SGLang's pp_loop_size with the default pp_async_batch_depth 0
    b = max(1, -(-per_replica // micro))
    active_layer = model["params"]["active_per_token"] / float(model["num_layers"])
    compute_tok = 2.0 * active_layer / tp / (flops * EFFICIENCY)
    if ep > 1 and model["moe"]:
        compute_tok *= 1.0 + EP_IMBALANCE * expert_fraction(model)
    frac = expert_fraction(model)
    weight_share = (1.0 - frac) + frac * touched(model, b)
    if tp > 1:
        bw = replica["tp_bandwidth_gbps"] * 1e9
        lat = allreduce_latency_us(tp, replica["tp_nvlink"], replica["tp_p2p_ok"], replica["tp_inter_node"]) * 1e-6
        allreduce = 2.0 * (lat + 2.0 * (tp - 1) / tp * b * h * 2 / bw)
    else:
        allreduce = 0.0
    stage_times, terms = [], {"compute_ms": 0.0, "weights_ms": 0.0, "allreduce_ms": 0.0, "pp_send_ms": 0.0,
                              "scheduling_ms": 0.0}
    for k, stage in enumerate(stages):
        layers = stage["layers"]
        w_layer = stage["weight_bytes_per_gpu"] / max(1, layers) * weight_share / hbm
        c_layer = b * compute_tok
        t = layers * (max(c_layer, w_layer) + allreduce)
        send = 0.0
        if k < len(stages) - 1:
            send = PP_SEND_LATENCY_US * 1e-6 + 2.0 * b * h * 2 / tp / (replica["boundaries"][k] * 1e9)
        sched = (SCHED_MS_PER_STEP + SCHED_MS_PER_REQUEST * b) * 1e-3 if (pp > 1 or not overlap) else 0.0
        stage_times.append(t + send + sched)
        terms["compute_ms"] += layers * c_layer * 1e3
        terms["weights_ms"] += layers * w_layer * 1e3
        terms["allreduce_ms"] += layers * allreduce * 1e3
        terms["pp_send_ms"] += send * 1e3
        terms["scheduling_ms"] += sched * 1e3
    bottleneck = max(stage_times)
    efficiency = float(micro) / (micro + pp - 1)
    cycle = micro * bottleneck / efficiency  # time for every micro-batch of the replica to advance one token
    tokens_per_s = dp * per_replica / cycle
    result = {k: round(v, 3) for k, v in terms.items()}
    result.update({
        "tokens_per_s": round(tokens_per_s, 1),
        "batch": per_replica * dp,
        "micro_batch": b,
        "step_ms": round(cycle * 1e3, 3),
        "pp_efficiency": round(efficiency, 3),
    })
    return result
