"""Action plugin sglang_plan: plan on the host, with the controller's measured results, and keep the plan here.

The planner runs on the host (it reads the model directory and, without topology facts, NVML there). Its two
controller-side companions run in this process instead of as tasks delegated to localhost (a Python start and an
SSH-free but still ~0.4 s round trip each, paid on every relaunch):

- results_dir: the bench stage's results tree on the controller; its measured records (module_utils
  topolaunch/results.py, the code bench_measured and the report use) are passed to the module as `measured`;
- save_to: the plan is written there as pretty JSON (directories made, 0644, only when it changed), in check mode
  too: it changes nothing on the host and a --check run is when one wants to see the plan.
"""
import importlib.util
import json
import os

from ansible import constants as C
from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase


def _module_utils(name):
    """module_utils/topolaunch/<name>.py (stdlib only, no relative imports), imported on the controller: module_utils
    are only packaged for hosts."""
    for base in C.DEFAULT_MODULE_UTILS_PATH:
        path = os.path.join(base, "topolaunch", name + ".py")
        if os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("topolaunch_controller_" + name, path)
            lib = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(lib)
            return lib
    raise AnsibleActionFail("sglang_plan: topolaunch/%s.py is not in the module_utils path %s"
                            % (name, C.DEFAULT_MODULE_UTILS_PATH))


def measured(results_dir):
    """Measured records of every model and topology under results_dir (the planner keeps its own)."""
    lib = _module_utils("results")
    try:
        return lib.measured_records(lib.load_runs(results_dir))
    except (lib.ResultsError, OSError) as exc:
        raise AnsibleActionFail("sglang_plan: cannot read the measured results in %s: %s" % (results_dir, exc))


def save(path, plan):
    """Write plan as pretty JSON to path (0644, ours) unless it already holds exactly that; True when written."""
    system = _module_utils("system")
    text = json.dumps(plan, indent=4, sort_keys=True) + "\n"
    owner = (os.getuid(), os.getgid())
    if not system.file_differs(path, text, 0o644, owner):
        return False
    os.makedirs(os.path.dirname(path), exist_ok=True)
    system.write_atomic(path, text, 0o644, owner)
    return True


class ActionModule(ActionBase):
    """sglang_plan with results_dir and save_to handled on the controller."""

    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        results_dir = args.pop("results_dir", None)
        save_to = args.pop("save_to", None)
        if results_dir:
            args["measured"] = list(args.get("measured") or []) + measured(os.path.expanduser(results_dir))
        result.update(self._execute_module(module_name="sglang_plan", module_args=args, task_vars=task_vars))
        if save_to and not result.get("failed"):
            path = os.path.expanduser(save_to)
            try:
                result["saved"] = save(path, result["plan"])
            except OSError as exc:
                raise AnsibleActionFail("sglang_plan: cannot save the plan to %s: %s" % (path, exc))
            result["saved_to"] = path
        return result
