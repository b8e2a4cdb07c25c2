#!/usr/bin/env python3
"""What a tune costs per candidate beyond the server's own load time and the short benchmark itself, on the lab.

    .venv/bin/python bench/tune_overhead.py [--keep]

Boots (or reuses) the private tune lab host of tests/lab/tunelab.py (field spec), provisions it, runs
`deploy.yml -e layout=tune` into a temporary results directory (every candidate measured: nothing measured before),
and prints per candidate, from the tune's record (results/<model>/<fingerprint>/tune-<run id>.json):
  wall     the candidate's whole turn (plan, relaunch: validate, cleanup, launch, health; bench, recording), per stage
  load     the server's own start: unit start until ready (health's measure)
  stop     the previous server's own stop (SGLang drains on SIGTERM)
  client   the bench_serving client runs (their wall time, warmup and client start included)
  overhead wall - load - stop - client: what the tune adds per candidate. Goal: under 10 s.
Also the run's total and the fixed part (provision checks, topology, plan, the plan after measuring, the record,
the report, the final relaunch and bench stages). Takes the lab down unless --keep. Needs root, systemd-nspawn,
debootstrap.
"""
import argparse
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "lab"))

from sweep_overhead import print_costs, unit_stops  # noqa: E402  pylint: disable=wrong-import-position
from tunelab import TUNE  # noqa: E402  pylint: disable=wrong-import-position
from ansible_collections.topolaunch.sglang.plugins.plugin_utils import bench as results  # noqa: E402  pylint: disable=wrong-import-position

GOAL_S = 10.0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", action="store_true", help="leave the lab host running")
    args = parser.parse_args()
    try:
        TUNE.up_and_provisioned()
        with tempfile.TemporaryDirectory() as tmp:
            out = pathlib.Path(tmp)
            start = time.monotonic()
            run = TUNE.playbook("deploy.yml", extra={
                "layout": "tune", "topolaunch_results_dir": str(out / "results"),
                "topolaunch_artifacts_dir": str(out / "artifacts")})
            total = time.monotonic() - start
            if run.returncode != 0:
                print(run.stdout[-6000:])
                print("tune_overhead: the tune failed (rc %d)" % run.returncode)
                return 2
            [tune] = results.load_tunes(str(out / "results"))
            runs = {r["run_id"] + r["layout"]: r for r in results.load_runs(str(out / "results"))}
            stops = unit_stops(TUNE.ssh)
            worst, candidates_s = print_costs(tune["layouts"], runs, stops)
            print("tune run total %.1f s, of which fixed (ansible start, provision checks, topology, plan, plan after "
                  "measuring, record, report, final relaunch and bench stages) %.1f s" % (total, total - candidates_s))
            print("tune_overhead: worst per-candidate overhead %.1f s (goal < %.0f s): %s" % (
                worst, GOAL_S, "OK" if worst < GOAL_S else "OVER GOAL"))
            return 0 if worst < GOAL_S else 1
    finally:
        if not args.keep:
            TUNE.lab("down")


if __name__ == "__main__":
    sys.exit(main())
