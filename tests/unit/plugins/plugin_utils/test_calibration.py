"""plugin_utils/calibration.py: a case's workload, where its spec is, how a case is scored (the winner, pairs within
the tie margin, the log-ratio error, a refused layout as a large miss), the priors, the constants written back into
plan_perf.py with their comments, and a case of the set replayed through the planner."""
import math

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import plan_perf
from ansible_collections.topolaunch.sglang.plugins.module_utils.plan_fit import FIT
from ansible_collections.topolaunch.sglang.plugins.plugin_utils import calibration
import paths


@pytest.fixture(autouse=True)
def this_checkout(monkeypatch):
    """The set of this checkout, also when the built collection is the one imported (make collection-test)."""
    monkeypatch.setattr(calibration, "ROOT", paths.ROOT)


@pytest.mark.parametrize("workload, concurrency", [
    ({"input_len": 1024, "output_len": 128, "concurrency": 64}, 64),
    ({"input_len": "1024", "output_len": "128", "num_prompts": 500}, 500),          # offline run of N prompts
    ({"input_len": 1024, "output_len": 128}, calibration.OFFLINE_CONCURRENCY),    # offline, no count
])
def test_a_cases_workload(workload, concurrency):
    assert calibration.case_workload({"workload": workload}) == {
        "input_len": 1024, "output_len": 128, "concurrency": concurrency}


def test_specs_come_from_the_set_then_the_lab():
    assert calibration.spec_path("proxmox-8x-rtx-pro-6000-vnuma") == \
        paths.ROOT / "lab" / "specs" / "proxmox-8x-rtx-pro-6000-vnuma.json"
    with pytest.raises(SystemExit, match="calibration: spec no-such-box not found"):
        calibration.spec_path("no-such-box")


def entries(*pairs):
    """Entries of one case: (layout, measured, predicted); the prediction rides in inputs."""
    return [{"layout": name, "measured": measured, "inputs": {"pred": predicted}} for name, measured, predicted in pairs]


@pytest.fixture
def predicted(monkeypatch):
    monkeypatch.setattr(calibration, "predict", lambda entry, eff: entry["inputs"]["pred"])


def test_a_case_scores_its_winner_pairs_and_errors(predicted):
    winner, right, total, errors, preds = calibration.score_case(
        entries(("tp8", 200.0, 100.0), ("tp4pp2", 100.0, 50.0), ("tp2pp4", 50.0, 60.0)), {})
    assert (winner, right, total, preds) == (True, 2, 3, [100.0, 50.0, 60.0])     # tp4pp2 vs tp2pp4 misordered
    assert errors[0] == pytest.approx(0.0) and errors[2] == pytest.approx(abs(math.log((50 / 60) / 2.0)))


def test_a_winner_within_the_tie_margin_counts_and_a_refused_layout_is_a_large_miss(predicted):
    winner, right, total, errors, _ = calibration.score_case(
        entries(("tp8", 100.0, 10.0), ("tp4pp2", 104.0, 20.0)), {})               # 4% apart: a tie
    assert (winner, right, total) == (True, 1, 1)
    winner, _, _, errors, _ = calibration.score_case(entries(("tp8", 100.0, 0.0), ("tp4pp2", 50.0, 20.0)), {})
    assert winner is False and errors == [math.log(10.0)]


def test_totals_add_the_cases_up(predicted):
    cases = [entries(("a", 2.0, 2.0), ("b", 1.0, 1.0)), entries(("a", 2.0, 1.0), ("b", 1.0, 2.0))]
    got = calibration.totals(cases, {})
    assert (got["winner"], got["cases"], got["pairs_right"], got["pairs"], len(got["errors"])) == (1, 2, 1, 2, 2)


def test_every_fit_starts_from_the_expected_values():
    prior = calibration.priors()
    assert set(prior) == set(plan_perf.EFFICIENCY)
    assert all(prior[key] == bounds[2] for key, bounds in FIT.items())


def test_constants_are_written_back_with_their_comments(tmp_path, capsys):
    path = tmp_path / "plan_perf.py"
    path.write_text('EFFICIENCY = {\n    "gemm": 0.7,            # a comment\n    "step_ms": 1.5,\n}\n'
                    "MODEL_ERROR = 0.183\n")
    calibration.write_constants({"gemm": 0.612345, "step_ms": 2.0}, 0.21, path)
    assert path.read_text() == ('EFFICIENCY = {\n    "gemm": 0.6123,            # a comment\n    "step_ms": 2.0,\n}\n'
                                "MODEL_ERROR = 0.210\n")
    assert "MODEL_ERROR 0.210" in capsys.readouterr().out


def test_the_field_case_replays_through_the_planner(tmp_path):
    case = next(c for c in calibration.load_cases() if c["id"] == "field-glm5-nvfp4-rtxpro6000-vm")
    replayed = calibration.replay(case, tmp_path)
    assert [e["layout"] for e in replayed] == [m["layout"] for m in case["measured"]]
    assert all(e["inputs"] and e["refused"] is None and e["measured"] > 0 for e in replayed)
    assert all(calibration.predict(e, plan_perf.EFFICIENCY) > 0 for e in replayed)


def test_a_cases_source_is_who_published_it():
    assert calibration.case_source({"id": "a", "citation": {"repo": "gpustack/gpustack", "url": "https://x.io/p"}}) == \
        "gpustack/gpustack"
    assert calibration.case_source({"id": "a", "citation": {"url": "https://substratus.ai/blog/l4"}}) == "substratus.ai"
    assert calibration.case_source({"id": "a", "citation": {}}) == "a"
    sources = {calibration.case_source(c) for c in calibration.load_cases()}
    assert len(sources) >= 5


def test_held_out_groups_are_predicted_without_their_own_cases(predicted, monkeypatch):
    """Each group is scored with the constants fitted on the other cases only (the fit sees neither of its cases)."""
    cases = [entries(("a", 2.0, 2.0), ("b", 1.0, 1.0)), entries(("a", 2.0, 1.0), ("b", 1.0, 2.0)),
             entries(("a", 1.0, 1.0), ("b", 2.0, 2.0))]
    seen = []
    monkeypatch.setattr(calibration, "fit", lambda others, start=None: seen.append(len(others)) or dict(start))
    report = {"cases": [{} for _ in cases]}
    w, r, t = calibration.held_out(cases, [[0, 1], [2]], {"gemm": 0.5}, report, "loso")
    assert seen == [1, 2] and (w, r, t) == (2, 2, 3)
    assert [c["loso"]["winner_right"] for c in report["cases"]] == [True, False, True]


def test_dp_replicas_keep_winning_at_the_fields_request_cap(tmp_path):
    """GPUStack measured tp4dp2 ahead of tp8ep8 for Qwen3-235B-FP8 on 8 x H100 (NVSwitch). Launched with the
    field's --max-running-requests 1024, each DP replica still admits 1024 requests (SGLang divides the flag only
    by the attention-DP size); dividing it by dp twice left 256 per replica and ranked tp8ep8 first."""
    case = next(c for c in calibration.load_cases() if c["id"] == "vllm-h100x8-qwen3-235b-fp8-sharegpt")
    entries = calibration.replay(case, tmp_path, {"max_running_requests": 1024})
    winner, right, total = calibration.score_case(entries, plan_perf.EFFICIENCY)[:3]
    assert winner and right == total
    assert all(e["inputs"]["settings"]["max_running_requests"] == 1024 for e in entries if e["layout"] == "tp4dp2")


def test_server_args_must_be_an_object():
    with pytest.raises(SystemExit):
        calibration.main(["--server-args", "[1]", "--no-loo"])
