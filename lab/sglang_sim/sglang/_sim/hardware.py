"""The simulated GPUs: the lab's GPU spec (the same JSON the fake NVML serves) and CUDA's device numbering."""
import json
import os

DEFAULT_SPEC = "/etc/fake-nvml/spec.json"
MIB = 1 << 20

# Per GPU model (matched as a substring of the NVML name): HBM/GDDR bandwidth in bytes/s and dense
# tensor throughput in FLOP/s at the precision a quantized MoE runs its GEMMs in (FP8/FP4 class).
# Public datasheet figures, rounded; the efficiency factors of perf.py turn them into achieved numbers.
GPU_MODELS = [
    ("RTX PRO 6000", 1.79e12, 1.0e15),
    ("H200", 4.8e12, 1.98e15),
    ("H100", 3.35e12, 1.98e15),
    ("B200", 8.0e12, 4.5e15),
    ("A100", 2.0e12, 0.31e15),
    ("L40S", 0.86e12, 0.73e15),
]
GPU_DEFAULT = (1.0e12, 0.3e15)
# PCIe bytes/s per lane by generation (after encoding); a link carries ~80% of it as payload
PCIE_LANE = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}


class HardwareError(Exception):
    pass


class Gpu:
    def __init__(self, index, entry):
        self.index = index
        self.name = entry.get("name", "NVIDIA GPU")
        self.uuid = entry.get("uuid")
        self.pci_bus_id = entry.get("pci_bus_id", "")
        self.memory_total = int(entry.get("memory_total_mib", 0)) * MIB
        self.memory_reserved = int(entry.get("memory_reserved_mib", 0)) * MIB
        self.nvlinks = int(entry.get("nvlinks", 0))
        self.numa_node = int(entry.get("numa_node", -1))  # what nvmlDeviceGetMemoryAffinity reports
        pcie = entry.get("pcie") or {}
        gen, width = pcie.get("cur_gen"), pcie.get("cur_width")
        # payload bandwidth of the GPU's own PCIe link as trained now (a degraded link caps every transfer)
        self.pcie_bw = PCIE_LANE.get(gen, 0) * width * 0.8 if (gen and width) else float("inf")
        for pattern, bw, flops in GPU_MODELS:
            if pattern.lower() in self.name.lower():
                self.mem_bw, self.flops = bw, flops
                break
        else:
            self.mem_bw, self.flops = GPU_DEFAULT


class Spec:
    def __init__(self, path, data):
        self.path = path
        self.data = data  # as read: a node sends it to node 0 for the performance model of a multi-node server
        self.name = data.get("name", os.path.basename(path))
        self.gpus = [Gpu(i, g) for i, g in enumerate(data.get("gpus", []))]
        n = len(self.gpus)
        self.pcie = data.get("pcie_topology") or [["X" if a == b else "SYS" for b in range(n)] for a in range(n)]
        if len(self.pcie) != n or any(len(row) != n for row in self.pcie):
            raise HardwareError("%s: pcie_topology must be %dx%d" % (path, n, n))
        nvlink = data.get("nvlink") or {}
        self.nvswitch = nvlink.get("fabric") == "nvswitch"
        self.nvlink_pairs = {}
        for a, b, links in nvlink.get("pairs", []):
            self.nvlink_pairs[(a, b)] = self.nvlink_pairs[(b, a)] = int(links)
        self.not_supported = set(data.get("not_supported", ["numa_node_id"]))
        p2p = data.get("p2p") or {}
        self.p2p_default = p2p.get("default", "OK")
        self.p2p_pairs = {}
        for a, b, status in p2p.get("pairs", []):
            self.p2p_pairs[(a, b)] = self.p2p_pairs[(b, a)] = status

    def level(self, a, b):
        """How GPUs a and b talk: NV (NVLink) or the PCIe common-ancestor word (PIX PXB PHB NODE SYS)."""
        if a == b:
            return "X"
        if self.nvswitch and self.gpus[a].nvlinks and self.gpus[b].nvlinks:
            return "NV"
        if self.nvlink_pairs.get((a, b)):
            return "NV"
        return self.pcie[a][b]

    def p2p_ok(self, a, b):
        return self.p2p_pairs.get((a, b), self.p2p_default) == "OK"


def load_spec(path=None):
    path = path or os.environ.get("SGLANG_SIM_GPU_SPEC") or DEFAULT_SPEC
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as err:
        raise HardwareError(
            "RuntimeError: No CUDA GPUs are available (simulator: cannot read the GPU spec %s: %s)" % (path, err.strerror)
        ) from None
    except ValueError as err:
        raise HardwareError("simulator: GPU spec %s is not valid JSON: %s" % (path, err)) from None
    return Spec(path, data)


def visible_devices(spec, env=None):
    """NVML indices of the devices CUDA numbers 0, 1, ... (CUDA_VISIBLE_DEVICES, as CUDA parses it).

    Entries are device indices or GPU UUIDs (prefixes allowed). As in CUDA, parsing stops at the first entry
    that is invalid, out of range or repeated: "0,1,9,2" on 8 GPUs gives devices 0 and 1. The lab's GPUs are
    identical, so PCI_BUS_ID and FASTEST_FIRST orders agree and both mean NVML order here.
    """
    env = os.environ if env is None else env
    value = env.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return list(range(len(spec.gpus)))
    result = []
    for item in value.split(","):
        item = item.strip()
        index = None
        if item.isdigit():
            index = int(item)
            if index >= len(spec.gpus):
                break
        elif item.startswith("GPU-"):
            matches = [g.index for g in spec.gpus if g.uuid and g.uuid.startswith(item)]
            if len(matches) != 1:
                break
            index = matches[0]
        else:
            break
        if index in result:
            break
        result.append(index)
    return result
