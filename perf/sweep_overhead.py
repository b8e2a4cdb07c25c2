#!/usr/bin/env python3
"""What a sweep point costs beyond the server's own load time and the benchmark itself, on the lab.

    .venv/bin/python perf/sweep_overhead.py [--layouts tp8,tp4pp2] [--keep]

Boots (or reuses) the private sweep lab host of tests/lab/sweeplab.py (field spec), provisions it, runs
playbooks/sweep.yml over the layouts into a temporary results directory, and prints per layout:
  wall     the layout's whole turn in the sweep (plan, relaunch: validate, cleanup, launch, health; bench, recording),
           and per stage
  load     the server's own start: unit start until ready (health's measure)
  stop     the previous server's own stop (SGLang drains on SIGTERM): Stopping -> Stopped in the unit's journal
  client   the bench_serving client runs (their wall time, warmup and client start included)
  overhead wall - load - stop - client: what topolaunch adds per layout. Goal: under 20 s.
Also the sweep's fixed cost (topology, first plan, report, winner relaunch). Takes the lab down unless --keep.
Needs root, systemd-nspawn, debootstrap.
"""
import argparse
import json
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "lab"))

import _common  # noqa: E402  pylint: disable=wrong-import-position
import sweeplab  # noqa: E402  pylint: disable=wrong-import-position
from ansible_collections.topolaunch.sglang.plugins.plugin_utils import results  # noqa: E402  pylint: disable=wrong-import-position

GOAL_S = 20.0
STAGES = ("plan", "relaunch", "bench")


def delta_seconds(text):
    """ansible.builtin.command's delta, '0:00:03.123456' -> 3.123456."""
    hours, minutes, seconds = text.split(":")
    return int(hours) * 3600 + int(minutes) * 60 + float(seconds)


def unit_stops(ssh=sweeplab.ssh):
    """[(stopping, stopped)] epoch seconds of the unit's stops, from its journal (host and controller share a clock).
    ssh: the lab host's (a PrivateLab's ssh)."""
    rc, out = ssh("journalctl -u topolaunch-sglang.service -o short-unix --no-pager")
    if rc != 0:
        raise RuntimeError("cannot read the unit's journal on the lab host")
    stops, stopping = [], None
    for line in out.splitlines():
        stamp = line.split(" ", 1)[0]
        if " systemd[1]: Stopping topolaunch-sglang.service" in line:
            stopping = float(stamp)
        elif stopping is not None and " systemd[1]: Stopped topolaunch-sglang.service" in line:
            stops.append((stopping, float(stamp)))
            stopping = None
    return stops


def layout_costs(outcome, runs, stops):
    """One measured layout's ([plan, relaunch, bench] seconds, load, stop, client, overhead), from its outcome (the
    role tune's layout tasks: stage_started, finished, seconds, server_ready_s, run_id), the results' runs by run id +
    layout and the unit's stops."""
    marks = {k: float(v) for k, v in outcome["stage_started"].items()}
    ends = dict(zip(STAGES, [marks[s] for s in STAGES[1:]] + [float(outcome["finished"])]))
    stage_s = [ends[s] - marks[s] for s in STAGES]
    meta = runs[outcome["run_id"] + outcome["layout"]]["meta"]
    client = sum(delta_seconds(c["delta"]) for c in meta["client_runs"])
    load = float(outcome["server_ready_s"] or 0.0)
    stop = sum(b - a for a, b in stops if marks["relaunch"] <= a < marks["bench"])
    return stage_s, load, stop, client, outcome["seconds"] - load - stop - client


def print_costs(outcomes, runs, stops):
    """Print a table row per layout (its costs, layout_costs) or why it was not measured; returns (the worst
    overhead, the layouts' seconds together, each measured layout's figures). outcomes: the sweep's summary or a tune record's layouts."""
    worst, total, per_layout = 0.0, 0.0, []
    print("%-9s %6s | %5s %8s %5s | %5s %5s %6s | %8s" % (
        "layout", "wall", "plan", "relaunch", "bench", "load", "stop", "client", "overhead"))
    for outcome in outcomes:
        if outcome["status"] not in ("ok", "measured") or not outcome.get("stage_started"):
            print("%-9s %s%s" % (outcome["layout"], outcome["status"], " at %s: %s" % (
                outcome.get("stage"), outcome.get("message")) if outcome.get("message") else ""))
            continue
        stage_s, load, stop, client, overhead = layout_costs(outcome, runs, stops)
        worst = max(worst, overhead)
        total += outcome["seconds"]
        per_layout.append({"layout": outcome["layout"], "wall": round(outcome["seconds"], 1),
                           "plan": round(stage_s[0], 1), "relaunch": round(stage_s[1], 1),
                           "bench": round(stage_s[2], 1), "load": round(load, 1), "stop": round(stop, 1),
                           "client": round(client, 1), "overhead": round(overhead, 1)})
        print("%-9s %6.1f | %5.1f %8.1f %5.1f | %5.1f %5.1f %6.1f | %6.1f s" % (
            outcome["layout"], outcome["seconds"], *stage_s, load, stop, client, overhead))
    return worst, total, per_layout


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layouts", default="tp8,tp4pp2")
    parser.add_argument("--keep", action="store_true", help="leave the lab host running")
    args = parser.parse_args()
    layouts = [x for x in args.layouts.split(",") if x]
    return measure_costs(
        sweeplab.SWEEP, "sweep_overhead", "playbooks/sweep.yml",
        lambda out: {"layouts": layouts, "topolaunch_results_dir": str(out / "results"),
                     "sweep_summary_file": str(out / "sweep.json")},
        lambda out: json.loads((out / "sweep.json").read_text())["layouts"],
        "ansible start, topology, first plan, report, winner relaunch", GOAL_S, args.keep)


WHAT = {"sweep_overhead": "sweep point beyond the server's own load, the old server's stop and the benchmark client",
        "tune_overhead": "`layout: tune` per candidate beyond the server's own load, the old server's stop and the "
                         "benchmark client"}


def measure_costs(lab, name, playbook, extra, outcomes_of, fixed, goal, keep):
    """Boot and provision the lab (a PrivateLab), run the playbook with extra(tmp dir) (results under tmp/results),
    print the cost table of outcomes_of(tmp dir) and the fixed part; 0 when the worst overhead is under goal."""
    try:
        lab.up_and_provisioned()
        with tempfile.TemporaryDirectory() as tmp:
            out = pathlib.Path(tmp)
            _common.count_tasks(out / "tasks.json")
            start = time.monotonic()
            run = lab.playbook(playbook, extra=extra(out))
            _common.count_tasks(None)
            total = time.monotonic() - start
            if run.returncode != 0:
                print(run.stdout[-6000:])
                print("%s: the playbook failed (rc %d)" % (name, run.returncode))
                return 2
            runs = {r["run_id"] + r["layout"]: r for r in results.load_runs(str(out / "results"))}
            worst, layouts_s, per_layout = print_costs(outcomes_of(out), runs, unit_stops(lab.ssh))
            print("total %.1f s, of which fixed (%s) %.1f s" % (total, fixed, total - layouts_s))
            print("%s: worst per-layout overhead %.1f s (goal < %.0f s): %s" % (
                name, worst, goal, "OK" if worst < goal else "OVER GOAL"))
            timed = _common.costs(out / "tasks.json")
            print("%s: %d tasks, %d remote calls (%.1f s), other tasks %.1f s" % (
                name, timed["tasks"], timed["remote_calls"], timed["remote_s"], timed["local_s"]))
            _common.record(name, [_common.row(WHAT[name], "%.1f s worst per layout (%s)" % (worst, ", ".join(
                "%s %.1f s" % (o["layout"], o["overhead"]) for o in per_layout)), "< %.0f s" % goal, worst < goal)],
                per_layout=per_layout, total_s=round(total, 1), playbook=timed)
            return 0 if worst < goal else 1
    finally:
        if not _common.keep(keep):
            lab.lab("down")


if __name__ == "__main__":
    sys.exit(main())
