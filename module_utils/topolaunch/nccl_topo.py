"""An NCCL topology file (NCCL_TOPO_FILE) for VMs whose PCI tree hides the real GPU grouping.

Plain Python 3.9+ stdlib. Input: one node's `gpu_topology` facts (docs/DESIGN.md) and optionally a preflight
record (preflight.py).

NCCL builds its topology from sysfs: the PCI path of each GPU up to a root complex, and the root port's
`numa_node` for the CPU it hangs under. A Proxmox q35 guest puts every GPU on its own root port of one emulated
host bridge with `numa_node` -1, so NCCL sees one CPU and every GPU pair as PHB. By default NCCL uses P2P only
up to PXB (src/graph/paths.cc: `p2pLevel = PATH_PXB`), so it never uses P2P there, and it cannot tell the
sockets apart when it builds rings. A topology file tells it the real grouping.

What `render` writes (the format NCCL reads and dumps, src/graph/xml.cc):

    <system version="1" name="topolaunch-<fingerprint>">
      <cpu numaid="0" affinity="00000000,ffffffff" [arch= vendor= familyid= modelid=]>
        <pci busid="ffff:ff:01.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16">   a P2P group
          <pci busid="0000:01:00.0" class="0x030200" link_speed="32.0 GT/s PCIe" link_width="16"/>  a GPU
          ...
        </pci>
        <pci busid="0000:05:00.0" .../>         a GPU without a working P2P partner: straight on the CPU
      </cpu>
      <cpu numaid="1" ...> ... </cpu>
    </system>

- One `<cpu>` per group of GPUs that share a socket: the NUMA islands of the facts, or, when NUMA is unknown,
  the clusters of the preflight's measured P2P bandwidth. `affinity` is the group's CPUs in sysfs cpumap form
  (32-bit hex words, highest first): NCCL reads affinity from /sys/devices/system/node/node<numaid>/cpumap only
  when the attribute is absent, which fails for a node the guest does not have.
- Inside a CPU, GPUs that talk P2P well (measured, or NVML P2P OK without a record) sit under one made-up PCIe
  switch (`ffff:ff:<n>.0`, class 0x060400, as Azure's published topology files do): their path becomes PIX, so
  NCCL uses P2P between them; a GPU whose P2P hung or is unavailable sits directly on the CPU (PHB: no P2P).
  Across CPUs the path is SYS.
- GPU `<pci>` nodes carry only busid, class and link: NCCL fills `<gpu dev= sm= rank= gdr=>` itself, and it
  keeps dev, sm, gdr and NVLink children from a file when present (ncclTopoGetXmlFromGpu sets them only when
  absent), so writing them would freeze values that belong to the running process. The GPU's class is re-read
  from sysfs anyway. cpu `arch`/`vendor`/`familyid`/`modelid` are filled by NCCL from cpuid when absent.

`needed(facts, record)` says whether a file is worth writing; `render` writes it; `write` puts it on disk;
`sync` (the preflight stage) keeps the file on disk as `for_node` says, and `written_for` (the plan) tells whether
the file on disk was written for this topology.
"""
import os
import re

from .preflight import expected_gbps
from .system import file_differs, write_atomic
from .topology import sysfs_bus_id
from .topology_render import parse_cpulist

__all__ = ["needed", "render", "write", "for_node", "sync", "written_for", "DEFAULT_PATH", "numa_groups",
           "measured_groups", "p2p_groups", "cpumask", "cpu_info", "BRIDGE_CLASS", "GPU_CLASS"]

BRIDGE_CLASS = "0x060400"
GPU_CLASS = "0x030200"
LINK_SPEED = {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe",
              6: "64.0 GT/s PCIe"}
DEFAULT_PATH = "/etc/topolaunch/nccl_topo.xml"
NAME_RE = re.compile(r'<system version="1" name="topolaunch-([^"]*)">')
SPLIT_DROP = 0.10           # a cluster merge this much slower than the previous one separates groups


def _gpu_count(facts):
    return len(facts["gpus"])


def numa_groups(facts):
    """GPUs by known NUMA node (facts islands), when every GPU's node is known and there are at least two."""
    groups = facts.get("islands", {}).get("numa") or []
    covered = sorted(g for grp in groups for g in grp)
    if len(groups) >= 2 and covered == list(range(_gpu_count(facts))):
        return [list(g) for g in groups]
    return []


def _ok_pairs(record):
    """Directed pair -> GB/s of the P2P copies that worked, from a preflight record."""
    return {(p["src"], p["dst"]): p["gbps"] for p in (record or {}).get("pairs", [])
            if not p["local"] and not p["p2p_disabled"] and p["status"] == "ok" and p["gbps"]}


def measured_groups(record, gpus):
    """Clusters of the measured P2P bandwidth: complete linkage (a cluster is as fast as its slowest pair, the
    slower direction counting; pairs that hung or failed are left out), merged from the fastest; the merge that
    is SPLIT_DROP slower than the one before separates the groups. [] when no pair was measured, the drop never
    comes, or a GPU would stay alone."""
    ok = _ok_pairs(record)
    speed = {}
    for a in gpus:
        for b in gpus:
            known = [ok[k] for k in ((a, b), (b, a)) if k in ok]
            if a < b and known:
                speed[(a, b)] = min(known)      # a pair that hung or failed says nothing about distance
    if len(gpus) < 4 or not speed:
        return []

    def linkage(x, y):
        known = [speed[(min(a, b), max(a, b))] for a in x for b in y if (min(a, b), max(a, b)) in speed]
        return min(known) if known else 0.0

    clusters = [[g] for g in gpus]
    heights = []
    states = []
    while len(clusters) > 1:
        best = None
        for i in range(len(clusters)):
            for j in range(i + 1, len(clusters)):
                link = linkage(clusters[i], clusters[j])
                if best is None or link > best[0]:
                    best = (link, i, j)
        link, i, j = best
        states.append([sorted(c) for c in clusters])
        heights.append(link)
        clusters[i] = clusters[i] + clusters[j]
        del clusters[j]
    for k in range(1, len(heights)):
        if heights[k - 1] > 0 and heights[k] < (1.0 - SPLIT_DROP) * heights[k - 1]:
            groups = sorted(states[k], key=lambda c: c[0])
            if len(groups) >= 2 and all(len(c) >= 2 for c in groups):
                return groups
            return []
    return []


def p2p_groups(facts, record=None):
    """GPUs that talk P2P well among themselves: from the record, pairs that worked both ways and are not far
    below their link's expectation; without a record, NVML's P2P islands."""
    n = _gpu_count(facts)
    if record and _ok_pairs(record):
        ok = _ok_pairs(record)

        def good(a, b):
            expect = expected_gbps(facts, a, b)
            return all((x, y) in ok and (expect is None or ok[(x, y)] >= 0.5 * expect) for x, y in ((a, b), (b, a)))
    else:
        read = facts["p2p"]["read"]

        def good(a, b):
            return read[a][b] == "OK" and read[b][a] == "OK"
    groups = []
    for g in range(n):
        for group in groups:
            if all(good(g, other) for other in group):
                group.append(g)
                break
        else:
            groups.append([g])
    return groups


def _flat(facts):
    """True when NVML (so NCCL, reading the same sysfs) sees one PCI level between every pair of GPUs."""
    words = {facts["pcie_levels"][i][j] for i in range(_gpu_count(facts)) for j in range(_gpu_count(facts)) if i != j}
    return len(words) <= 1


def needed(facts, record=None):
    """Whether an NCCL topology file helps on this node, and with which grouping.

    Returns {needed, reason, groups, source}: source is `numa` (the facts' NUMA islands) or `measured` (the
    record's P2P bandwidth clusters). Needed when the PCI tree NCCL reads is flat (one level between all GPUs)
    or the NUMA node of some GPU is unknown (sysfs -1), while the facts or the measurements show at least two
    groups. Not needed for one GPU, for NVLink-only boxes (NCCL takes NVLink from NVML, not from PCI), or when
    NCCL's own view already shows the grouping."""
    n = _gpu_count(facts)
    answer = {"needed": False, "groups": [], "source": None}
    if n < 2:
        return dict(answer, reason="one GPU: nothing to group")
    if all(facts["links"][i][j].startswith("NV") for i in range(n) for j in range(n) if i != j):
        return dict(answer, reason="every GPU pair is NVLinked: NCCL reads NVLink from NVML, the PCI tree does not matter")
    numa_unknown = any(g["numa_node"] is None for g in facts["gpus"])
    flat = _flat(facts)
    if not flat and not numa_unknown:
        return dict(answer, reason="NCCL reads the grouping itself: the PCI tree has levels and every GPU's NUMA "
                                   "node is known")
    groups, source = numa_groups(facts), "numa"
    if not groups:
        groups, source = measured_groups(record, list(range(n))), "measured"
    if not groups:
        return dict(answer, reason="the PCI tree is %s but neither NUMA nor measured P2P bandwidth shows groups%s" % (
            "flat" if flat else "without NUMA", "" if record else " (no preflight record yet)"))
    why = "the guest's PCI tree is flat (%s between every pair)" % facts["pcie_levels"][0][1] if flat else \
        "the NUMA node of some GPUs is unknown"
    return {"needed": True, "groups": groups, "source": source,
            "reason": "%s, while the %s show %d groups (%s): NCCL_TOPO_FILE tells NCCL" % (
                why, "NUMA islands" if source == "numa" else "measured P2P bandwidths", len(groups),
                " / ".join(",".join(map(str, g)) for g in groups))}


def _cpus(cpulist):
    return set(parse_cpulist(cpulist))


def cpumask(cpus):
    """CPUs -> sysfs cpumap text: 32-bit hex words, highest first, comma separated ("00000000,ffffffff")."""
    cpus = set(cpus)
    words = max(1, (max(cpus) // 32 + 1) if cpus else 1)
    return ",".join("%08x" % sum(1 << (c - 32 * w) for c in cpus if 32 * w <= c < 32 * (w + 1))
                    for w in reversed(range(words)))


def cpu_info(proc_cpuinfo="/proc/cpuinfo"):
    """arch, vendor, familyid, modelid of this machine as NCCL would fill them; {} when unreadable."""
    fields = {}
    try:
        with open(proc_cpuinfo, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if not sep:
                    if fields:
                        break
                    continue
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return {}
    info = {"arch": os.uname().machine}
    if "vendor_id" in fields:
        info["vendor"] = fields["vendor_id"]
    if "cpu family" in fields and "model" in fields:
        info["familyid"] = fields["cpu family"]
        info["modelid"] = fields["model"]
    return info


def _attrs(pairs):
    return " ".join('%s="%s"' % (k, str(v).replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;"))
                    for k, v in pairs)


def _link(gpus, facts):
    gens = [facts["gpus"][g]["pcie"].get("max_gen") for g in gpus]
    widths = [facts["gpus"][g]["pcie"].get("max_width") for g in gpus]
    out = []
    if None not in gens and min(gens) in LINK_SPEED:
        out.append(("link_speed", LINK_SPEED[min(gens)]))
    if None not in widths:
        out.append(("link_width", min(widths)))
    return out


def render(facts, groups, bridges, cpu=None, all_cpus=None, name=None):
    """The topology file text: a <cpu> per group, a made-up switch per `bridges` entry (GPUs that talk P2P well;
    entries of one GPU are allowed, used to prove the format on a one-GPU machine), other GPUs on the CPU.

    The CPU affinity of a group is the union of its GPUs' cpu_affinity; when the facts have none, `all_cpus`
    (default: this process's allowed CPUs). numaid: the group's NUMA node when the facts know it, else its index."""
    cpu = dict(cpu or {})
    if all_cpus is None:
        all_cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    lines = ['<system %s>' % _attrs([("version", 1), ("name", name or "topolaunch-%s" % facts.get("fingerprint", "x"))])]
    bridge_no = 0
    for k, group in enumerate(groups):
        nodes = {facts["gpus"][g]["numa_node"] for g in group}
        numaid = nodes.pop() if len(nodes) == 1 and None not in nodes else k
        cpus = set().union(*[_cpus(facts["gpus"][g].get("cpu_affinity")) for g in group]) or set(all_cpus)
        attrs = [("numaid", numaid), ("affinity", cpumask(cpus))] + [
            (key, cpu[key]) for key in ("arch", "vendor", "familyid", "modelid") if key in cpu]
        lines.append('  <cpu %s>' % _attrs(attrs))
        inside = [b for b in bridges if set(b) <= set(group)]
        loose = [g for g in group if not any(g in b for b in inside)]
        for members in sorted(inside, key=lambda b: b[0]):
            bridge_no += 1
            bridge = [("busid", "ffff:ff:%02x.0" % bridge_no), ("class", BRIDGE_CLASS)] + _link(members, facts)
            lines.append('    <pci %s>' % _attrs(bridge))
            for g in members:
                lines.append('      <pci %s/>' % _gpu_attrs(facts, g))
            lines.append('    </pci>')
        for g in loose:
            lines.append('    <pci %s/>' % _gpu_attrs(facts, g))
        lines.append('  </cpu>')
    lines.append('</system>')
    return "\n".join(lines) + "\n"


def _gpu_attrs(facts, g):
    return _attrs([("busid", sysfs_bus_id(facts["gpus"][g]["pci_bus_id"])), ("class", GPU_CLASS)] + _link([g], facts))


def for_node(facts, record=None, cpu=None, all_cpus=None):
    """(decision, text or None): `needed`'s answer, and the file for its groups with the P2P groups as switches."""
    decision = needed(facts, record)
    if not decision["needed"]:
        return decision, None
    bridges = [[g for g in grp if any(g in d for d in decision["groups"])] for grp in p2p_groups(facts, record)]
    bridges = [b for b in bridges if len(b) >= 2]
    # A switch never spans two CPUs: cut each P2P group along the groups.
    cut = [sorted(set(b) & set(grp)) for b in bridges for grp in decision["groups"]]
    cut = [b for b in cut if len(b) >= 2]
    return decision, render(facts, decision["groups"], cut, cpu=cpu, all_cpus=all_cpus)


def write(path, text, owner=None):
    """Write the file atomically, mode 0644 (NCCL runs as the service user), directory 0755 created if missing."""
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    write_atomic(path, text, 0o644, owner or (os.getuid(), os.getgid()))


def _system_name(path):
    """The fingerprint in the file's `<system name="topolaunch-...">`, "" for a file of someone else, None when
    there is no readable file."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            head = f.read(4096)
    except OSError:
        return None
    match = NAME_RE.search(head)
    return match.group(1) if match else ""


def written_for(path, fingerprint):
    """True when `path` holds the topology file this project wrote for the topology `fingerprint`."""
    return bool(path and fingerprint) and _system_name(path) == fingerprint


def sync(path, facts, record=None, check_mode=False, remove=True, cpu=None, all_cpus=None):
    """Keep the NCCL topology file at `path` as `for_node(facts, record)` says: written (0644) when needed and
    different, removed when not needed, `remove` and it is ours (a file of someone else is left alone). Returns the
    decision with `path`, `changed` and `env` ({"NCCL_TOPO_FILE": path} when the file is (to be) there)."""
    decision, text = for_node(facts, record, cpu=cpu, all_cpus=all_cpus)
    out = dict(decision, path=path, changed=False, env={})
    if decision["needed"]:
        out["env"] = {"NCCL_TOPO_FILE": path}
        owner = (os.getuid(), os.getgid())
        if file_differs(path, text, 0o644, owner):
            out["changed"] = True
            if not check_mode:
                write(path, text, owner)
    elif remove and _system_name(path):
        out["changed"] = True
        if not check_mode:
            os.unlink(path)
    return out
