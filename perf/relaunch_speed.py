#!/usr/bin/env python3
"""`deploy.yml --tags relaunch` against a hand-written shell relaunch over ssh, on the lab (instant-loading simulator).

    .venv/bin/python perf/relaunch_speed.py [--layout tp8] [--runs 5] [--keep]

Uses the private lab host of tests/lab/sweeplab.py (booted and provisioned when needed), with
SGLANG_SIM_LOAD_SECONDS=0 and SGLANG_SIM_CAPTURE_SECONDS=0. Compares
  ansible   `ansible-playbook deploy.yml --tags relaunch -e layout=L` (plan, cleanup, launch, health)
  shell     the same steps as a person scripts them over ssh: stop the unit, reset-failed (repeated starts spend
            systemd's start limit; the launch role clears it too), start it, poll /health until 200
in two series of --runs relaunches each:
  back to back  each relaunch right after the previous one (a person iterating on layouts);
  settled       each relaunch once the server has served for 5.5 .. 9.5 s, spread evenly over 5 s.
Why two: SGLang notices SIGTERM only on its next watchdog tick, every 5 s from its start (sigterm_watchdog; the
simulator does the same), so stopping a server costs 0-5 s depending on how long it has been up. Back to back,
that depends on how long the previous relaunch took (a slower relaunch can even wait less); the settled series
spreads the stop evenly over the tick for both sides, which is what replacing a server that has been up a while
costs on average. From the journal (read once per series, after it: queries between runs would shift the stops)
each relaunch also gives the server's own start (unit start to SGLang's ready line) and the old server's own stop
(systemd's Stopping to Stopped). Printed: medians; ratio = ansible / shell (goal <= 1.5); relaunch overhead =
ansible - the server's own start (goal < 15 s); own cost = wall - the server's own start and stop, what each
side adds. Takes the lab down unless --keep. Needs root, systemd-nspawn, debootstrap.
"""
import argparse
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "lab"))

import _common  # noqa: E402  pylint: disable=wrong-import-position
import sweeplab  # noqa: E402  pylint: disable=wrong-import-position

UNIT = "topolaunch-sglang.service"
RATIO_GOAL = 1.5
OVERHEAD_GOAL_S = 15.0
OWN_COST_GOAL_S = 5.0     # issue 21: topolaunch's own cost per relaunch
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


def uptime_target(run, runs):
    """The settled series' uptime before relaunch `run` (0-based): 5.5 .. 9.5 s for 5 runs, one tick period."""
    return 5.0 + 5.0 * (run + 0.5) / runs


def wait_until_up_for(seconds):
    """Let the server serve until it has been up `seconds` (the series' condition; it is up and healthy already).
    The lab host shares this machine's kernel, so systemd's monotonic start time is on our monotonic clock."""
    rc, out = sweeplab.ssh("systemctl show -p ExecMainStartTimestampMonotonic --value %s" % UNIT)
    assert rc == 0 and out.strip().isdigit(), "systemctl show failed: %r" % out
    delay = int(out) / 1e6 + seconds - time.monotonic()
    if delay > 0:
        time.sleep(delay)


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


def series(relaunch, runs, settled):
    """[(wall, the new server's start, the old server's stop)] of `runs` relaunches."""
    since = time.time()
    walls = []
    for run in range(runs):
        if settled:
            wait_until_up_for(uptime_target(run, runs))
        walls.append(relaunch())
    spans = journal_spans(since)
    if len(spans) != runs:
        raise RuntimeError("the journal shows %d replacements of the server for %d relaunches" % (len(spans), runs))
    return [(w, start, stop) for w, (start, stop) in zip(walls, spans)]


def report(name, ans, sh):
    """Print a series' figures; returns {wall, shell, ratio, overhead, own, shell_own} (medians)."""
    med = statistics.median
    wall, shell = med(r[0] for r in ans), med(r[0] for r in sh)
    ratio, overhead = wall / shell, wall - med(r[1] for r in ans)
    each = lambda rows, k: ", ".join("%.1f" % r[k] for r in rows)  # noqa: E731
    print(name)
    print("  ansible --tags relaunch   %5.1f s   (each: %s)" % (wall, each(ans, 0)))
    print("  shell over ssh            %5.1f s   (each: %s)" % (shell, each(sh, 0)))
    print("  ratio                     %5.2f     goal <= %.1f: %s" % (ratio, RATIO_GOAL,
                                                                    "met" if ratio <= RATIO_GOAL else "NOT met"))
    print("  old server's own stop     %5.1f s / %.1f s   (ansible / shell; each: %s / %s)" % (
        med(r[2] for r in ans), med(r[2] for r in sh), each(ans, 2), each(sh, 2)))
    print("  server's own start        %5.1f s / %.1f s" % (med(r[1] for r in ans), med(r[1] for r in sh)))
    print("  relaunch overhead         %5.1f s   goal < %.0f s: %s" % (overhead, OVERHEAD_GOAL_S,
                                                                     "met" if overhead < OVERHEAD_GOAL_S else "NOT met"))
    own, shell_own = med(r[0] - r[1] - r[2] for r in ans), med(r[0] - r[1] - r[2] for r in sh)
    print("  own cost                  %5.1f s / %.1f s   (ansible / shell: wall - the server's start and stop)"
          "   goal < %.0f s: %s" % (own, shell_own, OWN_COST_GOAL_S, "met" if own < OWN_COST_GOAL_S else "NOT met"))
    return {"wall": round(wall, 2), "shell": round(shell, 2), "ratio": round(ratio, 2), "overhead": round(overhead, 2),
            "own": round(own, 2), "shell_own": round(shell_own, 2)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layout", default="tp8")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="leave the lab host running")
    args = parser.parse_args()
    try:
        sweeplab.up_and_provisioned()
        _common.count_tasks(_common.OUT / "relaunch_speed.tasks.json")
        ansible_relaunch(args.layout)               # warm-up: unit and env with the instant-loading knobs in place
        _common.count_tasks(None)
        counted = _common.costs(_common.OUT / "relaunch_speed.tasks.json")
        ans = lambda: ansible_relaunch(args.layout)  # noqa: E731
        sh = lambda: shell_relaunch(sweeplab.SERVER_PORT)  # noqa: E731
        back = (series(ans, args.runs, False), series(sh, args.runs, False))
        settled = (series(ans, args.runs, True), series(sh, args.runs, True))
    finally:
        if not _common.keep(args.keep):
            sweeplab.lab("down")
    print("relaunch of %s on the lab (simulator loads instantly), medians of %d runs" % (args.layout, args.runs))
    b = report("back to back:", *back)
    s = report("settled (server up %.1f-%.1f s before each relaunch):" % (uptime_target(0, args.runs),
                                                                           uptime_target(args.runs - 1, args.runs)), *settled)
    print("one relaunch: %d tasks (%d skipped), %d remote calls (%.1f s of them), other tasks %.1f s" % (
        counted["tasks"], counted["skipped"], counted["remote_calls"], counted["remote_s"], counted["local_s"]))
    own = max(b["own"], s["own"])
    _common.record("relaunch_speed", [
        _common.row("topolaunch's own cost per `--tags relaunch` (wall - the server's own start and the old server's "
                    "own stop), against a shell stop/reset-failed/start/poll over ssh in the same run",
                    "%.1f s back to back, %.1f s settled (the shell's %.1f s / %.1f s); %d remote calls, %d tasks" % (
                        b["own"], s["own"], b["shell_own"], s["shell_own"], counted["remote_calls"],
                        counted["tasks"]), "< %.0f s" % OWN_COST_GOAL_S, own < OWN_COST_GOAL_S),
        _common.row("`--tags relaunch` wall against the shell's, back to back / settled (medians of %d)" % args.runs,
                    "%.1f s vs %.1f s (ratio %.2f) / %.1f s vs %.1f s (ratio %.2f)" % (
                        b["wall"], b["shell"], b["ratio"], s["wall"], s["shell"], s["ratio"]),
                    "ratio <= %.1f" % RATIO_GOAL, max(b["ratio"], s["ratio"]) <= RATIO_GOAL),
        _common.row("relaunch overhead beyond the server's own start", "%.1f s back to back, %.1f s settled" % (
            b["overhead"], s["overhead"]), "< %.0f s" % OVERHEAD_GOAL_S,
            max(b["overhead"], s["overhead"]) < OVERHEAD_GOAL_S)],
        back_to_back=b, settled=s, playbook=counted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
