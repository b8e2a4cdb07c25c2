#!/usr/bin/env python3
"""Run the lab test files in parallel lanes (`make lab-tests`): the files of one lane run one after another in one
pytest; lanes run at the same time. Files in different lanes boot different lab hosts on different ports (each file
names its own: see the file's docstring), so they never meet; most of a lab test's time is waiting (hosts booting,
servers loading, timeouts running out), which lanes overlap.

    tests/lab/lanes.py [--all] [PYTEST_ARG ...]

Without --all the tests marked `full` (longer scenarios of the same features) are left out, to keep CI short; `make
lab-tests-full` runs them too. Each lane's output goes to build/lab-lanes/lane<N>.log; a line every 60 s says how far
each lane is; at the end the output of every lane that failed is printed whole. Exits 1 when any lane failed.
"""
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
LANES = [
    ["test_lab.py", "test_lifecycle.py", "test_sweep.py"],
    ["test_versions.py", "test_security.py"],
    ["test_preflight.py", "test_multinode.py"],
    ["test_tune.py"],
]
TICK_S = 60


def last_line(path):
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1][-100:] if lines else "(no output yet)"


def main(argv):
    run_all = "--all" in argv
    extra = [a for a in argv if a != "--all"]
    listed = {f for lane in LANES for f in lane}
    present = {p.name for p in (ROOT / "tests" / "lab").glob("test_*.py")}
    if present != listed:
        print("lanes.py: the lanes must list every tests/lab/test_*.py once; missing: %s, unknown: %s"
              % (sorted(present - listed) or "none", sorted(listed - present) or "none"), file=sys.stderr)
        return 2
    out = ROOT / "build" / "lab-lanes"
    out.mkdir(parents=True, exist_ok=True)
    marks = [] if run_all else ["-m", "not full"]
    started = time.monotonic()
    procs = []
    for n, files in enumerate(LANES, 1):
        log = out / ("lane%d.log" % n)
        cmd = [str(ROOT / ".venv" / "bin" / "pytest"), "-q", "-rfE", "--durations=5", *marks, *extra,
               *("tests/lab/" + f for f in files)]
        with open(log, "w", encoding="utf-8") as handle:
            procs.append((n, files, log, subprocess.Popen(cmd, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT)))
        print("lane %d: %s (output: %s)" % (n, " ".join(files), log.relative_to(ROOT)), flush=True)
    done = {}
    next_tick = started + TICK_S
    while len(done) < len(procs):
        time.sleep(1)
        for n, files, log, proc in procs:
            if n not in done and proc.poll() is not None:
                done[n] = proc.returncode
                print("[%4d s] lane %d %s (rc %d): %s" % (time.monotonic() - started, n,
                                                          "passed" if proc.returncode == 0 else "FAILED",
                                                          proc.returncode, last_line(log)), flush=True)
        if time.monotonic() >= next_tick and len(done) < len(procs):
            next_tick += TICK_S
            print("[%4d s] running: %s" % (time.monotonic() - started, "; ".join(
                "lane %d %s" % (n, last_line(log)[-40:]) for n, _f, log, _p in procs if n not in done)), flush=True)
    failed = [n for n, rc in sorted(done.items()) if rc != 0]
    for n, files, log, _proc in procs:
        if n in failed:
            print("\n===== lane %d (%s) FAILED: its output =====\n%s" % (n, " ".join(files), log.read_text(errors="replace")))
    print("lab lanes: %d passed, %d failed%s, %d s" % (len(procs) - len(failed), len(failed),
                                                       " (lane %s)" % ", ".join(map(str, failed)) if failed else "",
                                                       time.monotonic() - started))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
