"""Filters for a DP layout served as replicas behind the model gateway (module_utils gateway.py, replicas.py; the plan
module sglang_plan adds replicas and gateway to a plan).

    replicas: "{{ plan | topolaunch.sglang.replica_servers(state_dir, env_file) }}"
    stale: "{{ unit_files | topolaunch.sglang.stale_units(plan, single_unit, template, gateway_unit) }}"
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


def replica_servers(plan, state_dir, env_file):
    """One entry per replica of a served plan: what the one-server steps (validate, cleanup, launch, health,
    rollback) take for it - {index, unit, plan (replicas.replica_plan), state_dir, env_file}."""
    out = []
    for r in (plan or {}).get("replicas") or []:
        out.append({"index": r["index"], "unit": r["unit"], "plan": replicas.replica_plan(plan, r),
                    "state_dir": replica_state_dir(state_dir, r["index"]),
                    "env_file": replica_env_file(env_file, r["index"])})
    return out


def stale_units(unit_files, plan, single_unit, template=replicas.UNIT_TEMPLATE, gateway_unit=gateway.UNIT_NAME):
    """The units of ours on the host (`unit_files`: names or paths in the unit directory) that the plan does not
    run, the other shape's: with replicas, the single unit and replica instances beyond the plan's; without, every
    replica instance and the gateway. Each: {unit, index (a replica's, else None)}."""
    prefix, _, suffix = str(template).partition("@")
    wanted = {r["unit"] for r in (plan or {}).get("replicas") or []}
    if (plan or {}).get("gateway"):
        wanted.add(gateway_unit)
    else:
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
        return {"replica_servers": replica_servers, "stale_units": stale_units}
