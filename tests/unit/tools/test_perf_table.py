"""tools/perf_table.py: the README's performance table is rewritten between its markers from make perf's results, in
a fixed order, with when and under what load each figure was measured; --check tells a stale table."""
import json

import perf_table


def result(tmp_path, name, rows, load=(0.4, 0.5, 0.6)):
    (tmp_path / ("%s.json" % name)).write_text(json.dumps({
        "script": "perf/%s.py" % name, "measured": "2026-12-02 01:00 UTC", "load_average": list(load), "cpus": 2,
        "rows": rows, "details": {}}))


def test_the_table_between_the_markers_is_the_results(tmp_path):
    result(tmp_path, "relaunch_speed", [{"what": "own cost", "figure": "4.1 s", "goal": "< 5 s", "met": True}])
    result(tmp_path, "provision_noop", [{"what": "no-change provision", "figure": "25 s | 30 calls",
                                         "goal": "< 20 s", "met": False}], load=(6.0, 7.0, 8.0))
    (tmp_path / "provision_noop.tasks.json").write_text("{}")          # a run's task times: not a result
    readme = tmp_path / "README.md"
    readme.write_text("intro\n%s\n| old | row |\n%s\nafter\n" % (perf_table.BEGIN, perf_table.END))
    args = ["--results", str(tmp_path), "--readme", str(readme)]
    assert perf_table.main(args + ["--check"]) == 1
    assert perf_table.main(args) == 0
    text = readme.read_text()
    assert text.startswith("intro\n" + perf_table.BEGIN + "\n| what | figure | goal | met | measured |\n")
    assert text.endswith(perf_table.END + "\nafter\n") and "| old | row |" not in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert rows[0].startswith("| no-change provision | 25 s \\| 30 calls | < 20 s | **no** | 2026-12-02 01:00 UTC, "
                              "load 6.0 7.0 8.0 (2 CPUs), `perf/provision_noop.py` |")   # provision before relaunch
    assert rows[1].startswith("| own cost | 4.1 s | < 5 s | yes |")
    assert perf_table.main(args + ["--check"]) == 0


def test_no_markers_or_no_results_is_an_error(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("no table\n")
    assert perf_table.main(["--results", str(tmp_path), "--readme", str(readme)]) == 2
    result(tmp_path, "plan_speed", [{"what": "plan", "figure": "5 ms", "goal": "< 50 ms", "met": True}])
    assert perf_table.main(["--results", str(tmp_path), "--readme", str(readme)]) == 2
    assert "no performance table markers" in capsys.readouterr().err and readme.read_text() == "no table\n"
