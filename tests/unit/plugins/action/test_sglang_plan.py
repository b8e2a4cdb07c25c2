"""Action plugin sglang_plan: measured results in, the plan and the candidates table out (artifacts/<host>/plan.json,
candidates.json), a new fit saved beside the results; all on the controller, in-process."""
import json

import pytest
from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.topolaunch.sglang.plugins.action import sglang_bench
from ansible_collections.topolaunch.sglang.plugins.action import sglang_plan as action
from actions import make_action
from bench_cases import record_args


def test_measured_reads_the_bench_results(tmp_path, run_action):
    run_action(sglang_bench, record_args(tmp_path))
    records = action.from_results(str(tmp_path))["measured"]
    assert [(m["model"], m["topology_fingerprint"], m["layout"], m["max_concurrency"], m["output_throughput"])
            for m in records] == [("glm-5-nvfp4", "a1b2c3d4e5f6", "tp8", 1, 321.0)]


def test_measured_of_a_missing_tree_is_empty(tmp_path):
    assert action.from_results(str(tmp_path / "none")) == {"measured": [], "fits": [], "failures": []}


def test_measured_names_a_broken_tree(tmp_path, run_action):
    run_action(sglang_bench, record_args(tmp_path))
    meta = next(tmp_path.rglob("*.meta.json"))
    meta.write_text("{not json")
    with pytest.raises(AnsibleActionFail, match="cannot read the measured results in %s: .*meta.json" % tmp_path):
        action.from_results(str(tmp_path))


def _action(args):
    return make_action(action, args)


def test_run_passes_measured_and_saves_the_plan(tmp_path, run_action, monkeypatch):
    run_action(sglang_bench, record_args(tmp_path / "results"))
    calls = []

    def execute(self, module_name, module_args, task_vars):
        calls.append((module_name, module_args))
        return {"changed": False, "plan": {"layout": {"name": "tp8"}}, "candidates": [{"name": "tp8"}], "report": []}

    monkeypatch.setattr(ActionBase, "run", lambda self, tmp=None, task_vars=None: {})
    monkeypatch.setattr(action.ActionModule, "_execute_module", execute)
    save_to = tmp_path / "artifacts" / "field" / "plan.json"
    result = _action({"layout": "tp8", "results_dir": str(tmp_path / "results"), "save_to": str(save_to),
                      "measured": [{"layout": "tp4pp2"}]}).run(task_vars={})
    name, args = calls[0]
    assert name == "topolaunch.sglang.sglang_plan" and "results_dir" not in args and "save_to" not in args
    assert [m["layout"] for m in args["measured"]] == ["tp4pp2", "tp8"]
    assert result["saved"] is True and result["saved_to"] == str(save_to)
    assert json.loads(save_to.read_text()) == {"layout": {"name": "tp8"}}
    assert json.loads((save_to.parent / "candidates.json").read_text()) == [{"name": "tp8"}]     # beside it


def test_run_saves_nothing_when_planning_failed(tmp_path, monkeypatch):
    monkeypatch.setattr(ActionBase, "run", lambda self, tmp=None, task_vars=None: {})
    monkeypatch.setattr(action.ActionModule, "_execute_module",
                        lambda self, module_name, module_args, task_vars: {"failed": True, "msg": "sglang_plan: 1"})
    result = _action({"layout": "tp3", "save_to": str(tmp_path / "plan.json")}).run(task_vars={})
    assert result["failed"] is True and "saved_to" not in result and not (tmp_path / "plan.json").exists()


@pytest.mark.parametrize("check_mode", [False, True])
def test_run_saves_a_new_fit_beside_the_results_not_in_check_mode(tmp_path, monkeypatch, check_mode):
    fit = {"model": "glm-5-nvfp4", "topology_fingerprint": "a1b2c3d4e5f6", "efficiency": {"step_ms": 3.0}}
    monkeypatch.setattr(ActionBase, "run", lambda self, tmp=None, task_vars=None: {})
    monkeypatch.setattr(action.ActionModule, "_execute_module", lambda self, module_name, module_args, task_vars: {
        "changed": False, "plan": {"layout": {"name": "tp8"}}, "candidates": [], "report": [], "fit": fit})
    (tmp_path / "results").mkdir()
    result = make_action(action, {"layout": "tune", "results_dir": str(tmp_path / "results")}, check_mode).run(
        task_vars={})
    path = tmp_path / "results" / "glm-5-nvfp4" / "a1b2c3d4e5f6" / "fit.json"
    if check_mode:
        assert not path.exists() and "fit_saved_to" not in result
    else:
        assert json.loads(path.read_text()) == fit and result["fit_saved_to"] == str(path)
        assert action.from_results(str(tmp_path / "results"))["fits"] == [fit]   # and read back for the next plan
