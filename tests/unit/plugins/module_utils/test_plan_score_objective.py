"""The workload's objective (issue 24 items 3 and 4): concurrency max (what every replica admits) and latency
targets (slo: p99 TTFT, median TPOT), through the planner's estimate, ranking and measured results."""
import pytest

from plan_cases import model_path, synth_facts
from ansible_collections.topolaunch.sglang.plugins.module_utils import plan_score, planner, tune

VNUMA = "proxmox-8x-rtx-pro-6000-vnuma"
MODEL = "glm-4.7"


@pytest.fixture(scope="module")
def vnuma(tmp_path_factory):
    return synth_facts(VNUMA, tmp_path_factory.mktemp("vnuma"))


def plan(facts, workload, **kwargs):
    return planner.plan(planner.PlanRequest(topology=facts, model_path=model_path(MODEL), workload=workload,
                                            **kwargs))


def valid(result):
    return {c["name"]: c for c in result["candidates"] if c["valid"]}


@pytest.mark.parametrize("workload, words", [
    ({"concurrency": "maximum"}, "workload.concurrency must be a positive integer or max, got 'maximum'"),
    ({"slo": {"ttft_ms": 0}}, "workload.slo.ttft_ms must be a positive number of milliseconds, got 0"),
    ({"slo": {"tpot_ms": -5}}, "workload.slo.tpot_ms must be a positive number of milliseconds, got -5"),
    ({"output_len": 0, "slo": {"ttft_ms": 500}}, "workload.slo: an SLO needs a workload with output tokens"),
    ({"output_len": 1, "slo": {"tpot_ms": 20}}, "workload.slo.tpot_ms: time per output token needs"),
    ({"slo": {"ttft_ms": 500, "ttft_percentile": 95}}, "workload.slo.ttft_percentile must be one of 50, 99"),
    ({"slo": {}}, None), ({"slo": {"p99": 1}}, "workload.slo has unknown keys p99"),
])
def test_bad_objectives_are_one_line_naming_the_field(workload, words):
    checked, reasons = plan_score.check_workload(workload)
    if words is None:
        assert reasons == [] and "slo" not in checked
        return
    assert any(words in r for r in reasons), reasons
    assert all("\n" not in r for r in reasons)


def test_an_slo_from_strings_and_its_percentiles():
    checked, reasons = plan_score.check_workload({"concurrency": "max", "slo": {"ttft_ms": "500"}})
    assert reasons == [] and checked["concurrency"] == "max"
    assert checked["slo"] == {"ttft_ms": 500.0, "tpot_ms": None, "ttft_percentile": 99, "tpot_percentile": 50}


def test_max_is_what_every_replica_admits(vnuma):
    result = plan(vnuma, {"concurrency": "max"})
    for c in valid(result).values():
        est = c["estimate"]
        admitted = min(est["kv_capacity_requests"] // c["dp"], 4096) * c["dp"]
        assert est["concurrency"] == min(admitted, plan_score.MAX_IN_FLIGHT)
        assert est["batch"] == est["concurrency"]
    assert result["concurrency"] == result["estimate"]["concurrency"]
    assert "max: what every replica admits" in result["reason"]


def test_every_estimate_predicts_ttft_and_tpot_and_they_grow_with_the_load(vnuma):
    one, many = valid(plan(vnuma, {"concurrency": 1})), valid(plan(vnuma, {"concurrency": 256}))
    for name, c in one.items():
        low, high = c["estimate"], many[name]["estimate"]
        assert 0 < low["tpot_ms"] < high["tpot_ms"] and 0 < low["ttft_ms"] < high["ttft_ms"]
        # throughput = requests in flight / TPOT (the tokens every user gets)
        assert high["tokens_per_s"] == pytest.approx(high["batch"] * high["tokens_per_user"], rel=0.01)


def test_with_an_slo_each_layout_runs_at_the_highest_concurrency_that_meets_it(vnuma):
    free = valid(plan(vnuma, {"concurrency": 128}))
    tpot = sorted(c["estimate"]["tpot_ms"] for c in free.values())[len(free) // 2]   # a target some layouts miss
    result = plan(vnuma, {"concurrency": 128, "slo": {"tpot_ms": tpot}})
    for name, c in valid(result).items():
        est = c["estimate"]
        if est["slo"]["met"]:
            assert est["tpot_ms"] <= tpot and est["concurrency"] <= 128
            if est["concurrency"] < 128:    # one request more misses it
                more = plan(vnuma, {"concurrency": est["concurrency"] + 1}, layout=name)["estimate"]
                assert more["tpot_ms"] > tpot
    ranked = [c for c in result["candidates"] if c["valid"]]
    met = [c["estimate"]["tokens_per_s"] for c in ranked if c["estimate"]["slo"]["met"]]
    assert met == sorted(met, reverse=True) and result["layout"]["name"] == ranked[0]["name"]
    assert result["concurrency"] == ranked[0]["estimate"]["concurrency"]


def test_a_layout_that_misses_the_slo_at_concurrency_one_ranks_last_with_the_reason(vnuma):
    one = valid(plan(vnuma, {"concurrency": 1}))
    tpots = sorted(c["estimate"]["tpot_ms"] for c in one.values())
    target = (tpots[0] + tpots[-1]) / 2.0
    result = plan(vnuma, {"concurrency": "max", "slo": {"tpot_ms": target}})
    ranked = [c for c in result["candidates"] if c["valid"]]
    missed = [planner.slo_missed(c) is not None for c in ranked]
    assert any(missed) and not missed[0] and missed == sorted(missed)     # misses after every layout that meets it
    slow = next(c for c in ranked if planner.slo_missed(c))
    assert slow["estimate"]["concurrency"] == 1
    assert "cannot meet the SLO even at concurrency 1: predicted TPOT" in slow["estimate"]["slo"]["reason"]
    assert tune.select(result["candidates"])["rows"][-1]["status"] == "misses the SLO"


def test_no_layout_meets_the_slo_is_warned(vnuma):
    result = plan(vnuma, {"concurrency": 8, "slo": {"ttft_ms": 0.001}})
    assert any("no valid layout meets the SLO p99 TTFT <= 0.001 ms" in w for w in result["warnings"])


def measured(layout, conc, tput, **figures):
    return dict({"model": MODEL, "layout": layout, "max_concurrency": conc, "output_throughput": tput,
                 "input_len": 1024, "output_len": 1024}, **figures)


def test_measurements_are_judged_on_the_slo(vnuma):
    fp = plan(vnuma, {"concurrency": 64})["topology_fingerprint"]
    records = [dict(r, topology_fingerprint=fp) for r in (
        measured("tp8", 64, 900.0, ttft_p99_ms=300.0, tpot_p50_ms=80.0),      # fastest, misses TPOT 50
        measured("tp4pp2", 32, 600.0, ttft_p99_ms=250.0, tpot_p50_ms=45.0),   # meets it
        measured("tp4pp2", 128, 950.0, ttft_p99_ms=200.0, tpot_p50_ms=40.0),  # above the workload's concurrency
    )]
    result = plan(vnuma, {"concurrency": 64, "slo": {"tpot_ms": 50}}, measured=records)
    assert result["layout"]["name"] == "tp4pp2" and result["source"] == "measured" and result["concurrency"] == 32
    tp8 = valid(result)["tp8"]
    assert tp8["measured"]["slo_met"] is False and planner.slo_missed(tp8) == "measured: measured p50 TPOT 80.0 ms > 50 ms"
    ranked = [c["name"] for c in result["candidates"] if c["valid"]]
    assert ranked.index("tp8") > ranked.index("tp8ep8")          # after the unmeasured layouts that may meet it
    assert "tp8" not in tune.select(result["candidates"])["chosen"]
    # without the SLO the fastest measurement at the workload's concurrency wins
    assert plan(vnuma, {"concurrency": 64}, measured=records)["layout"]["name"] == "tp8"


def test_saturating_measurements_count_from_the_layouts_saturating_concurrency(vnuma):
    first = plan(vnuma, {"concurrency": "max"})
    name, need, fp = first["layout"]["name"], first["concurrency"], first["topology_fingerprint"]
    short = [dict(measured(name, need - 1, 5000.0), topology_fingerprint=fp)]
    assert plan(vnuma, {"concurrency": "max"}, measured=short)["source"] == "model"
    full = [dict(measured(name, need, 5000.0), topology_fingerprint=fp)]
    assert plan(vnuma, {"concurrency": "max"}, measured=full)["source"] == "measured"


# The lab's SLO tune (tests/lab/test_tune.py test_a_tune_with_an_slo_ends_on_the_fastest_layout_that_meets_it):
# the lab workload at concurrency 32 with these targets.
LAB_SLO = {"input_len": 64, "output_len": 16, "concurrency": 32, "slo": {"ttft_ms": 400, "tpot_ms": 60}}


def test_the_lab_slo_tune_plans_its_two_layouts_far_apart(tmp_path):
    """What the lab's SLO tune relies on: on the field box glm-5-nvfp4 tp4pp2 is planned near the workload's 32
    requests and tp1pp8 (slow prompts through 8 stages) at 3 or fewer, so that tp4pp2 measures the faster one even
    when the simulator's speed knob makes it miss the TPOT target and tp1pp8 meet both."""
    facts = synth_facts("proxmox-8x-rtx-pro-6000-vnuma", tmp_path)
    result = planner.plan(planner.PlanRequest(topology=facts, model_path=model_path("glm-5-nvfp4"), workload=LAB_SLO,
                                              sglang_version="0.5.23"))
    planned = {c["name"]: c["estimate"] for c in result["candidates"] if c["valid"]}
    assert planned["tp4pp2"]["concurrency"] >= 16 and planned["tp4pp2"]["slo"]["met"]
    assert planned["tp1pp8"]["concurrency"] <= 3
