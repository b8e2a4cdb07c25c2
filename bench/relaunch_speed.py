#!/usr/bin/env python3
"""`deploy.yml --tags relaunch` against a hand-written shell relaunch over ssh, on the lab (instant-loading simulator).

    .venv/bin/python bench/relaunch_speed.py [--layout tp8] [--runs 3] [--keep]

Uses the private lab host of tests/lab/sweeplab.py (booted and provisioned when needed), with
SGLANG_SIM_LOAD_SECONDS=0 and SGLANG_SIM_CAPTURE_SECONDS=0. Prints, medians over --runs:
  ansible   wall time of `ansible-playbook deploy.yml --tags relaunch -e layout=L` (plan, cleanup, launch, health)
  shell     wall time of the same steps as a person scripts them over ssh: stop the unit, reset-failed (repeated
            starts spend systemd's start limit; the launch role clears it too), start it, poll /health
  ratio     ansible / shell (goal <= 1.5)
  server    the server's own start in the ansible runs: unit start until SGLang's ready line (from the journal)
  stop      the old server's own stop in the ansible runs: systemd's "Stopping" to "Stopped" (from the journal).
            SGLang notices SIGTERM on its next 5 s watchdog tick (sigterm_watchdog; the simulator does the same),
            so a stop takes 0-5 s depending on when the server started: both columns pay it
  overhead  ansible - server: what the relaunch adds to the server's own load (goal < 15 s); also shown without
            the old server's stop
Takes the lab down unless --keep. Needs root, systemd-nspawn, debootstrap.
"""
import argparse
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "lab"))

import sweeplab  # noqa: E402  pylint: disable=wrong-import-position

UNIT = "topolaunch-sglang.service"
RATIO_GOAL = 1.5
OVERHEAD_GOAL_S = 15.0
INSTANT = {"launch_extra_env": {"SGLANG_SIM_LOAD_SECONDS": "0", "SGLANG_SIM_CAPTURE_SECONDS": "0"}}
SSH = ("ssh -F /dev/null -i {key} -p {port} -o BatchMode=yes -o StrictHostKeyChecking=no "
       "-o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o ControlMaster=auto -o ControlPersist=60s "
       "-o ControlPath=/tmp/relaunch-speed-%C root@127.0.0.1")
# What people run today, minus the pkill: stop, start, poll /health until it answers 200 (bounded: 600 tries).
SHELL_RELAUNCH = """set -e
{ssh} systemctl stop {unit}
{ssh} systemctl reset-failed {unit}
{ssh} systemctl start {unit}
for i in $(seq 600); do
  if {ssh} curl -sf -o /dev/null http://127.0.0.1:{port}/health; then exit 0; fi
done
echo "no /health 200 after 600 polls" >&2; exit 1
"""


EVENTS = (("stopping", "systemd[1]: Stopping "), ("stopped", "systemd[1]: Stopped "),
          ("started", "systemd[1]: Started "), ("ready", "The server is fired up and ready to roll!"))


def journal_spans(since):
    """[(the new server's start, the old server's stop)] for each replacement of the server since `since` (epoch
    seconds; the lab host shares this machine's clock), from systemd's and SGLang's journal lines. Read once, after
    the runs: a query between two runs would add its time to the server's uptime and so shift its stop."""
    rc, out = sweeplab.ssh("journalctl -u %s -o short-unix --no-pager --since=@%d" % (UNIT, int(since)))
    assert rc == 0, "journalctl failed"
    spans, cur = [], None
    for line in out.splitlines():
        for key, words in EVENTS:
            if words in line:
                ts = float(line.split()[0])
                if key == "stopping":
                    cur = {}
                if cur is not None and key not in cur:
                    cur[key] = ts
                if cur is not None and len(cur) == len(EVENTS):
                    spans.append((cur["ready"] - cur["started"], cur["stopped"] - cur["stopping"]))
                    cur = None
    return spans


def ansible_relaunch(layout):
    """Wall time of one `--tags relaunch`."""
    t0 = time.monotonic()
    run = sweeplab.playbook("deploy.yml", "--tags", "relaunch", "-e", "layout=%s" % layout, extra=INSTANT)
    wall = time.monotonic() - t0
    if run.returncode != 0:
        raise RuntimeError("relaunch failed (rc %d):\n%s" % (run.returncode, run.stdout[-6000:]))
    return wall


def shell_relaunch(port):
    ssh = SSH.format(key=sweeplab.SSH_KEY, port=sweeplab.SSH_PORT)
    script = SHELL_RELAUNCH.format(ssh=ssh, unit=UNIT, port=port)
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False, timeout=900)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError("shell relaunch failed: " + proc.stderr)
    return wall


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layout", default="tp8")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="leave the lab host running")
    args = parser.parse_args()
    try:
        sweeplab.up_and_provisioned()
        ansible_relaunch(args.layout)               # warm-up: unit and env with the instant-loading knobs in place
        port = sweeplab.SERVER_PORT
        since = time.time()
        walls = [ansible_relaunch(args.layout) for _ in range(args.runs)]
        spans = journal_spans(since)
        if len(spans) != args.runs:
            raise RuntimeError("the journal shows %d replacements of the server for %d runs" % (len(spans), args.runs))
        runs = [(w, start, stop) for w, (start, stop) in zip(walls, spans)]
        shell = [shell_relaunch(port) for _ in range(args.runs)]
    finally:
        if not args.keep:
            sweeplab.lab("down")
    wall = statistics.median(r[0] for r in runs)
    server = statistics.median(r[1] for r in runs)
    stop = statistics.median(r[2] for r in runs)
    sh = statistics.median(shell)
    ratio = wall / sh
    overhead = wall - server
    beyond_stop = statistics.median(r[0] - r[1] - r[2] for r in runs)
    print("relaunch of %s on the lab (simulator loads instantly), medians of %d runs:" % (args.layout, args.runs))
    print("  ansible --tags relaunch   %6.1f s   (each: %s)" % (wall, ", ".join("%.1f" % r[0] for r in runs)))
    print("  shell over ssh            %6.1f s   (each: %s)" % (sh, ", ".join("%.1f" % s for s in shell)))
    print("  ratio                     %6.2f     goal <= %.1f: %s" % (ratio, RATIO_GOAL, "met" if ratio <= RATIO_GOAL else "NOT met"))
    print("  server's own start        %6.1f s" % server)
    print("  old server's own stop     %6.1f s   (each: %s)" % (stop, ", ".join("%.1f" % r[2] for r in runs)))
    print("  relaunch overhead         %6.1f s   goal < %.0f s: %s" % (overhead, OVERHEAD_GOAL_S,
                                                                     "met" if overhead < OVERHEAD_GOAL_S else "NOT met"))
    print("  ... without the stop      %6.1f s   (what topolaunch itself costs)" % beyond_stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
