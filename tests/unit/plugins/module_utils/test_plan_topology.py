"""plan_topology.py: link speed per GPU pair (NVLink, PCIe with and without P2P, across sockets, measured by the
preflight), the cluster tree that keeps islands contiguous, TP groups cut from it, and the NCCL settings rules."""
import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import plan_perf
from ansible_collections.topolaunch.sglang.plugins.module_utils.plan_topology import NodeTopology, nccl_env

GEN5 = plan_perf.pcie_gbps(5, 16)
P2P = GEN5 * plan_perf.PCIE_P2P_FRACTION


def facts(links, p2p=None, gen=5, width=16, cc="12.0", numa=None):
    """Facts of len(links) GPUs: the nvidia-smi words, P2P read (default OK), one PCIe link kind for all."""
    n = len(links)
    return {"fingerprint": "f" * 12, "links": links,
            "p2p": {"read": p2p or [["X" if i == j else "OK" for j in range(n)] for i in range(n)]},
            "gpus": [{"index": i, "compute_capability": cc, "numa_node": (numa or [None] * n)[i],
                      "pcie": {"max_gen": gen, "max_width": 16, "cur_width": width},
                      "memory": {"total_bytes": 96 << 30}} for i in range(n)]}


# Two sockets whose GPUs NVML enumerates interleaved: 0 and 2 on one, 1 and 3 on the other.
INTERLEAVED = [["X", "SYS", "NODE", "SYS"], ["SYS", "X", "SYS", "NODE"],
               ["NODE", "SYS", "X", "SYS"], ["SYS", "NODE", "SYS", "X"]]


def test_pair_speeds_follow_the_table_of_the_docstring():
    topo = NodeTopology(facts(INTERLEAVED))
    assert topo.bandwidth(0, 0) == float("inf")
    assert topo.bandwidth(0, 2) == pytest.approx(P2P)                                     # NODE, P2P OK
    assert topo.bandwidth(0, 1) == pytest.approx(P2P * plan_perf.PCIE_CROSS_SOCKET_FACTOR)  # SYS
    no_p2p = [[("X" if i == j else "CNS") for j in range(4)] for i in range(4)]
    assert NodeTopology(facts(INTERLEAVED, no_p2p)).bandwidth(0, 2) == pytest.approx(
        GEN5 * plan_perf.HOST_STAGED_FRACTION)                                            # staged through the host
    assert NodeTopology(facts(INTERLEAVED, width=8)).bandwidth(0, 2) == pytest.approx(P2P / 2)   # x8 link
    nvlink = [["X", "NV18"], ["NV18", "X"]]
    assert NodeTopology(facts(nvlink, cc="9.0")).bandwidth(0, 1) == 18 * 25.0
    assert NodeTopology(facts(nvlink, cc="10.0")).bandwidth(0, 1) == 18 * 50.0


def test_islands_stay_contiguous_and_tp_groups_are_cut_inside_them():
    topo = NodeTopology(facts(INTERLEAVED))
    assert topo.order() == [0, 2, 1, 3]
    assert topo.tp_groups(2) == [[0, 2], [1, 3]]
    assert topo.tp_groups(4) == [[0, 2, 1, 3]]
    assert topo.group_facts([0, 2])["levels"] == ["NODE"]
    assert topo.group_facts([0, 1]) == {"gpus": [0, 1], "bandwidth_gbps": pytest.approx(P2P * 0.83),
                                        "levels": ["SYS"], "p2p_ok": True, "nvlink": False, "numa_nodes": [None],
                                        "not_p2p_pairs": []}
    boundary = topo.boundary_facts([0, 2], [1, 3])
    assert boundary["pairs"] == [[0, 1], [2, 3]] and boundary["levels"] == ["SYS"]


def test_only_the_allowed_gpus_are_placed_and_the_fastest_groups_picked():
    slow_pair = [row[:] for row in INTERLEAVED]
    topo = NodeTopology(facts(slow_pair), allowed=[1, 2, 3])
    assert topo.order() == [1, 3, 2] and topo.tp_groups(2) == [[1, 3]]
    assert topo.place(2, 1) == [[1, 3]] and topo.place(2, 2) is None
    p2p = [["X" if i == j else "OK" for j in range(4)] for i in range(4)]
    p2p[0][2] = p2p[2][0] = "CNS"                  # the pair 0-2 stages through the host: 1-3 is faster
    assert NodeTopology(facts(INTERLEAVED, p2p)).place(2, 1) == [[1, 3]]


def test_measured_pairs_and_groups_replace_the_table():
    topo = NodeTopology(facts(INTERLEAVED))
    topo.use_preflight({"pairs": [{"src": 0, "dst": 1, "status": "ok", "gbps": 51.0},
                                  {"src": 0, "dst": 3, "status": "hang", "gbps": None}],
                        "groups": [{"gpus": [0, 2], "status": "ok", "busbw_gbps": 40.0, "latency_us": 7.0}]})
    assert topo.bandwidth(1, 0) == 51.0 and topo.bandwidth(0, 3) == pytest.approx(P2P * 0.83)
    assert topo.allreduce_figures([2, 0]) == (40.0, 7.0)
    # an unmeasured group of a measured size: the measured efficiency times its own slowest pair
    busbw, latency = topo.allreduce_figures([1, 3])
    assert busbw == pytest.approx(40.0 / P2P * topo.group_bandwidth([1, 3])) and latency == 7.0
    assert topo.allreduce_figures([0, 1, 2]) is None                 # nothing of size 3 measured
    assert topo.allreduce_figures([0, 2], level="SYS") is None       # P2P across sockets not proven


def test_facts_without_gpus_are_refused():
    with pytest.raises(ValueError, match="topology facts must be a mapping with a gpus list"):
        NodeTopology({"gpu_count": 8})


def group(levels, not_p2p=(), nvlink=False):
    return {"levels": levels, "not_p2p_pairs": [list(p) for p in not_p2p], "nvlink": nvlink}


def test_nccl_env_rules():
    env, notes = nccl_env([group(["NODE"], [(0, 1)])], [], in_vm=False, numa_known=True)
    assert env == {"NCCL_P2P_DISABLE": "1"} and "P2P is not available between GPUs 0-1" in notes[0]
    env, notes = nccl_env([group(["SYS"])], [], in_vm=False, numa_known=True)
    assert env == {} and "sets it only once the preflight stage proved it" in notes[0]
    env, notes = nccl_env([group(["SYS"])], [], in_vm=False, numa_known=True, cross_socket_p2p=True)
    assert env == {"NCCL_P2P_LEVEL": "SYS"}
    env, notes = nccl_env([group(["SYS", "NV"], nvlink=True)], [], in_vm=False, numa_known=True)
    assert (env, notes) == ({}, [])                                  # NVLink: nothing to say
    env, notes = nccl_env([group(["PHB"])], [], in_vm=True, numa_known=False)
    assert env == {} and "emulated PCIe tree" in notes[0]
    env, notes = nccl_env([group(["PHB"])], [], in_vm=True, numa_known=False, topo_file="/etc/topolaunch/x.xml")
    assert env == {} and notes[0].startswith("NCCL_TOPO_FILE=/etc/topolaunch/x.xml")
    env, _ = nccl_env([group(["NODE"])], [group(["SYS"], [(3, 7)])], in_vm=False, numa_known=True)
    assert env == {"NCCL_P2P_DISABLE": "1"}                          # a PP boundary without P2P counts too
