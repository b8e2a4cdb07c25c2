#!/usr/bin/env python3
"""What a sweep point costs beyond the server's own load time and the benchmark itself, on the lab.

    .venv/bin/python bench/sweep_overhead.py [--layouts tp8,tp4pp2] [--keep]

Boots (or reuses) the private sweep lab host of tests/lab/sweeplab.py (field spec), provisions it, runs
playbooks/sweep.yml over the layouts into a temporary results directory, and prints per layout:
  wall     the layout's whole turn in the sweep (plan, cleanup, launch, health, bench, recording)
  load     the server's own start: unit start until ready (health's measure)
  bench    the bench_serving client runs (their wall time, warmup and client start included)
  overhead wall - load - bench: what topolaunch adds per layout. Goal: under 20 s.
Also the sweep's fixed cost (topology, first plan, report, winner relaunch). Takes the lab down unless --keep.
Needs root, systemd-nspawn, debootstrap.
"""
import argparse
import json
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "module_utils"))
sys.path.insert(0, str(ROOT / "tests" / "lab"))

import sweeplab  # noqa: E402  pylint: disable=wrong-import-position
from topolaunch import results  # noqa: E402  pylint: disable=wrong-import-position

GOAL_S = 20.0


def delta_seconds(text):
    """ansible.builtin.command's delta, '0:00:03.123456' -> 3.123456."""
    hours, minutes, seconds = text.split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layouts", default="tp8,tp4pp2")
    parser.add_argument("--keep", action="store_true", help="leave the lab host running")
    args = parser.parse_args()
    layouts = [x for x in args.layouts.split(",") if x]
    try:
        sweeplab.up_and_provisioned()
        with tempfile.TemporaryDirectory() as tmp:
            out = pathlib.Path(tmp)
            start = time.monotonic()
            run = sweeplab.playbook("playbooks/sweep.yml", extra={
                "layouts": layouts, "topolaunch_results_dir": str(out / "results"),
                "sweep_summary_file": str(out / "sweep.json")})
            total = time.monotonic() - start
            if run.returncode != 0:
                print(run.stdout[-6000:])
                print("sweep_overhead: the sweep failed (rc %d)" % run.returncode)
                return 2
            summary = json.loads((out / "sweep.json").read_text())
            runs = {r["run_id"] + r["layout"]: r for r in results.load_runs(str(out / "results"))}
            worst, layout_total = 0.0, 0.0
            print("%-8s %8s %8s %8s %9s" % ("layout", "wall s", "load s", "bench s", "overhead"))
            for outcome in summary["layouts"]:
                if outcome["status"] != "ok":
                    print("%-8s failed at %s: %s" % (outcome["layout"], outcome["stage"], outcome["message"]))
                    continue
                meta = runs[outcome["run_id"] + outcome["layout"]]["meta"]
                bench = sum(delta_seconds(c["delta"]) for c in meta["client_runs"])
                load = float(outcome["server_ready_s"] or 0.0)
                overhead = outcome["seconds"] - load - bench
                worst = max(worst, overhead)
                layout_total += outcome["seconds"]
                print("%-8s %8.1f %8.1f %8.1f %8.1f s" % (outcome["layout"], outcome["seconds"], load, bench, overhead))
            print("sweep total %.1f s, of which fixed (topology, first plan, report, relaunch, ansible start) %.1f s"
                  % (total, total - layout_total))
            print("sweep_overhead: worst per-layout overhead %.1f s (goal < %.0f s): %s" % (
                worst, GOAL_S, "OK" if worst < GOAL_S else "OVER GOAL"))
            return 0 if worst < GOAL_S else 1
    finally:
        if not args.keep:
            sweeplab.lab("down")


if __name__ == "__main__":
    sys.exit(main())
