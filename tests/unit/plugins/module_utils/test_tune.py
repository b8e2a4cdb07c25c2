"""module_utils/tune.py: which layouts a tune measures - the top one and those within the model's error of it, EP
variants of one shape once, at most tune_max, measured ones and those that failed to start not again."""
import math

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import plan_perf, planner, tune
from plan_cases import model_path, synth_facts

LAB = {"input_len": 64, "output_len": 16, "concurrency": 4}
# the model's error as the plan and the tune print it (plan_perf.MODEL_ERROR, recomputed by the calibration)
ERROR_PCT = "%.0f%%" % (100 * (math.exp(plan_perf.MODEL_ERROR) - 1))


@pytest.fixture(scope="module")
def vnuma(tmp_path_factory):
    return synth_facts("proxmox-8x-rtx-pro-6000-vnuma", tmp_path_factory.mktemp("vnuma"))


def cand(name, estimate, measured=None, valid=True):
    layout = planner.parse_layout(name)
    out = dict(layout, name=name, valid=valid, reasons=[] if valid else ["does not fit"],
               estimate={"tokens_per_s": estimate} if valid else None)
    if measured is not None:
        out["measured"] = {"output_throughput": measured, "max_concurrency": 4, "simulated": True}
    return out


def test_the_field_box_at_the_lab_workload(vnuma):
    """The model puts nine layouts within its error of the top one: the top one and the next within its error, EP
    variants of a shape within 5% of each other once (the model cannot tell them apart), at most three."""
    plan = planner.plan(planner.PlanRequest(topology=vnuma, model_path=model_path("glm-5-nvfp4"), workload=LAB))
    estimates = {c["name"]: c["estimate"]["tokens_per_s"] for c in plan["candidates"] if c["valid"]}
    out = tune.select(plan["candidates"])
    top = max(estimates.values())
    assert out["measure"] == out["chosen"] == ["tp4pp2", "tp8", "tp4pp2ep4"]
    assert out["model_pick"] == "tp4pp2" == max(estimates, key=estimates.get)
    assert all(math.log(top / estimates[n]) <= plan_perf.MODEL_ERROR for n in out["measure"])
    rows = {r["name"]: r for r in out["rows"]}
    assert abs(estimates["tp4pp2ep2"] / estimates["tp4pp2ep4"] - 1) < tune.SAME_SHAPE
    assert rows["tp4pp2ep2"]["status"] == "same as tp4pp2ep4"
    assert rows["tp8ep8"]["status"] == rows["tp2pp4"]["status"] == "over the limit"    # within the error, 4th on
    error = "more than the model's error (%.0f%%)" % (100 * (math.exp(plan_perf.MODEL_ERROR) - 1))
    assert rows["tp1pp8"]["status"] == "cannot win" and error in rows["tp1pp8"]["note"]
    assert [r["name"] for r in out["rows"][:3]] == out["chosen"]        # the chosen ones first
    assert tune.select(plan["candidates"], max_count=2)["measure"] == ["tp4pp2", "tp8"]
    gap = math.log(top / estimates["tp2pp4ep2"])
    assert rows["tp2pp4ep2"]["status"] == ("cannot win" if gap > plan_perf.MODEL_ERROR else "over the limit")


def test_measured_layouts_are_not_measured_again_and_anchor_the_estimates():
    # tp8 measured 4x its estimate (the machine's scale): tp4pp2's estimate x 4 = 3600 is within 20% of 4000,
    # tp2pp4's 2800 is not
    cands = [cand("tp8", 1000.0, measured=4000.0), cand("tp4pp2", 900.0), cand("tp2pp4", 700.0)]
    out = tune.select(cands)
    assert out["scale"] == 4.0 and out["chosen"] == ["tp8", "tp4pp2"] and out["measure"] == ["tp4pp2"]
    assert {r["name"]: r["status"] for r in out["rows"]} == {"tp8": "measured", "tp4pp2": "measure",
                                                            "tp2pp4": "cannot win"}
    again = tune.select(cands, remeasure=True)
    assert again["measure"] == ["tp8", "tp4pp2"]


def test_a_layout_that_failed_to_start_is_left_out_unless_remeasured():
    cands = [cand("tp8", 1000.0), cand("tp4pp2", 950.0), cand("tp2pp4", 900.0)]
    out = tune.select(cands, failed={"tp8"})
    assert out["measure"] == ["tp4pp2", "tp2pp4"]
    assert {r["name"]: r["status"] for r in out["rows"]}["tp8"] == "failed before"
    assert tune.select(cands, failed={"tp8"}, remeasure=True)["measure"] == ["tp8", "tp4pp2", "tp2pp4"]
    # measured since it failed: a measurement wins over an older failure
    assert tune.select([cand("tp8", 1000.0, measured=1200.0)] + cands[1:], failed={"tp8"})["chosen"][0] == "tp8"


def test_listed_layouts_are_measured_as_listed():
    cands = [cand("tp8", 1000.0), cand("tp8ep8", 990.0), cand("tp4pp2", 500.0), cand("tp3", 0, valid=False)]
    out = tune.select(cands, listed=["tp8ep8", "tp8", "tp4pp2"])
    assert out["measure"] == ["tp8ep8", "tp8", "tp4pp2"]          # EP twins and a layout that cannot win: listed
    bad = tune.select(cands, listed=["tp9", "tp3"])
    assert bad["reasons"][0].startswith("tune_layouts: tp9 is not a layout of these GPUs (")
    assert bad["reasons"][1] == "tune_layouts: tp3 is not valid here: does not fit"


def test_tune_plan_says_tune_and_refuses_bad_input(vnuma):
    request = planner.PlanRequest(topology=vnuma, model_path=model_path("glm-5-nvfp4"), workload=LAB)
    plan, fit, selection = tune.tune_plan(request, tune_max=3)
    assert plan["requested_layout"] == "tune" and plan["layout"]["name"] == "tp4pp2" and fit is None
    assert selection["report"][0] == "tune: the model's error is %s; measuring tp4pp2, tp8, tp4pp2ep4" % ERROR_PCT
    assert any(line.startswith("tp8 ") and line.endswith("measure") for line in selection["report"])
    for bad in (0, True, "3"):
        with pytest.raises(planner.PlanError, match="tune_max .topolaunch_tune_max. must be a positive integer"):
            tune.tune_plan(request, tune_max=bad)
    with pytest.raises(planner.PlanError, match="tune_layouts: tp5 is not a layout of these GPUs"):
        tune.tune_plan(request, tune_layouts=["tp5"])


def test_failures_of_this_machine_only(vnuma):
    request = planner.PlanRequest(topology=vnuma, model_path=model_path("glm-5-nvfp4"), workload=LAB)
    failures = [{"model": "glm-5-nvfp4", "topology_fingerprint": vnuma["fingerprint"], "layout": "tp4pp2",
                 "stage": "health"},
                {"model": "glm-5-nvfp4", "topology_fingerprint": "000000000000", "layout": "tp8ep8", "stage": "health"},
                {"model": "glm-5-nvfp4", "topology_fingerprint": vnuma["fingerprint"], "layout": "tp2pp4",
                 "stage": "bench"}]   # a bench failure: it started
    selection = tune.tune_plan(request, failures=failures, tune_max=5)[2]
    assert "tp4pp2" not in selection["measure"] and {"tp8ep8", "tp2pp4"} <= set(selection["measure"])


@pytest.mark.parametrize("model", ["glm-5-nvfp4", "glm-4.7"])
@pytest.mark.parametrize("workload", [LAB, {"input_len": 1024, "output_len": 1024, "concurrency": 128},
                                      {"concurrency": 512}])
def test_the_plans_advice_is_what_a_tune_measures(vnuma, model, workload):
    """One rule: the auto plan's advice names exactly the layouts a tune then measures, and the runner-up it leaves
    out with the tune's own reason (the field: the plan said "measure both", the tune "same as" and measured none)."""
    request = planner.PlanRequest(topology=vnuma, model_path=model_path(model), workload=workload)
    reason = planner.plan(request)["reason"]
    _plan, _fit, selection = tune.tune_plan(request)
    rows = {r["name"]: r for r in selection["rows"]}
    runner = reason.split("runner-up ", 1)[1].split(" ", 1)[0]
    if len(selection["chosen"]) > 1:
        assert "could win, inside the model's error on the calibration set (%s): %s: measure them (layout: tune" % (ERROR_PCT,
            ", ".join(selection["chosen"])) in reason, reason
    else:
        assert "no other layout could win" in reason, reason
    if runner not in selection["chosen"]:
        assert "lower, %s: %s)" % (rows[runner]["status"], rows[runner]["note"]) in reason, reason


def test_the_advice_leaves_out_an_ep_twin_and_a_layout_that_cannot_win():
    cands = [cand("tp8ep8", 1000.0), cand("tp8", 990.0), cand("tp4pp2", 700.0)]
    first, second = cands[0], cands[1]
    note = planner.margin_note(first, second, cands)
    assert note.startswith("runner-up tp8 estimated 990 tok/s (1% lower, same as tp8ep8: an EP variant the model "
                           "cannot tell from tp8ep8); no other layout could win"), note
    assert tune.select(cands)["measure"] == ["tp8ep8"]
    cands = [cand("tp8ep8", 1000.0), cand("tp4pp2", 900.0), cand("tp2pp4", 700.0)]
    note = planner.margin_note(cands[0], cands[1], cands)
    assert ("(10%% lower); the layouts that could win, inside the model's error on the calibration set (%s): "
            "tp8ep8, tp4pp2: measure them" % ERROR_PCT) in note, note


def test_the_plan_line_of_a_tune_says_tune(vnuma):
    request = planner.PlanRequest(topology=vnuma, model_path=model_path("glm-5-nvfp4"), workload=LAB)
    plan, _fit, _selection = tune.tune_plan(request)
    assert planner.render_report(plan)[0].startswith("layout tp4pp2 (tune, model): ")
    assert planner.render_report(planner.plan(request))[0].startswith("layout tp4pp2 (auto, model): ")
