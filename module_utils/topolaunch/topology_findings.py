"""Findings: what in a GPU topology costs performance or blocks a launch, each with a stable id and a remedy.

| id | severity | when |
| --- | --- | --- |
| vm-no-numa | warning | GPUs in a VM and NVML/sysfs expose no NUMA node for them |
| numa-unknown | info | bare metal, but no NUMA node known for some GPUs |
| p2p-chipset-not-supported | warning | P2P read status CNS between GPUs |
| p2p-unavailable | warning | P2P read status GNS/TNS/NS/DIS/UNK between GPUs |
| pcie-link-degraded | warning (width) / info (generation only, may be idle power saving) | current PCIe link below max |
| gpu-busy | warning | GPUs hold compute processes or more than 1 GiB of memory |
| mixed-gpu-models | warning | more than one GPU model or memory size |
| mig-enabled | warning | MIG mode on |
| persistence-off | info | persistence mode off |
"""

from .proxmox_vm import clique_set_arg, gpu_args, pxb_args
from .topology_render import cpulist

BUSY_BYTES = 1 << 30   # used memory above this, with or without processes, counts as busy (drivers keep ~0.6 GB)


def _gpus(ids):
    return ("GPU %d" % ids[0]) if len(ids) == 1 else "GPUs " + cpulist(ids)


def _pairs(facts, kind, words):
    """Ordered pairs (i < j) whose P2P status (either direction) is one of words."""
    m = facts["p2p"][kind]
    return [(i, j) for i in range(facts["gpu_count"]) for j in range(i + 1, facts["gpu_count"])
            if m[i][j] in words or m[j][i] in words]


def _pair_text(pairs, n):
    if len(pairs) == n * (n - 1) // 2:
        return "every pair of the %d GPUs" % n
    return ", ".join("%d-%d" % p for p in pairs)


def _finding(fid, severity, gpus, message, remedy):
    return {"id": fid, "severity": severity, "gpus": sorted(gpus), "message": message, "remedy": remedy}


def _numa_findings(facts):
    unknown = [g["index"] for g in facts["gpus"] if g["numa_node"] is None]
    if not unknown or facts["gpu_count"] < 2:
        return []
    if facts.get("in_vm"):
        return [_finding(
            "vm-no-numa", "warning", unknown,
            "%s run in a VM that exposes no NUMA node for them (nvidia-smi shows NUMA Affinity N/A; sysfs numa_node "
            "is -1): the planner cannot keep tensor-parallel groups inside one CPU socket." % _gpus(unknown),
            "Give the VM the host's NUMA layout: in Proxmox set `numa: 1` and one `numaN: cpus=..,hostnodes=N,"
            "memory=..,policy=bind` per host socket; GPUs get a guest NUMA node only behind a pxb-pcie expander "
            "bridge in the VM's `args:` (root only), e.g. `" + " ".join(pxb_args(1, 1) + gpu_args("<bus>", 0, 1)) +
            "` for each GPU of host node 1 instead of its hostpciN line (`ansible-playbook playbooks/proxmox.yml` "
            "computes all of it from the host and writes it when asked). "
            "Compare with `nvidia-smi topo -m` on the host.")]
    return [_finding(
        "numa-unknown", "info", unknown,
        "No NUMA node is known for %s (NVML memory affinity empty, sysfs numa_node -1)." % _gpus(unknown),
        "Enable NUMA in the BIOS (e.g. disable node interleaving) if the machine has more than one socket.")]


def _p2p_findings(facts):
    out = []
    n = facts["gpu_count"]
    cns = _pairs(facts, "read", ("CNS",))
    if cns:
        gpus = sorted({i for p in cns for i in p})
        if facts.get("in_vm"):
            remedy = ("Tell QEMU the GPUs may talk P2P: add `" + " ".join(clique_set_arg("hostpciN", "K")) +
                      "` for every GPU to the VM's `args:` (same K for GPUs that may talk; hostpciN needs an explicit "
                      "`.0` function and no `hidden=1` CPU flag), then restart the VM; expect CNS -> OK in "
                      "`nvidia-smi topo -p2p r`.")
        else:
            remedy = ("The chipset refuses PCIe P2P between these GPUs: check IOMMU (iommu=pt) and ACS settings in the "
                      "BIOS/kernel; until then NCCL falls back to host memory (set NCCL_P2P_DISABLE=1 if it hangs).")
        out.append(_finding(
            "p2p-chipset-not-supported", "warning", gpus,
            "P2P is not supported by the chipset (CNS) for %s: GPU-to-GPU copies go through host memory "
            "(much lower bandwidth, ~14 us instead of ~0.4 us latency)." % _pair_text(cns, n), remedy))
    other = _pairs(facts, "read", ("GNS", "TNS", "NS", "DIS", "UNK"))
    if other:
        gpus = sorted({i for p in other for i in p})
        out.append(_finding(
            "p2p-unavailable", "warning", gpus,
            "P2P read is not available for %s (nvidia-smi topo -p2p r shows GNS/TNS/NS/DIS/U)." % _pair_text(other, n),
            "Check `nvidia-smi topo -p2p r` and the driver's P2P registry keys; for GPUs behind different IOMMU groups "
            "or hosts, P2P cannot work: keep tensor-parallel groups to GPUs that show OK."))
    return out


def _pcie_findings(facts):
    width, gen = [], []
    for g in facts["gpus"]:
        p = g["pcie"]
        if None in (p["max_width"], p["cur_width"], p["max_gen"], p["cur_gen"]):
            continue
        if p["cur_width"] < p["max_width"]:
            width.append(g)
        elif p["cur_gen"] < p["max_gen"]:
            gen.append(g)
    out = []
    if width:
        out.append(_finding(
            "pcie-link-degraded", "warning", [g["index"] for g in width],
            "PCIe link narrower than the GPU supports: %s." % "; ".join(
                "GPU %d x%d of x%d (Gen%d of Gen%d)"
                % (g["index"], g["pcie"]["cur_width"], g["pcie"]["max_width"], g["pcie"]["cur_gen"], g["pcie"]["max_gen"])
                for g in width),
            "Reseat the GPU or riser, check the slot's wiring (x16 electrical) and the BIOS PCIe settings "
            "(link width/bifurcation); confirm with `nvidia-smi -q -d PCIE`."))
    if gen:
        out.append(_finding(
            "pcie-link-degraded", "info", [g["index"] for g in gen],
            "PCIe link below the GPU's generation: %s. GPUs lower the link generation when idle to save power, "
            "so this matters only if it stays low under load." % "; ".join(
                "GPU %d Gen%d of Gen%d" % (g["index"], g["pcie"]["cur_gen"], g["pcie"]["max_gen"]) for g in gen),
            "Check under load with `nvidia-smi -q -d PCIE`; if it stays low, set the slot to the GPU's generation in "
            "the BIOS, reseat the GPU or riser, or replace a riser rated for a lower generation."))
    return out


def _busy_findings(facts):
    busy = [g for g in facts["gpus"] if g["processes"] or g["memory"]["used_bytes"] > BUSY_BYTES]
    if not busy:
        return []
    detail = "; ".join("GPU %d: %d MiB used, pids %s" % (
        g["index"], g["memory"]["used_bytes"] >> 20, ",".join(str(p["pid"]) for p in g["processes"]) or "none visible")
        for g in busy)
    return [_finding(
        "gpu-busy", "warning", [g["index"] for g in busy],
        "GPUs already hold memory or processes: %s." % detail,
        "Run the cleanup stage (`ansible-playbook deploy.yml --tags cleanup`) to stop the old server, "
        "or stop those processes; a launch next to them may run out of memory.")]


def _model_findings(facts):
    kinds = sorted({(g["name"], g["memory"]["total_bytes"]) for g in facts["gpus"]})
    if len(kinds) < 2:
        return []
    return [_finding(
        "mixed-gpu-models", "warning", [g["index"] for g in facts["gpus"]],
        "Mixed GPUs: %s. Tensor and pipeline parallel ranks run at the pace and memory of the smallest." % "; ".join(
            "%s (%d MiB): %s" % (name, total >> 20, ",".join(
                str(g["index"]) for g in facts["gpus"] if (g["name"], g["memory"]["total_bytes"]) == (name, total)))
            for name, total in kinds),
        "Serve on one model only: set `topolaunch_gpus` to the indices of the same GPUs.")]


def _mode_findings(facts):
    out = []
    mig = [g["index"] for g in facts["gpus"] if g["mig_enabled"]]
    if mig:
        out.append(_finding(
            "mig-enabled", "warning", mig,
            "MIG mode is on for %s: SGLang needs whole GPUs." % _gpus(mig),
            "Turn MIG off: `nvidia-smi -i <index> -mig 0` with nothing running, then reset the GPU "
            "(`nvidia-smi -r -i <index>`) or reboot."))
    off = [g["index"] for g in facts["gpus"] if g["persistence_mode"] is False]
    if off:
        out.append(_finding(
            "persistence-off", "info", off,
            "Persistence mode is off for %s: the driver unloads when no process uses the GPU, so each start pays "
            "the initialisation again and NVML queries are slower." % _gpus(off),
            "Enable the nvidia-persistenced service (`systemctl enable --now nvidia-persistenced`) or run "
            "`nvidia-smi -pm 1`."))
    return out


def findings(facts):
    """All findings for derived facts (needs gpus, p2p, in_vm), in a fixed order."""
    out = []
    for check in (_numa_findings, _p2p_findings, _pcie_findings, _busy_findings, _model_findings, _mode_findings):
        out.extend(check(facts))
    return out
