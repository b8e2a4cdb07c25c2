"""Shared cases of the topology tests: expected nvidia-smi texts, a spec check, and NVML answers synthesised from a
lab spec (replayed through plugin_utils topology_replay.Replay, so tests can inject errors such as a GPU lost
mid-query; `read` gives the facts the real reader makes of them). test_topology_fake.py checks that the
synthesised answers read the same as the C fake's.
"""
import json
import pathlib

from ansible_collections.topolaunch.sglang.plugins.module_utils import topology

from ansible_collections.topolaunch.sglang.plugins.plugin_utils.spec_facts import (  # noqa: F401 - re-exported
    INVALID_ARGUMENT, LEVELS, NOT_SUPPORTED, P2P_CODES, SWITCH_BUS, make_sysfs, mask, p2p_status, synthesize)
from ansible_collections.topolaunch.sglang.plugins.plugin_utils.topology_replay import Replay

SPECS = pathlib.Path(__file__).resolve().parents[2] / "lab" / "specs"


def load_spec(name):
    return json.loads((SPECS / (name + ".json")).read_text())


LEGEND_M = (
    "\nLegend:\n\n"
    "  X    = Self\n"
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n"
    "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node\n"
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n"
    "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)\n"
    "  PIX  = Connection traversing at most a single PCIe bridge\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n")
LEGEND_P2P = (
    "\nLegend:\n\n"
    "  X    = Self\n"
    "  OK   = Status Ok\n"
    "  CNS  = Chipset not supported\n"
    "  GNS  = GPU not supported\n"
    "  TNS  = Topology not supported\n"
    "  NS   = Not supported\n"
    "  U    = Unknown\n")
HEAD8 = "\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"

# What nvidia-smi topo -m prints for these machines (tabs as nvidia-smi writes them, header underlined).
EXPECTED_MATRIX = {
    "proxmox-8x-rtx-pro-6000-vnuma": HEAD8 + (
        "GPU0\t X \tNODE\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\t0-31\t0\t\tN/A\n"
        "GPU1\tNODE\t X \tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\t0-31\t0\t\tN/A\n"
        "GPU2\tNODE\tNODE\t X \tNODE\tSYS\tSYS\tSYS\tSYS\t0-31\t0\t\tN/A\n"
        "GPU3\tNODE\tNODE\tNODE\t X \tSYS\tSYS\tSYS\tSYS\t0-31\t0\t\tN/A\n"
        "GPU4\tSYS\tSYS\tSYS\tSYS\t X \tNODE\tNODE\tNODE\t32-63\t1\t\tN/A\n"
        "GPU5\tSYS\tSYS\tSYS\tSYS\tNODE\t X \tNODE\tNODE\t32-63\t1\t\tN/A\n"
        "GPU6\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\t X \tNODE\t32-63\t1\t\tN/A\n"
        "GPU7\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tNODE\t X \t32-63\t1\t\tN/A\n") + LEGEND_M,
    "proxmox-8x-rtx-pro-6000-naive": HEAD8 + (
        "GPU0\t X \tPHB\tPHB\tPHB\tPHB\tPHB\tPHB\tPHB\tN/A\tN/A\t\tN/A\n"
        "GPU1\tPHB\t X \tPHB\tPHB\tPHB\tPHB\tPHB\tPHB\tN/A\tN/A\t\tN/A\n"
        "GPU2\tPHB\tPHB\t X \tPHB\tPHB\tPHB\tPHB\tPHB\tN/A\tN/A\t\tN/A\n"
        "GPU3\tPHB\tPHB\tPHB\t X \tPHB\tPHB\tPHB\tPHB\tN/A\tN/A\t\tN/A\n"
        "GPU4\tPHB\tPHB\tPHB\tPHB\t X \tPHB\tPHB\tPHB\tN/A\tN/A\t\tN/A\n"
        "GPU5\tPHB\tPHB\tPHB\tPHB\tPHB\t X \tPHB\tPHB\tN/A\tN/A\t\tN/A\n"
        "GPU6\tPHB\tPHB\tPHB\tPHB\tPHB\tPHB\t X \tPHB\tN/A\tN/A\t\tN/A\n"
        "GPU7\tPHB\tPHB\tPHB\tPHB\tPHB\tPHB\tPHB\t X \tN/A\tN/A\t\tN/A\n") + LEGEND_M,
    "h200x2-vm-real": (
        "\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
        "GPU0\t X \tNV18\t0-31\t0\t\tN/A\n"
        "GPU1\tNV18\t X \t0-31\t0\t\tN/A\n") + LEGEND_M,
}

EXPECTED_P2P_READ = {
    "proxmox-8x-rtx-pro-6000-naive": " \t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\t\x1b[0m\n" + "".join(
        " GPU%d\t" % i + "".join("X\t" if i == j else "CNS\t" for j in range(8)) + "\n" for i in range(8)) + LEGEND_P2P,
    "h200x2-vm-real": (
        " \t\x1b[4mGPU0\tGPU1\t\x1b[0m\n"
        " GPU0\tX\tOK\t\n"
        " GPU1\tOK\tX\t\n") + LEGEND_P2P,
}


def expected_nvlinks(spec, i, j):
    """NV# nvidia-smi shows for a pair: NVSwitch: min(active links) of the two; direct: the pair's links."""
    nvlink = spec.get("nvlink", {})
    if i == j:
        return 0
    if nvlink.get("fabric") == "nvswitch":
        return min(spec["gpus"][i]["nvlinks"], spec["gpus"][j]["nvlinks"])
    return sum(links for a, b, links in nvlink.get("pairs", []) if {a, b} == {i, j})


def all_specs():
    return sorted(p.stem for p in SPECS.glob("*.json"))


def assert_facts_match_spec(facts, spec):
    """The facts say what the spec says: names, bus ids, memory, NUMA, PCIe, modes, NVLink, P2P read, links."""
    n = len(spec["gpus"])
    assert facts["gpu_count"] == n
    assert facts["driver_version"] == spec["driver_version"]
    assert facts["cuda_driver_version"] == "%d.%d" % (spec["cuda_driver_version"] // 1000,
                                                       spec["cuda_driver_version"] % 1000 // 10)
    assert facts["pcie_levels"] == spec["pcie_topology"]
    for g, s in zip(facts["gpus"], spec["gpus"]):
        assert g["name"] == s["name"]
        assert g["pci_bus_id"] == s["pci_bus_id"]
        assert g["memory"]["total_bytes"] == s["memory_total_mib"] << 20
        assert g["compute_capability"] == "%d.%d" % tuple(s["compute_capability"])
        assert g["pcie"] == s["pcie"]
        assert g["numa_node"] == (None if s["numa_node"] < 0 else s["numa_node"])
        assert g["cpu_affinity"] == s["cpu_affinity"]
        assert g["nvlinks_active"] == s["nvlinks"]
        assert g["mig_enabled"] is s["mig"]
        assert g["persistence_mode"] is s.get("persistence_mode", True)
        assert g["virtualization_mode"] == ("passthrough" if spec["virtualization"] == "passthrough" else "none")
    default = spec.get("p2p", {}).get("default", "OK")
    for i in range(n):
        for j in range(n):
            assert facts["p2p"]["read"][i][j] == ("X" if i == j else default)
            expected_nv = expected_nvlinks(spec, i, j)
            assert facts["nvlink_counts"][i][j] == expected_nv
            if i != j:
                word = "NV%d" % expected_nv if expected_nv else spec["pcie_topology"][i][j]
                assert facts["links"][i][j] == word


def read(spec, tmp_path, processes=None, overrides=None):
    return topology.read_topology(Replay(synthesize(spec, processes), overrides), make_sysfs(tmp_path, spec))
