"""A lab GPU spec as the planner sees it: NVML answers synthesised from the spec, read by the real topology reader.

    facts_from_spec(path_or_dict, workdir) -> gpu_topology facts (docs/DESIGN.md), without the C fake

Used by the unit tests (tests/unit/topology_cases.py re-exports it; tests/unit/plugins/module_utils/
test_topology_fake.py checks that these answers read the same as the C fake's) and by tools/calibration.py, which replays published measurements on their specs.
The answers follow lab/specs/README.md "What the fake derives from a spec".
"""
import json
import pathlib

from ansible_collections.topolaunch.sglang.plugins.module_utils import topology
from ansible_collections.topolaunch.sglang.plugins.plugin_utils.topology_replay import Replay

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
        lo, _sep, hi = part.partition("-")
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
        held = sum(size for _pid, size in processes.get(i, []))
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


def make_sysfs(tmp_path, spec):
    """A sysfs tree with numa_node per GPU as the spec says sysfs reads."""
    root = tmp_path / "sysfs"
    for g in spec["gpus"]:
        d = root / "bus" / "pci" / "devices" / topology.sysfs_bus_id(g["pci_bus_id"])
        d.mkdir(parents=True, exist_ok=True)
        (d / "numa_node").write_text("%d\n" % g.get("sysfs_numa_node", g["numa_node"]))
    return str(root)


def facts_from_spec(spec, workdir):
    """gpu_topology facts of a spec (a dict or a JSON file), with a fake sysfs under workdir."""
    if not isinstance(spec, dict):
        spec = json.loads(pathlib.Path(spec).read_text())
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    return topology.read_topology(Replay(synthesize(spec)), make_sysfs(workdir, spec))
