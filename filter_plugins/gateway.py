"""Filters for a DP layout served as replicas behind the model gateway (module_utils gateway.py, replicas.py; the plan
module sglang_plan adds replicas and gateway to a plan).

    replicas: "{{ plan | topolaunch.sglang.replica_servers(state_dir, env_file) }}"
    stale: "{{ unit_files | topolaunch.sglang.stale_units(plan, single_unit, template, gateway_unit) }}"
    watched: "{{ plan | topolaunch.sglang.watched_servers(single_unit, state_dir, env_file) }}"
    problem: "{{ gateway_host | topolaunch.sglang.gateway_host_problem(nodes, groups.sglang_servers, inventory_hostname) }}"
    here: "{{ plan | topolaunch.sglang.gateway_here }}"

With replicas on several hosts (the planner's replica_nodes) each host's served plan lists every replica (node_rank
says where) and the gateway (its node_rank); this host's node_rank is the plan's own. A host runs its replicas, and
the gateway when it is the gateway's node.
"""
import os

from ansible_collections.topolaunch.sglang.plugins.module_utils import gateway, replicas


def replica_state_dir(state_dir, index):
    """Where replica `index` keeps what a server keeps in the state directory (current and last good plan)."""
    return os.path.join(str(state_dir), "replica-%d" % int(index))


def replica_env_file(env_file, index):
    """Replica `index`'s env file beside the server's: /etc/topolaunch/sglang.env -> sglang@0.env."""
    root, ext = os.path.splitext(str(env_file))
    return "%s@%d%s" % (root, int(index), ext)


def local_replicas(plan):
    """gateway.local_replicas: the replicas of a served plan that run on this host."""
    return gateway.local_replicas(plan)


def gateway_here(plan):
    """gateway.runs_here: whether the served plan's gateway runs on this host."""
    return gateway.runs_here(plan)


def gateway_host_problem(gateway_host, nodes, servers, here):
    """gateway.host_problem: '' or the one-line reason topolaunch_gateway_host is refused."""
    return gateway.host_problem(gateway_host, nodes, servers, here)


def replica_servers(plan, state_dir, env_file):
    """One entry per replica of a served plan that runs on this host: what the one-server steps (validate,
    cleanup, launch, health, rollback) take for it - {index, unit, plan (replicas.replica_plan), state_dir,
    env_file}."""
    out = []
    for r in local_replicas(plan):
        out.append({"index": r["index"], "unit": r["unit"], "plan": replicas.replica_plan(plan, r),
                    "state_dir": replica_state_dir(state_dir, r["index"]),
                    "env_file": replica_env_file(env_file, r["index"])})
    return out


def watched_servers(plan, single_unit, state_dir, env_file):
    """What the watchdog probes and restarts (issue 23: per replica when there are replicas): [{unit, current_plan}]
    of each replica of a served plan (its own state directory's record), else of the one server."""
    replicas_ = replica_servers(plan, state_dir, env_file)
    if replicas_:
        return [{"unit": r["unit"], "current_plan": os.path.join(r["state_dir"], "current_plan.json")}
                for r in replicas_]
    return [{"unit": single_unit, "current_plan": os.path.join(str(state_dir), "current_plan.json")}]


def stale_units(unit_files, plan, single_unit, template=replicas.UNIT_TEMPLATE, gateway_unit=gateway.UNIT_NAME):
    """The units of ours on the host (`unit_files`: names or paths in the unit directory) that the plan does not
    run here, the other shape's: with replicas, the single unit and replica instances beyond the plan's on this
    host (and the gateway on a host that is not the gateway's); without, every replica instance and the gateway.
    Each: {unit, index (a replica's, else None)}."""
    prefix, _at, suffix = str(template).partition("@")
    wanted = {r["unit"] for r in local_replicas(plan)}
    if gateway_here(plan):
        wanted.add(gateway_unit)
    elif not (plan or {}).get("gateway"):
        wanted.add(single_unit)
    out = []
    for name in sorted({os.path.basename(str(p)) for p in unit_files or []}):
        if name in wanted:
            continue
        index = None
        if name.startswith(prefix + "@") and name.endswith(suffix):
            middle = name[len(prefix) + 1:len(name) - len(suffix)]
            if not middle.isdigit():
                continue
            index = int(middle)
        elif name not in (single_unit, gateway_unit):
            continue
        out.append({"unit": name, "index": index})
    return out


class FilterModule:
    """topolaunch.sglang gateway and replica filters."""

    def filters(self):
        return {"replica_servers": replica_servers, "stale_units": stale_units, "watched_servers": watched_servers,
                "gateway_here": gateway_here, "gateway_host_problem": gateway_host_problem}
