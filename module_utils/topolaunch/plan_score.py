"""The planner's performance model: output tokens/s of a layout at a workload, with the parts that make it up.

Plain Python 3.9+ stdlib. Every constant comes from plan_perf.py (datasheets, measurements, fitted
efficiencies). Measured results on the machine always rank ahead of this estimate (planner.py).

The workload is what a benchmark client does: `concurrency` requests in flight, each `input_len` prompt tokens
and `output_len` generated tokens. The model follows one replica (tp*pp GPUs; dp replicas are independent SGLang
servers behind one router, each gets concurrency/dp requests) through SGLang's steady state:

Batch. The running batch b is the concurrency, capped by what the KV cache holds: a request occupies on average
input_len + output_len/2 tokens while it decodes, and the replica's KV room (planner.memory_estimate: weights
per GPU, SGLang's mem_fraction_static, per-stage layers, MLA caches replicated per TP rank, GQA heads split)
holds kv_tokens; b = min(concurrency/dp, kv_tokens / (input + output/2), max_running_requests).

Decode. One forward pass of a stage over a micro-batch of m tokens costs, per layer, on one GPU:
  - GEMMs (attention projections, dense MLP or shared experts, routed experts), each as a roofline
    max(FLOPs / (tensor peak x gemm efficiency x tile occupancy), weight bytes read / (memory bandwidth x memory
    efficiency)). The tensor peak is the checkpoint's precision where the GPU has it (FP8 / FP4), else bf16.
    Routed experts: only the experts some token of the micro-batch routes to are read
    (1 - (1 - top_k/experts)^m of them) in one grouped kernel for gate+up and one for down, as fused MoE runs them;
    tile occupancy = output tiles of 64 rows x 128 columns / SMs (capped at 1), which is where thin shards (large
    tp) and few tokens per expert lose compute efficiency. Every kernel also pays its floor under a CUDA graph
    (plan_perf.GEMM_KERNEL_US, GROUPED_GEMM_KERNEL_US, ATTENTION_KERNEL_US: measured on an H200,
    tests/fixtures/real-gpu/, replayed by test_plan_score_kernels.py); a shard of `width` columns per GPU reaches
    1 / (1 + (plan_perf.SHARD_WIDTH / width)^2) of the roofline, and a grouped kernel streams at
    plan_perf.GROUPED_GEMM_BANDWIDTH of a dense one's bandwidth (both measured there too).
  - attention: KV bytes read (m tokens x the average context of input + output/2, per-GPU cache cell: MLA
    latent replicated on every TP rank, GQA heads split by tp; DSA reads only index_topk latent entries plus
    every index key) and its FLOPs, as the same roofline at bf16.
  - two allreduces of m x hidden activations over the TP group (NCCL ring: latency + bytes x 2(n-1)/n / bus
    bandwidth; bus bandwidth = the group's slowest link x a measured efficiency that depends on the link kind and
    group size; SGLang's custom allreduce only on NVLink or 2 PCIe GPUs), and a fixed GPU time per layer (kernel
    tails and small kernels under a CUDA graph). Without graphs (m > cuda_graph_max_bs, prefill) the CPU launches
    each kernel (eager_factor x that time per layer); the launches run ahead of the GPU, so a stage pays only what
    they take beyond its GPU work.
  The last stage adds the LM head and the all-gather of the logits over the TP group; every stage but the
  last sends hidden states and residual to the next stage over the boundary link.
  The scheduler's CPU time per step (a fixed part + a part per running request) overlaps the GPU with SGLang's
  overlap scheduler (pp = 1), and adds to it with pp > 1 (SGLang turns the overlap scheduler off).
PP. SGLang keeps pp micro-batches in flight (b/pp requests each). In steady state every stage works on one of
them, so advancing all b requests by one token takes pp x the slowest stage's time on b/pp tokens: no bubble
while b >= pp. A bubble exists only when the batch is too small to split (b < pp): micro-batches of one
request, pp - b stages idle. PP's costs are therefore per-micro-batch ones: weights read again for each
micro-batch, fixed per-layer times paid pp times; its gains: TP groups inside a socket or NVLink island,
smaller allreduces, MLA KV room doubled per stage halving.

Prefill. Prompts are processed in chunks of chunked_prefill_size tokens, compute-bound (the same roofline with
m = the chunk, attention over half the prompt on average), allreduces of the whole chunk's activations; PP
pipelines chunks across stages. Each request's prompt costs the replica input_len / prefill rate seconds, during
which it does not decode (SGLang runs prefill and decode batches one after the other).

Speculative decoding (settings.speculative: plan_speculative.settings, NEXTN/MTP). One cycle verifies
num_draft_tokens tokens of every running request in one target pass (m = b x num_draft_tokens tokens, graphs
captured for that many) and drafts with num_steps passes of the draft layer(s) (and the LM head) over b tokens;
each request gains accept_length tokens per cycle. At a small batch the verify pass costs about one plain step
(latency- and weight-bound), so the gain is near the accept length; as the batch grows the pass becomes
compute-bound and costs up to num_draft_tokens plain steps: the gain shrinks, and turns into a loss at high
concurrency, which is where speculative decoding helps least.

Throughput per replica = b / (decode step + b x prefill time per request / output_len); x the replicas that have
requests (all dp of them unless the concurrency is smaller than dp).
"""
import math

from . import plan_perf

QUANT_PRECISION = {
    "fp8": "fp8", "modelopt_fp8": "fp8", "w8a8_fp8": "fp8", "compressed-tensors": "fp8", "fbgemm_fp8": "fp8",
    "modelopt_fp4": "fp4", "mxfp4": "fp4", "nvfp4": "fp4", "w4afp8": "fp8",
}
WORKLOAD_DEFAULT = {"input_len": 1024, "output_len": 1024, "concurrency": 128}
# concurrency: max = as many requests in flight as every replica's KV room and request cap admit, at most this many
# in all (what a "max throughput" benchmark measures, bounded so that a bench of it ends).
SATURATING = "max"
MAX_IN_FLIGHT = 1024
# Latency targets (workload.slo): milliseconds, and the percentile of the measured distribution each is judged on.
# The bench client (bench_serving) reports the median and p99 of TTFT and TPOT.
SLO_KEYS = ("ttft_ms", "tpot_ms", "ttft_percentile", "tpot_percentile")
SLO_PERCENTILES = (50, 99)
SLO_DEFAULT_PERCENTILE = {"ttft": 99, "tpot": 50}


def _positive_number(value):
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return None
    return value


def check_slo(slo, output_len):
    """workload.slo -> ({ttft_ms, tpot_ms (each or None), ttft_percentile, tpot_percentile} or None, reasons)."""
    if slo is None or slo == {}:
        return None, []
    if not isinstance(slo, dict):
        return None, ["workload.slo must be a mapping {ttft_ms, tpot_ms}, got %r" % (slo,)]
    reasons = []
    unknown = sorted(set(map(str, slo)) - set(SLO_KEYS))
    if unknown:
        reasons.append("workload.slo has unknown keys %s (allowed: %s)" % (", ".join(unknown), ", ".join(SLO_KEYS)))
    out = {}
    for kind in ("ttft", "tpot"):
        key = kind + "_ms"
        value = slo.get(key)
        out[key] = None if value is None else _positive_number(value)
        if value is not None and out[key] is None:
            reasons.append("workload.slo.%s must be a positive number of milliseconds, got %r" % (key, value))
        key = kind + "_percentile"
        value = slo.get(key, SLO_DEFAULT_PERCENTILE[kind])
        number = _positive_number(value)
        if number not in SLO_PERCENTILES:
            reasons.append("workload.slo.%s must be one of %s (what the bench client reports), got %r" % (
                key, ", ".join(map(str, SLO_PERCENTILES)), value))
            number = SLO_DEFAULT_PERCENTILE[kind]
        out[key] = int(number)
    if out["ttft_ms"] is None and out["tpot_ms"] is None and not reasons:
        reasons.append("workload.slo needs ttft_ms, tpot_ms or both, got %r" % (slo,))
    if not isinstance(output_len, int) or output_len < 1:
        reasons.append("workload.slo: an SLO needs a workload with output tokens (workload.output_len is %r)"
                       % (output_len,))
    elif out["tpot_ms"] is not None and output_len < 2:
        reasons.append("workload.slo.tpot_ms: time per output token needs workload.output_len >= 2, got %d"
                       % output_len)
    return (out if not reasons else None), reasons


def check_workload(workload):
    """The workload with defaults filled in, and the reasons it is bad (each naming the field)."""
    reasons = []
    if workload is None:
        workload = {}
    if not isinstance(workload, dict):
        return dict(WORKLOAD_DEFAULT), ["workload must be a mapping {input_len, output_len, concurrency, slo}, got %r"
                                        % (workload,)]
    unknown = sorted(set(map(str, workload)) - set(WORKLOAD_DEFAULT) - {"slo"})
    if unknown:
        reasons.append("workload has unknown keys %s (allowed: input_len, output_len, concurrency, slo)"
                       % ", ".join(unknown))
    out = {}
    raw_output = workload.get("output_len", WORKLOAD_DEFAULT["output_len"])
    for key, default in WORKLOAD_DEFAULT.items():
        value = workload.get(key, default)
        if key == "concurrency" and value == SATURATING:
            out[key] = value
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            if isinstance(value, str) and value.strip().isdigit() and int(value) >= 1:
                value = int(value)
            else:
                reasons.append("workload.%s must be a positive integer%s, got %r" % (
                    key, " or %s" % SATURATING if key == "concurrency" else "", value))
                value = default
        out[key] = value
    if isinstance(raw_output, str) and raw_output.strip().isdigit():
        raw_output = int(raw_output)
    slo, slo_reasons = check_slo(workload.get("slo"), raw_output)
    reasons.extend(slo_reasons)
    if slo:
        out["slo"] = slo
    return out, reasons


def slo_misses(slo, ttft_ms, tpot_ms):
    """How TTFT / TPOT figures (ms; None = not known) miss an SLO: [] when they meet it."""
    misses = []
    for kind, value in (("ttft", ttft_ms), ("tpot", tpot_ms)):
        target = (slo or {}).get(kind + "_ms")
        if target is None:
            continue
        if value is None:
            misses.append("%s not known" % kind.upper())
        elif value > target:
            misses.append("%s %.1f ms > %g ms" % (kind.upper(), value, target))
    return misses


def measured_slo_misses(slo, record):
    """slo_misses of a measured point (results: ttft_p99_ms, tpot_p50_ms, ...) at the SLO's percentiles."""
    def figure(kind):
        value = record.get("%s_p%d_ms" % (kind, slo[kind + "_percentile"]))
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    return ["measured p%d %s" % (slo[m.split()[0].lower() + "_percentile"], m)
            for m in slo_misses(slo, figure("ttft"), figure("tpot"))]


def gemm_peak(model, gpu):
    return gemm_precision(model, gpu)[0]


def gemm_precision(model, gpu):
    """(tensor peak FLOP/s the checkpoint's GEMMs run at, its name)."""
    want = QUANT_PRECISION.get(model.get("quantization") or "", "bf16")
    if want in ("fp4", "fp8") and gpu[want]:
        return gpu[want], want
    return gpu["bf16"], "bf16"   # weight-only: dequantised into bf16 GEMMs


class Shape:
    """What the model needs of a model, computed once per plan."""

    def __init__(self, model, kv_bytes):
        p = model["params"]
        self.hidden = model["hidden_size"]
        self.vocab = model["vocab_size"]
        self.layers = model["num_layers"]
        self.experts = model["num_experts"] if model["moe"] else 0
        self.top_k = max(1, min(model["experts_per_token"] or 1, self.experts or 1))
        self.attention = p["attention_per_layer"]
        self.dense_mlp = p["dense_mlp_per_layer"]
        self.expert = p["expert"]
        self.shared = model["shared_experts"] * p["expert"]
        embed = model["vocab_size"] * self.hidden * 2 * (1 if model["tie_word_embeddings"] else 2)
        layer_params = self.attention * self.layers + self.dense_mlp * model["dense_layers"] + \
            p["moe_layers"] * (self.experts + model["shared_experts"]) * self.expert
        per_layer_avg = layer_params / float(self.layers)
        weights = max(1.0, model["total_size"] - embed)
        self.bytes_per_param = weights / (layer_params + model["nextn_layers"] * per_layer_avg)
        self.heads = model["num_heads"]
        self.kv_heads = model["num_kv_heads"]
        self.kv_bytes = kv_bytes
        self.mla = model["mla"]
        if self.mla:
            self.latent = (model["kv_lora_rank"] or 512) + (model["qk_rope_head_dim"] or 64)
            self.decode_dims = 2 * (model["kv_lora_rank"] or 512) + (model["qk_rope_head_dim"] or 64)
            self.prefill_dims = (model["qk_nope_head_dim"] or 128) + (model["qk_rope_head_dim"] or 64) + \
                (model["v_head_dim"] or 128)
        else:
            self.latent = 0
            self.decode_dims = self.prefill_dims = model["head_dim"] + model["v_head_dim"]
        self.head_dim = model["head_dim"]
        self.v_head_dim = model["v_head_dim"]
        self.nsa = model["nsa"]
        self.index_topk = model.get("index_topk") or 2048
        self.index_dim = model["index_head_dim"]
        self.index_heads = model.get("index_n_heads") or 64
        self.window = model.get("sliding_window")
        self.swa_share = (model.get("swa_layers") or 0) / float(self.layers)
        # GEMM widths per GPU before the tp split: attention heads x head size, the dense MLP's and one expert's
        # intermediate widths (the dimension tp cuts)
        self.attention_width = self.heads * max(self.head_dim, 64)
        self.dense_width = self.dense_mlp / (3.0 * self.hidden) if self.dense_mlp else self.hidden
        self.expert_width = self.expert / (3.0 * self.hidden) if self.expert else 0.0


def shard_efficiency(width):
    """Fraction of a GEMM's roofline it reaches when each GPU holds `width` columns (or rows) of it: thin shards
    (large tp) give short reductions and few tiles, so both tensor throughput and streamed bandwidth fall;
    1 / (1 + (plan_perf.SHARD_WIDTH / width)^2), measured (plan_perf: the H200 records' shard-to-tp1 ratios)."""
    return 1.0 / (1.0 + (plan_perf.SHARD_WIDTH / max(1.0, width)) ** 2)


def _occupancy(tiles, sms):
    return min(1.0, tiles / float(sms)) if sms else 1.0


def _tiles(tokens, cols):
    """Output tiles of a GEMM over `tokens` rows and `cols` columns (plan_perf.GEMM_TILE: Hopper's smallest
    tensor-core tile is 64 rows, which is what decode-sized GEMMs run)."""
    return math.ceil(tokens / float(plan_perf.GEMM_TILE[0])) * math.ceil(cols / float(plan_perf.GEMM_TILE[1]))


def kernel_time(flops, peak, tiles, bytes_, bandwidth, kernels, floor_us, sms):
    """One group of kernels: their fixed cost under a CUDA graph (kernels x the measured per-kernel floor) plus the
    roofline of their work, compute at tile occupancy min(1, tiles / SMs). -> (seconds, compute, memory)."""
    t, c, w = _roofline(flops, peak, _occupancy(tiles, sms), bytes_, bandwidth)
    return t + kernels * floor_us * 1e-6, c, w


def dense_gemm_time(local, width, tokens, hidden, bpp, peak, hbm, sms):
    """One layer's column-parallel + row-parallel GEMM pair of `local` weights per GPU (`width` = the cut dimension
    per GPU) on `tokens` tokens: two kernels."""
    cols = max(1.0, local / hidden)          # output columns per GPU of the column-parallel half
    se = shard_efficiency(width)
    return kernel_time(2.0 * tokens * local, peak * se, _tiles(tokens, cols) * 2, local * bpp, hbm * se, 2,
                       plan_perf.GEMM_KERNEL_US, sms)


def moe_gemm_time(shape, tp, ep, m, bpp, peak, hbm, sms):
    """One layer's routed experts on one GPU as fused MoE runs them: one grouped kernel for gate+up and one for
    down over every expert some token routes to (1 - (1 - top_k/experts)^m of them are read)."""
    assignments = m * shape.top_k
    touched = 1.0 - (1.0 - float(shape.top_k) / shape.experts) ** max(1.0, m)
    local_bytes = shape.experts * shape.expert / float(tp) * bpp * touched
    moe_tp = max(1.0, tp / float(ep))
    flops = 2.0 * assignments * shape.expert / float(tp)
    per_expert_tokens = assignments / float(shape.experts)
    cols = shape.expert_width * 2 / moe_tp
    experts_local = shape.experts / float(ep) * touched
    se = shard_efficiency(shape.expert_width / moe_tp)
    return kernel_time(flops, peak * se, experts_local * _tiles(per_expert_tokens, cols), local_bytes,
                       hbm * se * plan_perf.GROUPED_GEMM_BANDWIDTH, 2, plan_perf.GROUPED_GEMM_KERNEL_US, sms)


def attention_time(flops, kv, attn_peak, hbm, sms):
    """One layer's attention kernel over the KV cache: bandwidth-bound on the KV bytes in decode, plus the
    measured floor of a decode attention kernel."""
    return kernel_time(flops, attn_peak, sms, kv, hbm, 1, plan_perf.ATTENTION_KERNEL_US, sms)


def _roofline(flops, peak, occupancy, bytes_, bandwidth):
    compute = flops / (peak * occupancy) if flops else 0.0
    memory = bytes_ / bandwidth if bytes_ else 0.0
    return max(compute, memory), compute, memory


class Links:
    """The communication a replica does: its TP group's allreduce/all-gather and its PP boundaries."""

    def __init__(self, tp, kind, link_gbps, p2p_sys=False, boundaries=(), measured=None):
        self.tp = tp
        self.kind = kind                      # nvlink | pcie | host | net
        self.link = (link_gbps or plan_perf.INTER_NODE_GBPS) * 1e9
        self.p2p_sys = p2p_sys
        self.boundaries = list(boundaries)    # [(GB/s, kind)] between stage k and k+1
        n = tp
        if kind == "nvlink":
            eff = plan_perf.NVLINK_BUS_EFFICIENCY
            self.latency = (plan_perf.NVLINK_LATENCY_US[0] + plan_perf.NVLINK_LATENCY_US[1] * n) * 1e-6
        elif kind == "net":
            eff = plan_perf.INTER_NODE_EFFICIENCY
            self.latency = plan_perf.INTER_NODE_LATENCY_US * n * 1e-6
        else:
            eff = plan_perf.PCIE_BUS_EFFICIENCY_P2P_SYS if p2p_sys else \
                plan_perf.PCIE_BUS_EFFICIENCY.get(n, plan_perf.PCIE_BUS_EFFICIENCY[4]) if n > 2 else \
                plan_perf.PCIE_BUS_EFFICIENCY[2]
            self.latency = plan_perf.PCIE_LATENCY_US_PER_GPU * n * 1e-6
            if kind == "host":
                self.latency += plan_perf.HOST_PATH_LATENCY_US_PER_STEP * 2 * (n - 1) * 1e-6
        self.busbw = self.link * eff
        self.measured = measured
        if measured:
            # The preflight's NCCL allreduce on this machine (bus GB/s, 8 KB latency us) replaces the efficiency and
            # the latency of the link kind; NVLink keeps SGLang's custom allreduce latency (NCCL's is measured).
            self.busbw = measured[0] * 1e9
            if kind != "nvlink":
                self.latency = measured[1] * 1e-6

    def subgroup(self, n):
        """The same links for a group of n of these GPUs (attention TP inside a DP-attention replica)."""
        return Links(n, self.kind, self.link / 1e9, self.p2p_sys, self.boundaries)

    def allreduce(self, size):
        if self.tp < 2:
            return 0.0
        return self.latency + size * 2.0 * (self.tp - 1) / self.tp / self.busbw

    def allgather(self, total):
        if self.tp < 2:
            return 0.0
        return self.latency + total * (self.tp - 1.0) / self.tp / self.busbw

    def send(self, k, size):
        gbps, kind = self.boundaries[k]
        latency = plan_perf.INTER_NODE_LATENCY_US if kind == "net" else plan_perf.PCIE_LATENCY_US_PER_GPU
        return latency * 1e-6 + size / (gbps * 1e9)


def stage_time(shape, layout, stage, m, ctx, links, gpu, peak, eff, graph_bs, prefill=False):
    """Seconds one GPU of a stage spends on a forward pass over m tokens, and its parts.

    With attention data parallelism (layout attn_dp = a > 1, SGLang --enable-dp-attention) the attention of the
    replica's tokens is split over a ranks of tp/a GPUs each (its weights replicated a times, its KV per rank),
    and the MLP/MoE runs over all tp GPUs on every token, gathered before and scattered after (one allreduce's
    worth of traffic instead of two allreduces per layer)."""
    tp, ep = layout["tp"], max(1, layout["ep"])
    a = max(1, layout.get("attn_dp", 1))
    attn_tp = max(1, tp // a)
    m_attn = max(1.0, m / float(a))
    hbm = gpu["memory"] * eff["memory"]
    gemm_peak = peak * eff["gemm"]
    attn_peak = gpu["bf16"] * eff["attention"]
    sms = gpu["sms"]
    bpp = shape.bytes_per_param
    h = shape.hidden
    parts = {"compute": 0.0, "weights": 0.0, "kv": 0.0, "comm": 0.0, "overhead": 0.0}

    def add(time_, compute, memory, kind):
        parts["compute" if compute >= memory else kind] += time_

    def dense(params, count, width, split, tokens):
        """count layers' GEMMs of `params` weights split over `split` GPUs, on `tokens` tokens."""
        if not count or not params:
            return
        t, c, w = dense_gemm_time(params / float(split), width / split, tokens, h, bpp, gemm_peak, hbm, sms)
        add(t * count, c, w, "weights")

    layers = stage["layers"]
    dense(shape.attention, layers, shape.attention_width, attn_tp, m_attn)
    dense(shape.dense_mlp, stage["dense_layers"], shape.dense_width, tp, m)
    dense(shape.shared, stage["moe_layers"], shape.expert_width, tp, m)
    if stage["moe_layers"] and shape.experts:
        t, c, w = moe_gemm_time(shape, tp, ep, m, bpp, gemm_peak, hbm, sms)
        skew = 1.0 + eff["ep_skew"] if ep > 1 else 1.0    # the busiest EP rank's share of the routed tokens
        add(t * skew * stage["moe_layers"], c, w, "weights")

    # attention over the context (per GPU: its rank's tokens, its share of the heads)
    heads = shape.heads / float(attn_tp)
    context = ctx / 2.0 if prefill else ctx
    main = min(context, shape.index_topk) if shape.nsa else context
    if shape.window:
        main = main * (1 - shape.swa_share) + min(main, shape.window) * shape.swa_share
    if prefill:
        flops = 2.0 * m_attn * heads * shape.prefill_dims * main
        kv = 0.0
    else:
        flops = 2.0 * m_attn * heads * shape.decode_dims * main
        if shape.mla:
            cell = shape.latent * shape.kv_bytes
        else:
            cell = max(1.0, shape.kv_heads / float(attn_tp)) * (shape.head_dim + shape.v_head_dim) * shape.kv_bytes
        kv = m_attn * main * cell
    if shape.nsa:
        flops += 2.0 * m_attn * context * shape.index_heads * shape.index_dim
        kv += 0.0 if prefill else m_attn * context * (shape.index_dim + shape.index_dim // 128 * 4)
    t, c, w = attention_time(flops, kv, attn_peak, hbm, sms)
    add(t * layers, c, w, "kv")

    # communication and fixed costs
    size = m * h * plan_perf.ACTIVATION_BYTES
    if a > 1:
        parts["comm"] += layers * links.allreduce(size)           # gather before the MLP, scatter after
        if attn_tp > 1:
            parts["comm"] += layers * links.subgroup(attn_tp).allreduce(size / a)
    else:
        parts["comm"] += 2 * layers * links.allreduce(size)
    parts["overhead"] += eff["layer_us"] * 1e-6 * layers
    if prefill or m > graph_bs:
        # without CUDA graphs the CPU launches every kernel (eager_factor x the per-layer time of the graph); the
        # launches run ahead of the GPU, so the GPU waits only for what they take beyond its own work
        launches = eff["eager_factor"] * eff["layer_us"] * 1e-6 * layers
        parts["overhead"] += max(0.0, launches - sum(parts.values()))
    if stage["last"]:
        head = shape.vocab * h / float(tp)
        tokens = 1 if prefill else m
        t, c, w = kernel_time(2.0 * tokens * head, gpu["bf16"] * eff["gemm"], _tiles(tokens, shape.vocab / float(tp)),
                              head * 2, hbm, 1, plan_perf.GEMM_KERNEL_US, sms)
        add(t, c, w, "weights")
        parts["comm"] += links.allgather(tokens * shape.vocab * plan_perf.ACTIVATION_BYTES)
    else:
        parts["comm"] += links.send(stage["index"], 2.0 * m * h * plan_perf.ACTIVATION_BYTES / tp)
    return sum(parts.values()), parts


def estimate(model, layout, stages, links, gpu, workload, kv_tokens, settings, shape=None, eff=None,
             concurrency=None):
    """Estimated output tokens/s of a layout at a workload, and the parts behind it.

    stages: per PP stage {index, layers, dense_layers, moe_layers, last}. links: Links of a replica.
    gpu: plan_perf.gpu_perf(). workload: check_workload()'s. kv_tokens: KV tokens a replica holds.
    settings: {cuda_graph_max_bs, chunked_prefill_size, max_running_requests (SGLang's cap of one replica), overlap,
    kv_bytes}. concurrency: evaluate at this many requests in flight instead of the workload's.
    """
    eff = eff or plan_perf.EFFICIENCY
    shape = shape or Shape(model, settings["kv_bytes"])
    tp, pp, dp = layout["tp"], layout["pp"], layout["dp"]
    inp, out, conc = workload["input_len"], workload["output_len"], concurrency or workload["concurrency"]
    peak, precision = gemm_precision(model, gpu)
    footprint = inp + out / 2.0
    capacity = int(kv_tokens // footprint) if kv_tokens > 0 else 0
    running = max(1, settings.get("max_running_requests") or 4096)   # per replica (planner)
    if conc == SATURATING:   # every replica full: its KV room or its request cap, at most MAX_IN_FLIGHT in all
        conc = max(1, min(MAX_IN_FLIGHT, dp * min(capacity, running)))
    active = min(dp, conc)                      # replicas with at least one request
    per_replica = max(1, int(math.ceil(conc / float(active))))
    batch = max(0, min(per_replica, capacity, running))
    result = {"precision": precision, "concurrency": conc, "batch": min(conc, batch * active),
              "kv_capacity_requests": capacity * dp, "micro_batch": 0, "pp_bubble": 0.0, "tokens_per_s": 0.0}
    if batch < 1:
        result["limit"] = "kv"   # not even one request of this length fits the KV cache
        return result
    graph_bs = settings.get("cuda_graph_max_bs") or 0
    cpu_step = eff["step_ms"] * 1e-3
    cpu_req = eff["request_us"] * 1e-6
    overlap = settings.get("overlap", True) and pp == 1

    # decode: pp micro-batches of b/pp requests (1 each with a bubble when b < pp)
    micro = max(1.0, batch / float(pp))
    ctx = inp + out / 2.0
    spec = settings.get("speculative")
    verify = spec["num_draft_tokens"] if spec else 1      # tokens per request in one target pass
    slowest, parts = 0.0, None
    for stage in stages:
        gpu_time, stage_parts = stage_time(shape, layout, stage, micro * verify, ctx, links, gpu, peak, eff,
                                           graph_bs * verify)
        cpu = cpu_step + cpu_req * micro
        stage_parts["cpu"] = max(0.0, cpu - gpu_time) if overlap else cpu
        total = gpu_time + stage_parts["cpu"]
        if total > slowest:
            slowest, parts = total, stage_parts
    cycle = pp * slowest                              # every request advances one token
    gain = 1.0
    if spec:   # num_steps draft passes over the batch, then accept_length tokens per request per cycle
        draft_stage = {"index": len(stages) - 1, "layers": spec["draft_layers"], "dense_layers": 0,
                       "moe_layers": spec["draft_layers"] if shape.experts else 0, "last": True}
        if not shape.experts:
            draft_stage["dense_layers"] = spec["draft_layers"]
        draft = stage_time(shape, layout, draft_stage, micro, ctx, links, gpu, peak, eff, graph_bs)[0]
        cycle += pp * spec["num_steps"] * draft
        gain = spec["accept_length"]
    bubble = 1.0 - min(batch, pp) / float(pp)

    # prefill: chunks through the stages (pipelined with pp > 1)
    chunk = float(min(settings.get("chunked_prefill_size") or 8192, inp * per_replica))
    pre_slowest = 0.0
    for stage in stages:
        t = stage_time(shape, layout, stage, chunk, inp, links, gpu, peak, eff, graph_bs, prefill=True)[0]
        pre_slowest = max(pre_slowest, t + cpu_step)
    prefill_per_request = inp * pre_slowest / chunk
    # TPOT: a running request gets one token per decode cycle, and waits while the prompts of the requests that
    # replace finished ones are prefilled (batch x prefill / output_len per token). TTFT: the tail of a request
    # that arrives as a decode step starts - it waits for the requests queued ahead of it beyond the batch (each
    # slot frees after output_len x TPOT), that step, and its prompt's chunks (full ones under load) through
    # the pp stages.
    tpot = cycle / gain + batch * prefill_per_request / out
    tokens_per_s = active * batch / tpot
    queued = max(0, per_replica - batch)
    ttft = queued * out * tpot / batch + cycle + (math.ceil(inp / chunk) + pp - 1) * pre_slowest
    result.update({
        "tokens_per_s": round(tokens_per_s, 1) if tokens_per_s >= 10 else round(tokens_per_s, 4),
        "ttft_ms": round(ttft * 1e3, 2),
        "tpot_ms": round(tpot * 1e3, 3),
        "tokens_per_user": round(1.0 / tpot, 2),
        "micro_batch": round(micro, 1),
        "pp_bubble": round(bubble, 3),
        "step_ms": round(cycle * 1e3, 3),
        "prefill_ms_per_request": round(prefill_per_request * 1e3, 3),
        "limit": "kv" if capacity < min(per_replica, running) else "concurrency",
    })
    if spec:
        result["speculative_gain"] = round(gain, 3)
    # the parts of one decode step (per GPU of the slowest stage, x pp micro-batches)
    for key in ("compute", "weights", "kv", "comm", "overhead", "cpu"):
        result["%s_ms" % key] = round(parts[key] * pp * 1e3, 3)
    return result


def estimate_at_slo(model, layout, stages, links, gpu, workload, kv_tokens, settings, shape=None, eff=None):
    """estimate() at the workload's concurrency; with an SLO (workload.slo), at the highest concurrency up to the
    workload's whose predicted TTFT and TPOT meet it (a binary search: both grow with the concurrency), with
    `slo` {met, reason}. A layout that misses it even at concurrency 1 is estimated there, met False."""
    def at(concurrency=None):
        return estimate(model, layout, stages, links, gpu, workload, kv_tokens, settings, shape, eff, concurrency)

    result = at()
    slo = workload.get("slo")
    if not slo or not result["tokens_per_s"]:
        return result
    misses = slo_misses(slo, result["ttft_ms"], result["tpot_ms"])
    if not misses:
        result["slo"] = {"met": True, "reason": "meets the SLO at the workload's concurrency %d" % result["concurrency"]}
        return result
    low, high, high_misses = 1, result["concurrency"], misses
    best = at(1)
    misses = slo_misses(slo, best["ttft_ms"], best["tpot_ms"])
    if misses:
        best["slo"] = {"met": False, "reason": "cannot meet the SLO even at concurrency 1: predicted %s"
                       % ", ".join(misses)}
        return best
    while high - low > 1:
        mid = (low + high) // 2
        trial = at(mid)
        misses = slo_misses(slo, trial["ttft_ms"], trial["tpot_ms"])
        if misses:
            high, high_misses = mid, misses
        else:
            low, best = mid, trial
    best["slo"] = {"met": True, "reason": "concurrency %d is the highest that meets the SLO (at %d: predicted %s)"
                   % (low, high, ", ".join(high_misses))}
    return best


def interactivity_curve(inputs, top):
    """[[concurrency, output tok/s, output tok/s per user]] of one layout at 1, 4, 16, ... up to `top` requests in
    flight (and at top): throughput against the speed each user sees, the curve an SLO on TPOT cuts."""
    points = sorted({min(top, 4 ** k) for k in range(8) if 4 ** k <= top} | {top})
    out = []
    for conc in points:
        est = estimate(inputs["model"], inputs["layout"], inputs["stages"], inputs["links"], inputs["gpu"],
                       inputs["workload"], inputs["kv_tokens"], inputs["settings"], inputs["shape"],
                       inputs.get("eff"), conc)
        if est["tokens_per_s"]:
            out.append([conc, est["tokens_per_s"], est["tokens_per_user"]])
    return out
