"""Action plugin gpu_preflight: the record kept on the controller by topology fingerprint, the heatmap beside it."""
import json

import pytest
from ansible.plugins.action import ActionBase

from ansible_collections.topolaunch.sglang.plugins.action import gpu_preflight as action
from actions import make_action
from preflight_cases import hang_record  # noqa: F401  pylint: disable=unused-import  (fixture)


def test_action_keeps_records_by_fingerprint_and_the_heatmap(monkeypatch, tmp_path, hang_record):
    calls = []
    monkeypatch.setattr(ActionBase, "run", lambda self, tmp=None, task_vars=None: {})
    answer = {"changed": True, "measured": True, "record": hang_record}
    monkeypatch.setattr(action.ActionModule, "_execute_module", lambda self, module_name, module_args, task_vars: (
        calls.append((module_name, module_args)) or dict(answer)))
    path = tmp_path / "artifacts" / "hang" / "preflight.json"
    result = make_action(action, {"gpus": [0, 1], "save_to": str(path)}).run(task_vars={"inventory_hostname": "hang"})
    assert calls == [("topolaunch.sglang.gpu_preflight", {"gpus": [0, 1]})]
    assert result["saved"] is True and result["saved_to"] == str(path)
    assert result["heatmap"] == str(path.with_suffix(".png")) and path.with_suffix(".png").stat().st_size > 0
    assert json.loads(path.read_text()) == {"abcdef012345": hang_record}
    again = make_action(action, {"save_to": str(path)}).run(task_vars={})
    assert again["saved"] is False
    # another topology of the same host is kept beside it
    answer["record"] = dict(hang_record, fingerprint="0000000000aa")
    make_action(action, {"save_to": str(path)}).run(task_vars={})
    assert sorted(json.loads(path.read_text())) == ["0000000000aa", "abcdef012345"]
    # check mode with nothing measured yet: no record, nothing saved
    answer["record"] = None
    assert "saved" not in make_action(action, {"save_to": str(path)}, check_mode=True).run(task_vars={})
    path.write_text("[1, 2]")
    answer["record"] = hang_record
    with pytest.raises(Exception, match="is not a JSON object of preflight records: move it away"):
        make_action(action, {"save_to": str(path)}).run(task_vars={})
