"""Shared cases of the topology tests: expected nvidia-smi texts, a spec check, and NVML answers synthesised from a
lab spec (replayed through plugin_utils topology_replay.Replay, so tests can inject errors such as a GPU lost
mid-query). test_topology_fake.py checks that the synthesised answers read the same as the C fake's.
"""
import json
import pathlib

from ansible_collections.topolaunch.sglang.plugins.module_utils import topology

SPECS = pathlib.Path(__file__).resolve().parents[2] / "lab" / "specs"
LEVELS = {"PIX": 10, "PXB": 20, "PHB": 30, "NODE": 40, "SYS": 50}
P2P_CODES = {"OK": 0, "CNS": 1, "GNS": 2, "TNS": 3, "DISABLED": 4, "NS": 5, "UNKNOWN": 6}
NOT_SUPPORTED = 3
INVALID_ARGUMENT = 2
SWITCH_BUS = "FFFFFFFF:FF:FF.0"
MIB = 1 << 20


def mask(cpulist, words):
    """"0-3,8" -> list of 64-bit words with those bits set."""
    out = [0] * words
    for part in filter(None, cpulist.split(",")):
        lo, _, hi = part.partition("-")
        for cpu in range(int(lo), int(hi or lo) + 1):
            out[cpu // 64] |= 1 << (cpu % 64)
    return out


def p2p_status(spec, i, j):
    p2p = spec.get("p2p", {})
    for a, b, word in p2p.get("pairs", []):
        if {a, b} == {i, j}:
            return P2P_CODES[word]
    return P2P_CODES[p2p.get("default", "OK")]


def synthesize(spec, processes=None):
    """Recording dict for topology_replay.Replay. processes: {gpu index: [(pid, bytes), ...]}."""
    processes = processes or {}
    calls = []

    def ans(name, *args, result=None, error=None):
        entry = {"call": [name, *args]}
        entry.update({"error": error} if error is not None else {"result": result})
        calls.append(entry)

    gpus = spec["gpus"]
    n = len(gpus)
    nvlink = spec.get("nvlink", {})
    not_supported = set(spec.get("not_supported", []))
    ans("nvmlInit")
    ans("nvmlShutdown")
    ans("nvmlDeviceGetCount", result=n)
    ans("nvmlSystemGetDriverVersion", result=spec["driver_version"])
    ans("nvmlSystemGetCudaDriverVersion", result=spec["cuda_driver_version"])
    direct = {}
    for a, b, links in nvlink.get("pairs", []):
        direct.setdefault(a, []).extend([b] * links)
        direct.setdefault(b, []).extend([a] * links)
    for i, g in enumerate(gpus):
        h = {"handle": i}
        total = g["memory_total_mib"] * MIB
        held = sum(b for _, b in processes.get(i, []))
        used = g.get("memory_reserved_mib", 0) * MIB + held
        ans("nvmlDeviceGetHandleByIndex", i, result=h)
        ans("nvmlDeviceGetName", h, result=g["name"])
        ans("nvmlDeviceGetUUID", h, result=g.get("uuid", "GPU-synth-%d" % i))
        ans("nvmlDeviceGetPciInfo", h, result={"__obj__": {"busId": g["pci_bus_id"]}})
        ans("nvmlDeviceGetMemoryInfo", h, result={"__obj__": {"total": total, "used": used, "free": total - used}})
        ans("nvmlDeviceGetCudaComputeCapability", h, result=list(g["compute_capability"]))
        for key, fn in (("max_gen", "MaxPcieLinkGeneration"), ("max_width", "MaxPcieLinkWidth"),
                        ("cur_gen", "CurrPcieLinkGeneration"), ("cur_width", "CurrPcieLinkWidth")):
            ans("nvmlDeviceGet" + fn, h, result=g["pcie"][key])
        if "numa_node_id" in not_supported:
            ans("nvmlDeviceGetNumaNodeId", h, error=NOT_SUPPORTED)
        else:
            ans("nvmlDeviceGetNumaNodeId", h, result=g["numa_node"])
        node = g["numa_node"]
        ans("nvmlDeviceGetMemoryAffinity", h, 4, 0, result=mask("" if node < 0 else str(node), 4))
        ans("nvmlDeviceGetCpuAffinity", h, 16, result=mask(g["cpu_affinity"], 16))
        ans("nvmlDeviceGetVirtualizationMode", h, result=1 if spec["virtualization"] == "passthrough" else 0)
        ans("nvmlDeviceGetMigMode", h, result=[int(g["mig"]), int(g["mig"])])
        ans("nvmlDeviceGetPersistenceMode", h, result=int(g.get("persistence_mode", True)))
        ans("nvmlDeviceGetComputeRunningProcesses", h,
            result=[{"__obj__": {"pid": pid, "usedGpuMemory": b}} for pid, b in processes.get(i, [])])
        links = g["nvlinks"]
        if not links:
            ans("nvmlDeviceGetNvLinkState", h, 0, error=NOT_SUPPORTED)
        for link in range(links):
            ans("nvmlDeviceGetNvLinkState", h, link, result=1)
            if nvlink.get("fabric") == "nvswitch":
                ans("nvmlDeviceGetNvLinkRemoteDeviceType", h, link, result=2)
                ans("nvmlDeviceGetNvLinkRemotePciInfo", h, link, result={"__obj__": {"busId": SWITCH_BUS}})
            else:
                peer = direct[i][link]
                ans("nvmlDeviceGetNvLinkRemoteDeviceType", h, link, result=0)
                ans("nvmlDeviceGetNvLinkRemotePciInfo", h, link, result={"__obj__": {"busId": gpus[peer]["pci_bus_id"]}})
        if links:
            ans("nvmlDeviceGetNvLinkState", h, links, error=INVALID_ARGUMENT)
        for j in range(n):
            if i == j:
                continue
            if i < j:
                ans("nvmlDeviceGetTopologyCommonAncestor", h, {"handle": j},
                    result=LEVELS[spec["pcie_topology"][i][j]])
            status = p2p_status(spec, i, j)
            if nvlink.get("fabric") == "nvswitch":
                linked = bool(links and gpus[j]["nvlinks"])
            else:
                linked = j in direct.get(i, [])
            # index 2 (NVLink) answers the pair's status only where NVLink joins it; index 4 (PCI) answers
            # NOT_SUPPORTED there, as the real H200 pair did.
            answers = [status, status, status if linked else 5, status, 5 if linked else status]
            for index, answer in enumerate(answers):
                ans("nvmlDeviceGetP2PStatus", h, {"handle": j}, index, result=answer)
    return {"meta": {"synthesized_from": spec["name"]}, "calls": calls}


def load_spec(name):
    return json.loads((SPECS / (name + ".json")).read_text())


def make_sysfs(tmp_path, spec):
    """A sysfs tree with numa_node per GPU as the spec says sysfs reads."""
    root = tmp_path / "sysfs"
    for g in spec["gpus"]:
        d = root / "bus" / "pci" / "devices" / topology.sysfs_bus_id(g["pci_bus_id"])
        d.mkdir(parents=True)
        (d / "numa_node").write_text("%d\n" % g.get("sysfs_numa_node", g["numa_node"]))
    return str(root)


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
