"""Filters for a server across nodes (topolaunch_nodes: inventory hosts in node-rank order): which of its nodes are
not in this run, and what keeps them from being validated, launched, checked and rolled back together.

One rule under all of them: a node is in this run when it is in ansible_play_hosts (not unreachable, not failed
earlier, not left out by --limit). The roles call these filters; nothing else decides it.

    plan_nodes | topolaunch.sglang.absent_nodes(ansible_play_hosts)
    relaunch_nodes | topolaunch.sglang.node_plan_problems(inventory_hostname, ansible_play_hosts, hostvars)
    relaunch_nodes | topolaunch.sglang.replaced_nodes(ansible_play_hosts, hostvars)
    health_nodes | topolaunch.sglang.failed_nodes(inventory_hostname, ansible_play_hosts, hostvars)
    relaunch_nodes | topolaunch.sglang.rollback_refusals(inventory_hostname, ansible_play_hosts, hostvars)

`hostvars` is Ansible's (or any mapping host -> variables): each node's registered results are read from it
(launch_validated, health_wait, relaunch_failure).
"""


def _get(hostvars, host, name, default=None):
    """A variable of another host (None when it has none); Ansible's hostvars templates it on access."""
    try:
        value = hostvars[host].get(name, default)
    except (KeyError, AttributeError):
        return default
    return default if value is None else value


def absent_nodes(nodes, play_hosts):
    """The nodes not in this run, in node-rank order."""
    here = set(play_hosts or [])
    return [n for n in nodes or [] if n not in here]


def node_plan_problems(nodes, me, play_hosts, hostvars):
    """After validate: why the nodes cannot run their parts of one plan together ([] when they can). Each node's
    plan is its validate result's (launch_validated.plan): the same per_node on every node, and this host is the
    node its plan says (node_rank of nnodes)."""
    nodes = list(nodes or [])
    mine = (_get(hostvars, me, "launch_validated", {}) or {}).get("plan") or {}
    absent = set(absent_nodes(nodes, play_hosts))
    out = []
    for n in nodes:
        if n in absent:
            out.append("%s is not in this run (unreachable, failed earlier or left out by --limit)" % n)
        elif (_get(hostvars, n, "launch_validated", {}) or {}).get("plan", {}).get("per_node") != mine.get("per_node"):
            out.append("%s has another plan than %s (plan every node in one run: --tags relaunch, or the plan stage)"
                       % (n, me))
    if me not in nodes:
        out.append("%s is not one of them" % me)
    else:
        nnodes = (mine.get("layout") or {}).get("nnodes", 1)
        rank = mine.get("node_rank", 0)
        if nnodes != len(nodes) or rank != nodes.index(me):
            out.append("the plan of %s is node %s of %s, not node %d of %d (plan again: --tags relaunch)"
                       % (me, rank, nnodes, nodes.index(me), len(nodes)))
    return out


def replaced_nodes(nodes, play_hosts, hostvars):
    """The nodes in this run whose validate decided to replace their server."""
    absent = set(absent_nodes(nodes, play_hosts))
    return [n for n in nodes or [] if n not in absent
            and (_get(hostvars, n, "launch_validated", {}) or {}).get("replace")]


def failed_nodes(nodes, me, play_hosts, hostvars):
    """The other nodes that failed their health check in this run (their health_wait) or left it, each with why."""
    absent = set(absent_nodes(nodes, play_hosts))
    out = []
    for n in nodes or []:
        if n == me:
            continue
        wait = _get(hostvars, n, "health_wait", {}) or {}
        if n in absent:
            out.append("%s left this run (failed or unreachable, see above)" % n)
        elif wait.get("failed"):
            out.append("%s: %s" % (n, wait.get("msg") or "failed"))
    return out


def rollback_refusals(nodes, me, play_hosts, hostvars):
    """Why the other nodes cannot roll back with this one: one server rolls back on every node or on none. A node
    that left the run, or failed outside health (no relaunch_failure), cannot; one whose own rollback is refused
    (relaunch_failure.no_rollback) says why."""
    absent = set(absent_nodes(nodes, play_hosts))
    out = []
    for n in nodes or []:
        if n == me:
            continue
        failure = _get(hostvars, n, "relaunch_failure")
        if n in absent or failure is None:
            out.append("node %s cannot roll back with it (unreachable, or failed outside health)" % n)
        elif failure.get("no_rollback"):
            out.append("node %s: %s" % (n, failure["no_rollback"]))
    return out


class FilterModule:
    """topolaunch.sglang node filters."""

    def filters(self):
        return {"absent_nodes": absent_nodes, "node_plan_problems": node_plan_problems,
                "replaced_nodes": replaced_nodes, "failed_nodes": failed_nodes,
                "rollback_refusals": rollback_refusals}
