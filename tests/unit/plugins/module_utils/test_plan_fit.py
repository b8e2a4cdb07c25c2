"""module_utils/plan_fit.py: the fit machinery (shared with the calibration set) and the fit of one machine - the
constants its measured ratios determine, fitted, its error before and after, a poor fit said to be poor, kept while
the measurements it was made from stay, used by the planner for the layouts not measured."""
import math

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import plan_fit, plan_perf, planner
from plan_cases import model_path, synth_facts

LAB = {"input_len": 64, "output_len": 16, "concurrency": 4}
LAYOUTS = ("tp8ep8", "tp4pp2", "tp2pp4", "tp1pp8")


@pytest.fixture(scope="module")
def vnuma(tmp_path_factory):
    return synth_facts("proxmox-8x-rtx-pro-6000-vnuma", tmp_path_factory.mktemp("vnuma"))


def request(vnuma, **kw):
    return planner.PlanRequest(topology=vnuma, model_path=model_path("glm-5-nvfp4"), workload=LAB, **kw)


def truth_records(vnuma, truth, workloads=(LAB,), layouts=LAYOUTS, scale=7.0):
    """Measured records of a machine whose true constants are `truth`, running `scale` x the model."""
    records = []
    for w in workloads:
        fields = {"topology": vnuma, "model_path": model_path("glm-5-nvfp4"), "workload": w}
        for name, cand in zip(layouts, planner.evaluate_layouts(planner.PlanRequest(**fields),
                                                                [planner.parse_layout(n) for n in layouts])):
            records.append({"model": "glm-5-nvfp4", "topology_fingerprint": vnuma["fingerprint"], "layout": name,
                            "max_concurrency": w["concurrency"], "input_len": w["input_len"],
                            "output_len": w["output_len"], "run_id": "r-%s-%d" % (name, w["concurrency"]),
                            "output_throughput": scale * plan_fit.predict(cand["estimate"]["inputs"], truth)})
    return records


def test_the_search_finds_a_minimum_and_refines_it():
    objective = lambda eff: (math.log(eff["gemm"]) - math.log(0.5)) ** 2 + (math.log(eff["step_ms"]) - math.log(4.0)) ** 2
    coarse = plan_fit.coordinate_search(objective, plan_perf.EFFICIENCY, ["gemm", "step_ms"])
    fine = plan_fit.coordinate_search(objective, plan_perf.EFFICIENCY, ["gemm", "step_ms"], refine=2)
    assert objective(fine) < objective(coarse)
    assert fine["gemm"] == pytest.approx(0.5, rel=0.01) and fine["step_ms"] == pytest.approx(4.0, rel=0.02)
    assert fine["memory"] == plan_perf.EFFICIENCY["memory"]       # constants not searched stay


def test_a_machine_fit_recovers_what_the_measurements_determine(vnuma):
    truth = dict(plan_perf.EFFICIENCY, step_ms=plan_perf.EFFICIENCY["step_ms"] * 4)
    two = [LAB, dict(LAB, concurrency=1)]
    points = plan_fit.machine_points(request(vnuma), truth_records(vnuma, truth, two))
    assert len(points) == 8
    fit = plan_fit.fit_machine(points)
    assert fit["ratios"] == 6 and "step_ms" in fit["constants"]
    assert fit["efficiency"]["step_ms"] == pytest.approx(truth["step_ms"], rel=0.15)
    assert fit["error_after"] < 0.2 * fit["error_before"] and fit["error_after"] <= plan_perf.MODEL_ERROR
    assert fit["quality"] == "good" and fit["why"] == ""
    # the machine's absolute speed (7x the model) is not a ratio: nothing to fit when the constants are right
    exact = plan_fit.fit_machine(plan_fit.machine_points(request(vnuma), truth_records(vnuma, plan_perf.EFFICIENCY)))
    assert exact["error_before"] == pytest.approx(0.0, abs=1e-3) and exact["efficiency"] == {}


def test_few_points_make_a_poor_fit_and_one_layout_none(vnuma):
    truth = dict(plan_perf.EFFICIENCY, step_ms=plan_perf.EFFICIENCY["step_ms"] * 4)
    records = truth_records(vnuma, truth, layouts=("tp8ep8", "tp4pp2"))
    fit = plan_fit.fit_machine(plan_fit.machine_points(request(vnuma), records))
    assert fit["ratios"] == 1 and len(fit["constants"]) <= 1
    assert fit["quality"] == "poor" and fit["why"].startswith("few points: 1 independent ratio between measured")
    one = plan_fit.fit_machine(plan_fit.machine_points(request(vnuma), records[:1]))
    assert one["quality"] == "none" and one["efficiency"] == {} and "two layouts measured at one workload" in one["why"]


def test_only_constants_that_move_the_ratios_are_determined(vnuma):
    # no layout with expert parallelism measured: ep_skew cannot move any ratio; the memory efficiency scales every
    # layout's weight reads alike
    points = plan_fit.machine_points(request(vnuma), truth_records(vnuma, plan_perf.EFFICIENCY,
                                                                   layouts=("tp8", "tp4pp2", "tp2pp4", "tp1pp8")))
    keys = plan_fit.determined_constants(points, plan_perf.EFFICIENCY, 9)
    assert keys and "ep_skew" not in keys and len(keys) <= 3


def test_plan_with_fit_makes_keeps_and_remakes_the_fit(vnuma):
    truth = dict(plan_perf.EFFICIENCY, step_ms=plan_perf.EFFICIENCY["step_ms"] * 4)
    records = truth_records(vnuma, truth, layouts=("tp8ep8", "tp4pp2", "tp2pp4"))
    plan, fit = plan_fit.plan_with_fit(request(vnuma, measured=records))
    assert fit["model"] == "glm-5-nvfp4" and fit["topology_fingerprint"] == vnuma["fingerprint"]
    assert fit["basis"] == plan_fit.basis_of(records) and plan["fit"]["basis"] == fit["basis"]
    assert plan["fit"]["efficiency"] == fit["efficiency"] != {}
    by_name = {c["name"]: c for c in plan["candidates"] if c["valid"]}
    assert by_name["tp8"]["estimate"]["unfitted_tokens_per_s"] != by_name["tp8"]["estimate"]["tokens_per_s"]
    assert plan["source"] == "measured"                           # a fit never overrides a measurement
    # the same measurements and the fit made from them: used as it is, nothing new to save
    again, new = plan_fit.plan_with_fit(request(vnuma, measured=records, fits=[fit]))
    assert new is None and again["fit"] == plan["fit"]
    # one more measurement: a new fit
    more = records + truth_records(vnuma, truth, layouts=("tp1pp8",))
    _, remade = plan_fit.plan_with_fit(request(vnuma, measured=more, fits=[fit]))
    assert remade is not None and len(remade["basis"]) == 4
    # no measurements of this machine: no fit
    elsewhere = [dict(r, topology_fingerprint="000000000000") for r in records]
    assert plan_fit.plan_with_fit(request(vnuma, measured=elsewhere))[1] is None


def test_the_planner_uses_the_fit_of_this_machine_only_and_refuses_a_broken_one(vnuma):
    fit = {"model": "glm-5-nvfp4", "topology_fingerprint": vnuma["fingerprint"], "efficiency": {"step_ms": 6.0},
           "quality": "poor", "why": "few points"}
    base = planner.plan(request(vnuma))
    fitted = planner.plan(request(vnuma, fits=[dict(fit, topology_fingerprint="000000000000"), fit]))
    assert "fit" not in base and fitted["fit"]["efficiency"] == {"step_ms": 6.0}
    before = {c["name"]: c["estimate"] for c in base["candidates"] if c["valid"]}
    after = {c["name"]: c["estimate"] for c in fitted["candidates"] if c["valid"]}
    assert all(after[n]["unfitted_tokens_per_s"] == before[n]["tokens_per_s"] for n in before)
    assert after["tp4pp2"]["tokens_per_s"] < before["tp4pp2"]["tokens_per_s"]   # PP pays the scheduler's CPU time
    other = planner.plan(request(vnuma, fits=[dict(fit, topology_fingerprint="000000000000")]))
    assert "fit" not in other
    with pytest.raises(planner.PlanError) as exc:
        planner.plan(request(vnuma, fits=[dict(fit, efficiency={"step_ms": -1, "warp": 2.0})]))
    assert exc.value.reasons == ["fits[0] (glm-5-nvfp4 on %s): efficiency needs plan_perf.EFFICIENCY names with "
                                 "positive numbers, got step_ms=-1, warp=2.0" % vnuma["fingerprint"]]


def test_fits_and_measurements_of_a_bad_shape_are_named(vnuma):
    # measured and fits are read by one loop (planner._records_of_machine): each names its own field
    with pytest.raises(planner.PlanError) as exc:
        planner.plan(request(vnuma, fits={"model": "glm-5-nvfp4"}, measured=["tp8"]))
    assert sorted(exc.value.reasons) == ["fits must be a list of records, got dict",
                                         "measured[0] must be a mapping, got 'tp8'"]
