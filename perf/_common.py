"""Shared by the perf scripts (make perf runs perf/[!_]*.py): where each writes its figures, and what a playbook run
cost in tasks and remote calls (the callback perf/callback_plugins/task_times.py).

Every script ends with record(script, rows, ...): build/perf/<script>.json with the rows of the README's performance
table it measured ({what, figure, goal, met}), the load average it was measured under and its details;
tools/perf_table.py rewrites the README's table from those files. Figures are never typed into the README.
"""
import configparser
import datetime
import json
import os
import pathlib
import re
import statistics
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "build" / "perf"
CALLBACK = ROOT / "perf" / "callback_plugins"


def count_tasks(path=None):
    """Point the task_times callback at `path` (set before a playbook starts; sweeplab passes os.environ on)."""
    OUT.mkdir(parents=True, exist_ok=True)
    os.environ["ANSIBLE_CALLBACK_PLUGINS"] = str(CALLBACK)
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "ansible.cfg")
    os.environ["ANSIBLE_CALLBACKS_ENABLED"] = ",".join(        # ansible.cfg's (the environment replaces it), and ours
        [c for c in cfg.get("defaults", "callbacks_enabled", fallback="").split(",") if c.strip()] + ["task_times"])
    if path is None:
        os.environ.pop("TASK_TIMES_FILE", None)
    else:
        os.environ["TASK_TIMES_FILE"] = str(path)


def costs(path):
    """What one playbook run cost: tasks (run, skipped), remote calls and their seconds, and the rest's seconds."""
    data = json.loads(pathlib.Path(path).read_text())
    rows = data["tasks"]
    remote = [r for r in rows if r["remote"]]
    return {"wall": data["wall"], "tasks": len(rows), "skipped": sum(r["status"] == "skipped" for r in rows),
            "remote_calls": len(remote), "remote_s": round(sum(r["seconds"] for r in remote), 2),
            "local_s": round(sum(r["seconds"] for r in rows if not r["remote"]), 2),
            "slowest": sorted(({"task": r["task"], "seconds": r["seconds"], "remote": r["remote"]} for r in rows),
                              key=lambda r: -r["seconds"])[:8]}


def median_costs(all_costs):
    """The median of each count and time over runs."""
    keys = ("wall", "tasks", "skipped", "remote_calls", "remote_s", "local_s")
    return {k: round(statistics.median(c[k] for c in all_costs), 2) for k in keys}


def row(what, figure, goal, met):
    return {"what": what, "figure": figure, "goal": goal, "met": met}


def record(script, rows, **details):
    """Write build/perf/<script>.json: the rows, when, and under what load (other work on the machine inflates
    every wall time; counts of tasks and remote calls do not move)."""
    OUT.mkdir(parents=True, exist_ok=True)
    data = {"script": "perf/%s.py" % script,
            "measured": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "load_average": [round(x, 1) for x in os.getloadavg()], "cpus": os.cpu_count(), "rows": rows,
            "details": details}
    (OUT / ("%s.json" % script)).write_text(json.dumps(data, indent=1) + "\n")
    return data


def keep(flag):
    """Whether to leave the lab host running: --keep, or TOPOLAUNCH_PERF_KEEP=1 (make perf: its scripts share hosts,
    which it takes down at the end)."""
    return flag or os.environ.get("TOPOLAUNCH_PERF_KEEP") == "1"


RECAP = re.compile(r"^(\S+)\s+:\s+ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def recap(output):
    """{host: (ok, changed, unreachable, failed)} from a PLAY RECAP."""
    return {m.group(1): tuple(int(x) for x in m.groups()[1:]) for m in RECAP.finditer(output)}


def no_change_runs(lab, name, runs, *args):
    """`runs` runs of lab.playbook(*args) that must change nothing, each timed and counted; prints a line each.
    Returns (walls, costs, how many changed something or failed)."""
    times, counted, bad_runs = [], [], 0
    for i in range(runs):
        count_tasks(OUT / ("%s.tasks.json" % name))
        start = time.monotonic()
        run = lab.playbook(*args)
        times.append(time.monotonic() - start)
        count_tasks(None)
        counted.append(costs(OUT / ("%s.tasks.json" % name)))
        hosts = recap(run.stdout)
        bad = run.returncode != 0 or not hosts or any(c or u or f for _ok, c, u, f in hosts.values())
        bad_runs += bad
        print("run %d: %5.1f s  %s; %d tasks (%d skipped), %d remote calls %.1f s%s" % (
            i + 1, times[-1], ", ".join("%s ok=%d changed=%d unreachable=%d failed=%d" % ((h,) + v)
                                        for h, v in sorted(hosts.items())),
            counted[-1]["tasks"], counted[-1]["skipped"], counted[-1]["remote_calls"], counted[-1]["remote_s"],
            "  NOT A NO-CHANGE RUN" if bad else ""))
        if bad:
            print(run.stdout[-4000:])
    return times, counted, bad_runs
