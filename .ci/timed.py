#!/usr/bin/env python3
"""Run one CI phase and say what it cost: wall time, CPU time, the machine's load.

    .ci/timed.py TIMES_FILE NAME -- COMMAND [ARG ...]

CPU time is user + system of every process the phase started, lab hosts included: this process becomes a child
subreaper (prctl PR_SET_CHILD_SUBREAPER), so what lab.py starts in a new session (systemd-nspawn and, through the
container's systemd, everything that ran in a lab host; the repository HTTP server) is reparented here when lab.py
exits and is counted when it ends. The machine's busy CPU time (from /proc/stat) is printed beside it: on a shared
machine the difference is other people's work. Appends one tab-separated line to TIMES_FILE
(name, rc, wall s, cpu s, machine busy s, load average before, after, start s: seconds after the epoch time in
$TIMED_T0, when set) and exits with the command's status.
"""
import ctypes
import os
import resource
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def busy_seconds():
    """CPU seconds the whole machine spent busy (all fields of /proc/stat's cpu line but idle and iowait)."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def load():
    with open("/proc/loadavg", encoding="ascii") as f:
        return f.read().split()[0]


def main(argv):
    if len(argv) < 4 or argv[2] != "--":
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    times_file, name, command = argv[0], argv[1], argv[3:]
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print("timed.py: prctl(PR_SET_CHILD_SUBREAPER) failed: CPU time leaves out lab hosts", file=sys.stderr)
    load_before, busy_before, started = load(), busy_seconds(), time.monotonic()
    offset = "%.0f" % (time.time() - float(os.environ["TIMED_T0"])) if os.environ.get("TIMED_T0") else "-"
    child = subprocess.Popen(command)
    # Forward Ctrl-C/TERM to the phase; reap every process that ends (ours and orphans reparented here) so that
    # their CPU time is counted and no zombie is left. Popen.wait() is not used: this loop reaps the child itself.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    rc = None
    while rc is None:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        if pid == child.pid:
            rc = os.waitstatus_to_exitcode(status)
    while True:  # orphans already gone
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
    wall = time.monotonic() - started
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = usage.ru_utime + usage.ru_stime
    busy = busy_seconds() - busy_before
    rc = 1 if rc is None else rc
    line = "\t".join([name, str(rc), "%.1f" % wall, "%.1f" % cpu, "%.1f" % busy, load_before, load(), offset])
    with open(times_file, "a", encoding="utf-8") as f:
        f.write(line + "\n")
    print("=== phase %s: %s in %dm%02ds wall, %.0f s CPU (the machine was busy %.0f CPU s: %.0f%% of its cores; "
          "load %s -> %s)" % (name, "passed" if rc == 0 else "FAILED (rc %d)" % rc, wall // 60, wall % 60, cpu, busy,
                               100 * busy / max(wall, 1) / os.cpu_count(), load_before, load()), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
