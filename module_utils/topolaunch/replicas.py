"""A DP layout served as independent SGLang servers (replicas) behind the model gateway (gateway.py).

SGLang calls its in-process data parallelism (`--dp-size`) "highly not recommended" and points to its model gateway
instead: M servers of `tp * pp` GPUs each, one endpoint in front. A replica is what a server is without a gateway:
its own systemd unit (an instance of the templated `topolaunch-sglang@.service`: `topolaunch-sglang@<i>.service`),
its own port, its GPUs (CUDA_VISIBLE_DEVICES), its `--numa-node` list and its environment; cleanup, launch, health
and rollback act on one replica as they act on the single server. This module turns a plan into its replicas; it
never decides where GPUs go: the planner's placement (`tp_groups`: dp replicas x pp stages, in the order SGLang
would map ranks) is the one placement, which already keeps a TP group inside the fastest island the topology has.
The topology facts (`gpu_topology`) give each replica its NUMA nodes and say when a replica spans two NUMA islands
or P2P cliques. Plain Python 3.9+ stdlib.
"""
from ansible_collections.topolaunch.sglang.plugins.module_utils.text import control_character

__all__ = ["UNIT_TEMPLATE", "ReplicaError", "unit_name", "replica_ports", "split", "replica_plan", "url_host",
           "port_number"]

UNIT_TEMPLATE = "topolaunch-sglang@.service"
# Flags a replica sets itself (its own --host, --port and --numa-node; no --dp-size: one replica is dp 1).
_OWN_FLAGS = {"--host": 1, "--port": 1, "--dp-size": 1, "--data-parallel-size": 1}


class ReplicaError(ValueError):
    """Bad input about replicas: the message names the field and the value."""


def unit_name(index, template=UNIT_TEMPLATE):
    """The instance unit of replica `index`: topolaunch-sglang@.service -> topolaunch-sglang@0.service."""
    prefix, at, suffix = str(template).partition("@")
    if not at or not suffix.startswith("."):
        raise ReplicaError("the replica unit template %r is not a templated unit name (NAME@.service)" % template)
    return "%s@%d%s" % (prefix, int(index), suffix)


def port_number(value, field):
    try:
        port = int(value)
    except (TypeError, ValueError):
        raise ReplicaError("%s: %r is not a port number" % (field, value))
    if isinstance(value, bool) or str(value).strip() != str(port) or not 1 <= port <= 65535:
        raise ReplicaError("%s: %r is not a port number (1-65535)" % (field, value))
    return port


def replica_ports(dp, gateway_port, ports=None, field="topolaunch_replica_ports"):
    """The port of each of `dp` replicas: `ports` when given (one per replica), else the ports after the gateway's
    (gateway_port + 1 + i). A replica port equal to the gateway's or to another replica's is refused, naming it."""
    gateway_port = port_number(gateway_port, "topolaunch_port")
    if ports:
        if not isinstance(ports, (list, tuple)):
            raise ReplicaError("%s: %r is not a list of ports" % (field, ports))
        if len(ports) != dp:
            raise ReplicaError("%s: %d ports %s for %d replicas: give one port per replica" % (
                field, len(ports), list(ports), dp))
        out = [port_number(p, "%s[%d]" % (field, i)) for i, p in enumerate(ports)]
    else:
        out = [gateway_port + 1 + i for i in range(dp)]
        if out[-1] > 65535:
            raise ReplicaError("topolaunch_port: %d leaves no room for %d replica ports after it; set %s" % (
                gateway_port, dp, field))
    for i, p in enumerate(out):
        if p == gateway_port:
            raise ReplicaError("%s[%d]: port %d is the gateway's port (topolaunch_port): the gateway listens there, "
                               "each replica needs a port of its own" % (field, i, p))
        if p in out[:i]:
            raise ReplicaError("%s[%d]: port %d is already replica %d's port" % (field, i, p, out.index(p)))
    return out


def _numa_of(topology):
    return {int(g["index"]): g.get("numa_node") for g in (topology or {}).get("gpus") or [] if "index" in g}


def _island_of(groups, gpu):
    for k, group in enumerate(groups or []):
        if gpu in group:
            return k
    return None


def _strip(argv):
    """argv without the flags a replica sets itself, and the --numa-node list (returned apart)."""
    out, numa, i = [], None, 0
    while i < len(argv):
        a = str(argv[i])
        if a in _OWN_FLAGS:
            i += 1 + _OWN_FLAGS[a]
            continue
        if a == "--numa-node":
            j = i + 1
            while j < len(argv) and not str(argv[j]).startswith("--"):
                j += 1
            numa = [str(v) for v in argv[i + 1:j]]
            i = j
            continue
        out.append(argv[i])
        i += 1
    return out, numa


def _slots(plan, dp, pp, tp, topology, host):
    """Where each replica goes, in replica order: [(node_rank, listen host, its GPUs, NUMA node per GPU or None,
    topology facts or None)]. One node: the plan's placement (tp_groups) on this host, --numa-node from the plan's
    argv or the topology facts. Several nodes (the planner's replica_nodes): node r holds replicas
    r * dp/nnodes ... of its own placement, listening on its address, --numa-node from its own facts."""
    layout = plan.get("layout") or {}
    nodes = plan.get("replica_nodes")
    if nodes:
        if dp % len(nodes):
            raise ReplicaError("plan %s: %d replicas do not spread evenly over %d nodes" % (
                layout.get("name"), dp, len(nodes)))
        here = dp // len(nodes)
        out = []
        for node in nodes:
            groups = [list(g) for g in node.get("tp_groups") or []]
            if len(groups) != here * pp or any(len(g) != tp for g in groups):
                raise ReplicaError("plan %s: node %s's tp_groups %s are not %d replicas x %d stages of %d GPUs" % (
                    layout.get("name"), node.get("node_rank"), groups, here, pp, tp))
            address = str(node.get("address") or "")
            if not address or control_character(address) or address.startswith("-") or \
                    any(c.isspace() for c in address):
                raise ReplicaError("topolaunch_replica_address of node %s: %r is not a host name or address" % (
                    node.get("node_rank"), address))
            order = [int(g) for g in node.get("gpu_indices") or []]
            numa = node.get("numa_nodes")
            mine = int(node.get("node_rank", 0)) == int(plan.get("node_rank", 0))
            for d in range(here):
                gpus = [g for k in range(pp) for g in groups[d * pp + k]]
                own = [str(numa[order.index(g)]) for g in gpus] if numa and len(numa) == len(order) and \
                    all(g in order for g in gpus) else None
                out.append((int(node.get("node_rank", 0)), address, gpus, own, topology if mine else None))
        return out
    if int(layout.get("nnodes", 1)) > 1:
        raise ReplicaError("layout %s: replicas behind the gateway run on one node each; a server across %d nodes "
                           "is not a replica" % (layout.get("name"), layout.get("nnodes")))
    groups = [list(g) for g in plan.get("tp_groups") or []]
    if len(groups) != dp * pp or any(len(g) != tp for g in groups):
        raise ReplicaError("plan %s: its tp_groups %s are not %d replicas x %d stages of %d GPUs" % (
            layout.get("name"), groups, dp, pp, tp))
    order = [int(g) for g in plan.get("gpu_indices") or []]
    flat = [g for grp in groups for g in grp]
    if sorted(order) != sorted(flat):
        raise ReplicaError("plan %s: tp_groups %s do not cover its GPUs %s" % (layout.get("name"), groups, order))
    if control_character(host) or str(host).startswith("-") or not str(host) or any(c.isspace() for c in str(host)):
        raise ReplicaError("topolaunch_replica_host: %r is not a host name or address" % (host,))
    _base, plan_numa = _strip(plan.get("argv") or [])
    numa_facts = _numa_of(topology)
    out = []
    for d in range(dp):
        gpus = [g for k in range(pp) for g in groups[d * pp + k]]
        if plan_numa and len(plan_numa) == len(flat):
            numa = [plan_numa[flat.index(g)] for g in gpus]
        elif all(numa_facts.get(g) is not None for g in gpus) and gpus:
            numa = [str(numa_facts[g]) for g in gpus]
        else:
            numa = None
        out.append((int(plan.get("node_rank", 0)), str(host), gpus, numa, topology))
    return out


def split(plan, topology=None, host="127.0.0.1", ports=None, gateway_port=None, template=UNIT_TEMPLATE):
    """The replicas of a plan: [{index, node_rank, unit, host, port, url, gpu_indices, cuda_visible_devices,
    numa_nodes, env, argv, warnings}], one per DP rank. Each replica's GPUs are its pp stages' TP groups from the
    plan's placement (tp_groups; per node with replicas on several nodes: replica_nodes), in CUDA_VISIBLE_DEVICES
    order; its --numa-node list is the plan's own entries for those GPUs, else one per GPU from the topology facts
    when every one is known (one NUMA node per replica where the placement allows: SGLang then binds each
    scheduler to it). Replicas on one node listen on `host`; on several nodes each on its node's address, where
    the gateway reaches it. Ports are per replica and distinct over all nodes."""
    layout = plan.get("layout") or {}
    dp, pp, tp = int(layout.get("dp", 1)), int(layout.get("pp", 1)), int(layout.get("tp", 1))
    slots = _slots(plan, dp, pp, tp, topology, host)
    if gateway_port is None:
        gateway_port = plan.get("port", 30000)
    ports = replica_ports(dp, gateway_port, ports)
    base, _numa = _strip(plan.get("argv") or [])
    out = []
    for d, (rank, where, gpus, numa, facts) in enumerate(slots):
        islands = (facts or {}).get("islands") or {}
        warnings = []
        for kind, word in (("numa", "NUMA islands"), ("p2p", "P2P cliques")):
            found = {_island_of(islands.get(kind), g) for g in gpus}
            if islands.get(kind) and len(found) > 1:
                warnings.append("replica %d (GPUs %s) spans %s %s" % (
                    d, gpus, word, [islands[kind][k] for k in sorted(found, key=lambda v: (v is None, v))
                                    if k is not None]))
        own = ["--host", where, "--port", str(ports[d])] + (["--numa-node"] + numa if numa else [])
        env = dict(plan.get("env") or {})
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
        argv = list(base) + own
        out.append({"index": d, "node_rank": rank, "unit": unit_name(d, template), "host": where, "port": ports[d],
                    "url": "http://%s:%d" % (url_host(where), ports[d]), "gpu_indices": gpus,
                    "cuda_visible_devices": env["CUDA_VISIBLE_DEVICES"],
                    "numa_nodes": [int(n) for n in numa] if numa else None, "env": env, "argv": argv,
                    "warnings": warnings})
    return out


def url_host(host):
    host = str(host)
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return "[%s]" % host if ":" in host else host


def replica_plan(plan, replica):
    """The plan one replica runs, in the one plan shape (so cleanup, launch, health and rollback take it as they
    take a server's): the plan with this replica's GPUs, env, argv, host, port and dp 1 in its layout, and
    `replica` (index, unit) saying which one it is."""
    out = dict(plan)
    layout = dict(plan.get("layout") or {})
    out.update({"gpu_indices": list(replica["gpu_indices"]), "cuda_visible_devices": replica["cuda_visible_devices"],
                "env": dict(replica["env"]), "argv": list(replica["argv"]), "host": replica["host"],
                "port": replica["port"], "replica": {"index": replica["index"], "unit": replica["unit"],
                                                     "of": layout.get("dp", 1)}})
    out.pop("replicas", None)
    out.pop("gateway", None)
    if replica.get("numa_nodes"):       # health checks this replica's own --numa-node (numa_bind)
        out["numa_bind"] = dict(plan.get("numa_bind") or {"node_cpus": {}}, nodes=list(replica["numa_nodes"]))
    else:
        out.pop("numa_bind", None)
    return out
