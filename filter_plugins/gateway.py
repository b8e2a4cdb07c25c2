"""Filters for a DP layout served as replicas behind the model gateway (module_utils gateway.py, replicas.py; the plan
module sglang_plan adds replicas and gateway to a plan).

    replicas: "{{ plan | topolaunch.sglang.replica_servers(state_dir, env_file) }}"
    stale: "{{ unit_files | topolaunch.sglang.stale_units(plan, single_unit, template, gateway_unit) }}"
    watched: "{{ plan | topolaunch.sglang.watched_servers(single_unit, state_dir, env_file) }}"
    served: "{{ replica_records | topolaunch.sglang.host_served_plan(unit_files, gateway_unit) }}"
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


def host_served_plan(records, unit_files, gateway_unit=gateway.UNIT_NAME):
    """The replicas a host serves, rebuilt from what is on it, for a stage run without a plan (`--tags monitoring`
    or `--tags watchdog` alone): a plan with `replicas` (the fields replicas.replica_plan took from each) and
    `gateway` ({unit}, when its unit file is there), from the records of the replicas (replica-<i>/
    current_plan.json: each replica_plan's output, its `replica` saying which) whose unit files are there
    (`unit_files`: names or paths). {} when none is: one server (a replica's record left from an earlier layout has
    no unit any more)."""
    names = {os.path.basename(str(p)) for p in unit_files or []}
    found = []
    for record in records or []:
        which = record.get("replica") if isinstance(record, dict) else None
        if isinstance(which, dict) and which.get("unit") in names and isinstance(which.get("index"), int):
            found.append(record)
    if not found:
        return {}
    found.sort(key=lambda r: r["replica"]["index"])
    out = {k: v for k, v in found[0].items() if k != "replica"}
    out["replicas"] = [{"index": r["replica"]["index"], "unit": r["replica"]["unit"],
                        "gpu_indices": list(r.get("gpu_indices") or []),
                        "cuda_visible_devices": r.get("cuda_visible_devices", ""), "env": dict(r.get("env") or {}),
                        "argv": list(r.get("argv") or []), "host": r.get("host"), "port": r.get("port"),
                        "numa_nodes": (r.get("numa_bind") or {}).get("nodes")}
                       for r in found]
    if gateway_unit in names:
        out["gateway"] = {"unit": gateway_unit}
    return out


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
                "host_served_plan": host_served_plan, "gateway_here": gateway_here,
                "gateway_host_problem": gateway_host_problem}
