"""Every constant of the planner's performance model, in one place, each with its source.

Plain Python 3.9+ stdlib. plan_score.py reads these; nothing else defines a speed, a bandwidth or an efficiency.
Three kinds of constants:

1. Datasheet physics (GPU_TABLE, PCIE_LANE_GBPS, NVLINK_GBPS_PER_LINK): what the hardware is rated for.
2. Measured link behaviour (P2P fractions, NCCL bus efficiencies, latencies): numbers measured on real boxes
   (reference: the field's RTX PRO 6000 measurements, nccl-tests results on NVSwitch boxes).
3. Efficiencies (EFFICIENCY): the few numbers no datasheet gives (what fraction of peak real kernels reach,
   SGLang's fixed costs per step). These are the ones the calibration set (tests/calibration/) determines;
   tools/calibration.py fits them and reports the model's error with and without a case.

A GPU absent from the table is matched by its compute capability (GENERATION_DEFAULTS) and the plan says so.
"""

# name fragment (first match wins: specific names first) ->
#   (bf16 dense TFLOPS, fp8 dense TFLOPS or None, fp4 dense TFLOPS or None, memory GB/s, SMs, source)
# Dense = without structured sparsity. FP8/FP4 None: the GPU has no such tensor cores, SGLang runs those
# checkpoints as weight-only (dequantised to bf16 in the GEMM), so they compute at the bf16 rate.
GPU_TABLE = (
    ("GB200", (2500.0, 5000.0, 10000.0, 8000.0, 148, "NVIDIA GB200 NVL72 datasheet (per GPU)")),
    ("B300", (2250.0, 4500.0, 13500.0, 8000.0, 148, "NVIDIA HGX B300 datasheet (per GPU)")),
    ("B200", (2250.0, 4500.0, 9000.0, 8000.0, 148, "NVIDIA HGX B200 datasheet (per GPU)")),
    ("GH200", (989.0, 1979.0, None, 4000.0, 132, "NVIDIA GH200 datasheet (HBM3 96 GB)")),
    ("H200", (989.0, 1979.0, None, 4800.0, 132, "NVIDIA H200 datasheet (SXM)")),
    ("H100 NVL", (835.0, 1671.0, None, 3900.0, 132, "NVIDIA H100 NVL datasheet")),
    ("H100 PCIe", (756.0, 1513.0, None, 2000.0, 114, "NVIDIA H100 PCIe datasheet")),
    ("H100", (989.0, 1979.0, None, 3350.0, 132, "NVIDIA H100 SXM5 datasheet")),
    ("H800", (989.0, 1979.0, None, 3350.0, 132, "NVIDIA H800 SXM5 (H100 compute, NVLink 400 GB/s)")),
    ("H20", (148.0, 296.0, None, 4000.0, 78, "NVIDIA H20 product brief")),
    ("A100-SXM4-40GB", (312.0, None, None, 1555.0, 108, "NVIDIA A100 datasheet (40 GB SXM)")),
    ("A100 80GB PCIe", (312.0, None, None, 1935.0, 108, "NVIDIA A100 datasheet (80 GB PCIe)")),
    ("A100-PCIE-40GB", (312.0, None, None, 1555.0, 108, "NVIDIA A100 datasheet (40 GB PCIe)")),
    ("A100", (312.0, None, None, 2039.0, 108, "NVIDIA A100 datasheet (80 GB SXM)")),
    ("A800", (312.0, None, None, 2039.0, 108, "NVIDIA A800 (A100 compute, NVLink 400 GB/s)")),
    ("RTX PRO 6000", (503.8, 1007.6, 2015.2, 1792.0, 188, "NVIDIA RTX PRO 6000 Blackwell datasheet")),
    ("RTX 6000 Ada", (364.2, 728.5, None, 960.0, 142, "NVIDIA RTX 6000 Ada datasheet")),
    ("L40S", (362.1, 733.0, None, 864.0, 142, "NVIDIA L40S datasheet")),
    ("L40", (181.0, 362.0, None, 864.0, 142, "NVIDIA L40 datasheet")),
    ("L4", (121.0, 242.0, None, 300.0, 58, "NVIDIA L4 datasheet")),
    ("A10", (125.0, None, None, 600.0, 72, "NVIDIA A10 datasheet")),
    ("RTX A6000", (154.8, None, None, 768.0, 84, "NVIDIA RTX A6000 datasheet")),
    ("RTX 5090", (209.5, 419.0, 838.0, 1792.0, 170, "NVIDIA RTX Blackwell whitepaper (GeForce RTX 5090)")),
    ("RTX 4090", (165.2, 330.3, None, 1008.0, 128, "NVIDIA Ada whitepaper (GeForce RTX 4090)")),
)

# Compute capability major.minor -> the table row that stands in for an unknown GPU of that generation.
GENERATION_DEFAULTS = {
    "8.0": "A100", "8.6": "RTX A6000", "8.7": "A10", "8.9": "L40S", "9.0": "H100",
    "10.0": "B200", "10.3": "B300", "12.0": "RTX PRO 6000", "12.1": "RTX PRO 6000",
}

# PCIe payload rate per lane and direction, GB/s (PCI-SIG: 8b/10b for Gen1-2, 128b/130b for Gen3-5, FLIT Gen6).
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
# P2P copy through PCIe as a fraction of the link's rate: 53-56 GB/s measured on Gen5 x16 RTX PRO 6000 (63 rated)
# within a socket; 39-51 across the socket interconnect (reference topology.md, the field box).
PCIE_P2P_FRACTION = 0.86
PCIE_CROSS_SOCKET_FACTOR = 0.83
# No P2P (NVML P2P status not OK, e.g. CNS in a VM without the clique setting): copies are staged through host
# memory. Measured 11 GB/s against 27 with P2P on 2x RTX 3090 (Gen4 x16) (reference topology.md).
HOST_STAGED_FRACTION = 0.41
# NVLink rate per link and direction, GB/s, by compute capability major (NVLink 3 on A100: 12 links x 25 =
# 300 GB/s; NVLink 4 on Hopper: 18 x 25 = 450; NVLink 5 on Blackwell: 18 x 50 = 900; datasheets).
NVLINK_GBPS_PER_LINK = {8: 25.0, 9: 25.0, 10: 50.0}
# Between nodes: one NIC per GPU, GB/s per direction (400 Gb/s InfiniBand NDR / RoCE, the common GPU node),
# and what NCCL reaches of it over IB (nccl-tests on 400G fabrics: ~40 of 50 GB/s bus bandwidth).
INTER_NODE_GBPS = 50.0
INTER_NODE_EFFICIENCY = 0.80
INTER_NODE_LATENCY_US = 10.0

# NCCL ring allreduce bus bandwidth as a fraction of the slowest link of the group (nccl-tests busbw, large
# messages). PCIe, measured on 8 RTX PRO 6000 (aiconfigurator data, reference topology.md): 2 GPUs 38.6,
# 4 GPUs 26.4, 8 GPUs 24.7 GB/s over ~54 GB/s links (the host bridges are shared by the ring); with
# NCCL_P2P_LEVEL=SYS or NCCL_MIN_NCHANNELS=8 the 8-GPU figure was 37-42 over 45 GB/s cross-socket links.
PCIE_BUS_EFFICIENCY = {2: 0.71, 4: 0.49}          # n > 4 uses the 4-GPU figure
PCIE_BUS_EFFICIENCY_P2P_SYS = 0.88
# NVLink / NVSwitch: nccl-tests all_reduce_perf on DGX H100 reaches ~360 of 450 GB/s per direction.
NVLINK_BUS_EFFICIENCY = 0.80
# Small-message (8 KB) allreduce latency, microseconds: PCIe with P2P 6.8 / 13.5 / 26.7 us for 2 / 4 / 8 GPUs
# (~3.4 us per GPU, reference topology.md); NVLink with SGLang's custom allreduce (one-shot, ~2 us + ~0.8 us per
# GPU, sgl-kernel custom_all_reduce benchmarks); without P2P each ring step pays the host path (~14 us measured
# latency without P2P against ~0.4 us with it).
PCIE_LATENCY_US_PER_GPU = 3.4
NVLINK_LATENCY_US = (2.0, 0.8)
HOST_PATH_LATENCY_US_PER_STEP = 13.6

# SGLang facts the model relies on (sglang 0.5.9 / 0.5.23 source):
# - custom allreduce (lower latency) runs only on NVLink-connected groups or on exactly 2 PCIe GPUs
#   (distributed/device_communicators/custom_all_reduce.py: "not supported on more than two PCIe-only GPUs");
# - activations are bf16 between layers (2 bytes per element);
# - the vocabulary-parallel LM head all-gathers the logits over the TP group every step (LogitsProcessor);
# - PP sends hidden states and residual from each TP rank to the next stage's rank (pp_group.send_tensor_dict);
# - a batch larger than cuda_graph_max_bs runs without CUDA graphs (eager kernel launches);
# - pp > 1 turns the overlap scheduler off (server_args._handle_pipeline_parallelism).
ACTIVATION_BYTES = 2

# Kernel floors and tiles measured on a real H200 under CUDA graphs (tests/fixtures/real-gpu/: the records and the
# programs that took them; tests/unit/plugins/module_utils/test_plan_score_kernels.py replays them through the model):
# - a GEMM kernel costs at least ~4.5 us (no decode GEMM group of two kernels ran in under ~9 us, gemm_h200.json);
# - a fused-MoE grouped GEMM kernel (torch._grouped_mm / _scaled_grouped_mm over the routed experts) at least ~10 us
#   (12-13 us per kernel with under one expert's weights to read, moe_h200.json);
# - a decode attention kernel at least ~8 us (8.2-9.1 us for one request over 1k tokens, attention_h200.json);
# - decode GEMMs run 64-row tiles (Hopper's smallest tensor-core tile, wgmma M = 64): counting 128-row tiles
#   over-charged compute for small shards near m = 128 (ratios up to 1.7 in gemm_h200.json).
# - thin shards: a GEMM whose cut dimension per GPU is `width` reaches 1 / (1 + (SHARD_WIDTH / width)^2) of its
#   roofline. Measured as the ratio of each shard's time to its tp1 twin's at the same tokens (the width effect alone,
#   what a layout choice compares): dense pairs lose nothing measurable beyond their floors down to width 768, grouped
#   bf16 ones lose ~4% at 384 and ~25% at 192. The squared form and 110 fit those ratios best (median |log error|
#   0.049 over 288 ratios; the fitted hyperbola width / (width + w) the model had is at best 0.056, at w = 65, and
#   at its fitted 83.6 charged widths 384-1024 6-11% more than this: the TP-vs-EP margin of a tp4 MoE);
#   test_plan_score_kernels.py recomputes both.
# - a grouped (fused-MoE) kernel streams its experts at ~85% of the bandwidth a dense GEMM reaches (3.1-3.3 TB/s at
#   tp1 against 4.1-4.4; the best fraction for the grouped records, recomputed by the same test).
GEMM_KERNEL_US = 4.5
GROUPED_GEMM_KERNEL_US = 10.0
ATTENTION_KERNEL_US = 8.0
GEMM_TILE = (64, 128)
SHARD_WIDTH = 110.0
GROUPED_GEMM_BANDWIDTH = 0.85

# The fitted efficiencies: what kernels and SGLang's scheduler reach. Initial values are the usual figures
# (GEMM ~70% of dense peak on large shapes, streaming ~80% of memory bandwidth); tools/calibration.py fits them
# to tests/calibration/ and writes the fitted values here (a test recomputes the fit).
EFFICIENCY = {
    "gemm": 0.7,            # fraction of dense tensor peak a large GEMM reaches
    "attention": 0.5,       # fraction of bf16 peak the attention kernels reach on their FLOPs
    "memory": 0.8,          # fraction of memory bandwidth a streaming read reaches (weights, KV cache)
    "layer_us": 20.0,        # fixed GPU time per layer and forward with CUDA graphs beyond the per-kernel floors
    "eager_factor": 4.0,     # CPU launch time per layer without CUDA graphs, x layer_us (batch above cuda_graph_max_bs,
                             # prefill; overlaps the GPU's work, paid only beyond it; not measured: fitted)
    "step_ms": 1.5,          # scheduler CPU time per forward step (Python, per scheduler process)
    "request_us": 12.0,      # scheduler CPU time per running request and step
    "ep_skew": 0.3162,       # how much more routed work the busiest expert-parallel rank gets than the mean
}

# The model's error on the calibration set: the typical |log(predicted ratio / measured ratio)| between two
# measured layouts of one case (tools/calibration.py computes it; tests/unit recompute it). A margin between the
# top two layouts smaller than this is inside the model's error: measure (layout: tune).
MODEL_ERROR = 0.243


def gpu_perf(name, compute_capability=None):
    """The table row for a GPU: {bf16, fp8, fp4 (FLOP/s or None), memory (bytes/s), sms, match, source}.

    Unknown names fall back to their compute capability's generation (then `match` says which stand-in)."""
    lowered = str(name or "").lower()
    row, match = None, None
    for key, values in GPU_TABLE:
        if key.lower() in lowered:
            row, match = values, key
            break
    fallback = False
    if row is None:
        stand_in = GENERATION_DEFAULTS.get(str(compute_capability or ""), "H100")
        row = dict(GPU_TABLE)[stand_in]
        match, fallback = stand_in, True
    bf16, fp8, fp4, mem, sms, source = row
    return {
        "bf16": bf16 * 1e12, "fp8": fp8 * 1e12 if fp8 else None, "fp4": fp4 * 1e12 if fp4 else None,
        "memory": mem * 1e9, "sms": sms, "match": match, "source": source, "fallback": fallback,
    }


def nvlink_gbps_per_link(compute_capability):
    try:
        major = int(str(compute_capability).split(".", maxsplit=1)[0])
    except (TypeError, ValueError):
        major = 9
    return NVLINK_GBPS_PER_LINK.get(major, NVLINK_GBPS_PER_LINK[9] if major < 10 else NVLINK_GBPS_PER_LINK[10])


def pcie_gbps(gen, width):
    """Rated PCIe rate per direction of a link, GB/s (Gen5 x16 = 63)."""
    try:
        return PCIE_LANE_GBPS.get(int(gen), PCIE_LANE_GBPS[4]) * int(width)
    except (TypeError, ValueError):
        return PCIE_LANE_GBPS[4] * 16
