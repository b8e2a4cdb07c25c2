#!/usr/bin/env python3
"""What a tune costs per candidate beyond the server's own load time and the short benchmark itself, on the lab.

    .venv/bin/python perf/tune_overhead.py [--keep]

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

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "lab"))

from sweep_overhead import measure_costs  # noqa: E402  pylint: disable=wrong-import-position
from tunelab import TUNE  # noqa: E402  pylint: disable=wrong-import-position
from ansible_collections.topolaunch.sglang.plugins.plugin_utils import results  # noqa: E402  pylint: disable=wrong-import-position

GOAL_S = 10.0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", action="store_true", help="leave the lab host running")
    args = parser.parse_args()
    return measure_costs(
        TUNE, "tune_overhead", "deploy.yml",
        lambda out: {"layout": "tune", "topolaunch_results_dir": str(out / "results"),
                     "topolaunch_artifacts_dir": str(out / "artifacts")},
        lambda out: results.load_tunes(str(out / "results"))[-1]["layouts"],
        "ansible start, provision checks, topology, plan, plan after measuring, record, report, final relaunch and "
        "bench stages", GOAL_S, args.keep)


if __name__ == "__main__":
    sys.exit(main())
