#!/usr/bin/env python3
"""Run the lab test files in parallel lanes (`make lab-tests`): first the provisioned layers every file's hosts boot
from (tests/lab/labhosts.py; built once per change of their inputs), then every tests/lab/test_*.py in its own
pytest, LANES at a time. A lane that finishes a file takes the next one, longest first (by the durations of the
last run, build/lab-lanes/durations.json; a file not timed yet goes first, the longer file first), so the lanes stay
balanced without a list to keep: a new test file is picked up as it is. Files boot different lab hosts on different
ports (each file names its own: see its docstring), so they never meet; most of a lab test's time is waiting (hosts
booting, servers loading, timeouts running out), which lanes overlap.

    tests/lab/lanes.py [--all] [--lanes N] [--layers-only] [PYTEST_ARG ...]

Without --all the tests marked `full` (longer scenarios of the same features) are left out, to keep CI short;
`make lab-tests-full` runs them too. --layers-only builds the layers and stops (`make lab-layers`). Each file's
output goes to build/lab-lanes/<file>.log; a line every 60 s says what each lane runs; at the end the output of
every file that failed is printed whole, and each file's time. Exits 1 when any file failed.
"""
import argparse
import json
import pathlib
import re
import subprocess
import sys
import time

import labhosts

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "build" / "lab-lanes"
DURATIONS = OUT / "durations.json"
LANES = 4
TICK_S = 60
# The kernel's ephemeral ports while the lanes run: above every fixed port a lab test listens on (ssh 22xx-25xx,
# repositories 180xx-182xx, servers 29000-39999, rendezvous 50000-53099). Lab hosts share this network namespace, so
# a client's ephemeral port in the default 32768-60999 could take a test's server port first, and the validate step
# (rightly) refuses a port it cannot bind: a flaky "Address already in use" (CI, test_monitoring). Restored after.
EPHEMERAL = "/proc/sys/net/ipv4/ip_local_port_range"
LAB_EPHEMERAL = "54000 60999"


def last_line(path):
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()] if path.exists() else []
    return lines[-1][-100:] if lines else "(no output yet)"


def releases():
    """The SGLang releases the lab repository has a simulator for (build/repo/pip/sglang-X+sim-*.whl): the layers
    the lab tests may boot from."""
    found = {m.group(1) for w in (ROOT / "build" / "repo" / "pip").glob("sglang-*+sim-*.whl")
             if (m := re.match(r"sglang-([0-9.]+)\+sim-", w.name))}
    if not found:
        raise SystemExit("lanes.py: no sglang-*+sim wheel in build/repo/pip: run make repo")
    return sorted(found)


def order(files):
    """Longest first by the last run's durations; files without one first, larger files first."""
    try:
        known = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        known = {}
    return sorted(files, key=lambda f: (f.name in known, -known.get(f.name, f.stat().st_size)))


def _ephemeral(value):
    """Set the kernel's ephemeral port range (root: the lab needs it anyway); returns the one it replaced."""
    try:
        with open(EPHEMERAL, encoding="utf-8") as f:
            old = " ".join(f.read().split())
        with open(EPHEMERAL, "w", encoding="utf-8") as f:
            f.write(value + "\n")
        return old
    except OSError:
        return None


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--all", action="store_true", help="the tests marked full too")
    parser.add_argument("--lanes", type=int, default=LANES, help="files run at once (default %(default)s)")
    parser.add_argument("--layers-only", action="store_true", help="build the provisioned layers and stop")
    args, extra = parser.parse_known_args(argv)
    started = time.monotonic()
    layers = labhosts.ensure_layers(releases())
    print("[%4d s] provisioned layers: %s" % (time.monotonic() - started, ", ".join(
        p.name for p in layers.values())), flush=True)
    if args.layers_only:
        return 0
    OUT.mkdir(parents=True, exist_ok=True)
    previous = _ephemeral(LAB_EPHEMERAL)
    if previous and previous != LAB_EPHEMERAL:
        print("ephemeral ports %s while the lanes run (were %s; restored after)" % (LAB_EPHEMERAL, previous), flush=True)
    try:
        return _lanes(args, extra, started)
    finally:
        if previous and previous != LAB_EPHEMERAL:
            _ephemeral(previous)


def _lanes(args, extra, started):
    marks = [] if args.all else ["-m", "not full"]
    queue = order(sorted((ROOT / "tests" / "lab").glob("test_*.py")))
    running, done = {}, {}
    lanes_started = time.monotonic()
    next_tick = lanes_started + TICK_S
    while queue or running:
        while queue and len(running) < args.lanes:
            f = queue.pop(0)
            log = OUT / (f.stem + ".log")
            cmd = [str(ROOT / ".venv" / "bin" / "pytest"), "-q", "-rfE", "--durations=5", *marks, *extra,
                   str(f.relative_to(ROOT))]
            with open(log, "w", encoding="utf-8") as handle:
                proc = subprocess.Popen(cmd, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT)
            running[f.name] = (proc, log, time.monotonic())
            print("[%4d s] start %s (output: %s)" % (time.monotonic() - started, f.name, log.relative_to(ROOT)),
                  flush=True)
        time.sleep(1)
        for name, (proc, log, t0) in list(running.items()):
            if proc.poll() is not None:
                del running[name]
                # pytest exits 5 when it collected nothing (every test of the file deselected): not a failure
                rc = 0 if proc.returncode == 5 else proc.returncode
                done[name] = (rc, time.monotonic() - t0, log)
                print("[%4d s] %s %s in %d s: %s" % (time.monotonic() - started, name,
                                                     "passed" if rc == 0 else "FAILED (rc %d)" % rc,
                                                     done[name][1], last_line(log)), flush=True)
        if time.monotonic() >= next_tick and running:
            next_tick += TICK_S
            print("[%4d s] running: %s" % (time.monotonic() - started, "; ".join(
                "%s %s" % (n, last_line(log)[-40:]) for n, (_p, log, _t) in running.items())), flush=True)
    failed = sorted(n for n, (rc, _s, _l) in done.items() if rc != 0)
    for name in failed:
        print("\n===== %s FAILED: its output =====\n%s" % (name, done[name][2].read_text(errors="replace")))
    try:
        history = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        history = {}
    history.update({n: round(s) for n, (rc, s, _l) in done.items() if rc == 0})
    DURATIONS.write_text(json.dumps(history, indent=1, sort_keys=True) + "\n")
    print("\nlab test files (%d lanes), seconds each:" % args.lanes)
    for name, (rc, seconds, _l) in sorted(done.items(), key=lambda kv: -kv[1][1]):
        print("  %5d  %s%s" % (seconds, name, "" if rc == 0 else "  FAILED"))
    print("lab tests: %d files passed, %d failed%s; layers %d s, lanes %d s, %d s in all" % (
        len(done) - len(failed), len(failed), " (%s)" % ", ".join(failed) if failed else "",
        lanes_started - started, time.monotonic() - lanes_started, time.monotonic() - started))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
