#!/usr/bin/env python3
"""How long planning takes: every candidate layout for one 8-GPU box, and for 8 nodes x 8 GPUs, at the default
workload and with a latency target (workload.slo: each layout searched for the highest concurrency that meets it).
Targets: under 50 ms for 8 GPUs, under 1 s for 8 nodes x 8 GPUs, with or without the SLO.

    make fakenvml && .venv/bin/python perf/plan_speed.py [--runs 20] [--spec NAME] [--model NAME]

The topology is read once through the lab's fake libnvidia-ml.so.1 and the real nvidia-ml-py (as the topology
stage does); then planner.plan(layout="auto") runs --runs times: model directory read, every candidate checked,
placed, sized and scored, ranking and argv. Prints the candidate counts and the median and slowest wall times;
exits 1 when a slowest time misses its target.
"""
import argparse
import ctypes
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent

import _common
from ansible_collections.topolaunch.sglang.plugins.module_utils import planner, topology

TARGETS_S = {"8 GPUs": 0.050, "8 nodes x 8 GPUs": 1.0}
# A target that some layouts meet at a part of the concurrency only (a search per layout), others not at all.
SLO_WORKLOAD = {"input_len": 1024, "output_len": 1024, "concurrency": 256, "slo": {"ttft_ms": 3000, "tpot_ms": 60}}


def read_facts(lib, spec_name):
    ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)  # pynvml's CDLL("libnvidia-ml.so.1") then finds the fake
    import pynvml  # pylint: disable=import-outside-toplevel

    spec_path = ROOT / "lab" / "specs" / (spec_name + ".json")
    spec = json.loads(spec_path.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["FAKE_NVML_SPEC"] = str(spec_path)
        os.environ["FAKE_NVML_STATE_DIR"] = tmp
        sysfs = pathlib.Path(tmp) / "sysfs"
        for gpu in spec["gpus"]:
            d = sysfs / "bus" / "pci" / "devices" / topology.sysfs_bus_id(gpu["pci_bus_id"])
            d.mkdir(parents=True)
            (d / "numa_node").write_text("%d\n" % gpu.get("sysfs_numa_node", gpu["numa_node"]))
        return topology.read_topology(pynvml, str(sysfs))


def timed(runs, request):
    times, result = [], None
    for _ in range(runs):
        start = time.perf_counter()
        result = planner.plan(request)
        times.append(time.perf_counter() - start)
    return times, result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--spec", default="proxmox-8x-rtx-pro-6000-vnuma")
    parser.add_argument("--model", default="glm-5-nvfp4", help="a folder of tests/fixtures/models")
    parser.add_argument("--lib", default=str(ROOT / "build" / "fakenvml" / "libnvidia-ml.so.1"))
    args = parser.parse_args()
    if not os.path.isfile(args.lib):
        parser.exit(2, "plan_speed: %s is missing: run `make fakenvml` first\n" % args.lib)
    facts = read_facts(args.lib, args.spec)
    model_path = str(ROOT / "tests" / "fixtures" / "models" / args.model)
    cases = {
        "8 GPUs": {"topology": facts},
        "8 nodes x 8 GPUs": {"node_topologies": [facts] * 8, "nnodes": 8, "dist_init_addr": "10.0.0.1:50000"},
    }
    failed, figures = False, []
    for name, kwargs in [(n, k) for n, k in cases.items()] + [(n + ", SLO", dict(k, workload=SLO_WORKLOAD))
                                                               for n, k in cases.items()]:
        times, result = timed(args.runs, planner.PlanRequest(model_path=model_path, layout="auto", **kwargs))
        valid = sum(1 for c in result["candidates"] if c["valid"])
        slowest, target = max(times), TARGETS_S[name.replace(", SLO", "")]
        ok = slowest < target
        failed |= not ok
        figures.append((name, statistics.median(times), slowest, target, ok))
        print("%-22s %3d candidates (%d valid), chose %-8s at concurrency %4s, median %7.1f ms, slowest %7.1f ms, "
              "target < %.0f ms: %s"
              % (name, len(result["candidates"]), valid, result["layout"]["name"], result["concurrency"],
                 statistics.median(times) * 1e3,
                 slowest * 1e3, target * 1e3, "ok" if ok else "MISSED"))
    _common.record("plan_speed", [_common.row(
        "planning all candidates, %s" % " / ".join(f[0] for f in figures),
        " / ".join("%.0f ms median (slowest %.0f ms)" % (f[1] * 1e3, f[2] * 1e3) for f in figures),
        " / ".join("< %.0f ms" % (f[3] * 1e3) for f in figures), not failed)])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
