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


class FilterModule:
    """The rolling relaunch's filters."""

    def filters(self):
        return {"rolling_drain_timeout": rolling_drain_timeout}
