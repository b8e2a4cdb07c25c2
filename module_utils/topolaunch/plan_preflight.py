"""The planner's use of a preflight record (preflight.py): this machine's measured links instead of table values.

Plain Python 3.9+ stdlib. A record applies to the node whose topology fingerprint it carries; from its `figures`
(measured with the P2P setting the plan will run):

- every directed GPU pair that copied: its GB/s replaces the table value (NodeTopology.measured_pairs);
- every group with an NCCL allreduce: its bus bandwidth and 8 KB latency (NodeTopology.measured_groups); a TP group
  that was not measured itself takes the efficiency measured for its size (busbw over the measured group's slowest
  pair) times its own slowest pair, and that size's latency (NodeTopology.allreduce_figures);
- `cross_socket_p2p.proven`: NCCL_P2P_LEVEL=SYS worked and was faster on every group across the sockets, so the
  plan may set it (plan_topology.nccl_env rule 2), with the figures measured that way for those groups;
- `plan_fixes`: env (NCCL_P2P_DISABLE=1) and server args (disable_custom_all_reduce) the plan applies itself.

A record of another topology is ignored (a warning says so); a record whose `ok` is false (the GPUs misbehave even
with the fixes) refuses the plan. Bad input: every problem named by its field, nothing applied.
"""
import re

__all__ = ["check_record", "applies_to", "server_args_with_fixes", "describe"]

_ENV_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_record(record):
    """(record, reasons): the record when its shape is usable by the planner, every problem otherwise."""
    if record is None:
        return None, []
    if not isinstance(record, dict):
        return None, ["preflight: must be a preflight record (a mapping), got %s" % type(record).__name__]
    reasons = []
    if not isinstance(record.get("fingerprint"), str) or not record["fingerprint"]:
        reasons.append("preflight.fingerprint: %r is not a topology fingerprint" % (record.get("fingerprint"),))
    figures = record.get("figures")
    if not isinstance(figures, dict):
        return None, reasons + ["preflight.figures: missing or not a mapping (a record of preflight.derive)"]
    for key in ("pairs", "groups"):
        if not isinstance(figures.get(key), list):
            reasons.append("preflight.figures.%s: must be a list" % key)
    for k, p in enumerate(figures.get("pairs") if isinstance(figures.get("pairs"), list) else []):
        if not isinstance(p, dict) or not all(isinstance(p.get(x), int) for x in ("src", "dst")) or (
                p.get("gbps") is not None and not _number(p["gbps"])):
            reasons.append("preflight.figures.pairs[%d]: %r is not {src, dst, gbps, status}" % (k, p))
    for k, g in enumerate(figures.get("groups") if isinstance(figures.get("groups"), list) else []):
        if not isinstance(g, dict) or not isinstance(g.get("gpus"), list) or not all(
                isinstance(x, int) for x in g["gpus"]) or any(
                    g.get(x) is not None and not _number(g[x]) for x in ("busbw_gbps", "latency_us")):
            reasons.append("preflight.figures.groups[%d]: %r is not {gpus, busbw_gbps, latency_us, status}" % (k, g))
    fixes = record.get("plan_fixes", {"env": {}, "server_args": {}})
    if not isinstance(fixes, dict) or not isinstance(fixes.get("env", {}), dict) or not isinstance(
            fixes.get("server_args", {}), dict):
        reasons.append("preflight.plan_fixes: %r is not {env: {...}, server_args: {...}}" % (fixes,))
    else:
        for name, value in fixes.get("env", {}).items():
            if not isinstance(name, str) or not _ENV_NAME.match(name) or not isinstance(value, str) or any(
                    ord(c) < 0x20 for c in value):
                reasons.append("preflight.plan_fixes.env: %r=%r is not an environment variable" % (name, value))
    if not isinstance(record.get("ok", True), bool):
        reasons.append("preflight.ok: %r is not true or false" % (record.get("ok"),))
    return (None if reasons else record), reasons


def applies_to(record, nodes):
    """The nodes (NodeTopology) the record was measured on: those with its fingerprint."""
    return [n for n in nodes if record and n.fingerprint == record.get("fingerprint")]


def server_args_with_fixes(server_args, record, warnings):
    """server_args with the record's plan_fixes server args added; a value the user set wins, with a warning."""
    fixes = ((record or {}).get("plan_fixes") or {}).get("server_args") or {}
    if not fixes or not isinstance(server_args, (dict, type(None))):
        return server_args
    merged = dict(fixes)
    for key, value in (server_args or {}).items():
        if key in fixes and value != fixes[key]:
            warnings.append("server_args.%s=%r overrides the preflight's fix %s=%r (P2P misbehaved on this "
                            "topology)" % (key, value, key, fixes[key]))
        merged[key] = value
    return merged


def describe(record, used):
    """One sentence for the plan's reason: whose link figures the estimates use."""
    if not used:
        return ""
    figures = record["figures"]
    sizes = sorted({len(g["gpus"]) for g in figures["groups"] if g.get("status") == "ok" and len(g["gpus"]) > 1})
    text = "Link figures measured on this machine by the preflight of %s (topology %s): %d GPU pairs%s" % (
        record.get("created") or "?", record["fingerprint"],
        len([p for p in figures["pairs"] if p.get("status") == "ok" and p.get("gbps")]),
        ", NCCL allreduce at %s GPUs" % "/".join(map(str, sizes)) if sizes else "")
    if figures.get("p2p_disabled"):
        text += ", with P2P off as the plan runs it"
    return text + "."
