"""The health stage on a server across nodes: when a worker node is ready, and every node's rank processes.

A plan with `layout.nnodes > 1` runs one launcher per node. SGLang on a node with node_rank >= 1 runs no API
server: once its ranks are ready it serves a small health check server on its own --host/--port
(entrypoints/http_server.py, 0.5.9 and 0.5.23: `Dummy health check server started in background thread at H:P`;
/health, /health_generate and /ping answer 200, everything else 404). So a worker is followed to that line, and
asked /health only; node 0 is followed and asked as a one-node server is. On every node the unit's scheduler
processes must be the ranks the plan gives the node (`per_node[node_rank].processes`: SGLang's process titles,
plan_nodes.scheduler_titles): a rank that died without taking its launcher down, or one too many, is a failure.

Plain Python 3.9+ stdlib; /proc through `proc_root`.
"""
import os

from .cleanup import in_unit_cgroup, read_process

WORKER_READY = "Dummy health check server started in background thread at"
TITLE_PREFIX = "sglang::scheduler"


def node_entry(plan):
    """This node's per_node entry of a plan across nodes, or None for a one-node plan."""
    layout = plan.get("layout") if isinstance(plan.get("layout"), dict) else {}
    nodes = plan.get("per_node")
    rank = plan.get("node_rank", 0)
    if int(layout.get("nnodes") or 1) <= 1 or not isinstance(nodes, list):
        return None
    return next((n for n in nodes if isinstance(n, dict) and n.get("node_rank") == rank), None)


def is_worker(plan):
    """True on a node with node_rank >= 1 of a server across nodes (no API; SGLang's health check server)."""
    return node_entry(plan) is not None and int(plan.get("node_rank") or 0) >= 1


def milestones(plan, base):
    """The milestones to follow: `base` (key, words), with a worker's ready line in place of node 0's."""
    if not is_worker(plan):
        return base
    return [(key, WORKER_READY if key == "ready" else words) for key, words in base]


def unit_schedulers(unit, proc_root="/proc", pids=False):
    """Titles of the scheduler processes in the unit's cgroup, sorted; with `pids`, (pid, title) pairs."""
    titles = []
    for entry in os.listdir(proc_root):
        if not entry.isdigit():
            continue
        info = read_process(int(entry), proc_root)
        if info and info["state"] not in ("Z", "X") and info["title"].startswith(TITLE_PREFIX) \
                and in_unit_cgroup(info["cgroup"], unit):
            titles.append((info["pid"], info["title"]) if pids else info["title"])
    return sorted(titles, key=lambda t: (t[1], t[0]) if pids else t)


def rank_problem(unit, plan, proc_root="/proc"):
    """Why this node's rank processes are not the ones its plan names (None when they are, or the plan names
    none: one node)."""
    node = node_entry(plan)
    expected = (node or {}).get("processes")
    if not expected:
        return None
    found = unit_schedulers(unit, proc_root)
    missing = [t for t in expected if found.count(t) < expected.count(t)]
    extra = sorted(t for t in set(found) if found.count(t) > expected.count(t))
    if not missing and not extra:
        return None
    parts = []
    if missing:
        parts.append("missing %s" % ", ".join(missing))
    if extra:
        parts.append("not in the plan %s" % ", ".join(extra))
    return ("node %s runs %d of its %d rank processes in %s: %s (layout %s; ps -eo pid,args | grep %s)"
            % (plan.get("node_rank"), len(expected) - len(missing), len(expected), unit, "; ".join(parts),
               (plan.get("layout") or {}).get("name", "?"), TITLE_PREFIX))
