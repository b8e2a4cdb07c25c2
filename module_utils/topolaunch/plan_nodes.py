"""Several nodes as one SGLang server: what the planner checks and says across nodes.

Plain Python 3.9+ stdlib, used by planner.py for plans with nnodes > 1 (SGLang's --nnodes/--node-rank/
--dist-init-addr: one launcher per node, torch.distributed and NCCL underneath).

- `node_mapping` / `node_ranks`: the ranks SGLang 0.5.9 starts on each node (entrypoints/engine.py
  _launch_scheduler_processes: pp_size_per_node = max(pp // nnodes, 1), nnodes_per_pp_rank = max(nnodes // pp, 1),
  tp_size_per_node = tp // nnodes_per_pp_rank; node r runs pp ranks [pp_per_node * (r // nodes_per_pp), ...) and
  tp ranks [tp_per_node * (r % nodes_per_pp), ...)).
- `scheduler_titles`: the process titles of those ranks (managers/scheduler.py run_scheduler_process:
  `sglang::scheduler` + `_PP{p}` when pp > 1, `_TP{t}` when tp > 1, `_EP{e}` when ep > 1 with
  e = t // (tp / ep); 0.5.23's configure_scheduler_process writes the same), which the health stage looks for.
- `check_nodes`: nodes that differ in GPU model, GPU count or driver branch are refused (one model runs across them:
  SGLang splits it evenly and NCCL needs the same driver branch end to end); any other difference of what the
  topology fingerprint covers is a warning that lists them.
- `crossings`: where a layout's traffic crosses the network between nodes (a TP group spanning nodes: two
  allreduces per layer; a PP stage boundary between nodes: each micro-batch's hidden states), in words.
- `check_node_servers`: each node's listen address (node 0: the API; the others: SGLang's health check server),
  and where its replicas listen when a DP layout is served as replicas on several nodes (`address`).
"""
from .plan_args import text_problem
from .topology import fingerprint_basis

# fingerprint_basis "gpus" entries: [name, memory, compute capability, PCIe max gen, PCIe max width, MIG]
GPU_FIELDS = ((1, "GPU memory"), (2, "compute capability"), (3, "PCIe max generation"), (4, "PCIe max width"),
              (5, "MIG mode"))
OTHER_KEYS = (("links", "link matrix (nvidia-smi topo -m)"), ("nvlink_counts", "NVLink counts"),
              ("p2p", "P2P matrices"), ("numa_islands", "NUMA islands"))
SAME_NEEDED = "one server across nodes needs the same GPU model, GPU count and driver branch on every node"


def node_mapping(tp, pp, nnodes):
    """(tp per node, pp per node, nodes per pp rank) as SGLang maps ranks to nodes."""
    pp_per_node = max(pp // nnodes, 1)
    nodes_per_pp = max(nnodes // pp, 1)
    return tp // nodes_per_pp, pp_per_node, nodes_per_pp


def node_ranks(tp, pp, nnodes, node_rank):
    """(pp ranks, tp ranks) that node `node_rank` runs."""
    tp_local, pp_local, nodes_per_pp = node_mapping(tp, pp, nnodes)
    first_pp = pp_local * (node_rank // nodes_per_pp)
    first_tp = tp_local * (node_rank % nodes_per_pp)
    return list(range(first_pp, first_pp + pp_local)), list(range(first_tp, first_tp + tp_local))


def scheduler_titles(tp, pp, ep, nnodes, node_rank):
    """The titles of the scheduler processes SGLang starts on this node, in start order."""
    pp_ranks, tp_ranks = node_ranks(tp, pp, nnodes, node_rank)
    titles = []
    for p in pp_ranks:
        for t in tp_ranks:
            title = "sglang::scheduler"
            if pp > 1:
                title += "_PP%d" % p
            if tp > 1:
                title += "_TP%d" % t
            if ep > 1:
                title += "_EP%d" % (t // (tp // ep))
            titles.append(title)
    return titles


def _nodes_text(first, count):
    return "node %d" % first if count == 1 else "nodes %d-%d" % (first, first + count - 1)


def crossings(tp, pp, nnodes):
    """[(short, sentence)] for every place the layout's traffic crosses the network; [] on one node."""
    if nnodes <= 1:
        return []
    tp_local, pp_local, nodes_per_pp = node_mapping(tp, pp, nnodes)
    out = []
    if nodes_per_pp > 1:
        spans = ", ".join(_nodes_text(k, nodes_per_pp) for k in range(0, nnodes, nodes_per_pp))
        out.append(("TP over %d nodes" % nodes_per_pp,
                    "each TP group of %d spans %d nodes (%s, %d GPUs on each): its 2 allreduces per layer cross the "
                    "network" % (tp, nodes_per_pp, spans, tp_local)))
    for k in range(pp - 1):
        if (k + 1) % pp_local:
            continue
        here = _nodes_text(nodes_per_pp * (k // pp_local), nodes_per_pp)
        there = _nodes_text(nodes_per_pp * ((k + 1) // pp_local), nodes_per_pp)
        out.append(("PP %d>%d" % (k, k + 1),
                    "PP stage %d -> %d crosses the network from %s to %s: each micro-batch's hidden states, once "
                    "per step" % (k, k + 1, here, there)))
    if nodes_per_pp == 1:
        out.append(("TP inside nodes", "every TP group stays inside one node (its allreduces never cross the network)"))
    return out


def cross_node_tp_reason(tp, pp, nnodes):
    """Why a layout whose TP groups span nodes is refused unless allowed (None when they stay inside a node)."""
    _tp_local, _pp_local, nodes_per_pp = node_mapping(tp, pp, nnodes)
    if nodes_per_pp <= 1:
        return None
    return ("each TP group of %d would span %d nodes, so its 2 allreduces per layer cross the network; TP is kept "
            "inside a node unless allow_cross_node_tp is set (topolaunch_allow_cross_node_tp: true)"
            % (tp, nodes_per_pp))


def _describe(facts):
    gpus = facts.get("gpus") or []
    names = sorted({str(g.get("name", "?")) for g in gpus})
    return {
        "GPU model": " + ".join(names) or "?",
        "GPU count": str(facts.get("gpu_count", len(gpus))),
        "driver branch": str(facts.get("driver_version", "?")).split(".", maxsplit=1)[0],
    }


def _basis(facts):
    try:
        return fingerprint_basis(facts)
    except (KeyError, TypeError, IndexError):
        return None


def _other_differences(a, b):
    """What else of the fingerprint differs between two nodes' bases (names, in FINGERPRINT_DOC's order)."""
    found = []
    pairs = list(zip(a["gpus"], b["gpus"]))
    for index, words in GPU_FIELDS:
        if any(x[index] != y[index] for x, y in pairs):
            found.append(words)
    found.extend(words for key, words in OTHER_KEYS if a.get(key) != b.get(key))
    return found


def check_nodes(topologies):
    """(reasons, warnings) for the nodes' gpu_topology facts in node-rank order, each compared with node 0."""
    reasons, warnings = [], []
    if len(topologies) < 2:
        return reasons, warnings
    first = _describe(topologies[0])
    first_basis = _basis(topologies[0])
    for rank, facts in enumerate(topologies[1:], 1):
        this = _describe(facts)
        differ = [key for key in first if this[key] != first[key]]
        if differ:
            values = "; ".join("%s: node 0 %s, node %d %s" % (key, first[key], rank, this[key]) for key in differ)
            reasons.append("node %d differs from node 0 in %s (%s): %s" % (rank, ", ".join(differ), values,
                                                                           SAME_NEEDED))
            continue
        basis = _basis(facts)
        if first_basis is None or basis is None or basis == first_basis:
            continue
        warnings.append("node %d's topology differs from node 0's (fingerprints %s, %s) in: %s; each node is placed on "
                        "its own topology and memory is sized by the smallest GPU, but measure before trusting the "
                        "estimate" % (rank, topologies[0].get("fingerprint", "?"), facts.get("fingerprint", "?"),
                                      ", ".join(_other_differences(first_basis, basis)) or "other facts"))
    return reasons, warnings


def check_node_servers(servers, nnodes):
    """([{host, port[, address]}] per node or None, reasons): where each node's SGLang listens (--host/--port);
    `address`, when given: where that node's replicas listen (replicas on several nodes)."""
    if servers is None:
        return None, []
    if not isinstance(servers, list) or len(servers) != nnodes:
        return None, ["node_servers must list one {host, port} per node (%d), got %r" % (nnodes, servers)]
    out, reasons = [], []
    for rank, entry in enumerate(servers):
        host = entry.get("host") if isinstance(entry, dict) else None
        port = entry.get("port") if isinstance(entry, dict) else None
        if not isinstance(host, str) or not host.strip():
            reasons.append("node_servers[%d].host must be a non-empty string, got %r" % (rank, host))
        elif text_problem(host, "node_servers[%d].host" % rank):
            reasons.append(text_problem(host, "node_servers[%d].host" % rank))
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            reasons.append("node_servers[%d].port must be a port number (1-65535), got %r" % (rank, port))
        address = entry.get("address") if isinstance(entry, dict) else None
        if address is not None and (not isinstance(address, str) or not address.strip() or address.startswith("-")
                                    or any(c.isspace() for c in address)):
            reasons.append("node_servers[%d].address (topolaunch_replica_address) must be a host name or address, "
                           "got %r" % (rank, address))
        elif address is not None and text_problem(address, "node_servers[%d].address" % rank):
            reasons.append(text_problem(address, "node_servers[%d].address" % rank))
        entry = {"host": host, "port": port}
        if address is not None:
            entry["address"] = address
        out.append(entry)
    return (None if reasons else out), reasons
