#!/usr/bin/env python3
"""A no-change `deploy.yml --tags provision` on a provisioned lab host: wall time and changed count.
Target: under 30 s with changed=0.

    .venv/bin/python perf/provision_noop.py [--runs 3] [--keep]

Boots a private lab host laid out like tests/lab/sweeplab.py's (its code, with this bench's own name and ports:
host bprov, ssh 2219, repository 18081, state .lab/bench-provision/) and provisions it: driver, CUDA, tools venv,
SGLang simulator venv, stand-in model, from the lab repository. Then runs the provision stage --runs times and
prints each wall time, the median and the slowest; exits 1 when a run changed anything, failed, or the slowest
misses the target. Takes the lab down unless --keep. Needs root, systemd-nspawn, debootstrap, `make repo`.
"""
import argparse
import pathlib
import re
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "lab"))

import sweeplab  # noqa: E402  pylint: disable=wrong-import-position

# The sweep lab's helpers on this bench's own lab, so that the two never share a host or a port.
sweeplab.NAME, sweeplab.HOST, sweeplab.SSH_PORT, sweeplab.REPO_PORT, sweeplab.SERVER_PORT = (
    "bench-provision", "bprov", 2219, 18081, 32019)
sweeplab.INVENTORY = ROOT / ".lab" / "inventories" / sweeplab.NAME

TARGET_S = 30.0
RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def recap(output):
    """{host: (ok, changed, unreachable, failed)} from a PLAY RECAP."""
    return {m.group(1): tuple(int(x) for x in m.groups()[1:]) for m in RECAP.finditer(output)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="leave the lab host running")
    args = parser.parse_args()
    failed = False
    try:
        sweeplab.up_and_provisioned()
        times = []
        for i in range(args.runs):
            start = time.monotonic()
            run = sweeplab.playbook("deploy.yml", "--tags", "provision")
            times.append(time.monotonic() - start)
            hosts = recap(run.stdout)
            bad = run.returncode != 0 or not hosts or any(c or u or f for _ok, c, u, f in hosts.values())
            failed |= bad
            print("run %d: %5.1f s  %s%s" % (i + 1, times[-1], ", ".join(
                "%s ok=%d changed=%d unreachable=%d failed=%d" % ((h,) + v) for h, v in sorted(hosts.items())),
                "  NOT A NO-CHANGE RUN" if bad else ""))
            if bad:
                print(run.stdout[-4000:])
        slowest = max(times)
        failed |= slowest >= TARGET_S
        print("no-change provision: median %.1f s, slowest %.1f s, target < %.0f s with changed=0: %s"
              % (statistics.median(times), slowest, TARGET_S, "MISSED" if failed else "ok"))
    finally:
        if not args.keep:
            sweeplab.lab("down")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
