"""Performance model: how long one forward step takes for a layout on a topology. Simulated, not measured.

One decode step of a batch of m tokens through one pipeline stage of l layers on a TP group of t GPUs:

    per layer   max(bytes / (BW * BW_EFF), flops / (FLOPS * FLOPS_EFF)) + LAYER_OVERHEAD
                + 2 allreduces of m * hidden * 2 bytes over the TP group
    bytes       (attention + dense/shared MLP + experts touched by m tokens) * bytes_per_param / t
                + KV cache read for the tokens in the batch's contexts
    flops       2 * m * active params of the layer / t  (+ attention over the contexts)
    allreduce   AR_BASE + 2(t-1) * alpha + 2(t-1)/t * size / bw, alpha and bw of the worst pair in the
                group by its link: NVLink, PCIe level (PIX PXB PHB NODE SYS) or no P2P (through host memory),
                capped by the PCIe link of either GPU as trained now (cur_gen x cur_width, 80% payload)

Experts touched by m tokens: E * (1 - (1 - k/E)^m), so a small batch reads few experts, a big one all.

Several nodes: a pair of GPUs on different nodes talks over the network between the nodes (NET): one NIC per
node that the node's GPUs share, at SGLANG_SIM_NET_GBPS (line rate, default 400 Gb/s, 80% of it payload) with
SGLANG_SIM_NET_LATENCY_US per message (default 10 us), capped by the PCIe link of either GPU. A TP group that
crosses nodes pays that latency on every ring step; a PP boundary between nodes sends the whole micro-batch's
hidden states through the one NIC.

SGLANG_SIM_LAYOUT_SPEED multiplies the throughput of named layouts: step times are divided by the factor.

With pp stages SGLang splits the running batch into min(B, pp) micro-batches; each micro-batch reads the
stage's weights again, each stage must process every micro-batch, and a token must cross every stage:

    step = max(sum over stages of t_stage(m) + (pp-1) * boundary transfer,  n_microbatches * max t_stage(m))

Each stage's time is divided by PP_EFFICIENCY when pp > 1 (calibration, see below).
Scheduler CPU time per forward (CPU_BASE + CPU_PER_REQ * m) overlaps with the GPU when SGLang's overlap
scheduler runs (pp == 1 and no --disable-overlap-schedule) and adds to it otherwise (pp > 1 turns it off).
Prefill of n tokens is the same formula with m = n (compute bound), stage after stage.

The constants are public datasheet figures times efficiency factors, and NCCL allreduce figures measured on
8x RTX PRO 6000 (PCIe Gen5): 8 KB latency 6.8 / 13.5 / 26.7 us on 2 / 4 / 8 GPUs, bus bandwidth 24-38 GB/s.
They are calibrated so that GLM-5-NVFP4 on the field machine (vnuma spec) shows what the field measured:
TP8 ahead of TP4+PP2 by about 2x at serving concurrency. Absolute numbers are indicative only.
"""
import math

BW_EFF = 0.45  # achieved fraction of memory bandwidth in decode GEMV / grouped GEMM
FLOPS_EFF = 0.4  # achieved fraction of dense tensor throughput
LAYER_OVERHEAD = 12e-6  # kernel launches and small ops per layer (CUDA graphs on)
AR_BASE = 3e-6  # NCCL allreduce fixed cost
# per ring step latency (s), bus bandwidth (bytes/s) by how a pair of GPUs talks, P2P available
LINKS = {
    "NV": (0.6e-6, 300e9),
    "PIX": (1.5e-6, 45e9),
    "PXB": (1.6e-6, 40e9),
    "PHB": (1.9e-6, 30e9),
    "NODE": (1.75e-6, 30e9),
    "SYS": (2.2e-6, 24e9),
}
NO_P2P = (7e-6, 12e9)  # P2P not available (CNS, ...): NCCL goes through host memory
# Pipeline stages run below the efficiency of a TP-only forward: half-size micro-batches run smaller GEMMs,
# the overlap scheduler is off and each stage waits on a synchronous handoff. A calibration, not a derivation:
# it brings GLM-5-NVFP4 on the field machine to TP8 ~2x ahead of TP4+PP2, as measured there.
PP_EFFICIENCY = 0.6
CPU_BASE = 1.5e-3  # scheduler CPU time per forward (batch preparation, sampling, output processing)
CPU_PER_REQ = 15e-6
ACT_BYTES = 2  # hidden states travel in bf16
NET_GBPS = 400.0  # network between nodes: line rate of the one NIC per node (Gb/s), 400G InfiniBand/RoCE class
NET_LATENCY_US = 10.0  # per message over the network, NCCL over IB/RoCE class
NET_PAYLOAD = 0.8  # fraction of the line rate that carries data


def layout_name(tp, pp=1, dp=1, ep=1):
    """tp{tp}, then pp{pp}, dp{dp}, ep{ep} where that size is > 1: tp8, tp4pp2, tp2pp2ep2, tp4dp2."""
    return "tp%d" % tp + "".join("%s%d" % (part, size) for part, size in (("pp", pp), ("dp", dp), ("ep", ep))
                                 if size > 1)


class Network:
    """The network between nodes: per-message latency (s) and payload bandwidth (bytes/s) of a node's NIC."""

    def __init__(self, gbps=NET_GBPS, latency_us=NET_LATENCY_US):
        self.alpha = latency_us * 1e-6
        self.bw = gbps * 1e9 / 8 * NET_PAYLOAD


class Layout:
    """tp, pp, dp and each rank's GPU: rank (d, s, t) uses gpus[d*pp*tp + s*tp + t], an NVML index on node 0 or
    a (node, NVML index) pair."""

    def __init__(self, tp, pp, dp, gpus, stage_layers, overlap=True, kv_dtype_bytes=2):
        self.tp, self.pp, self.dp = tp, pp, dp
        self.gpus = list(gpus)
        self.stage_layers = list(stage_layers)  # [(start, end)] per stage
        self.overlap = overlap
        self.kv_dtype_bytes = kv_dtype_bytes

    def group(self, replica, stage):
        base = replica * self.pp * self.tp + stage * self.tp
        return self.gpus[base:base + self.tp]


def _where(gpu):
    """(node, NVML index) of a layout entry."""
    return tuple(gpu) if isinstance(gpu, (tuple, list)) else (0, gpu)


class PerfModel:
    def __init__(self, model, spec, layout, speed=1.0, network=None):
        """spec: the GPU spec of a single node, or {node: spec}; speed: SGLANG_SIM_LAYOUT_SPEED's factor."""
        self.model = model
        self.specs = spec if isinstance(spec, dict) else {0: spec}
        self.layout = layout
        self.speed = speed
        self.network = network or Network()
        self.speculative = None   # (num_steps, num_draft_tokens, draft layers) of a speculative run
        gpu = self._gpu(layout.gpus[0])
        self.bw = gpu.mem_bw * BW_EFF
        self.flops = gpu.flops * FLOPS_EFF
        # one replica describes them all (the planner keeps replicas alike); the worst links count
        self.stage_links = [self._group_link(layout.group(0, s)) for s in range(layout.pp)]
        self.boundary_links = [
            self._pair_links(layout.group(0, s), layout.group(0, s + 1)) for s in range(layout.pp - 1)
        ]

    # ------------------------------------------------------------------ links
    def _gpu(self, gpu):
        node, index = _where(gpu)
        return self.specs[node].gpus[index]

    def _link(self, a, b):
        (node_a, a), (node_b, b) = _where(a), _where(b)
        cap = min(self.specs[node_a].gpus[a].pcie_bw, self.specs[node_b].gpus[b].pcie_bw)
        if node_a != node_b:
            alpha, bw = self.network.alpha, self.network.bw
            return ((alpha, cap), "NET/degraded") if cap < bw else ((alpha, bw), "NET")
        spec = self.specs[node_a]
        level = spec.level(a, b)
        if level == "NV":
            return LINKS["NV"], level
        alpha, bw = NO_P2P if not spec.p2p_ok(a, b) else LINKS.get(level, LINKS["SYS"])
        if not spec.p2p_ok(a, b):
            level += "/no-p2p"
        if cap < bw:  # a GPU whose PCIe link trained below its maximum (gen or width)
            return (alpha, cap), level + "/degraded"
        return (alpha, bw), level

    def _group_link(self, group):
        worst_alpha, worst_bw, levels = 0.0, float("inf"), set()
        for i, a in enumerate(group):
            for b in group[i + 1:]:
                (alpha, bw), level = self._link(a, b)
                worst_alpha, worst_bw = max(worst_alpha, alpha), min(worst_bw, bw)
                levels.add(level)
        return worst_alpha, worst_bw, sorted(levels)

    def _pair_links(self, src, dst):
        worst_alpha, worst_bw, levels = 0.0, float("inf"), set()
        for a, b in zip(src, dst):
            (alpha, bw), level = self._link(a, b)
            worst_alpha, worst_bw = max(worst_alpha, alpha), min(worst_bw, bw)
            levels.add(level)
        return worst_alpha, worst_bw, sorted(levels)

    def allreduce(self, size, stage):
        n = self.layout.tp
        if n == 1:
            return 0.0
        alpha, bw, _ = self.stage_links[stage]
        return AR_BASE + 2 * (n - 1) * alpha + 2 * (n - 1) / n * size / bw

    def transfer(self, size, boundary):
        alpha, bw, levels = self.boundary_links[boundary]
        # each GPU pair carries its share; over the network the pairs share the node's one NIC
        share = 1 if any(level.startswith("NET") for level in levels) else self.layout.tp
        return AR_BASE + alpha + size / share / bw

    # ------------------------------------------------------------------ compute
    def _experts_touched(self, tokens):
        m = self.model
        if not m.experts:
            return 0.0
        return m.experts * (1.0 - (1.0 - m.topk / m.experts) ** tokens)

    def _layer(self, layer, tokens, ctx_tokens, stage):
        """Seconds for one layer on one GPU of the stage's TP group: tokens new tokens, ctx_tokens in context."""
        m = self.model
        tp = self.layout.tp
        if m.is_moe_layer(layer):
            weight_params = m.p_attn + (self._experts_touched(tokens) + m.shared_experts) * m.p_expert
            active = m.p_attn + (m.topk + m.shared_experts) * m.p_expert
        else:
            weight_params = active = m.p_attn + m.p_dense_mlp
        kv_read = ctx_tokens * m.kv_bytes_per_token_layer(tp, self.layout.kv_dtype_bytes)
        nbytes = weight_params * m.bytes_per_param / tp + kv_read
        attn_dim = (int(m.kv_lora_rank) + m.qk_rope) if m.is_mla else m.head_dim
        flops = (2 * tokens * active + 4 * ctx_tokens * m.heads * attn_dim) / tp
        compute = max(nbytes / self.bw, flops / self.flops) + LAYER_OVERHEAD
        return compute + 2 * self.allreduce(tokens * m.hidden * ACT_BYTES, stage)

    def _stage(self, stage, tokens, ctx_tokens):
        start, end = self.layout.stage_layers[stage]
        t = sum(self._layer(layer, tokens, ctx_tokens, stage) for layer in range(start, end))
        m = self.model
        if stage == 0 or stage == self.layout.pp - 1:  # embedding lookup / LM head
            lm = m.p_embed * m.bytes_per_param / self.layout.tp
            t += max(lm / self.bw, 2 * tokens * m.p_embed / self.layout.tp / self.flops) / 2
        return t

    def _cpu(self, requests):
        return CPU_BASE + CPU_PER_REQ * requests

    # ------------------------------------------------------------------ steps
    def decode_step(self, batch, ctx_tokens):
        """Seconds until every one of `batch` running requests (ctx_tokens in context together) has one more token;
        with speculative decoding (self.speculative = (num_steps, num_draft_tokens, draft layers)) one verify
        step: num_steps draft passes over the batch, then one target pass over num_draft_tokens tokens of each
        request (each request then gains the accept length's tokens, Engine.tokens_per_step)."""
        if batch <= 0:
            return 0.0
        spec = self.speculative
        if not spec:
            return self._decode(batch, ctx_tokens, 1)
        steps, draft_tokens, draft_layers = spec
        lay = self.layout
        per_replica = math.ceil(batch / lay.dp)
        last = lay.stage_layers[-1][1] - 1
        draft = draft_layers * self._layer(last, per_replica, ctx_tokens / lay.dp, lay.pp - 1)
        draft += self.model.p_embed * self.model.bytes_per_param / lay.tp / self.bw   # the LM head of each pass
        return self._decode(batch, ctx_tokens, draft_tokens) + steps * draft / self.speed

    def _decode(self, batch, ctx_tokens, tokens_per_request):
        lay = self.layout
        batch = math.ceil(batch / lay.dp)
        ctx_tokens = ctx_tokens / lay.dp
        if lay.pp == 1:
            gpu = self._stage(0, batch * tokens_per_request, ctx_tokens)
            cpu = self._cpu(batch)
            return (max(gpu, cpu) if lay.overlap else gpu + cpu) / self.speed
        n_mb = min(batch, lay.pp)
        m = math.ceil(batch / n_mb)
        ctx_mb = ctx_tokens / n_mb
        stages = [self._stage(s, m * tokens_per_request, ctx_mb) / PP_EFFICIENCY + self._cpu(m) for s in range(lay.pp)]
        xfer = sum(self.transfer(m * self.model.hidden * ACT_BYTES, b) for b in range(lay.pp - 1))
        return max(sum(stages) + xfer, n_mb * max(stages)) / self.speed

    def prefill(self, tokens, requests=1):
        """Seconds to prefill `tokens` new prompt tokens of `requests` requests (first output token included)."""
        if tokens <= 0:
            return 0.0
        lay = self.layout
        tokens = math.ceil(tokens / lay.dp)
        eff = PP_EFFICIENCY if lay.pp > 1 else 1.0
        t = sum(self._stage(s, tokens, tokens / 2) / eff + self._cpu(requests) for s in range(lay.pp))
        t += sum(self.transfer(tokens * self.model.hidden * ACT_BYTES, b) for b in range(lay.pp - 1))
        return t / self.speed

    def describe(self):
        lay = self.layout
        return {
            "model": "simulated performance model (lab); see the simulator README",
            "layout_speed": self.speed,
            "nodes": len({_where(g)[0] for g in lay.gpus}),
            "gpu_memory_bandwidth_effective": self.bw,
            "gpu_flops_effective": self.flops,
            "tp_group_links": [links for _, _, links in self.stage_links],
            "pp_boundary_links": [links for _, _, links in self.boundary_links],
            "overlap_schedule": lay.overlap,
            "decode_step_ms": {
                str(b): round(self.decode_step(b, b * 1024) * 1e3, 3) for b in (1, 8, 32, 128)
            },
        }
