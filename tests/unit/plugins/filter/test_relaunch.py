"""filter_plugins/relaunch.py: the relaunch's steps from --tags and --skip-tags, and why a failed health check is
not rolled back."""
import pytest

from ansible_collections.topolaunch.sglang.plugins.filter.relaunch import FilterModule, relaunch_steps, rollback_refusal

ALL = ["validate", "cleanup", "launch", "health"]


@pytest.mark.parametrize("run_tags, skip_tags, steps", [
    (["all"], [], ALL),                                      # no --tags
    (["relaunch"], [], ALL),
    (["relaunch"], ["health"], ["validate", "cleanup", "launch"]),
    (["cleanup"], [], ["cleanup"]),
    (["health", "validate"], [], ["validate", "health"]),    # in their order, whatever the tags' order
    (["provision", "bench"], [], []),
    ([], [], ALL),
])
def test_steps_follow_the_tags(run_tags, skip_tags, steps):
    assert relaunch_steps(run_tags, skip_tags) == steps


@pytest.mark.parametrize("failed, rollback, rolling_back, why", [
    ({"last_good_plan": {"layout": {}}, "last_good_differs": True}, True, False, ""),
    ({"last_good_plan": {"layout": {}}, "last_good_differs": True}, False, False, "rollback is off (health_rollback=false)"),
    ({"last_good_plan": {}}, True, False, "there is no last known good plan"),
    ({}, True, False, "there is no last known good plan"),
    (None, True, False, "there is no last known good plan"),
    ({"last_good_plan": {"layout": {}}, "last_good_differs": False}, True, False,
     "the last known good plan is the one that failed"),
    ({"last_good_plan": {"layout": {}}, "last_good_differs": True, "server_stopped": False}, True, False,
     "nothing was stopped: the server that ran still runs"),       # a launch call that failed before stopping
    ({"last_good_plan": {"layout": {}}, "last_good_differs": True, "server_stopped": True}, True, False, ""),
    ({}, False, True, ""),                                   # the rollback itself failed: the caller says so
    # -e health_rollback=false and the like come as strings: Ansible's booleans
    ({"last_good_plan": {"layout": {}}, "last_good_differs": True}, "false", "False", "rollback is off (health_rollback=false)"),
    ({"last_good_plan": {"layout": {}}, "last_good_differs": True}, "no", False, "rollback is off (health_rollback=false)"),
    ({"last_good_plan": {"layout": {}}, "last_good_differs": True}, "true", "0", ""),
    ({}, True, "true", ""),
])
def test_why_no_rollback(failed, rollback, rolling_back, why):
    assert rollback_refusal(failed, rollback, rolling_back) == why


def test_the_filters_are_named():
    assert FilterModule().filters() == {"relaunch_steps": relaunch_steps, "rollback_refusal": rollback_refusal}
