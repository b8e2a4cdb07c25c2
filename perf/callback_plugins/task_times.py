"""Callback task_times: per task and host, how long it took and whether it was a remote call; written as JSON.

Enabled by the bench scripts (perf/playbook_cost.py): ANSIBLE_CALLBACK_PLUGINS=perf/callback_plugins,
ANSIBLE_CALLBACKS_ENABLED=task_times, TASK_TIMES_FILE=<path>. A task is a remote call when its action runs
something on the host (a module, or an action plugin that executes one); controller-only actions (set_fact,
debug, assert, include_*, the sglang_bench action plugin, anything delegated to localhost) are not.
"""
import json
import os
import time

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: task_times
type: aggregate
short_description: per-task times and remote calls, as JSON (TASK_TIMES_FILE)
description: Records each task's duration per host and whether it ran on the host; perf/playbook_cost.py reads it.
requirements: [enable in configuration]
"""

CONTROLLER_ONLY = {
    "set_fact", "debug", "assert", "fail", "include_tasks", "import_tasks", "include_role", "import_role", "meta",
    "include_vars", "set_stats", "add_host", "group_by", "validate_argument_spec", "sglang_bench", "bench_record",
    "pause", "import_playbook", "topolaunch.sglang.relaunch_nodes",
}


def short(action):
    return action.rsplit(".", 1)[-1] if action else ""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "task_times"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.started = time.monotonic()
        self.task_start = {}
        self.rows = []

    def _start(self, task):
        self.task_start[task._uuid] = time.monotonic()

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._start(task)

    def v2_playbook_on_handler_task_start(self, task):
        self._start(task)

    def _end(self, result, status):
        task = result._task
        began = self.task_start.get(task._uuid, self.started)
        delegated = result._result.get("_ansible_delegated_vars", {}).get("ansible_host") in ("localhost", "127.0.0.1") \
            and task.delegate_to in ("localhost", "127.0.0.1")
        action = task.action
        remote = status != "skipped" and short(action) not in CONTROLLER_ONLY and not delegated \
            and action not in CONTROLLER_ONLY
        self.rows.append({"task": task.get_name(), "action": action, "host": result._host.get_name(),
                          "status": status, "remote": bool(remote), "seconds": round(time.monotonic() - began, 3),
                          "role": task._role.get_name() if task._role else ""})

    def v2_runner_on_ok(self, result):
        self._end(result, "changed" if result._result.get("changed") else "ok")

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._end(result, "failed")

    def v2_runner_on_skipped(self, result):
        self._end(result, "skipped")

    def v2_runner_on_unreachable(self, result):
        self._end(result, "unreachable")

    def v2_playbook_on_stats(self, stats):
        path = os.environ.get("TASK_TIMES_FILE")
        if path:
            with open(path, "w", encoding="utf-8") as f:
                json.dump({"wall": round(time.monotonic() - self.started, 3), "tasks": self.rows}, f, indent=1)
