"""The performance model's kernel times against real-GPU records (tests/fixtures/real-gpu/, an H200 under CUDA
graphs): decode GEMM pairs (gemm_h200.json), fused-MoE grouped GEMMs (moe_h200.json) and decode attention
(attention_h200.json). Each record is replayed through the same functions stage_time uses, with the committed
efficiencies; the model's time must be within the stated tolerance of the measured one.

Tolerance, per family: median |log(model / measured)| <= 0.15 and its 90th percentile <= 0.30 (a 35% miss);
fp8 grouped GEMMs only median <= 0.35: torch's fp8 grouped kernel loses far more than bf16 on thin expert shards
(0.5-1 TB/s at tp8), a gap the model does not claim to close (SGLang's own fused_moe kernel is not measured).
"""
import json
import math
import pathlib
import types

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import plan_perf, plan_score

RECORDS = pathlib.Path(__file__).resolve().parents[3] / "fixtures" / "real-gpu"
GPU = plan_perf.gpu_perf("NVIDIA H200")
EFF = plan_perf.EFFICIENCY
TOLERANCE = {"median": 0.15, "p90": 0.30}
FP8_GROUPED_MEDIAN = 0.35


def _load(name):
    return json.loads((RECORDS / name).read_text())


def _peak(dtype):
    return GPU[dtype] * EFF["gemm"]


def _hbm():
    return GPU["memory"] * EFF["memory"]


def dense_errors():
    out = []
    for r in _load("gemm_h200.json")["rows"]:
        if "seconds" not in r:
            continue
        (cols, rows), tp = r["gemms"][0], r["tp"]
        local = (r["hidden"] * cols + rows * r["hidden"]) / float(tp)
        t = plan_score.dense_gemm_time(local, r["width"] / float(tp), r["m"], r["hidden"],
                                       1 if r["dtype"] == "fp8" else 2, _peak(r["dtype"]), _hbm(), GPU["sms"])[0]
        out.append((math.log(t / r["seconds"]), r))
    return out


def moe_errors():
    out = []
    for r in _load("moe_h200.json")["moe"]:
        if "seconds" not in r:
            continue
        h, inter = r["hidden"], r["intermediate"]
        shape = types.SimpleNamespace(experts=r["experts"], top_k=r["top_k"], expert=3.0 * h * inter,
                                      expert_width=float(inter))
        tp, ep = r["n"], (r["n"] if r["split"] == "ep" else 1)
        t = plan_score.moe_gemm_time(shape, tp, ep, r["m"], 1 if r["dtype"] == "fp8" else 2, _peak(r["dtype"]),
                                     _hbm(), GPU["sms"])[0]
        out.append((math.log(t / r["seconds"]), r))
    return out


def attention_errors():
    """Per shape the faster of the two measured kernels (SDPA flash, Triton paged split-KV): SGLang picks its
    fastest backend too."""
    best = {}
    for r in _load("attention_h200.json")["attention"]:
        if "seconds" in r:
            key = (r["shape"], r["tp"], r["batch"], r["ctx"])
            if key not in best or r["seconds"] < best[key]["seconds"]:
                best[key] = r
    out = []
    for r in best.values():
        flops = 2.0 * r["batch"] * r["heads"] * 2 * r["head_dim"] * r["ctx"]    # QK and PV, as stage_time counts
        t = plan_score.attention_time(flops, r["kv_bytes"], GPU["bf16"] * EFF["attention"], _hbm(), GPU["sms"])[0]
        out.append((math.log(t / r["seconds"]), r))
    return out


def _stats(errors):
    a = sorted(abs(e) for e, _ in errors)
    return {"n": len(a), "median": a[len(a) // 2], "p90": a[int(0.9 * (len(a) - 1))], "max": a[-1]}


def families():
    moe = moe_errors()
    return {"dense GEMMs": dense_errors(),
            "grouped GEMMs bf16": [x for x in moe if x[1]["dtype"] == "bf16"],
            "decode attention": attention_errors()}, [x for x in moe if x[1]["dtype"] == "fp8"]


def misses():
    fams, fp8 = families()
    out = []
    for name, errors in fams.items():
        s = _stats(errors)
        if s["median"] > TOLERANCE["median"] or s["p90"] > TOLERANCE["p90"]:
            out.append("%s: median %.3f, p90 %.3f over %d records" % (name, s["median"], s["p90"], s["n"]))
    s = _stats(fp8)
    if s["median"] > FP8_GROUPED_MEDIAN:
        out.append("grouped GEMMs fp8: median %.3f over %d records" % (s["median"], s["n"]))
    return out


def test_the_records_cover_the_shapes_the_issue_asks_for():
    fams, fp8 = families()
    assert len(fams["dense GEMMs"]) == 192 and len(fams["grouped GEMMs bf16"]) == 90 and len(fp8) == 90
    assert len(fams["decode attention"]) == 96
    attn = _load("attention_h200.json")
    assert {r["kernel"] for r in attn["attention"]} == {"sdpa_flash", "triton_paged"}
    # the Triton paged kernel was checked against SDPA on every shape
    assert max(r["max_abs_err"] for r in attn["attention"] if r["kernel"] == "triton_paged") < 0.01


def test_kernel_times_match_the_h200_records():
    assert misses() == []


@pytest.mark.parametrize("floors, tile", [((0.0, 0.0, 0.0), (64, 128)), ((4.5, 10.0, 8.0), (128, 128)),
                                          ((0.0, 0.0, 0.0), (128, 128))])
def test_without_the_floors_or_with_128_row_tiles_the_records_are_missed(monkeypatch, floors, tile):
    """The model before the floors (no per-kernel floor, 128-row tiles) misses the records: the test can fail."""
    for name, value in zip(("GEMM_KERNEL_US", "GROUPED_GEMM_KERNEL_US", "ATTENTION_KERNEL_US"), floors):
        monkeypatch.setattr(plan_perf, name, value)
    monkeypatch.setattr(plan_perf, "GEMM_TILE", tile)
    assert misses()


def width_ratio_errors():
    """log(model ratio / measured ratio) of every shard's time to its tp1 twin's (same shape, dtype and tokens):
    how a GEMM's time changes with its width per GPU alone, the part of the records a layout choice compares
    (TP against EP of one MoE, tp4 against tp8), free of the absolute level the efficiencies set."""
    out = []
    moe = {(r["shape"], r["dtype"], r["split"], r["n"], r["m"]): e for e, r in moe_errors()}
    for (shape, dtype, split, n, m), e in moe.items():
        if (split, n) != ("tp", 1):
            out.append(e - moe[(shape, dtype, "tp", 1, m)])
    dense = {(r["shape"], r["dtype"], r["tp"], r["m"]): e for e, r in dense_errors()}
    for (shape, dtype, tp, m), e in dense.items():
        if tp != 1:
            out.append(e - dense[(shape, dtype, 1, m)])
    return sorted(abs(e) for e in out)


def _median(values):
    return values[len(values) // 2]


def test_the_shard_width_is_the_records_best(monkeypatch):
    """plan_perf.SHARD_WIDTH is where the width ratios are best (within 0.002 over 60-200), and the squared form
    beats the hyperbola width / (width + w) the model had at any w: measured, not fitted to the calibration set."""
    committed = _median(width_ratio_errors())
    assert len(width_ratio_errors()) == 288
    for width in range(60, 210, 10):
        monkeypatch.setattr(plan_perf, "SHARD_WIDTH", float(width))
        assert _median(width_ratio_errors()) >= committed - 0.002, width
    monkeypatch.undo()
    for width in (40, 60, 80, 110, 135, 170):
        monkeypatch.setattr(plan_score, "shard_efficiency", lambda w, s=width: w / (w + s))
        assert _median(width_ratio_errors()) > committed + 0.005, width


def test_the_grouped_bandwidth_is_the_records_best(monkeypatch):
    """plan_perf.GROUPED_GEMM_BANDWIDTH (a fused-MoE kernel streams at that fraction of a dense GEMM's bandwidth) is
    within 0.01 of the best fraction for the bf16 grouped records; without it (1.0) they are missed."""
    def grouped_median():
        return _stats([x for x in moe_errors() if x[1]["dtype"] == "bf16"])["median"]

    committed = grouped_median()
    for fraction in (0.75, 0.8, 0.85, 0.9, 0.95):
        monkeypatch.setattr(plan_perf, "GROUPED_GEMM_BANDWIDTH", fraction)
        assert grouped_median() >= committed - 0.01, fraction
    monkeypatch.setattr(plan_perf, "GROUPED_GEMM_BANDWIDTH", 1.0)
    assert misses()
