"""The stdout callback topolaunch's ansible.cfg sets: Ansible's default callback, briefer at verbosity 0."""
from __future__ import annotations

DOCUMENTATION = """
    name: brief
    type: stdout
    short_description: Ansible's default output, showing at verbosity 0 only the lines that matter
    description:
      - Ansible's default stdout callback (ansible.builtin.default, which it extends), with one change at verbosity
        0 (without -v) - a task is shown only when it says something - what a debug task prints (its msg, one line
        per item, without the JSON around it), a result that changed, a warning, a failure. A failure is shown once
        as its one-line reason (the result's msg) and, when the result has one, its readable table (a C(table) list
        of lines); the whole result (JSON or YAML) is left for -v. Tasks that were ok or skipped and say nothing, and
        "included" lines, are not shown; a play's banner is shown only when one of its tasks is.
      - At -v and above it is the default callback, unchanged.
    extends_documentation_fragment:
      - default_callback
      - result_format_callback
    requirements:
      - set as the stdout callback (ansible.cfg stdout_callback = topolaunch.sglang.brief)
"""

from ansible import constants as C
from ansible.playbook.task_include import TaskInclude
from ansible.plugins.callback.default import CallbackModule as DefaultCallback

DEBUG_ACTIONS = frozenset(("debug", "ansible.builtin.debug", "ansible.legacy.debug"))


class CallbackModule(DefaultCallback):
    """Ansible's default callback; at verbosity 0 only what a person reads (see DOCUMENTATION)."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "topolaunch.sglang.brief"

    def __init__(self):
        super().__init__()
        self._pending_play = None
        self._said = set()          # (host, reason) of the failures shown: a rescue that fails again says it once

    def _brief(self):
        return self._display.verbosity < 1

    # ---- banners: a play's only once one of its tasks shows something, a task's only with a result shown
    def v2_playbook_on_play_start(self, play):
        if not self._brief():
            return super().v2_playbook_on_play_start(play)
        self._play = play
        self._pending_play = play
        return None

    def _print_task_banner(self, task):
        if self._pending_play is not None:
            play, self._pending_play = self._pending_play, None
            name = play.get_name().strip()
            self._display.banner("PLAY [%s]" % name if name else "PLAY")
        super()._print_task_banner(task)

    def _task_start(self, task, prefix=None):
        if not self._brief():
            return super()._task_start(task, prefix)
        if prefix is not None:
            self._task_type_cache[task._uuid] = prefix
        self._last_task_name = task.get_name().strip()
        return None

    def v2_playbook_on_include(self, included_file):
        if not self._brief():
            return super().v2_playbook_on_include(included_file)
        return None

    def v2_playbook_on_no_hosts_matched(self):
        if not self._brief():
            return super().v2_playbook_on_no_hosts_matched()
        return None

    # ---- results
    @staticmethod
    def _messages(result):
        """What a debug task says: its msg (a list: one line each), or its var's value, as text lines."""
        data = result.result
        if "msg" in data:
            msg = data["msg"]
            return [str(m) for m in msg] if isinstance(msg, list) else str(msg).splitlines() or [""]
        return ["%s: %s" % (k, v) for k, v in data.items() if not k.startswith("_") and k not in (
            "changed", "failed", "skipped", "warnings", "deprecations")]

    def _say(self, result, lines, color=None):
        if self._last_task_banner != result.task._uuid:
            self._print_task_banner(result.task)
        for line in lines:
            self._display.display("%s: %s" % (self.host_label(result), line) if line else "", color=color)

    def v2_runner_on_ok(self, result):
        if not self._brief():
            return super().v2_runner_on_ok(result)
        if isinstance(result.task, TaskInclude):
            return None
        self._handle_warnings(result.result)
        if result.task.action in DEBUG_ACTIONS and not (result.task.loop and "results" in result.result):
            self._say(result, self._messages(result))
        elif result.result.get("changed", False):
            self._say(result, ["changed"], C.COLOR_CHANGED)
        return None

    def v2_runner_item_on_ok(self, result):
        if not self._brief():
            return super().v2_runner_item_on_ok(result)
        if result.task.action in DEBUG_ACTIONS:
            self._say(result, self._messages(result))
        elif result.result.get("changed", False):
            self._say(result, ["changed (%s)" % self._get_item_label(result.result)], C.COLOR_CHANGED)
        return None

    def v2_runner_on_skipped(self, result):
        if not self._brief():
            return super().v2_runner_on_skipped(result)
        return None

    def v2_runner_item_on_skipped(self, result):
        if not self._brief():
            return super().v2_runner_item_on_skipped(result)
        return None

    def _failure_lines(self, result):
        data = result.result
        msg = data.get("msg") or data.get("reason") or "failed (rc %s)" % data.get("rc", "?")
        lines = ["FAILED: %s" % line for line in str(msg).splitlines()[:1]] + str(msg).splitlines()[1:]
        table = data.get("table")
        if isinstance(table, list):
            lines += [str(line) for line in table]
        return lines + ["(the whole result: run again with -v)"]

    def v2_runner_on_failed(self, result, ignore_errors=False):
        if not self._brief() or (result.task.loop and "results" in result.result):
            return super().v2_runner_on_failed(result, ignore_errors)
        self._handle_warnings(result.result)
        lines = self._failure_lines(result)
        said = (self.host_label(result), tuple(lines))
        if said in self._said:
            self._say(result, ["FAILED (the reason above)"], C.COLOR_ERROR)
        else:
            self._said.add(said)
            self._say(result, lines, C.COLOR_ERROR)
        if ignore_errors:
            self._display.display("...ignoring", color=C.COLOR_SKIP)
        return None

    def v2_runner_item_on_failed(self, result):
        if not self._brief():
            return super().v2_runner_item_on_failed(result)
        self._handle_warnings(result.result)
        self._say(result, ["(%s) %s" % (self._get_item_label(result.result), line)
                           for line in self._failure_lines(result)[:-1]], C.COLOR_ERROR)
        return None
