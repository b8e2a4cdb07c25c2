#!/usr/bin/env python3
"""A second `deploy.yml` on a converged lab box: wall time, changed=0, tasks and remote calls.
Target: under 40 s with changed=0 (issue 21).

    .venv/bin/python perf/deploy_noop.py [--runs 3] [--keep]

Uses the private lab host of tests/lab/sweeplab.py (booted and provisioned when needed), runs `deploy.yml` once to
converge it (provision, topology, preflight, plan, relaunch, bench: the server up and measured at the workload),
then --runs more times: each must change nothing (the same plan runs, the server is already measured) and is timed,
with its tasks and remote calls (perf/callback_plugins/task_times.py). Takes the lab down unless --keep. Needs root,
systemd-nspawn, debootstrap.
"""
import argparse
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "lab"))

import _common  # noqa: E402  pylint: disable=wrong-import-position
import sweeplab  # noqa: E402  pylint: disable=wrong-import-position

TARGET_S = 40.0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="leave the lab host running")
    args = parser.parse_args()
    failed = False
    try:
        sweeplab.up_and_provisioned()
        first = sweeplab.playbook("deploy.yml")
        if first.returncode != 0:
            print(first.stdout[-6000:])
            print("deploy_noop: the converging deploy.yml failed (rc %d)" % first.returncode)
            return 2
        times, counted, changed_runs = _common.no_change_runs(sweeplab, "deploy_noop", args.runs, "deploy.yml")
        median = statistics.median(times)
        failed = changed_runs > 0 or median >= TARGET_S
        each = _common.median_costs(counted)
        print("second deploy.yml: median %.1f s, slowest %.1f s, target < %.0f s with changed=0: %s" % (
            median, max(times), TARGET_S, "MISSED" if failed else "ok"))
        _common.record("deploy_noop", [_common.row(
            "a second `deploy.yml` on a converged lab box",
            "%.1f s median of %d, changed=0%s; %d tasks, %d remote calls (%.1f s of them)" % (
                median, len(times), "" if not changed_runs else " NOT in %d runs" % changed_runs, each["tasks"],
                each["remote_calls"], each["remote_s"]), "< %.0f s, changed=0" % TARGET_S, not failed)],
            runs=times, costs=counted)
    finally:
        if not _common.keep(args.keep):
            sweeplab.lab("down")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
