"""Text tables laid out as nvidia-smi prints them: `nvidia-smi topo -m` and `nvidia-smi topo -p2p <kind>`.

The layout (tabs, the underlined header, the legend) was copied from nvidia-smi 580 on a real 2x H200 VM
(tests/fixtures/nvml/), so a rendered table can be compared with nvidia-smi's byte for byte.
"""


def cpulist(cpus):
    """[0, 1, 2, 5] -> "0-2,5" (the kernel's cpulist format, as nvidia-smi prints CPU affinity)."""
    parts, cpus = [], sorted(cpus)
    start = prev = None
    for cpu in cpus + [None]:
        if start is not None and (cpu is None or cpu != prev + 1):
            parts.append(str(start) if start == prev else "%s-%s" % (start, prev))
            start = None
        if cpu is not None and start is None:
            start = cpu
        prev = cpu
    return ",".join(parts)


def parse_cpulist(text):
    """The kernel's cpulist format -> sorted CPUs: "0-2,5" -> [0, 1, 2, 5] (empty text: [])."""
    cpus = set()
    for part in filter(None, (text or "").split(",")):
        a, _sep, b = part.partition("-")
        cpus.update(range(int(a), int(b or a) + 1))
    return sorted(cpus)


UNDERLINE = "\x1b[4m"
RESET = "\x1b[0m"

MATRIX_LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""

P2P_LEGEND = """
Legend:

  X    = Self
  OK   = Status Ok
  CNS  = Chipset not supported
  GNS  = GPU not supported
  TNS  = Topology not supported
  NS   = Not supported
  U    = Unknown
"""

# nvidia-smi's word for a P2P status where ours differs (UNK -> U).
_P2P_SMI_WORD = {"UNK": "U"}

P2P_KINDS = {"read": "r", "write": "w", "nvlink": "n", "atomics": "a", "pci": "p"}


def render_matrix(facts):
    """`nvidia-smi topo -m` for these facts: links, CPU affinity, NUMA affinity, GPU NUMA ID, legend."""
    n = facts["gpu_count"]
    header = "\t" + UNDERLINE + "".join("GPU%d\t" % i for i in range(n)) + \
        "CPU Affinity\tNUMA Affinity\tGPU NUMA ID" + RESET
    lines = [header]
    for i, gpu in enumerate(facts["gpus"]):
        cells = [" X " if i == j else facts["links"][i][j] for j in range(n)]
        gpu_numa = "N/A" if gpu.get("gpu_numa_id") is None else str(gpu["gpu_numa_id"])
        lines.append("GPU%d\t%s\t%s\t%s\t\t%s" % (
            i, "\t".join(cells), gpu["cpu_affinity"] or "N/A", gpu.get("numa_affinity") or "N/A", gpu_numa))
    return "\n".join(lines) + "\n" + MATRIX_LEGEND


def render_p2p(facts, kind="read"):
    """`nvidia-smi topo -p2p r|w|n|a|p` for these facts; kind is read, write, nvlink, atomics or pci."""
    if kind not in P2P_KINDS:
        raise ValueError("P2P kind %r is not one of %s" % (kind, ", ".join(P2P_KINDS)))
    n = facts["gpu_count"]
    matrix = facts["p2p"][kind]
    lines = [" \t" + UNDERLINE + "".join("GPU%d\t" % i for i in range(n)) + RESET]
    for i in range(n):
        lines.append(" GPU%d\t" % i + "".join("%s\t" % _P2P_SMI_WORD.get(w, w) for w in matrix[i]))
    return "\n".join(lines) + "\n" + P2P_LEGEND


def _plain(text):
    """nvidia-smi text for a log: no ANSI escapes, tabs expanded to nvidia-smi's terminal columns."""
    return [line.expandtabs().rstrip() for line in text.replace(UNDERLINE, "").replace(RESET, "").splitlines()]


def render_report(facts):
    """Lines for a human: the matrix and P2P read table without escapes or tabs, then the findings."""
    lines = _plain(render_matrix(facts).split("\nLegend:", maxsplit=1)[0]) + [""]
    lines += _plain(render_p2p(facts, "read").split("\nLegend:", maxsplit=1)[0]) + [""]
    lines.append("fingerprint %s, driver %s, CUDA %s, %d GPU(s): %s" % (
        facts["fingerprint"], facts["driver_version"], facts["cuda_driver_version"], facts["gpu_count"],
        ", ".join(sorted({g["name"] for g in facts["gpus"]}))))
    if not facts["findings"]:
        lines.append("findings: none")
    for f in facts["findings"]:
        lines.append("%s %s (GPU %s): %s" % (f["severity"].upper(), f["id"], cpulist(f["gpus"]), f["message"]))
        lines.append("    fix: " + f["remedy"])
    return lines
