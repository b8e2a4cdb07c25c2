"""The sweep on the lab with the field spec: tp8 and tp4pp2 give results, FINDINGS.md and plots, and the winner is
left running and healthy; the planner's auto mode then picks the measured winner; `--tags bench` only benchmarks;
a failing layout is recorded and the sweep goes on; an unknown layout is refused before anything changes.

Boots one lab host (tests/lab/sweeplab.py: ssh 2231, server 32000, repository 18083), provisions it, and takes
it down at the end. Needs root, systemd-nspawn and debootstrap:

    .venv/bin/pytest -m lab tests/lab/test_sweep.py
"""
import json
import os
import shutil
import struct

import pytest

import sweeplab

LAB_MISSING = os.geteuid() != 0 or not shutil.which("systemd-nspawn") or not shutil.which("debootstrap")
pytestmark = [pytest.mark.lab, pytest.mark.skipif(LAB_MISSING, reason="needs root, systemd-nspawn, debootstrap")]
LAYOUTS = ["tp8", "tp4pp2"]


@pytest.fixture(scope="module")
def lab_host():
    sweeplab.up_and_provisioned()
    yield sweeplab.HOST
    sweeplab.lab("down")


@pytest.fixture(scope="module")
def sweep(lab_host, tmp_path_factory):
    results = tmp_path_factory.mktemp("results")
    summary = results.parent / "sweep.json"
    run = sweeplab.playbook("playbooks/sweep.yml", extra={
        "layouts": LAYOUTS, "topolaunch_results_dir": str(results), "sweep_summary_file": str(summary)})
    assert run.returncode == 0, run.stdout[-8000:]
    data = json.loads(summary.read_text())
    return {"run": run, "results": results, "summary": data,
            "dir": results / data["model"] / data["topology_fingerprint"]}


host_json, main_pid = sweeplab.host_json, sweeplab.main_pid


def winner_of(summary):
    ok = [o for o in summary["layouts"] if o["status"] == "ok"]
    return max(ok, key=lambda o: o["peak_output_throughput"])["layout"]


def test_sweep_measures_both_layouts(sweep):
    outcomes = {o["layout"]: o for o in sweep["summary"]["layouts"]}
    assert sorted(outcomes) == sorted(LAYOUTS)
    for layout in LAYOUTS:
        assert outcomes[layout]["status"] == "ok", outcomes[layout]
        files = sorted(p.name for p in (sweep["dir"] / layout).iterdir())
        [jsonl] = [f for f in files if f.endswith(".jsonl")]
        run_id = jsonl[:-len(".jsonl")]
        assert files == sorted(run_id + s for s in (".jsonl", ".meta.json", ".plan.json", ".topology.json",
                                                     ".versions.json"))
        lines = [json.loads(line) for line in (sweep["dir"] / layout / jsonl).read_text().splitlines()]
        meta = json.loads((sweep["dir"] / layout / (run_id + ".meta.json")).read_text())
        assert [line["max_concurrency"] for line in lines] == [p["max_concurrency"] for p in meta["points"]]
        assert all(line["completed"] == p["num_prompts"] for line, p in zip(lines, meta["points"]))
        plan = json.loads((sweep["dir"] / layout / (run_id + ".plan.json")).read_text())
        assert plan["layout"]["name"] == layout
        versions = json.loads((sweep["dir"] / layout / (run_id + ".versions.json")).read_text())
        assert versions["sglang"].endswith("+sim") and versions["driver_version"] and versions["topolaunch_commit"]


def test_findings_and_plots(sweep):
    findings = (sweep["results"] / "FINDINGS.md").read_text()
    assert "> **SIMULATED RESULTS.**" in findings
    winner = winner_of(sweep["summary"])
    assert "**Winner: %s**" % winner in findings
    for layout in LAYOUTS:
        assert "| %s | 1 |" % layout in findings
    plots = sorted((sweep["results"] / "plots").glob("*.png"))
    assert len(plots) == 2
    for plot in plots:
        head = plot.read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", head[16:24])[0] >= 600
        assert plot.stat().st_size > 20000


def test_winner_left_running_and_healthy(sweep):
    winner = winner_of(sweep["summary"])
    current = host_json("/var/lib/topolaunch/current_plan.json")
    assert current["layout"]["name"] == winner
    assert host_json("/var/lib/topolaunch/last_good_plan.json") == current
    rc, code = sweeplab.ssh("curl -s -o /dev/null -w '%%{http_code}' http://127.0.0.1:%d/health" % sweeplab.SERVER_PORT)
    assert rc == 0 and code == "200"


def test_auto_plan_picks_the_measured_winner(sweep):
    run = sweeplab.playbook("deploy.yml", "--tags", "plan", extra={"topolaunch_results_dir": str(sweep["results"])})
    assert run.returncode == 0, run.stdout[-6000:]
    plan = json.loads((sweeplab.ROOT / "artifacts" / sweeplab.HOST / "plan.json").read_text())
    candidates = json.loads((sweeplab.ROOT / "artifacts" / sweeplab.HOST / "candidates.json").read_text())
    assert plan["layout"]["name"] == winner_of(sweep["summary"]) and "candidates" not in plan
    assert candidates[0]["source"] == "measured"


def test_bench_tag_only_benchmarks(sweep):
    winner = winner_of(sweep["summary"])
    before_pid = main_pid()
    before = set(p.name for p in (sweep["dir"] / winner).glob("*.jsonl"))
    # The sweep measured this server at this workload already: bench_force measures it again.
    run = sweeplab.playbook("deploy.yml", "--tags", "bench", extra={"topolaunch_results_dir": str(sweep["results"]),
                                                                    "bench_force": True})
    assert run.returncode == 0, run.stdout[-6000:]
    assert main_pid() == before_pid  # not restarted
    changed, task = [], None
    for line in run.stdout.splitlines():
        if line.startswith("TASK ["):
            task = line
        elif line.startswith("changed: "):
            changed.append(task)
    # Other stages may publish facts or validate arguments (tagged always); only bench changes anything.
    assert changed and all(t.startswith("TASK [topolaunch.sglang.bench : ") for t in changed), changed
    after = set(p.name for p in (sweep["dir"] / winner).glob("*.jsonl"))
    assert len(after - before) == 1
    # The client's raw output holds the server's API key when one is set (bench_serving copies /server_info): root only.
    rc, mode = sweeplab.ssh("stat -c '%a %U' /var/lib/topolaunch/bench")
    assert rc == 0 and mode.split() == ["700", "root"], mode


def test_failed_layout_is_recorded_and_the_sweep_goes_on(sweep):
    candidates = json.loads((sweeplab.ROOT / "artifacts" / sweeplab.HOST / "candidates.json").read_text())
    invalid = [c["name"] for c in candidates if not c["valid"]]
    assert invalid, "the planner lists no invalid candidate for the field spec"
    bad, good = invalid[0], winner_of(sweep["summary"])
    good_before = set((sweep["dir"] / good).glob("*.jsonl"))
    run = sweeplab.playbook("playbooks/sweep.yml", extra={
        "layouts": [bad, good], "topolaunch_results_dir": str(sweep["results"]), "sweep_relaunch_winner": False})
    assert run.returncode != 0
    assert "Layout %s FAILED at plan" % bad in run.stdout
    [error] = list((sweep["dir"] / bad).glob("*.error.json"))
    assert json.loads(error.read_text())["stage"] == "plan"
    assert len(set((sweep["dir"] / good).glob("*.jsonl")) - good_before) == 1  # the sweep went on
    findings = (sweep["results"] / "FINDINGS.md").read_text()
    assert "| %s | plan |" % bad in findings


def test_unknown_layout_is_refused_before_anything_changes(sweep):
    before = main_pid()
    run = sweeplab.playbook("playbooks/sweep.yml", extra={
        "layouts": ["tp8", "tp9"], "topolaunch_results_dir": str(sweep["results"])})
    assert run.returncode != 0
    assert "unknown: tp9" in run.stdout
    assert main_pid() == before


def test_client_failure_is_recorded_and_fails_the_stage(sweep):
    winner = winner_of(sweep["summary"])
    before = set((sweep["dir"] / winner).glob("*.error.json"))
    run = sweeplab.playbook("playbooks/bench.yml", extra={
        "topolaunch_results_dir": str(sweep["results"]), "bench_concurrency": [1], "bench_output_len": 4000,
        "bench_point_timeout": 1})
    assert run.returncode != 0
    assert "bench of %s failed at concurrency 1: client failed (exit code 124): timed out after 1 s" % winner in run.stdout
    [error] = set((sweep["dir"] / winner).glob("*.error.json")) - before
    assert (error.parent / error.name.replace(".error.json", ".jsonl")).exists()  # the run is kept, even if empty
    assert "timed out after 1 s" in json.loads(error.read_text())["message"]
