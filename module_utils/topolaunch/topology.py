"""GPU topology read through NVML (nvidia-ml-py), the facts of `ansible_facts.gpu_topology`.

`read_topology(nvml, sysfs_root)` takes the pynvml module, or any object with the same functions (the replay
of a recorded machine in tests), and returns plain data: per GPU, per pair, derived islands, a fingerprint,
findings and the rendered tables. Everything here is plain Python 3.9+ stdlib; NVML is only reached through
the `nvml` argument, so the logic is testable without a GPU.

NVML constants are the C library's numbers, written here, not taken from nvidia-ml-py: its
`NVML_P2P_CAPS_INDEX_READ` is the tuple `(0,)` in 13.x and passing it raises ctypes.ArgumentError.
"""
import hashlib
import json
import os
import sys

from .topology_findings import findings
from .topology_render import cpulist, render_matrix, render_p2p, render_report

__all__ = ["read_topology", "derive", "render_matrix", "render_p2p", "render_report", "fingerprint", "fingerprint_basis",
           "findings", "import_nvml", "TopologyError", "P2P_INDICES"]

# nvmlReturn_t values (nvml.h)
ERR_UNINITIALIZED = 1
ERR_INVALID_ARGUMENT = 2
ERR_NOT_SUPPORTED = 3
ERR_NO_PERMISSION = 4
ERR_NOT_FOUND = 6
ERR_DRIVER_NOT_LOADED = 9
ERR_LIBRARY_NOT_FOUND = 12
ERR_FUNCTION_NOT_FOUND = 13
ERR_GPU_IS_LOST = 15
ERR_RESET_REQUIRED = 16
ERR_LIB_RM_VERSION_MISMATCH = 18
ERR_NO_DATA = 21
ERR_UNKNOWN = 999

# Errors that mean "this machine cannot answer this question": the fact becomes null / absent.
_ABSENT = (ERR_NOT_SUPPORTED, ERR_FUNCTION_NOT_FOUND, ERR_INVALID_ARGUMENT, ERR_NOT_FOUND, ERR_NO_PERMISSION, ERR_NO_DATA)

# nvmlGpuP2PCapsIndex_t, as plain integers (see module docstring).
P2P_INDICES = {"read": 0, "write": 1, "nvlink": 2, "atomics": 3, "pci": 4}
# nvmlGpuP2PStatus_t -> the word nvidia-smi topo -p2p prints (DIS and UNK have no legend entry there).
P2P_WORDS = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DIS", 5: "NS", 6: "UNK"}
# nvmlGpuTopologyLevel_t -> nvidia-smi topo -m word. INTERNAL (two GPUs on one board) is shown as PIX.
ANCESTOR_WORDS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
VIRTUALIZATION_MODES = {0: "none", 1: "passthrough", 2: "vgpu", 3: "host_vgpu", 4: "host_vsga"}
NVLINK_DEVICE_GPU = 0
NVLINK_DEVICE_SWITCH = 2
NVLINK_SWITCH_BUS_ID = "FFFFFFFF:FF:FF.0"
NVLINK_MAX_LINKS = 36           # NVML_NVLINK_MAX_LINKS of driver 580; GPUs with fewer answer INVALID_ARGUMENT
AFFINITY_SCOPE_NODE = 0
NODE_SET_WORDS = 4              # 64-bit words of the NUMA node mask asked for (256 nodes)
CPU_SET_WORDS = 16              # 64-bit words of the CPU mask asked for (1024 CPUs)


class TopologyError(Exception):
    """A failure the user must fix; the message says how."""


class _Absent:
    """Marker for an NVML answer of NOT_SUPPORTED and kin; `code` keeps the NVML error number."""

    def __init__(self, code):
        self.code = code


def import_nvml():
    """Import pynvml or say which interpreter lacks it and how to fix it."""
    try:
        import pynvml  # pylint: disable=import-outside-toplevel
    except ImportError as exc:
        if sys.prefix == sys.base_prefix:
            fix = ("%s is a system python, not the tools venv: set topolaunch_tools_python to the tools venv's "
                   "python (default /opt/topolaunch/tools/bin/python), made with nvidia-ml-py by the provision stage "
                   "(ansible-playbook deploy.yml --tags provision)" % sys.executable)
        else:
            fix = ("run the provision stage (ansible-playbook deploy.yml --tags provision), or "
                   "`%s -m pip install nvidia-ml-py` to pip install nvidia-ml-py into the venv %s"
                   % (sys.executable, sys.prefix))
        raise TopologyError("nvidia-ml-py (import name pynvml) is not importable by %s (%s): %s."
                            % (sys.executable, exc, fix)) from exc
    return pynvml


def _code(exc):
    return getattr(exc, "value", None)


def _fatal(exc, what, gpu=None, text=None):
    """Turn an NVML error that ends the query into a TopologyError naming the fix; text: the library's own text
    for the error (default: nvidia-ml-py's)."""
    code = _code(exc)
    text = str(exc) if text is None else text
    where = "" if gpu is None else " on GPU %s" % gpu
    if code == ERR_LIBRARY_NOT_FOUND:
        return TopologyError(
            "NVML library libnvidia-ml.so.1 not found (%s): the NVIDIA driver is not installed on this host. "
            "Run the provision stage (ansible-playbook deploy.yml --tags provision) to install it." % what)
    if code == ERR_DRIVER_NOT_LOADED:
        return TopologyError(
            "NVIDIA kernel driver not loaded (%s): run `modprobe nvidia` (or reboot after the driver install by the "
            "provision stage) and check `nvidia-smi` and `dmesg | grep -i nvrm`." % what)
    if code == ERR_LIB_RM_VERSION_MISMATCH:
        return TopologyError(
            "NVML library and NVIDIA kernel module versions differ (%s): the driver was upgraded without a reboot. "
            "Reboot the host (or reload the nvidia modules)." % what)
    if code in (ERR_GPU_IS_LOST, ERR_RESET_REQUIRED) or (code == ERR_UNKNOWN and gpu is not None):
        return TopologyError(
            "GPU lost during the topology query%s (%s: NVML error %s, %s). Check `dmesg` for Xid errors; the GPU "
            "needs a reset (`nvidia-smi -r -i %s` with nothing running on it) or a host reboot, "
            "and in a VM possibly a VM restart." % (where, what, code, text, "<index>" if gpu is None else gpu))
    return TopologyError("NVML call %s failed%s: error %s (%s)." % (what, where, code, text))


class _Reader:
    """Calls NVML with error policy: absent answers become _Absent, everything else a TopologyError."""

    def __init__(self, nvml):
        self.nvml = nvml
        self.error = getattr(nvml, "NVMLError")

    def call(self, name, *args, gpu=None, optional=False):
        function = getattr(self.nvml, name, None)
        if function is None:     # an nvidia-ml-py too old to know the call
            if optional:
                return _Absent(ERR_FUNCTION_NOT_FOUND)
            raise TopologyError("nvidia-ml-py in %s has no %s: upgrade it in the tools venv (provision stage)."
                                % (sys.prefix, name))
        try:
            return function(*args)
        except self.error as exc:
            if optional and _code(exc) in _ABSENT:
                return _Absent(_code(exc))
            raise _fatal(exc, name, gpu, self.text(exc)) from exc

    def text(self, exc):
        """The library's own text for the error: nvidia-ml-py's str() answers known codes from its own table
        and never asks the library; the lab's fake NVML puts a bad spec's field after "Unknown Error" there."""
        try:
            return _text(self.nvml.nvmlErrorString(_code(exc)))
        except Exception:  # noqa: BLE001 - no text from the library: nvidia-ml-py's own
            return str(exc)


def _text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def _mask_bits(words):
    """Indices of set bits in an array of 64-bit words (NVML affinity masks)."""
    return [w * 64 + b for w, word in enumerate(words) for b in range(64) if int(word) >> b & 1]


def sysfs_bus_id(bus_id):
    """NVML "00000000:01:00.0" -> sysfs "0000:01:00.0" (lower case, 4-hex domain)."""
    domain, rest = bus_id.split(":", 1)
    return ("%04x:%s" % (int(domain, 16), rest)).lower()


def sysfs_numa_node(sysfs_root, bus_id):
    """NUMA node sysfs gives for a PCI device, None when absent or -1."""
    path = os.path.join(sysfs_root, "bus", "pci", "devices", sysfs_bus_id(bus_id), "numa_node")
    try:
        with open(path, encoding="ascii") as handle:
            node = int(handle.read().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def _numa(rd, handle, index, bus_id, sysfs_root):
    """CPU-side NUMA node: GetNumaNodeId, then memory affinity, then sysfs. Returns (node, source, affinity)."""
    node_id = rd.call("nvmlDeviceGetNumaNodeId", handle, gpu=index, optional=True)
    gpu_numa_id = None if isinstance(node_id, _Absent) or node_id < 0 else node_id
    mask = rd.call("nvmlDeviceGetMemoryAffinity", handle, NODE_SET_WORDS, AFFINITY_SCOPE_NODE, gpu=index, optional=True)
    nodes = [] if isinstance(mask, _Absent) else _mask_bits(mask)
    affinity = cpulist(nodes)
    if gpu_numa_id is not None:
        return gpu_numa_id, "nvml_numa_node_id", affinity, gpu_numa_id
    if len(nodes) == 1:
        return nodes[0], "nvml_memory_affinity", affinity, None
    node = sysfs_numa_node(sysfs_root, bus_id)
    if node is not None:
        return node, "sysfs", affinity or str(node), None
    return None, "none", affinity, None


def _value(answer, convert=lambda v: v):
    return None if isinstance(answer, _Absent) else convert(answer)


def _read_gpu(rd, index, sysfs_root):
    handle = rd.call("nvmlDeviceGetHandleByIndex", index, gpu=index)
    bus_id = _text(rd.call("nvmlDeviceGetPciInfo", handle, gpu=index).busId).upper()
    mem = rd.call("nvmlDeviceGetMemoryInfo", handle, gpu=index)
    cc = rd.call("nvmlDeviceGetCudaComputeCapability", handle, gpu=index, optional=True)
    pcie = {key: _value(rd.call(fn, handle, gpu=index, optional=True)) for key, fn in (
        ("max_gen", "nvmlDeviceGetMaxPcieLinkGeneration"), ("max_width", "nvmlDeviceGetMaxPcieLinkWidth"),
        ("cur_gen", "nvmlDeviceGetCurrPcieLinkGeneration"), ("cur_width", "nvmlDeviceGetCurrPcieLinkWidth"))}
    numa_node, numa_source, numa_affinity, gpu_numa_id = _numa(rd, handle, index, bus_id, sysfs_root)
    cpus = rd.call("nvmlDeviceGetCpuAffinity", handle, CPU_SET_WORDS, gpu=index, optional=True)
    virt = rd.call("nvmlDeviceGetVirtualizationMode", handle, gpu=index, optional=True)
    mig = rd.call("nvmlDeviceGetMigMode", handle, gpu=index, optional=True)
    persistence = rd.call("nvmlDeviceGetPersistenceMode", handle, gpu=index, optional=True)
    procs = rd.call("nvmlDeviceGetComputeRunningProcesses", handle, gpu=index, optional=True)
    gpu = {
        "index": index,
        "name": _text(rd.call("nvmlDeviceGetName", handle, gpu=index)),
        "uuid": _text(rd.call("nvmlDeviceGetUUID", handle, gpu=index)),
        "pci_bus_id": bus_id,
        "memory": {"total_bytes": int(mem.total), "used_bytes": int(mem.used), "free_bytes": int(mem.free)},
        "compute_capability": _value(cc, lambda v: "%d.%d" % (v[0], v[1])),
        "pcie": pcie,
        "numa_node": numa_node,
        "numa_source": numa_source,
        "numa_affinity": numa_affinity,
        "gpu_numa_id": gpu_numa_id,
        "cpu_affinity": "" if isinstance(cpus, _Absent) else cpulist(_mask_bits(cpus)),
        "virtualization_mode": _value(virt, lambda v: VIRTUALIZATION_MODES.get(v, "unknown")),
        "mig_enabled": _value(mig, lambda v: bool(v[0])),
        "persistence_mode": _value(persistence, bool),
        "processes": [] if isinstance(procs, _Absent) else [
            {"pid": int(p.pid), "used_memory_bytes": None if p.usedGpuMemory is None else int(p.usedGpuMemory)}
            for p in procs],
    }
    return handle, gpu


def _read_nvlinks(rd, handle, index):
    """Active links of one GPU as a list of remotes: ("switch", None) or ("gpu", bus id)."""
    remotes = []
    for link in range(NVLINK_MAX_LINKS):
        state = rd.call("nvmlDeviceGetNvLinkState", handle, link, gpu=index, optional=True)
        if isinstance(state, _Absent):
            if state.code == ERR_NOT_SUPPORTED and link == 0:
                break            # no NVLink on this GPU
            if state.code == ERR_INVALID_ARGUMENT:
                break            # past this GPU's last link
            continue
        if not state:
            continue
        kind = rd.call("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link, gpu=index, optional=True)
        if kind == NVLINK_DEVICE_SWITCH:
            remotes.append(("switch", None))
            continue
        pci = rd.call("nvmlDeviceGetNvLinkRemotePciInfo", handle, link, gpu=index, optional=True)
        remote_bus = None if isinstance(pci, _Absent) else _text(pci.busId).upper()
        if remote_bus == NVLINK_SWITCH_BUS_ID:
            remotes.append(("switch", None))
        elif kind == NVLINK_DEVICE_GPU or isinstance(kind, _Absent):
            remotes.append(("gpu", remote_bus))
    return remotes


def _nvlink_counts(gpus, remotes, nvlink_p2p):
    """Links per pair: direct links to the peer, or, on an NVSwitch fabric, min(active links) of the two GPUs
    when NVML says the pair can do P2P over NVLink (as nvidia-smi shows NV18 for H100/H200 on NVSwitch)."""
    n = len(gpus)
    by_bus = {g["pci_bus_id"][-12:]: g["index"] for g in gpus}   # domain width differs between calls
    direct = [[0] * n for _row in range(n)]
    switch = [0] * n
    for i, links in enumerate(remotes):
        for kind, bus in links:
            if kind == "switch":
                switch[i] += 1
            elif bus is not None and bus[-12:] in by_bus:
                direct[i][by_bus[bus[-12:]]] += 1
    counts = [[0] * n for _row in range(n)]
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            count = max(direct[i][j], direct[j][i])
            if switch[i] and switch[j] and nvlink_p2p[i][j] == "OK":
                count += min(switch[i], switch[j])
            counts[i][j] = count
    fabric = "nvswitch" if any(switch) else ("direct" if any(map(any, direct)) else None)
    return counts, fabric


def _p2p_word(rd, h1, h2, index, gpu):
    status = rd.call("nvmlDeviceGetP2PStatus", h1, h2, index, gpu=gpu, optional=True)
    if isinstance(status, _Absent):
        return "NS" if status.code == ERR_NOT_SUPPORTED else "UNK"
    return P2P_WORDS.get(int(status), "UNK")


def read_raw(nvml, sysfs_root="/sys"):
    """Query NVML and return the measured facts (no derived ones). nvmlInit/nvmlShutdown are done here."""
    rd = _Reader(nvml)
    rd.call("nvmlInit")
    try:
        count = rd.call("nvmlDeviceGetCount")
        handles, gpus = [], []
        for index in range(count):
            handle, gpu = _read_gpu(rd, index, sysfs_root)
            handles.append(handle)
            gpus.append(gpu)
        n = len(gpus)
        levels = [["X"] * n for _row in range(n)]
        for i in range(n):
            for j in range(i + 1, n):
                level = rd.call("nvmlDeviceGetTopologyCommonAncestor", handles[i], handles[j], gpu=i, optional=True)
                word = "UNK" if isinstance(level, _Absent) else ANCESTOR_WORDS.get(int(level), "UNK")
                levels[i][j] = levels[j][i] = word
        p2p = {}
        for kind, idx in P2P_INDICES.items():
            p2p[kind] = [["X" if i == j else _p2p_word(rd, handles[i], handles[j], idx, i) for j in range(n)]
                         for i in range(n)]
        remotes = [_read_nvlinks(rd, handles[i], i) for i in range(n)]
        counts, fabric = _nvlink_counts(gpus, remotes, p2p["nvlink"])
        for i, gpu in enumerate(gpus):
            gpu["nvlinks_active"] = len(remotes[i])
        cuda = rd.call("nvmlSystemGetCudaDriverVersion", optional=True)
        raw = {
            "driver_version": _text(rd.call("nvmlSystemGetDriverVersion")),
            "cuda_driver_version": _value(cuda, lambda v: "%d.%d" % (v // 1000, v % 1000 // 10)),
            "gpu_count": n,
            "gpus": gpus,
            "pcie_levels": levels,
            "nvlink_counts": counts,
            "nvlink_fabric": fabric,
            "p2p": p2p,
        }
    finally:
        try:
            nvml.nvmlShutdown()
        except rd.error:
            pass  # shutdown after a failed query: the query's own error is the one to report
    return raw


def _groups(n, linked):
    """Cliques by greedy merge in index order: GPUs that are all pairwise linked. Groups of one are dropped."""
    groups = []
    for i in range(n):
        for group in groups:
            if all(linked(i, j) and linked(j, i) for j in group):
                group.append(i)
                break
        else:
            groups.append([i])
    return [g for g in groups if len(g) > 1]


def _components(n, linked):
    """Connected components (GPUs reachable through a chain of links). Components of one are dropped."""
    seen, out = set(), []
    for start in range(n):
        if start in seen:
            continue
        stack, comp = [start], []
        seen.add(start)
        while stack:
            i = stack.pop()
            comp.append(i)
            for j in range(n):
                if j not in seen and (linked(i, j) or linked(j, i)):
                    seen.add(j)
                    stack.append(j)
        if len(comp) > 1:
            out.append(sorted(comp))
    return out


def derive(raw):
    """Add links, islands, fingerprint, findings and rendered tables to the measured facts."""
    facts = dict(raw)
    n = facts["gpu_count"]
    counts = facts["nvlink_counts"]
    facts["links"] = [["X" if i == j else ("NV%d" % counts[i][j] if counts[i][j] else facts["pcie_levels"][i][j])
                       for j in range(n)] for i in range(n)]
    numa = {}
    for gpu in facts["gpus"]:
        if gpu["numa_node"] is not None:
            numa.setdefault(gpu["numa_node"], []).append(gpu["index"])
    p2p = facts["p2p"]
    facts["islands"] = {
        "numa": [numa[node] for node in sorted(numa)],
        "p2p": _groups(n, lambda i, j: p2p["read"][i][j] == "OK" and p2p["write"][i][j] == "OK"),
        "nvlink": _components(n, lambda i, j: counts[i][j] > 0),
    }
    facts["in_vm"] = any(g["virtualization_mode"] in ("passthrough", "vgpu") for g in facts["gpus"])
    facts["fingerprint"] = fingerprint(facts)
    facts["findings"] = findings(facts)
    facts["rendered"] = {"matrix": render_matrix(facts), "p2p_read": render_p2p(facts, "read")}
    facts["rendered"]["report"] = render_report(facts)
    return facts


def read_topology(nvml, sysfs_root="/sys"):
    """Everything `ansible_facts.gpu_topology` holds, read through `nvml` (pynvml or a replay of it)."""
    return derive(read_raw(nvml, sysfs_root))


FINGERPRINT_DOC = """The fingerprint is the first 12 hex digits of sha256 over canonical JSON of: the driver branch
(major version), the GPU count, per GPU in index order its name, total memory, compute capability, PCIe max
generation and width, MIG mode; the link matrix (nvidia-smi words), the NVLink counts, all five P2P matrices
and the NUMA islands. Not in it: memory used/free, processes, UUIDs, PCI bus ids, current PCIe link (it drops
at idle), persistence mode, the driver's minor/patch version, NUMA node numbers (only the grouping)."""


def fingerprint_basis(facts):
    """What the fingerprint is taken over (see FINGERPRINT_DOC), as plain data: the planner compares nodes by it."""
    return {
        "driver_branch": str(facts.get("driver_version", "")).split(".", maxsplit=1)[0],
        "gpu_count": facts["gpu_count"],
        "gpus": [[g["name"], g["memory"]["total_bytes"], g["compute_capability"],
                  g["pcie"]["max_gen"], g["pcie"]["max_width"], g["mig_enabled"]] for g in facts["gpus"]],
        "links": facts["links"],
        "nvlink_counts": facts["nvlink_counts"],
        "p2p": facts["p2p"],
        "numa_islands": facts["islands"]["numa"],
    }


def fingerprint(facts):
    """Stable 12-hex-digit id of what determines performance (see FINGERPRINT_DOC)."""
    blob = json.dumps(fingerprint_basis(facts), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]
