#!/usr/bin/env python3
"""Turn a real GPU machine into a lab spec (lab/specs/README.md format), so the lab can rehearse it.

Run on the GPU machine with a python that has nvidia-ml-py (the tools venv):
    /opt/topolaunch/tools/bin/python tools/nvml_dump.py --name my-box > lab/specs/my-box.json
or from a recording made by tools/record_nvml.py (no GPU needed):
    .venv/bin/python tools/nvml_dump.py --recording tests/fixtures/nvml/h200x2-vm.json --name h200x2
Copy the checkout (or just tools/ and module_utils/) to the machine; only the standard library and pynvml are used.
"""
import argparse
import json
import os
import pathlib
import socket
import sys


from ansible_collections.topolaunch.sglang.plugins.module_utils import topology
from ansible_collections.topolaunch.sglang.plugins.plugin_utils.topology_replay import Replay

# Our P2P words -> the spec's status names.
SPEC_P2P = {"OK": "OK", "CNS": "CNS", "GNS": "GNS", "TNS": "TNS", "NS": "NS", "DIS": "DISABLED", "UNK": "UNKNOWN"}


def _cuda_int(text):
    major, minor = text.split(".")
    return int(major) * 1000 + int(minor) * 10


def spec_from_raw(raw, name, sysfs_root="/sys", sysfs_numa=None):
    """Lab spec for measured facts (topology.read_raw). sysfs_numa: per GPU index, what sysfs read (-1 = none);
    read from sysfs_root when not given."""
    gpus = []
    for g in raw["gpus"]:
        held = sum(p["used_memory_bytes"] or 0 for p in g["processes"])
        affinity = g["numa_affinity"]
        numa = int(affinity) if affinity.isdigit() else -1
        if sysfs_numa is not None:
            sysfs_node = sysfs_numa[g["index"]]
        else:
            node = topology.sysfs_numa_node(sysfs_root, g["pci_bus_id"])
            sysfs_node = -1 if node is None else node
        major, minor = (g["compute_capability"] or "0.0").split(".")
        entry = {
            "name": g["name"],
            "uuid": g["uuid"],
            "pci_bus_id": g["pci_bus_id"],
            "memory_total_mib": g["memory"]["total_bytes"] >> 20,
            "memory_reserved_mib": max(0, g["memory"]["used_bytes"] - held) >> 20,
            "compute_capability": [int(major), int(minor)],
            "numa_node": numa,
            "cpu_affinity": g["cpu_affinity"],
            "pcie": g["pcie"],
            "nvlinks": g["nvlinks_active"],
            "mig": bool(g["mig_enabled"]),
        }
        if sysfs_node != numa:
            entry["sysfs_numa_node"] = sysfs_node
        gpus.append(entry)
    n = raw["gpu_count"]
    words = [raw["p2p"]["read"][i][j] for i in range(n) for j in range(n) if i != j]
    default = max(sorted(set(words)), key=words.count) if words else "OK"
    pairs = [[i, j, SPEC_P2P[raw["p2p"]["read"][i][j]]] for i in range(n) for j in range(i + 1, n)
             if raw["p2p"]["read"][i][j] != default]
    spec = {
        "name": name,
        "driver_version": raw["driver_version"],
        "cuda_driver_version": _cuda_int(raw["cuda_driver_version"] or "0.0"),
        "virtualization": "passthrough" if any(g["virtualization_mode"] == "passthrough" for g in raw["gpus"])
        else "none",
        "gpus": gpus,
        "pcie_topology": raw["pcie_levels"],
        "p2p": {"default": SPEC_P2P[default], "pairs": pairs},
    }
    if raw["nvlink_fabric"] == "nvswitch":
        spec["nvlink"] = {"fabric": "nvswitch", "pairs": []}
    elif raw["nvlink_fabric"] == "direct":
        spec["nvlink"] = {"fabric": "direct", "pairs": [
            [i, j, raw["nvlink_counts"][i][j]] for i in range(n) for j in range(i + 1, n) if raw["nvlink_counts"][i][j]]}
    if all(g["gpu_numa_id"] is None for g in raw["gpus"]):
        spec["not_supported"] = ["numa_node_id"]
    return spec


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", default=socket.gethostname(), help="spec name (default: host name)")
    parser.add_argument("--sysfs-root", default="/sys", help="where bus/pci/devices/<bus>/numa_node is read")
    parser.add_argument("--recording", help="read a tools/record_nvml.py recording instead of this machine's NVML")
    parser.add_argument("--output", "-o", help="write here instead of stdout")
    args = parser.parse_args(argv)
    sysfs_numa = None
    if args.recording:
        with open(args.recording, encoding="utf-8") as handle:
            recording = json.load(handle)
        nvml = Replay(recording)
        sysfs_numa = recording.get("meta", {}).get("sysfs_numa_node")
        if sysfs_numa is not None:
            sysfs_numa = {int(k): v for k, v in sysfs_numa.items()}
    else:
        try:
            nvml = topology.import_nvml()
        except topology.TopologyError as exc:
            parser.exit(2, "nvml_dump: %s\n" % exc)
    try:
        raw = topology.read_raw(nvml, args.sysfs_root)
    except topology.TopologyError as exc:
        parser.exit(2, "nvml_dump: %s\n" % exc)
    text = json.dumps(spec_from_raw(raw, args.name, args.sysfs_root, sysfs_numa), indent=1) + "\n"
    if args.output:
        tmp = args.output + ".tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, args.output)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
