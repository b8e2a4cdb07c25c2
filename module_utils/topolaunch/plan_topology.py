"""GPU placement for the planner: link speeds, islands, TP groups, PP stage order, NCCL settings.

Plain Python 3.9+ stdlib. Input: one node's `gpu_topology` facts (docs/DESIGN.md).

Link speed of a GPU pair (GB/s, one direction), from the nvidia-smi word in `links`, the P2P read status and
each GPU's PCIe link (constants and their sources in plan_perf.py):

| pair | GB/s |
| --- | --- |
| NV# | # links x the NVLink generation's rate per link (25 GB/s on A100/Hopper, 50 on Blackwell) |
| PIX, PXB, PHB, NODE with P2P | the slower GPU's PCIe link (generation x lanes) x the measured P2P fraction |
| SYS with P2P | the same x the measured cross-socket factor |
| P2P not OK | the PCIe link x the measured host-staged fraction (copies go through host memory) |

A measured preflight record (plan_preflight.py) replaces these table values pair by pair, and gives the NCCL
allreduce figures of the groups it measured (`allreduce_figures`).

Islands: GPUs are clustered by complete linkage on these speeds (the slowest pair inside a cluster decides),
so a NUMA node, a P2P clique and an NVLink island each end up as one cluster, nested as the links are. The
leaf order of that cluster tree keeps every island contiguous. TP groups are cut from it bottom-up: each
cluster first forms as many whole groups of tp GPUs as it can from its own GPUs; only the rest straddle into
the neighbouring cluster. PP stages (and DP replicas) take groups in tree order, so stage k+1 sits next to
stage k and a two-socket box puts the stage boundary on the socket boundary.

SGLang 0.5.9 maps ranks to devices as gpu_id = dp_rank*tp*pp + pp_rank*tp + tp_rank in CUDA_VISIBLE_DEVICES
order (sglang/srt/entrypoints/engine.py _launch_scheduler_processes, managers/data_parallel_controller.py
launch_dp_schedulers: base_gpu_id += tp_size * pp_size per DP rank), so the planner lists the GPUs as
replica 0 stage 0 group, replica 0 stage 1 group, ..., replica 1 stage 0 group, ...
"""
from . import plan_perf

LEVEL_ORDER = {"X": 0, "NV": 1, "PIX": 2, "PXB": 3, "PHB": 4, "NODE": 5, "SYS": 6, "UNK": 6, "NET": 7}


class NodeTopology:
    """One node's facts with the questions placement asks: pair speed, P2P, level, memory."""

    def __init__(self, facts, allowed=None):
        if not isinstance(facts, dict) or not isinstance(facts.get("gpus"), list):
            raise ValueError("topology facts must be a mapping with a gpus list (ansible_facts.gpu_topology)")
        self.facts = facts
        self.gpus = {g["index"]: g for g in facts["gpus"]}
        n = len(facts["gpus"])
        self.links = facts.get("links") or facts.get("pcie_levels") or [
            ["X" if i == j else "UNK" for j in range(n)] for i in range(n)]
        p2p = facts.get("p2p") or {}
        self.p2p_read = p2p.get("read") or [["X" if i == j else "OK" for j in range(n)] for i in range(n)]
        self.indices = sorted(self.gpus) if allowed is None else [i for i in sorted(self.gpus) if i in set(allowed)]
        self.fingerprint = facts.get("fingerprint") or "unknown"
        self.measured_pairs = {}   # (i, j) -> GB/s from a preflight record
        self.measured_groups = {}  # (level, sorted GPUs) -> (busbw GB/s, latency us); level "" or "SYS"
        self._tree = None
        self._groups = {}

    def level(self, i, j):
        word = self.links[i][j]
        return "NV" if word.startswith("NV") else word

    def p2p_ok(self, i, j):
        return i == j or self.p2p_read[i][j] == "OK" or self.level(i, j) == "NV"

    def pcie_rate(self, i):
        """Rated PCIe GB/s per direction of GPU i's link: the generation the link can reach, the lanes it has."""
        pcie = self.gpus[i].get("pcie") or {}
        width = pcie.get("cur_width") or pcie.get("max_width") or 16
        return plan_perf.pcie_gbps(pcie.get("max_gen") or 4, width)

    def bandwidth(self, i, j):
        """GB/s one direction between GPUs i and j (see the module docstring)."""
        if i == j:
            return float("inf")
        measured = self.measured_pairs.get((i, j)) or self.measured_pairs.get((j, i))
        if measured:
            return measured
        word = self.links[i][j]
        if word.startswith("NV"):
            try:
                count = int(word[2:])
            except ValueError:
                count = 1
            return plan_perf.nvlink_gbps_per_link(self.gpus[i].get("compute_capability")) * count
        rate = min(self.pcie_rate(i), self.pcie_rate(j))
        if self.p2p_read[i][j] != "OK":
            return rate * plan_perf.HOST_STAGED_FRACTION
        rate *= plan_perf.PCIE_P2P_FRACTION
        return rate * plan_perf.PCIE_CROSS_SOCKET_FACTOR if word == "SYS" else rate

    def use_preflight(self, figures):
        """Take a preflight record's figures (preflight.py `figures`): measured pair bandwidths, the allreduce
        figures of each measured group, and those measured with NCCL_P2P_LEVEL=SYS when they proved it."""
        self.measured_pairs = {(p["src"], p["dst"]): float(p["gbps"]) for p in figures.get("pairs") or []
                               if p.get("status") == "ok" and p.get("gbps")}
        cross = figures.get("cross_socket_p2p") or {}
        for level, groups in (("", figures.get("groups") or []),
                              ("SYS", cross.get("groups") or [] if cross.get("proven") else [])):
            for g in groups:
                if g.get("status") == "ok" and len(g["gpus"]) > 1 and g.get("busbw_gbps") and g.get("latency_us"):
                    self.measured_groups[(level, tuple(sorted(g["gpus"])))] = (float(g["busbw_gbps"]),
                                                                               float(g["latency_us"]))
        self._tree = None
        self._groups = {}

    def allreduce_figures(self, group, level=""):
        """(bus GB/s, latency us) of an NCCL allreduce over `group` from the preflight, or None when nothing of its
        size was measured: its own figures when the group was measured, else the bus efficiency measured for its
        size (busbw over the measured group's slowest pair; the lowest of that size) times this group's slowest
        pair, and the highest latency measured at that size. level SYS: the figures measured with
        NCCL_P2P_LEVEL=SYS (for groups that cross the sockets)."""
        own = self.measured_groups.get((level, tuple(sorted(group))))
        if own:
            return own
        same = [(gpus, figs) for (lvl, gpus), figs in self.measured_groups.items()
                if lvl == level and len(gpus) == len(group)]
        if len(group) < 2 or not same:
            return None
        efficiency = min(busbw / self.group_bandwidth(gpus) for gpus, (busbw, _lat) in same)
        return efficiency * self.group_bandwidth(group), max(lat for _gpus, (_bw, lat) in same)

    def memory_total(self, i):
        return int(self.gpus[i]["memory"]["total_bytes"])

    def numa(self, i):
        return self.gpus[i].get("numa_node")

    # ----------------------------------------------------------------------------------------- clustering

    def tree(self):
        """Cluster tree over the allowed GPUs as nested pairs (leaves are GPU indices), complete linkage."""
        if self._tree is None and self.indices:
            nodes = {i: i for i in self.indices}            # cluster id -> tree node
            low = {i: i for i in self.indices}              # cluster id -> smallest GPU index in it
            slow = {(a, b): self.bandwidth(a, b) for a in self.indices for b in self.indices if a < b}
            next_id = max(self.indices) + 1
            while len(nodes) > 1:
                (a, b), _speed = min(slow.items(), key=lambda kv: (-kv[1], min(low[kv[0][0]], low[kv[0][1]]),
                                                                   max(low[kv[0][0]], low[kv[0][1]])))
                first, second = (a, b) if low[a] < low[b] else (b, a)
                new = next_id
                next_id += 1
                nodes[new] = (nodes.pop(first), nodes.pop(second))
                low[new] = low[first]
                for other in nodes:
                    if other == new:
                        continue
                    speeds = [slow.pop((min(x, other), max(x, other))) for x in (a, b)]
                    slow[(min(new, other), max(new, other))] = min(speeds)
                slow.pop((min(a, b), max(a, b)))
            self._tree = next(iter(nodes.values()))
        return self._tree

    def order(self):
        """Allowed GPUs in cluster-tree leaf order (islands contiguous)."""
        out = []

        def walk(node):
            if isinstance(node, tuple):
                walk(node[0])
                walk(node[1])
            else:
                out.append(node)

        if self.tree() is not None:
            walk(self.tree())
        return out

    def tp_groups(self, tp):
        """Every group of tp GPUs, cut bottom-up from the cluster tree, in tree order (cached per tp)."""
        if tp not in self._groups:
            def pack(node):
                if not isinstance(node, tuple):
                    return [], [node]
                full_l, rest_l = pack(node[0])
                full_r, rest_r = pack(node[1])
                full, rest = full_l + full_r, rest_l + rest_r
                while len(rest) >= tp:
                    full.append(rest[:tp])
                    rest = rest[tp:]
                return full, rest

            groups = pack(self.tree())[0] if self.tree() is not None else []
            position = {g: k for k, g in enumerate(self.order())}
            groups.sort(key=lambda grp: position[grp[0]])
            self._groups[tp] = groups
        return self._groups[tp]

    def group_bandwidth(self, group):
        if len(group) < 2:
            return float("inf")
        return min(self.bandwidth(a, b) for a in group for b in group if a != b)

    def place(self, tp, count):
        """`count` TP groups of size tp, the fastest groups first picked, then put back in tree order.
        Returns None when the node has fewer than tp*count allowed GPUs."""
        groups = self.tp_groups(tp)
        if len(groups) < count:
            return None
        position = {id(g): k for k, g in enumerate(groups)}
        chosen = sorted(groups, key=lambda g: (-self.group_bandwidth(g), position[id(g)]))[:count]
        return sorted(chosen, key=lambda g: position[id(g)])

    def group_facts(self, group):
        """What the score and the warnings need about one TP group."""
        pairs = [(a, b) for a in group for b in group if a < b]
        levels = sorted({self.level(a, b) for a, b in pairs}, key=lambda w: LEVEL_ORDER.get(w, 9))
        return {
            "gpus": list(group),
            "bandwidth_gbps": self.group_bandwidth(group) if pairs else None,
            "levels": levels,
            "p2p_ok": all(self.p2p_ok(a, b) for a, b in pairs),
            "nvlink": bool(pairs) and all(self.level(a, b) == "NV" for a, b in pairs),
            "numa_nodes": sorted({self.numa(g) for g in group}, key=lambda v: (v is None, v)),
            "not_p2p_pairs": [[a, b] for a, b in pairs if not self.p2p_ok(a, b)],
        }

    def boundary_facts(self, group_a, group_b):
        """PP stage boundary: TP rank r of stage k sends to TP rank r of stage k+1."""
        pairs = list(zip(group_a, group_b))
        return {
            "pairs": [list(p) for p in pairs],
            "bandwidth_gbps": min(self.bandwidth(a, b) for a, b in pairs),
            "p2p_ok": all(self.p2p_ok(a, b) for a, b in pairs),
            "levels": sorted({self.level(a, b) for a, b in pairs}, key=lambda w: LEVEL_ORDER.get(w, 9)),
            "not_p2p_pairs": [list(p) for p in pairs if not self.p2p_ok(*p)],
        }


def nccl_env(groups, boundaries, in_vm, numa_known, cross_socket_p2p=False, topo_file=None):
    """NCCL settings by documented rules. Returns (env dict, notes list).

    1. A TP group or PP boundary whose GPUs cannot do P2P (NVML P2P read not OK, e.g. CNS in a VM without
       x-nv-gpudirect-clique): NCCL_P2P_DISABLE=1. NCCL then stages through host memory, which is what the
       hardware allows anyway, and the reported allreduce hangs with half-working P2P cannot happen.
    2. Otherwise, a TP group that crosses sockets (SYS) over PCIe with P2P OK: NCCL keeps P2P off across the socket
       interconnect by itself (24.7 GB/s allreduce bus bandwidth measured on 8 RTX PRO 6000); allowing it
       (NCCL_P2P_LEVEL=SYS) measured 37-42 GB/s, but allreduces with P2P on this card are also reported to hang.
       The plan sets it only when `cross_socket_p2p` says a preflight measurement on this topology proved it
       (otherwise a note says what it would gain).
    3. A VM whose GPUs all sit on one emulated host bridge without NUMA information: no setting, a note that NCCL
       sees a made-up PCIe tree (an NCCL_TOPO_FILE describing the real one helps).
    4. `topo_file`: the preflight stage wrote an NCCL topology file for this topology (nccl_topo.py): a note (the
       planner sets NCCL_TOPO_FILE in this node's env).
    """
    env, notes = {}, []
    broken = [p for g in groups for p in g["not_p2p_pairs"]] + [p for b in boundaries for p in b["not_p2p_pairs"]]
    if broken:
        env["NCCL_P2P_DISABLE"] = "1"
        notes.append("NCCL_P2P_DISABLE=1: P2P is not available between GPUs %s (NVML P2P read status); NCCL "
                     "stages through host memory." % ", ".join("%d-%d" % tuple(p) for p in broken[:8]))
    elif any("SYS" in g["levels"] and not g["nvlink"] for g in groups):
        if cross_socket_p2p:
            env["NCCL_P2P_LEVEL"] = "SYS"
            notes.append("NCCL_P2P_LEVEL=SYS: a TP group crosses the socket interconnect and the preflight "
                         "measurement on this topology showed P2P across it working and faster.")
        else:
            notes.append("a TP group crosses the socket interconnect: NCCL keeps P2P off there (24.7 GB/s allreduce "
                         "bus bandwidth measured on 8 PCIe GPUs); NCCL_P2P_LEVEL=SYS measured 37-42 GB/s but is "
                         "reported to hang on some boxes, so the plan sets it only once the preflight stage proved "
                         "it on this topology.")
    if topo_file:
        notes.append("NCCL_TOPO_FILE=%s: the preflight stage wrote the GPU grouping this VM's PCI tree hides (NUMA "
                     "islands or measured P2P groups), so that NCCL builds its rings and P2P paths on it." % topo_file)
    elif in_vm and not numa_known:
        notes.append("GPUs in a VM without NUMA information: NCCL sees the VM's emulated PCIe tree; an "
                     "NCCL_TOPO_FILE describing the host's real tree can help (the preflight stage writes one when "
                     "its measurements show the grouping).")
    return env, notes
