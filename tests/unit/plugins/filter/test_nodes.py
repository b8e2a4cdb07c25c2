"""filter_plugins/nodes.py: the rules of a server across nodes - which nodes are not in this run, what keeps them from
running one plan, which were replaced, which failed their health check, which cannot roll back - from each node's
registered results in hostvars. One rule under all of them: a node is here when it is in ansible_play_hosts."""
import pytest

from ansible_collections.topolaunch.sglang.plugins.filter.nodes import (FilterModule, absent_nodes, failed_nodes,
                                                                       node_plan_problems, replaced_nodes,
                                                                       rollback_refusals)
from local_play import run_plays

NODES = ["n0", "n1"]
PER_NODE = [{"node_rank": 0}, {"node_rank": 1}]


def plan(rank, per_node=PER_NODE, nnodes=2):
    return {"layout": {"name": "tp8pp2", "nnodes": nnodes}, "node_rank": rank, "per_node": per_node}


def validated(rank, replace=False, **kw):
    return {"launch_validated": {"plan": plan(rank, **kw), "replace": replace}}


def test_absent_nodes_keep_node_rank_order():
    assert absent_nodes(["n0", "n1", "n2"], ["n2", "n0"]) == ["n1"]
    assert absent_nodes([], ["n0"]) == [] and absent_nodes(None, None) == []


def test_nodes_that_run_one_plan_have_no_problem():
    hostvars = {"n0": validated(0), "n1": validated(1)}
    assert node_plan_problems(NODES, "n0", NODES, hostvars) == []
    assert node_plan_problems(NODES, "n1", NODES, hostvars) == []


def test_every_problem_is_named():
    hostvars = {"n0": validated(0), "n1": validated(1, per_node=[{"node_rank": 0}])}
    assert node_plan_problems(NODES, "n0", NODES, hostvars) == [
        "n1 has another plan than n0 (plan every node in one run: --tags relaunch, or the plan stage)"]
    assert node_plan_problems(NODES, "n0", ["n0"], hostvars) == [
        "n1 is not in this run (unreachable, failed earlier or left out by --limit)"]
    hostvars = {"n0": validated(1), "n1": validated(1)}
    assert node_plan_problems(NODES, "n0", NODES, hostvars) == [
        "the plan of n0 is node 1 of 2, not node 0 of 2 (plan again: --tags relaunch)"]
    assert "n2 is not one of them" in node_plan_problems(NODES, "n2", NODES + ["n2"], hostvars)


def test_replaced_nodes_are_those_here_whose_validate_said_replace():
    hostvars = {"n0": validated(0), "n1": validated(1, replace=True)}
    assert replaced_nodes(NODES, NODES, hostvars) == ["n1"]
    assert replaced_nodes(NODES, ["n0"], hostvars) == []


def test_failed_nodes_name_the_other_nodes_that_failed_or_left():
    hostvars = {"n0": {"health_wait": {"failed": True, "msg": "me"}},
                "n1": {"health_wait": {"failed": True, "msg": "died while starting"}}, "n2": {}}
    nodes = ["n0", "n1", "n2", "n3"]
    assert failed_nodes(nodes, "n0", ["n0", "n1", "n2"], hostvars) == [
        "n1: died while starting", "n3 left this run (failed or unreachable, see above)"]


def test_rollback_refusals_of_the_other_nodes():
    hostvars = {"n1": {"relaunch_failure": {"no_rollback": ""}}, "n2": {"relaunch_failure": {"no_rollback": "x"}},
                "n3": {}}
    nodes = ["n0", "n1", "n2", "n3", "n4"]
    assert rollback_refusals(nodes, "n0", ["n0", "n1", "n2", "n3"], hostvars) == [
        "node n2: x", "node n3 cannot roll back with it (unreachable, or failed outside health)",
        "node n4 cannot roll back with it (unreachable, or failed outside health)"]


def test_the_filters_are_ansibles_and_read_its_hostvars(tmp_path):
    """Through Ansible itself: its hostvars (templated on access), a registered result of this host."""
    assert set(FilterModule().filters()) == {"absent_nodes", "node_plan_problems", "replaced_nodes",
                                             "failed_nodes", "rollback_refusals"}
    play = {"name": "nodes", "hosts": "localhost", "gather_facts": False,
            "vars": {"two": ["localhost", "other"], "mine": plan(0)},
            "tasks": [{"ansible.builtin.set_fact": {"launch_validated": {"plan": "{{ mine }}", "replace": True}}},
                      {"ansible.builtin.set_fact": {
                          "absent": "{{ two | topolaunch.sglang.absent_nodes(ansible_play_hosts) }}",
                          "problems": "{{ two | topolaunch.sglang.node_plan_problems(inventory_hostname, "
                                      "ansible_play_hosts, hostvars) }}",
                          "replaced": "{{ two | topolaunch.sglang.replaced_nodes(ansible_play_hosts, hostvars) }}"}}]}
    absent, problems, replaced = run_plays([play], tmp_path, ["absent", "problems", "replaced"])
    assert absent == ["other"] and replaced == ["localhost"]
    assert problems == ["other is not in this run (unreachable, failed earlier or left out by --limit)"]


@pytest.mark.parametrize("bad", [{"n1": None}, {"n1": {"launch_validated": None}}])
def test_a_node_without_results_counts_as_another_plan(bad):
    hostvars = dict({"n0": validated(0)}, **bad)
    assert node_plan_problems(NODES, "n0", NODES, hostvars)[0].startswith("n1 has another plan than n0")
