"""Unit-test fixtures: run a module's main() or an action plugin's run() as Ansible does (one helper each)."""
import json

import pytest
from ansible.module_utils.testing import patch_module_args
from ansible.plugins.action import ActionBase

from actions import make_action


# ---------------------------------------------------------------------------------------- modules and actions
@pytest.fixture
def run_module(capsys):
    """Run a module's main() as Ansible does (arguments in, one JSON result out):
    run_module(module, args, check_mode=False) -> (exit code, result, raw stdout)."""

    def run(module, args, check_mode=False):
        if check_mode:
            args = dict(args, _ansible_check_mode=True)
        with patch_module_args(args), pytest.raises(SystemExit) as exc:
            module.main()
        out = capsys.readouterr().out
        return exc.value.code, json.loads(out), out

    return run


@pytest.fixture
def run_action(monkeypatch):
    """Run a controller-side action plugin as Ansible does: run_action(plugin, args, check_mode=False) -> result."""
    monkeypatch.setattr(ActionBase, "run", lambda self, tmp=None, task_vars=None: {})
    return lambda plugin, args, check_mode=False: make_action(plugin, args, check_mode).run(task_vars={})
