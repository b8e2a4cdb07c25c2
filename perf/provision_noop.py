#!/usr/bin/env python3
"""A no-change `deploy.yml --tags provision` on a provisioned lab host: wall time and changed count.
Target: under 20 s with changed=0 (issue 21).

    .venv/bin/python perf/provision_noop.py [--runs 3] [--keep]

Boots a private lab host laid out like tests/lab/sweeplab.py's (its code, with this bench's own name and ports:
host bprov, ssh 2219, repository 18081, state .lab/bench-provision/) and provisions it: driver, CUDA, tools venv,
SGLang simulator venv, stand-in model, from the lab repository. Then runs the provision stage --runs times and
prints each wall time with its tasks and remote calls (perf/callback_plugins/task_times.py), the median and the
slowest; exits 1 when a run changed anything, failed, or the median misses the target. Also the lab's own `up` of
the provisioned host (its root filesystem cached), timed. Takes the lab down unless --keep. Needs root, systemd-nspawn, debootstrap, `make repo`.
"""
import argparse
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "lab"))

import _common  # noqa: E402  pylint: disable=wrong-import-position
import sweeplab  # noqa: E402  pylint: disable=wrong-import-position

# The sweep lab's helpers on this bench's own lab, so that the two never share a host or a port.
sweeplab.NAME, sweeplab.HOST, sweeplab.SSH_PORT, sweeplab.REPO_PORT, sweeplab.SERVER_PORT = (
    "bench-provision", "bprov", 2219, 18081, 32019)
sweeplab.INVENTORY = ROOT / ".lab" / "inventories" / sweeplab.NAME

TARGET_S = 20.0
LAB_UP_TARGET_S = 60.0
def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="leave the lab host running")
    args = parser.parse_args()
    failed = False
    try:
        sweeplab.up_and_provisioned()
        start = time.monotonic()
        sweeplab.lab("up")                                  # the host is up: what a second `make lab-up` costs
        lab_up = time.monotonic() - start
        times, counted, bad_runs = _common.no_change_runs(sweeplab, "provision_noop", args.runs, "deploy.yml",
                                                          "--tags", "provision")
        failed = bad_runs > 0
        median = statistics.median(times)
        failed |= median >= TARGET_S
        each = _common.median_costs(counted)
        print("no-change provision: median %.1f s, slowest %.1f s, target < %.0f s with changed=0: %s"
              % (median, max(times), TARGET_S, "MISSED" if failed else "ok"))
        print("lab up of the running, provisioned host: %.1f s" % lab_up)
        _common.record("provision_noop", [
            _common.row("no-change `deploy.yml --tags provision` on a provisioned lab host",
                        "%.1f s median of %d, changed=0%s; %d tasks, %d remote calls (%.1f s of them)" % (
                            median, len(times), "" if not bad_runs else " NOT in %d runs" % bad_runs, each["tasks"],
                            each["remote_calls"], each["remote_s"]),
                        "< %.0f s" % TARGET_S, not failed),
            _common.row("`make lab-up` with the lab running (rootfs cached)", "%.1f s" % lab_up,
                        "< %.0f s" % LAB_UP_TARGET_S, lab_up < LAB_UP_TARGET_S)],
            runs=times, costs=counted)
    finally:
        if not _common.keep(args.keep):
            sweeplab.lab("down")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
