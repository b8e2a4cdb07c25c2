#!/usr/bin/env python3
"""Rewrite the README's performance table from what `make perf` measured (build/perf/<script>.json, written by
perf/_common.py record()): the rows between the markers, never typed by hand.

    .venv/bin/python tools/perf_table.py [--results build/perf] [--readme README.md] [--check]

Each row: what, the figure, the goal, whether it is met, the script, when and under what load average it ran (other
work on the machine inflates wall times; the counts of tasks and remote calls do not move). --check exits 1 when
the README's table differs from what the results give (nothing written).
"""
import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
BEGIN = "<!-- perf table: begin (tools/perf_table.py writes it from make perf's build/perf/*.json; do not edit) -->"
END = "<!-- perf table: end -->"
ORDER = ("topology_speed", "plan_speed", "calibration", "provision_noop", "deploy_noop", "relaunch_speed",
         "sweep_overhead", "tune_overhead", "gateway_overhead", "rolling_restart", "tune_start")


def cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(results):
    """The table's lines for the results (script name -> its record), in ORDER then the others by name."""
    lines = ["| what | figure | goal | met | measured |", "| --- | --- | --- | --- | --- |"]
    names = [n for n in ORDER if n in results] + sorted(n for n in results if n not in ORDER)
    for name in names:
        data = results[name]
        when = "%s, load %s (%d CPUs), `%s`" % (data["measured"], " ".join("%.1f" % x for x in data["load_average"]),
                                               data["cpus"], data["script"])
        for row in data["rows"]:
            lines.append("| %s | %s | %s | %s | %s |" % (cell(row["what"]), cell(row["figure"]), cell(row["goal"]),
                                                        "yes" if row["met"] else "**no**", cell(when)))
    return lines


def load(directory):
    return {p.stem: json.loads(p.read_text()) for p in sorted(pathlib.Path(directory).glob("*.json"))
            if not p.name.endswith(".tasks.json")}


def rewrite(text, lines):
    """text with the part between the markers replaced by lines; ValueError when the markers are not there."""
    if BEGIN not in text or END not in text or text.index(BEGIN) > text.index(END):
        raise ValueError("no performance table markers (%s ... %s)" % (BEGIN, END))
    head, rest = text.split(BEGIN, 1)
    _old, tail = rest.split(END, 1)
    return head + BEGIN + "\n" + "\n".join(lines) + "\n" + END + tail


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=str(ROOT / "build" / "perf"))
    parser.add_argument("--readme", default=str(ROOT / "README.md"))
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    results = load(args.results)
    if not results:
        print("perf_table: no results in %s: run make perf first" % args.results, file=sys.stderr)
        return 2
    readme = pathlib.Path(args.readme)
    old = readme.read_text()
    try:
        new = rewrite(old, table(results))
    except ValueError as exc:
        print("perf_table: %s: %s" % (readme, exc), file=sys.stderr)
        return 2
    if args.check:
        return 0 if new == old else 1
    if new != old:
        readme.write_text(new)
    print("perf_table: %s: %d rows from %d results in %s" % (
        readme, sum(len(r["rows"]) for r in results.values()), len(results), args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
