"""Filters for the relaunch sequence (role relaunch): which steps this run takes, and whether a failed health check
may roll back.

    relaunch_steps: "{{ ansible_run_tags | topolaunch.sglang.relaunch_steps(ansible_skip_tags) }}"
    no_rollback: "{{ failed | topolaunch.sglang.rollback_refusal(relaunch_rollback, relaunch_rolling_back) }}"
"""

from ansible.module_utils.parsing.convert_bool import boolean

STEPS = ("validate", "cleanup", "launch", "health")


def relaunch_steps(run_tags, skip_tags=()):
    """The relaunch's steps in order: every step with no tags, --tags all or --tags relaunch; else those named in
    --tags; minus --skip-tags."""
    run_tags = set(run_tags or ["all"])
    wanted = set(STEPS) if run_tags & {"all", "relaunch"} else run_tags
    return [s for s in STEPS if s in wanted and s not in set(skip_tags or [])]


def rollback_refusal(failed, rollback=True, rolling_back=False):
    """Why the server whose health check failed is not rolled back ('' when it is): `failed` is sglang_health's
    failure (its plan and last good plan). A rollback that failed again is not rolled back again (the caller says
    so); rollback off; a failed launch call that stopped nothing (`server_stopped` false: the old server still
    runs); no last good plan; the last good plan is the one that failed."""
    failed = failed or {}
    # -e health_rollback=false comes as the string "false": Ansible's booleans, as the | bool filter reads them
    if boolean(rolling_back, strict=False):
        return ""
    if not boolean(rollback, strict=False):
        return "rollback is off (health_rollback=false)"
    if failed.get("server_stopped") is False:        # a launch or cleanup failure before the old server stopped
        return "nothing was stopped: the server that ran still runs"
    if not failed.get("last_good_plan"):
        return failed.get("last_good_problem") or "there is no last known good plan"
    if not failed.get("last_good_differs"):
        return "the last known good plan is the one that failed"
    return ""


class FilterModule:
    """topolaunch.sglang relaunch filters."""

    def filters(self):
        return {"relaunch_steps": relaunch_steps, "rollback_refusal": rollback_refusal}
