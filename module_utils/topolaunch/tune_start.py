"""What a server's start costs, in parts, and the cheaper start of a tune candidate.

Plain Python 3.9+ stdlib. A start is (the parts the plan predicts, before anything runs):

    other       what every start spends besides (OTHER_S)
    weights     the checkpoint read: the bytes one replica's ranks hold (weights per GPU x tp x pp; replicas read
                the same files at once) at THREADED_READ_BYTES_PER_S with the release's multi-threaded loader
                (LOADER facts: model_loader_extra_config {"enable_multithread_load": true}; 0.5.9 loads
                single-threaded by default, 0.5.23 multi-threaded), MULTITHREAD_SPEEDUP times slower without
    capture     CUDA-graph capture: CAPTURE_S_PER_SIZE for each batch size (decode) or token count (0.5.23's
                prefill graph) the release captures, the lists read from its source (CUDA_GRAPH facts, through
                planner.sglang_memory_defaults: e.g. 52 decode sizes up to 512 on 96 GB GPUs at tp >= 4)

A tune candidate (tune.py) only has to serve its short bench, at the workload's concurrency (roles/tune: bench
concurrency [workload concurrency]): it starts with the decode graph captured for that batch size only (the
release's --cuda-graph-bs / --cuda-graph-bs-decode, CUDA_GRAPH bs_arg; a smaller batch replays it padded, as
SGLang pads to the next captured size) and with the multi-threaded loader where the release's default is off. The
winner is launched afterwards with the normal settings (the operator's server args only). A server arg the
operator set for these (the graph's sizes, its max size, graphs off, the loader's config) is kept.

The figures (stated; a box differs) are the field's knowledge base's (known_combinations.KB_NAME, Startup time):
GLM-5 NVFP4 (440 GB) on 8 RTX PRO 6000 starts in 7-8 minutes, of which the multi-threaded load (16 threads) takes
~36 s and CUDA-graph capture ~208 s. That launch captured --cuda-graph-max-bs 32 with NEXTN: the speculative list
1-8, 10-32 by 2 (20 sizes, draft graphs included), so a size costs ~10 s there (an upper bound without speculative
decoding). The rest (~206 s: process start, kernel JIT, NCCL, the KV pool) is the same for every start. The
single-threaded read is MULTITHREAD_SPEEDUP times slower: an assumption, not a measurement.
"""
import json

from . import planner, tune_backends

KB_START_S = 450.0           # "Total startup ~7-8 minutes"
KB_LOAD_S = 36.0             # "Model load (multithread, 16 threads) ~36 seconds"
KB_CAPTURE_S = 208.0         # "CUDA graph capture ~208 seconds"
KB_CAPTURED_SIZES = 20       # --cuda-graph-max-bs 32 with speculative decoding: list(range(1, 9)) + range(10, 33, 2)
KB_CHECKPOINT_BYTES = 440e9  # GLM-5 NVFP4's model.safetensors.index.json total_size ("NVFP4 weights: ~440 GB")
CAPTURE_S_PER_SIZE = KB_CAPTURE_S / KB_CAPTURED_SIZES
OTHER_S = KB_START_S - KB_LOAD_S - KB_CAPTURE_S
THREADED_READ_BYTES_PER_S = KB_CHECKPOINT_BYTES / KB_LOAD_S
MULTITHREAD_SPEEDUP = 2.0


def _multithreaded(loader, values):
    """Whether the release's default loader reads multi-threaded under these server args."""
    raw = values.get(loader["arg"])
    try:
        given = json.loads(raw) if isinstance(raw, str) else (raw or {})
    except ValueError:
        given = {}
    return bool(given.get(loader["switch"], loader["default_on"])) if isinstance(given, dict) else \
        loader["default_on"]


def start_parts(facts, gpu_bytes, layout, weights_per_gpu_bytes, values):
    """The predicted start of `layout` ({tp, pp}) under these server args (field names) with the SGLang release of
    `facts`: {other_s, weights_s, multithread, decode_sizes, prefill_sizes (counts), capture_s, total_s}."""
    tp, pp = layout["tp"], layout["pp"]
    defaults = planner.sglang_memory_defaults(gpu_bytes, tp, pp, values, facts)
    threaded = _multithreaded(facts.LOADER, values)
    weights = weights_per_gpu_bytes * tp * pp / THREADED_READ_BYTES_PER_S * (1.0 if threaded else MULTITHREAD_SPEEDUP)
    decode, prefill = len(defaults["decode_graph_sizes"]), len(defaults["prefill_graph_sizes"])
    capture = (decode + prefill) * CAPTURE_S_PER_SIZE
    return {"other_s": round(OTHER_S, 1), "weights_s": round(weights, 1), "multithread": threaded,
            "decode_sizes": decode, "prefill_sizes": prefill, "capture_s": round(capture, 1),
            "total_s": round(OTHER_S + weights + capture, 1)}


def candidate_server_args(facts, values, batch_sizes):
    """The server args a tune candidate adds to the operator's (`values`): the decode graph for `batch_sizes` only,
    the multi-threaded loader where the release's default is off. Keys the operator set (under any of the graph's
    names) are left alone."""
    graph, loader, out = facts.CUDA_GRAPH, facts.LOADER, {}
    graph_keys = [graph["bs_arg"], graph["max_bs_arg"]] + list(graph["disable_args"]) + \
        ([graph["backend_arg"]] if graph["backend_arg"] else [])
    if batch_sizes and not any(values.get(k) not in (None, False) for k in graph_keys):
        out[graph["bs_arg"]] = sorted(set(int(b) for b in batch_sizes))
    if not loader["default_on"] and values.get(loader["arg"]) is None:
        out[loader["arg"]] = json.dumps({loader["switch"]: True})
    return out


def tune_cost(facts, gpu_bytes, candidates, measure, values, batch_sizes):
    """The start costs of a tune: each layout to measure as a candidate (candidate_server_args) and as a normal
    launch, and the winner's normal launch after. candidates: the plan's table (tp, pp, weights_per_gpu_bytes).
    Returns {batch_sizes, server_args (what a candidate adds), layouts: {name: {candidate, normal}}, candidates_s
    (the starts of the layouts measured), saved_s (against measuring them with normal starts), winner_s (the
    slowest normal start among them: the winner's relaunch), total_s, figures (the constants)}."""
    extra = candidate_server_args(facts, values, batch_sizes)
    by_name = {c["name"]: c for c in candidates}
    layouts = {}
    for name in measure:
        c = by_name[tune_backends.base_layout(name)]   # a backend or speculative variant starts as its layout
        layouts[name] = {"candidate": start_parts(facts, gpu_bytes, c, c["weights_per_gpu_bytes"],
                                                  dict(values, **extra)),
                         "normal": start_parts(facts, gpu_bytes, c, c["weights_per_gpu_bytes"], values)}
    spent = sum(p["candidate"]["total_s"] for p in layouts.values())
    normal = sum(p["normal"]["total_s"] for p in layouts.values())
    winner = max((p["normal"]["total_s"] for p in layouts.values()), default=0.0)
    return {"batch_sizes": sorted(set(batch_sizes)), "server_args": extra, "layouts": layouts,
            "candidates_s": round(spent, 1), "saved_s": round(normal - spent, 1), "winner_s": round(winner, 1),
            "total_s": round(spent + winner, 1),
            "figures": {"capture_s_per_size": round(CAPTURE_S_PER_SIZE, 2), "other_s": round(OTHER_S, 1),
                        "threaded_read_gb_per_s": round(THREADED_READ_BYTES_PER_S / 1e9, 2),
                        "multithread_speedup": MULTITHREAD_SPEEDUP}}


def cost_lines(cost):
    """The tune's start costs as the plan report's lines."""
    args = ", ".join("%s=%s" % kv for kv in sorted(cost["server_args"].items())) or "nothing (the operator set it)"
    lines = ["tune: each candidate starts with %s; the winner is launched again with the normal settings" % args]
    for name, parts in cost["layouts"].items():
        cand, norm = parts["candidate"], parts["normal"]
        lines.append("tune: %s starts in ~%.0f s as a candidate (weights %.0f s%s, %d graph sizes %.0f s) instead "
                     "of ~%.0f s (weights %.0f s, %d graph sizes %.0f s)" % (
                         name, cand["total_s"], cand["weights_s"], " multi-threaded" if cand["multithread"] else "",
                         cand["decode_sizes"] + cand["prefill_sizes"], cand["capture_s"], norm["total_s"],
                         norm["weights_s"], norm["decode_sizes"] + norm["prefill_sizes"], norm["capture_s"]))
    lines.append("tune: predicted starts %.0f s for the candidates (%.0f s saved) + %.0f s for the winner's launch "
                 "= %.0f s, benches not counted (the field box's figures: %.0f s per start besides, %.1f s per "
                 "captured size, %.1f GB/s threaded read)" % (
                     cost["candidates_s"], cost["saved_s"], cost["winner_s"], cost["total_s"],
                     cost["figures"]["other_s"], cost["figures"]["capture_s_per_size"],
                     cost["figures"]["threaded_read_gb_per_s"]))
    return lines
