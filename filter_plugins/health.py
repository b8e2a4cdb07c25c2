"""Filters for the health stage (role health), checked before anything changes (role relaunch, validate).

    problem: "{{ health_answer_probe | topolaunch.sglang.answer_probe_problem('health_answer_probe') }}"
"""
from ansible_collections.topolaunch.sglang.plugins.module_utils.health import probe_settings


def answer_probe_problem(value, field="health_answer_probe"):
    """What is wrong with the answer probe's settings, in one line naming the field ('' when nothing): the rule is
    module_utils/topolaunch/health.py probe_settings, the one sglang_health applies to its option answer_probe."""
    try:
        probe_settings(value, field)
    except ValueError as err:
        return str(err)
    return ""


class FilterModule:
    """topolaunch.sglang health filters."""

    def filters(self):
        return {"answer_probe_problem": answer_probe_problem}
