"""Action plugin sglang_plan: plan on the host, with the controller's measured results, and keep the plan here.

The planner runs on the host (it reads the model directory and, without topology facts, NVML there). Its two
controller-side companions run in this process instead of as tasks delegated to localhost (a Python start and an
SSH-free but still ~0.4 s round trip each, paid on every relaunch):

- results_dir: the bench stage's results tree on the controller; its measured records (plugin_utils results.py, the
  code the bench stage and the report use) are passed to the module as `measured`, the machines' fits
  (<model>/<fingerprint>/fit.json) as `fits`, the layouts whose newest run failed as `failures`; a new fit the
  module returns is saved as that fit.json (not in check mode: it would change the results tree);
- save_to: the plan is written there as pretty JSON, and the candidates table beside it as candidates.json
  (directories made, 0644, only when changed), in check mode too: it changes nothing on the host and a --check run
  is when one wants to see the plan.
"""
import os

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.topolaunch.sglang.plugins.plugin_utils.artifacts import save_json
from ansible_collections.topolaunch.sglang.plugins.plugin_utils.results import (ResultsError, fit_path,
                                                                                latest_failures, load_fits, load_runs,
                                                                                measured_records)


def from_results(results_dir):
    """{measured, fits, failures} of every model and topology under results_dir (the planner keeps its own)."""
    try:
        runs = load_runs(results_dir)
        return {"measured": measured_records(runs), "fits": load_fits(results_dir), "failures": latest_failures(runs)}
    except (ResultsError, OSError) as exc:
        raise AnsibleActionFail("sglang_plan: cannot read the measured results in %s: %s" % (results_dir, exc))


class ActionModule(ActionBase):
    """sglang_plan with results_dir and save_to handled on the controller."""

    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        results_dir = args.pop("results_dir", None)
        save_to = args.pop("save_to", None)
        if results_dir:
            for key, records in from_results(os.path.expanduser(results_dir)).items():
                args[key] = list(args.get(key) or []) + records
        result.update(self._execute_module(module_name="topolaunch.sglang.sglang_plan", module_args=args,
                                           task_vars=task_vars))
        if save_to and not result.get("failed"):
            path = os.path.expanduser(save_to)
            try:
                saved_plan = save_json(path, result["plan"])
                saved_candidates = save_json(os.path.join(os.path.dirname(path), "candidates.json"),
                                             result["candidates"])
                result["saved"] = saved_plan or saved_candidates
            except OSError as exc:
                raise AnsibleActionFail("sglang_plan: cannot save the plan to %s: %s" % (path, exc))
            result["saved_to"] = path
        fit = result.get("fit")
        if results_dir and fit and not result.get("failed") and not self._task.check_mode:
            path = fit_path(os.path.expanduser(results_dir), fit["model"], fit["topology_fingerprint"])
            try:
                result["fit_saved_to"] = path if save_json(path, fit) else None
            except (OSError, ResultsError) as exc:
                raise AnsibleActionFail("sglang_plan: cannot save the fit to %s: %s" % (path, exc))
        return result
