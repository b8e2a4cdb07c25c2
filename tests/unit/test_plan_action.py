"""action_plugins/sglang_plan.py: measured results and the saved plan, handled on the controller in-process."""
import json
import os
import pathlib
import stat

import pytest
from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.plugins.filter.core import to_nice_json

from ansible_collections.topolaunch.sglang.plugins.action import sglang_bench
from conftest import make_action
from test_sglang_bench import record_args

from ansible_collections.topolaunch.sglang.plugins.action import sglang_plan as action
from ansible_collections.topolaunch.sglang.plugins.plugin_utils.artifacts import save_json


def test_measured_reads_the_bench_results(tmp_path, run_action):
    run_action(sglang_bench, record_args(tmp_path))
    records = action.measured(str(tmp_path))
    assert [(m["model"], m["topology_fingerprint"], m["layout"], m["max_concurrency"], m["output_throughput"])
            for m in records] == [("glm-5-nvfp4", "a1b2c3d4e5f6", "tp8", 1, 321.0)]


def test_measured_of_a_missing_tree_is_empty(tmp_path):
    assert action.measured(str(tmp_path / "none")) == []


def test_measured_names_a_broken_tree(tmp_path, run_action):
    run_action(sglang_bench, record_args(tmp_path))
    meta = next(tmp_path.rglob("*.meta.json"))
    meta.write_text("{not json")
    with pytest.raises(AnsibleActionFail, match="cannot read the measured results in %s: .*meta.json" % tmp_path):
        action.measured(str(tmp_path))


def test_save_writes_pretty_json_0644_once(tmp_path):
    path = tmp_path / "artifacts" / "field" / "plan.json"
    plan = {"layout": {"name": "tp8", "tp": 8}, "argv": ["--tp-size", "8"]}
    assert save_json(str(path), plan) is True
    assert path.read_text() == to_nice_json(plan) + "\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert save_json(str(path), plan) is False
    assert save_json(str(path), dict(plan, port=1)) is True and json.loads(path.read_text())["port"] == 1
    assert sorted(os.listdir(path.parent)) == ["plan.json"]          # no temporary file left


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
