"""The SGLang model gateway (`smg`, the Shepherd Model Gateway) in front of a DP layout's replicas (replicas.py).

`topolaunch_gateway: auto | always | never`: auto runs it whenever the plan has dp > 1, always also for one
replica, never keeps SGLang's in-process `--dp-size` (today's single unit). The gateway comes from the registry,
pinned with hashes, into its own venv (the role topolaunch's `topolaunch_gateway_releases`: per gateway release its
requirements and the SGLang releases it pairs with, from smg's own source and CI); this module picks the release
for the installed SGLang, renders the gateway's command line (its worker URLs, policy and health checks; never the
API key, which its launcher reads from the unit's credential) and refuses bad input naming the field, before
anything on a host changes. Plain Python 3.9+ stdlib.
"""
from ansible_collections.topolaunch.sglang.plugins.module_utils import replicas as replica_split
from ansible_collections.topolaunch.sglang.plugins.module_utils.constants import base_version
from ansible_collections.topolaunch.sglang.plugins.module_utils.text import control_character

__all__ = ["MODES", "POLICIES", "UNIT_NAME", "GatewayError", "wanted", "local_replicas", "runs_here", "host_problem",
           "release_for", "argv", "describe", "serve"]

MODES = ("auto", "always", "never")
# smg 1.13.0 bindings/python/src/smg/router_args.py COMMON_POLICY_CHOICES (the routing policies for regular workers)
POLICIES = ("random", "round_robin", "passthrough", "cache_aware", "power_of_two", "least_load", "manual",
            "consistent_hashing", "prefix_hash")
UNIT_NAME = "topolaunch-gateway.service"
# Options topolaunch sets itself: the user's topolaunch_gateway_args may not set them.
_OWN = {"host", "port", "worker_urls", "policy", "api_key", "disable_health_check", "health_check_endpoint",
        "health_check_interval_secs", "health_failure_threshold", "health_success_threshold", "prometheus_host",
        "prometheus_port"}


class GatewayError(ValueError):
    """Bad input about the gateway: the message names the field and the value."""


def wanted(mode, dp):
    """Whether the plan's replicas run behind the gateway: auto = dp > 1."""
    if mode not in MODES:
        raise GatewayError("topolaunch_gateway: %r is not one of %s" % (mode, ", ".join(MODES)))
    return mode == "always" or (mode == "auto" and int(dp) > 1)


def _node_rank(plan):
    return int((plan or {}).get("node_rank", 0) or 0)


def local_replicas(plan):
    """The replicas of a served plan that run on this host (the plan's own node_rank): all of them on one host."""
    here = _node_rank(plan)
    return [r for r in (plan or {}).get("replicas") or []
            if isinstance(r, dict) and int(r.get("node_rank", here)) == here]


def runs_here(plan):
    """Whether the served plan's gateway runs on this host (on one host always; on several, the gateway's)."""
    gateway = (plan or {}).get("gateway")
    return bool(gateway) and int(gateway.get("node_rank", _node_rank(plan))) == _node_rank(plan)


def host_problem(gateway_host, nodes, servers, here):
    """Why topolaunch_gateway_host cannot be the gateway's host ('' when it can, or is empty): it must be a host of
    the sglang_servers group (`servers`) and, with replicas on several hosts (`nodes`: topolaunch_nodes), one of
    them; on one host, that host (`here`)."""
    name = "" if gateway_host is None else str(gateway_host)
    if not name:
        return ""
    servers = [str(h) for h in servers or []]
    nodes = [str(h) for h in nodes or []]
    if name not in servers:
        return "topolaunch_gateway_host: %r is not a host of the sglang_servers group (%s)" % (
            name, ", ".join(servers) or "it is empty")
    if len(nodes) > 1 and name not in nodes:
        return "topolaunch_gateway_host: %r is not one of topolaunch_nodes (%s), the hosts the replicas run on" % (
            name, ", ".join(nodes))
    if len(nodes) <= 1 and name != str(here):
        return ("topolaunch_gateway_host: %r is not this host (%s): with topolaunch_nodes unset the replicas and "
                "the gateway run on one host" % (name, here))
    return ""


def release_for(releases, version, sglang_version, mode="auto"):
    """The row of the release table (topolaunch_gateway_releases) for gateway `version`, which must pair with the
    installed SGLang release. Refused (naming the field) when the table has no such gateway, or it does not pair."""
    if not isinstance(releases, dict) or not releases:
        raise GatewayError("topolaunch_gateway_releases: %r is not a table of gateway releases" % (releases,))
    row = releases.get(str(version))
    if not isinstance(row, dict):
        raise GatewayError("topolaunch_gateway_version: %r is not in topolaunch_gateway_releases (it lists %s)" % (
            version, ", ".join(sorted(map(str, releases)))))
    sglang = base_version(sglang_version)
    pairs = [str(v) for v in row.get("sglang") or []]
    if sglang not in pairs:
        others = sorted(str(v) for v, r in releases.items() if isinstance(r, dict)
                        and sglang in [str(s) for s in r.get("sglang") or []])
        raise GatewayError(
            "topolaunch_gateway: %s, but topolaunch_gateway_releases has no gateway for SGLang %s: gateway %s pairs "
            "with SGLang %s%s" % (mode, sglang, version, ", ".join(pairs) or "nothing",
                                  "; gateways %s do (topolaunch_gateway_version)" % ", ".join(others)
                                  if others else ""))
    for field in ("package", "requirements"):
        if not row.get(field):
            raise GatewayError("topolaunch_gateway_releases[%s].%s is missing" % (version, field))
    return dict(row, version=str(version))


def _item(value, field):
    text = str(value)
    bad = control_character(text)
    if bad is not None:
        raise GatewayError("%s: %r holds the control character %r" % (field, value, bad))
    if text.startswith("-"):
        raise GatewayError("%s: %r looks like a flag" % (field, value))
    return text


def argv(replicas, host, port, policy="cache_aware", health_interval=10, extra=None, metrics_port=29000):
    """The gateway's command line after `smg launch`: listen on host:port, route to every replica's URL with
    `policy`, probe each replica's /health (SGLang's liveness route) every `health_interval` seconds, serve its
    Prometheus metrics on 127.0.0.1:metrics_port (smg's default is every address). `extra`: the user's
    topolaunch_gateway_args (snake_case smg options: value, true for a switch, a list for many)."""
    if policy not in POLICIES:
        raise GatewayError("topolaunch_gateway_policy: %r is not one of smg's policies %s" % (
            policy, ", ".join(POLICIES)))
    try:
        interval = int(health_interval)
    except (TypeError, ValueError):
        interval = 0
    if isinstance(health_interval, bool) or interval < 1:
        raise GatewayError("topolaunch_gateway_health_interval: %r is not a number of seconds >= 1" % (
            health_interval,))
    if not replicas:
        raise GatewayError("the gateway has no replica to route to")
    out = ["--host", _item(host, "topolaunch_host"), "--port", str(int(port)),
           "--worker-urls"] + [_item(r["url"], "replica %d url" % r["index"]) for r in replicas]
    try:
        metrics = replica_split.port_number(metrics_port, "topolaunch_gateway_metrics_port")
    except replica_split.ReplicaError as exc:
        raise GatewayError(str(exc))
    if metrics == int(port):
        raise GatewayError("topolaunch_gateway_metrics_port: %d is the gateway's port (topolaunch_port)" % metrics)
    if metrics in [int(r["port"]) for r in replicas if "port" in r]:
        raise GatewayError("topolaunch_gateway_metrics_port: %d is a replica's port" % metrics)
    out += ["--policy", policy, "--health-check-endpoint", "/health",
            "--health-check-interval-secs", str(interval), "--prometheus-host", "127.0.0.1",
            "--prometheus-port", str(metrics)]
    for key, value in sorted((extra or {}).items()):
        name = str(key)
        if name in _OWN or name.replace("-", "_") in _OWN:
            raise GatewayError("topolaunch_gateway_args.%s: topolaunch sets it (see the README's gateway section)"
                               % name)
        if not name.replace("_", "").replace("-", "").isalnum():
            raise GatewayError("topolaunch_gateway_args: %r is not an option name" % name)
        flag = "--" + name.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            out += [flag] + [_item(v, "topolaunch_gateway_args.%s" % name) for v in value]
        else:
            out += [flag, _item(value, "topolaunch_gateway_args.%s" % name)]
    return out


def describe(gateway_argv, replicas):
    """One line for the plan's reason: what serves the endpoint."""
    policy = gateway_argv[gateway_argv.index("--policy") + 1]
    nodes = len({r.get("node_rank", 0) for r in replicas})
    return "%d replicas behind the model gateway (%s)%s: %s" % (
        len(replicas), policy, " on %d nodes" % nodes if nodes > 1 else "", "; ".join("%s%s on GPUs %s port %d%s" % (
            r["unit"], " (node %d, %s)" % (r.get("node_rank", 0), r["host"]) if nodes > 1 else "",
            ",".join(map(str, r["gpu_indices"])), r["port"],
            " NUMA %s" % ",".join(sorted({str(n) for n in r["numa_nodes"]})) if r.get("numa_nodes") else "")
            for r in replicas))


def serve(plan, topology=None, mode="auto", releases=None, version=None, policy="cache_aware", health_interval=10,
          replica_ports=None, replica_host="127.0.0.1", extra=None, metrics_port=29000):
    """The plan as it is served: unchanged when the gateway is not wanted (dp = 1 keeps today's single unit, and
    `never` keeps SGLang's own --dp-size); else the plan with `replicas` (replicas.split: which replica is where)
    and `gateway` {unit, node_rank (the node it runs on), version, package, requirements, host, port, url, policy,
    argv}. Every check runs here, on the controller's plan, before anything on a host changes."""
    layout = plan.get("layout") or {}
    if not wanted(mode, layout.get("dp", 1)):
        return plan
    row = release_for(releases, version, plan.get("sglang_version"), mode)
    try:
        reps = replica_split.split(plan, topology, host=replica_host, ports=replica_ports,
                                   gateway_port=plan.get("port", 30000))
    except replica_split.ReplicaError as exc:
        raise GatewayError(str(exc))
    gateway_argv = argv(reps, plan.get("host", "127.0.0.1"), plan.get("port", 30000), policy, health_interval,
                        extra, metrics_port)
    out = dict(plan)
    out["replicas"] = reps
    # the node the gateway runs on: the planner's gateway_node with replicas on several nodes, else this one
    out["gateway"] = {"unit": UNIT_NAME, "node_rank": int(plan.get("gateway_node", plan.get("node_rank", 0))),
                      "version": row["version"], "package": row["package"],
                      "host": str(plan.get("host", "127.0.0.1")), "port": int(plan.get("port", 30000)),
                      "url": "http://%s:%d" % (replica_split.url_host(plan.get("host", "127.0.0.1")),
                                               int(plan.get("port", 30000))),
                      "policy": policy, "argv": gateway_argv}
    out["warnings"] = list(plan.get("warnings") or []) + [w for r in reps for w in r["warnings"]]
    out["reason"] = " ".join(filter(None, [plan.get("reason"), describe(gateway_argv, reps) + "."]))
    return out
