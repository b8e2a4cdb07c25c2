"""Action plugin gpu_topology: the module's facts saved on the controller (artifacts/<host>/topology.json) in-process,
never reported as a change."""
import json

from ansible.plugins.action import ActionBase

from ansible_collections.topolaunch.sglang.plugins.action import gpu_topology as action
from actions import make_action


def test_action_saves_the_facts_on_the_controller_as_no_change(tmp_path, monkeypatch):
    """save_to: written in the controller process (not a task delegated to localhost), only when different, and
    never reported as a change of the host (a second run has nothing to do)."""
    facts = {"fingerprint": "a1b2c3d4e5f6", "gpu_count": 2}
    calls = []
    monkeypatch.setattr(ActionBase, "run", lambda self, tmp=None, task_vars=None: {})
    monkeypatch.setattr(action.ActionModule, "_execute_module", lambda self, module_name, module_args, task_vars: (
        calls.append((module_name, module_args)) or {"changed": False, "ansible_facts": {"gpu_topology": facts}}))
    path = tmp_path / "artifacts" / "field" / "topology.json"
    result = make_action(action, {"sysfs_root": "/sys", "save_to": str(path)}).run(task_vars={})
    assert calls == [("topolaunch.sglang.gpu_topology", {"sysfs_root": "/sys"})]
    assert result["saved"] is True and result["saved_to"] == str(path) and result["changed"] is False
    assert json.loads(path.read_text()) == facts
    assert make_action(action, {"save_to": str(path)}).run(task_vars={})["saved"] is False
