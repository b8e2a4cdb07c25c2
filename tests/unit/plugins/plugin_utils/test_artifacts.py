"""plugin_utils/artifacts.py: the controller's JSON artifacts (topology.json, plan.json, candidates.json)."""
import json
import os
import stat

from ansible.plugins.filter.core import to_nice_json

from ansible_collections.topolaunch.sglang.plugins.plugin_utils.artifacts import save_json


def test_save_writes_pretty_json_0644_once(tmp_path):
    path = tmp_path / "artifacts" / "field" / "plan.json"
    plan = {"layout": {"name": "tp8", "tp": 8}, "argv": ["--tp-size", "8"]}
    assert save_json(str(path), plan) is True
    assert path.read_text() == to_nice_json(plan) + "\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert save_json(str(path), plan) is False
    assert save_json(str(path), dict(plan, port=1)) is True and json.loads(path.read_text())["port"] == 1
    assert sorted(os.listdir(path.parent)) == ["plan.json"]          # no temporary file left
