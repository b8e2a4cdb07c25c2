"""Filters for the rolling relaunch of a DP layout behind the model gateway (module_utils rolling.py).

    seconds: "{{ topolaunch_drain_timeout | topolaunch.sglang.rolling_drain_timeout }}"
"""
from ansible.errors import AnsibleFilterError

from ansible_collections.topolaunch.sglang.plugins.module_utils import rolling


def rolling_drain_timeout(value):
    """topolaunch_drain_timeout as seconds (> 0); a one-line error naming the field otherwise."""
    try:
        return rolling.drain_timeout(value)
    except rolling.RollingError as exc:
        raise AnsibleFilterError(str(exc)) from None


def rolling_drain_timeout_problem(value):
    """What is wrong with topolaunch_drain_timeout: empty when nothing is, else the one line naming the field
    (the relaunch asserts it before anything stops)."""
    try:
        rolling.drain_timeout(value)
    except rolling.RollingError as exc:
        return str(exc)
    return ""


def rolling_decide(plan, plans, states, gateway_unit):
    """How to relaunch `plan`'s replicas ({mode: rolling | all, reason}): `plans` the replica plans the host runs now
    (their current_plan.json), `states` unit -> ActiveState (the replicas' and the gateway's)."""
    return rolling.decide(rolling.running(plans, states), (plan or {}).get("replicas") or [],
                          (states or {}).get(gateway_unit) == "active")


def rolling_failed(replica, step, why, done, rolled_back=True):
    """The one line a rolling relaunch stopped at `replica` fails with (rolling.failed)."""
    return rolling.failed(replica, step, why, done or [], bool(rolled_back))


class FilterModule:
    """The rolling relaunch's filters."""

    def filters(self):
        return {"rolling_drain_timeout": rolling_drain_timeout,
                "rolling_drain_timeout_problem": rolling_drain_timeout_problem, "rolling_decide": rolling_decide,
                "rolling_failed": rolling_failed}
