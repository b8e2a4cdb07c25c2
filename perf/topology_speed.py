#!/usr/bin/env python3
"""How long the topology stage's full NVML query of 8 GPUs takes (all pairs, all 5 P2P indices, all NVLink links),
through the lab's fake libnvidia-ml.so.1 and the real nvidia-ml-py, in-process. Target: under 0.5 s.

    make fakenvml && .venv/bin/python perf/topology_speed.py [--runs 20] [--spec NAME ...]

Prints, per spec, the NVML calls made and the median and slowest wall time of read_topology (query + derived
facts + rendering). A real 2x H200 took 0.064-0.068 s (tests/fixtures/nvml/README.md).
"""
import argparse
import ctypes
import os
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent

import _common
from ansible_collections.topolaunch.sglang.plugins.module_utils import topology
from ansible_collections.topolaunch.sglang.plugins.plugin_utils.topology_replay import Recorder

TARGET_S = 0.5
DEFAULT_SPECS = ("hgx-8x-h100-nvswitch", "proxmox-8x-rtx-pro-6000-vnuma")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--spec", action="append", help="lab spec name (default: %s)" % ", ".join(DEFAULT_SPECS))
    parser.add_argument("--lib", default=str(ROOT / "build" / "fakenvml" / "libnvidia-ml.so.1"))
    args = parser.parse_args()
    if not os.path.isfile(args.lib):
        parser.exit(2, "topology_speed: %s is missing: run `make fakenvml` first\n" % args.lib)
    ctypes.CDLL(args.lib, mode=ctypes.RTLD_GLOBAL)   # pynvml's CDLL("libnvidia-ml.so.1") then finds the fake
    import pynvml  # pylint: disable=import-outside-toplevel
    worst, medians = 0.0, []
    with tempfile.TemporaryDirectory() as state:
        os.environ["FAKE_NVML_STATE_DIR"] = state
        for name in args.spec or DEFAULT_SPECS:
            spec = ROOT / "lab" / "specs" / (name + ".json")
            if not spec.is_file():
                parser.exit(2, "topology_speed: no spec %s\n" % spec)
            os.environ["FAKE_NVML_SPEC"] = str(spec)
            recorder = Recorder(pynvml)
            facts = topology.read_topology(recorder, "/nonexistent")
            calls = len(recorder.calls)
            times = []
            for _ in range(args.runs):
                start = time.perf_counter()
                topology.read_topology(pynvml, "/nonexistent")
                times.append(time.perf_counter() - start)
            worst = max(worst, max(times))
            medians.append(statistics.median(times))
            print("%-34s %d GPUs, %4d NVML calls: median %.4f s, slowest %.4f s over %d runs (target < %.1f s)" % (
                name, facts["gpu_count"], calls, statistics.median(times), max(times), args.runs, TARGET_S))
    print("topology_speed: slowest full query %.4f s: %s" % (worst, "OK" if worst < TARGET_S else "OVER TARGET"))
    _common.record("topology_speed", [_common.row(
        "full NVML topology query, 8 GPUs (all pairs, all P2P indices, all links), fake NVML, in-process",
        "%.4f-%.4f s median, slowest %.4f s" % (min(medians), max(medians), worst), "< %.1f s" % TARGET_S,
        worst < TARGET_S)])
    return 0 if worst < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
