"""Action plugin sglang_bench: the bench stage's controller side, in-process (no module, no round trip).

state=query: the newest complete run of this very server (plan SERVER_KEYS) at this very workload (points and
bench settings) under results_dir, or none; changes nothing. The bench role skips measuring again when there is one.
With artifacts_dir it also returns the topology the plan was made for (plugin_utils/results.py planned_topology:
this run's facts of each node, else those the topology stage saved), or fails when it is missing or changed.
state=record: store one bench_serving run (or one failed sweep layout) under results_dir, never overwriting
(plugin_utils/results.py record_run); changed. In check mode nothing is written and the run id that would be used is
returned. Formerly the module bench_record (delegated to localhost); that name is routed here.
state=tune: store one tune's record (plugin_utils/results.py tune_record, record_tune); changed.
state=report: write FINDINGS.md and the plots (plugin_utils/report.py build); changed.
Runs and tunes are filed under the plan's model and fingerprint (plugin_utils/results.py filed_under: a server across
nodes under its cluster fingerprint) unless model and topology_fingerprint are given (a layout whose plan failed).
"""

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase

from ansible_collections.topolaunch.sglang.plugins.plugin_utils import report
from ansible_collections.topolaunch.sglang.plugins.plugin_utils.results import (ResultsError, failure_message,
                                                                                filed_under, load_runs, measured_run,
                                                                                plan_hosts, planned_topology, record_run,
                                                                                record_tune, tune_record)

ARGUMENT_SPEC = {
    "state": {"type": "str", "choices": ["record", "query", "tune", "report"], "default": "record"},
    "results_dir": {"type": "path", "required": True},
    "model": {"type": "str"},
    "topology_fingerprint": {"type": "str"},
    "layout": {"type": "str"},
    "started": {"type": "str"},
    "points": {"type": "list", "elements": "dict", "default": []},
    "lines": {"type": "str", "default": ""},
    "meta": {"type": "dict", "default": {}},
    "bench": {"type": "dict", "default": {}},
    "plan": {"type": "dict"},
    "topology": {"type": "dict"},
    "versions": {"type": "dict"},
    "client_error": {"type": "dict"},
    "error": {"type": "dict"},
    "tune": {"type": "dict"},
    "out_dir": {"type": "path"},
    "nodes": {"type": "list", "elements": "str", "default": []},
    "artifacts_dir": {"type": "path"},
}
# What each state needs; record and tune also need the model and fingerprint to file under: given, or the plan's
# (plugin_utils/results.py filed_under: a server across nodes is filed under its cluster fingerprint).
REQUIRED = {"record": ("layout", "started"), "query": ("plan",), "tune": ("started", "tune"), "report": ()}
FILED = ("record", "tune")


def file_under(p):
    """Fill model and topology_fingerprint from the plan where they are not given; the names of those missing."""
    model, fingerprint = filed_under(p["plan"] or (p["tune"] or {}).get("plan"))
    p["model"] = p["model"] or model
    p["topology_fingerprint"] = p["topology_fingerprint"] or fingerprint
    return [k for k in ("model", "topology_fingerprint") if not p[k]]


def find_run(p, host, hostvars):
    """{measured_run: {run_id, dir, points} or None, topology}: with artifacts_dir, also the topology facts the plan
    was made for (every node's for a server across nodes: nodes), from this run's facts of each host, else the
    topology stage's saved ones; it fails when they are missing or another topology's."""
    plan = p["plan"]
    model, fingerprint = filed_under(plan)
    out = {"changed": False, "measured_run": None}
    if p["artifacts_dir"]:
        hosts = plan_hosts(plan, p["nodes"], host)
        out["topology"] = planned_topology(plan, hosts, lambda h: _facts(hostvars, h), p["artifacts_dir"])
    runs = load_runs(p["results_dir"], model=model, fingerprint=fingerprint)
    found = measured_run(runs, plan, p["points"], p["bench"])
    if found is not None:
        out["measured_run"] = {"run_id": found["run_id"], "dir": found["dir"], "points": found["points"]}
    return out


def _facts(hostvars, host):
    """This run's gpu_topology facts of a host (None: the topology stage did not run for it)."""
    try:
        return (hostvars[host].get("ansible_facts") or {}).get("gpu_topology")
    except (KeyError, AttributeError, TypeError):
        return None


def store_run(p, check_mode):
    """{run_id, dir, files, points, failures, message}; changed."""
    meta = dict(p["meta"], bench=p["bench"]) if p["bench"] else p["meta"]
    out = record_run(p["results_dir"], p["model"], p["topology_fingerprint"], p["layout"], p["started"], p["points"],
                     lines=p["lines"], meta=meta, plan=p["plan"], topology=p["topology"], versions=p["versions"],
                     client_error=p["client_error"], error=p["error"], write=not check_mode)
    message = (p["error"] or {}).get("message") or failure_message(p["layout"], out["failures"])
    return dict(out, changed=True, message=message)


def store_tune(p, check_mode):
    """{run_id, files}; changed."""
    t = p["tune"]
    data = dict({k: v for k, v in t.items() if k not in ("selection", "outcomes", "candidates", "plan")},
                **tune_record(t.get("selection"), t.get("outcomes"), t.get("candidates"), t.get("plan"),
                              t.get("workload")))
    out = record_tune(p["results_dir"], p["model"], p["topology_fingerprint"], p["started"], data,
                      write=not check_mode)
    return {"changed": True, "run_id": out["run_id"], "files": [out["file"]]}


def write_report(p, check_mode):
    """{files}; changed. In check mode nothing is written."""
    if check_mode:
        return {"changed": True, "files": []}
    return {"changed": True, "files": report.build(p["results_dir"], p["out_dir"] or p["results_dir"])}


class ActionModule(ActionBase):
    """sglang_bench, controller side only."""

    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        validated = ArgumentSpecValidator(ARGUMENT_SPEC).validate(self._task.args)
        if validated.error_messages:
            raise AnsibleActionFail("sglang_bench: %s" % "; ".join(validated.error_messages))
        p = validated.validated_parameters
        missing = [k for k in REQUIRED[p["state"]] if not p[k]]
        if p["state"] in FILED:
            missing += ["plan or %s" % k for k in file_under(p)]
        if missing:
            raise AnsibleActionFail("sglang_bench: state %s needs %s" % (p["state"], ", ".join(missing)))
        try:
            if p["state"] == "query":
                task_vars = task_vars or {}
                result.update(find_run(p, task_vars.get("inventory_hostname"), task_vars.get("hostvars") or {}))
            else:
                result.update({"record": store_run, "tune": store_tune, "report": write_report}[p["state"]](
                    p, self._task.check_mode))
        except (ResultsError, OSError) as exc:
            raise AnsibleActionFail("sglang_bench: %s" % exc)
        result["stage"] = "bench"
        return result
