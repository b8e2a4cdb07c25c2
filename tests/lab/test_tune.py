"""layout: tune on the lab with the field spec (tests/lab/tunelab.py: host tfield, ssh 2391, server 33900, repository
18099). The simulator's truth is set against the model (lab_sim_layout_speed): the model's second choice, tp8, is
truly the fastest. `deploy.yml -e layout=tune` must end with it running (the test fails if the tune keeps the model's
pick), plan.json `source: measured`, FINDINGS.md with predicted and measured figures; a second tune measures and
relaunches nothing; a candidate that crashes at load (SGLANG_SIM_FAULT crash_during_load@LAYOUT) is recorded and the
tune ends with a healthy winner; with every candidate crashing the last known good plan runs again and the play fails.
The candidates start with the decode CUDA graph for the bench's batch size only (faster capture) and the winner is
launched again with the full set (module_utils/topolaunch/tune_start.py). With topolaunch_speculative auto and a
checkpoint that carries its MTP layer, a layout whose estimates with and without NEXTN are close is measured both
ways and the faster measured is kept (the simulator's accept length is the truth: lab_sim_accept_length).

    .venv/bin/pytest -m lab tests/lab/test_tune.py
"""
import json
import os
import re
import shutil
import signal
import time

import pytest

from tunelab import TUNE

LAB_MISSING = os.geteuid() != 0 or not shutil.which("systemd-nspawn") or not shutil.which("debootstrap")
pytestmark = [pytest.mark.lab, pytest.mark.skipif(LAB_MISSING, reason="needs root, systemd-nspawn, debootstrap")]
# The model's choice at the lab workload (tests/unit/plugins/module_utils/test_tune.py): tp4pp2 first, then tp8 and
# tp4pp2ep4.
MODEL_PICK, TRUE_WINNER, CANDIDATES = "tp4pp2", "tp8", ["tp4pp2", "tp8", "tp4pp2ep4"]
SPEED = "tp8=3,tp4pp2=0.5,tp4pp2ep4=0.4"


@pytest.fixture(scope="module")
def lab_host():
    TUNE.write_inventory(lab_sim_layout_speed=SPEED)
    TUNE.up_and_provisioned()
    yield TUNE
    TUNE.lab("down")


host_json, main_pid = TUNE.host_json, TUNE.main_pid


def healthy():
    rc, code = TUNE.ssh("curl -s -o /dev/null -w '%%{http_code}' http://127.0.0.1:%d/health" % TUNE.server_port)
    return rc == 0 and code == "200"


# The cases after the first tune's (which runs the whole deploy.yml, and a second one that must change nothing) tune
# with the stages a tune needs (plan, the tune, the relaunch): the whole deploy.yml is a minute of CPU each.
RELAUNCH = ("--tags", "relaunch")


def tune(tmp, *args, **extra):
    """deploy.yml -e layout=tune with this test's results and artifacts directories."""
    return TUNE.playbook("deploy.yml", *args, extra=dict(
        {"layout": "tune", "topolaunch_results_dir": str(tmp / "results"),
         "topolaunch_artifacts_dir": str(tmp / "artifacts")}, **extra))


def runs_of(results):
    return sorted(p.name for p in results.rglob("*.jsonl"))


def recap_changed(stdout, host):
    line = next(l for l in stdout.splitlines() if l.startswith(host + " ") and "changed=" in l)
    return int(line.split("changed=")[1].split()[0])


@pytest.fixture(scope="module")
def first(lab_host, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tune")
    run = tune(tmp)
    assert run.returncode == 0, run.stdout[-8000:]
    return {"run": run, "tmp": tmp}


def test_tune_runs_the_measured_winner_not_the_model_pick(first):
    current = host_json("/var/lib/topolaunch/current_plan.json")
    assert current["layout"]["name"] == TRUE_WINNER != MODEL_PICK
    assert host_json("/var/lib/topolaunch/last_good_plan.json") == current
    assert healthy()
    plan = json.loads((first["tmp"] / "artifacts" / TUNE.host / "plan.json").read_text())
    assert plan["layout"]["name"] == TRUE_WINNER and plan["source"] == "measured"
    candidates = {c["name"]: c for c in json.loads(
        (first["tmp"] / "artifacts" / TUNE.host / "candidates.json").read_text())}
    for name in CANDIDATES:   # measured and predicted figures of every candidate measured
        assert candidates[name]["measured"]["output_throughput"] > 0
        assert candidates[name]["estimate"]["tokens_per_s"] > 0
    assert candidates[TRUE_WINNER]["measured"]["output_throughput"] > candidates[MODEL_PICK]["measured"][
        "output_throughput"]
    assert plan["fit"]["error_before"] is not None   # the model's error on this machine


def decode_captures(log):
    """(batch sizes, seconds) of each decode CUDA-graph capture in a server log (0.5.23's line, as the simulator
    writes it: one forward per size, so its time follows the list)."""
    return [(json.loads(m.group(1)), float(m.group(2))) for m in re.finditer(
        r"Capture target decode CUDA graph end\. bs=(\[[0-9, ]*\]), elapsed=([0-9.]+) s", log)]


def test_candidates_capture_the_bench_batch_size_only_and_the_winner_the_full_set(first):
    """The candidates started with --cuda-graph-bs-decode at the bench's concurrency (4) and captured faster than
    the winner, which was launched again with the normal settings: the release's whole list."""
    invocation = TUNE.ssh("systemctl show -p InvocationID --value topolaunch-sglang.service")[1].strip()
    running = decode_captures(TUNE.ssh("journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID=%s + INVOCATION_ID=%s"
                                       % (invocation, invocation))[1])
    every = decode_captures(TUNE.ssh("journalctl --no-pager -o cat -u topolaunch-sglang.service")[1])
    candidates = [seconds for sizes, seconds in every if sizes == [4]]
    assert running and candidates, every
    assert all(len(sizes) > 1 and 4 in sizes for sizes, _s in running), running   # the release's default list
    assert max(candidates) < min(seconds for _sizes, seconds in running), (candidates, running)
    argv = host_json("/var/lib/topolaunch/current_plan.json")["argv"]
    assert "--cuda-graph-bs-decode" not in argv and "--cuda-graph-bs" not in argv
    assert "predicted starts on a real box" in " ".join(first["run"].stdout.split()).lower()


def test_findings_show_predicted_and_measured(first):
    findings = (first["tmp"] / "results" / "FINDINGS.md").read_text()
    assert "predicted" in findings.lower() and "measured" in findings.lower()
    for name in CANDIDATES:
        assert name in findings
    [fit] = list((first["tmp"] / "results").rglob("fit.json"))
    assert json.loads(fit.read_text())["quality"] in ("good", "poor")
    assert len(list((first["tmp"] / "results").rglob("tune-*.json"))) == 1


def test_second_tune_measures_and_relaunches_nothing(first):
    pid, before = main_pid(), runs_of(first["tmp"] / "results")
    run = tune(first["tmp"])
    assert run.returncode == 0, run.stdout[-8000:]
    assert "nothing new to measure" in run.stdout
    assert main_pid() == pid and runs_of(first["tmp"] / "results") == before
    assert recap_changed(run.stdout, TUNE.host) == 0, run.stdout[-4000:]
    assert healthy()


@pytest.mark.full
def test_tune_with_tags_relaunch_restarts_the_winner(first):
    pid, before = main_pid(), runs_of(first["tmp"] / "results")
    run = tune(first["tmp"], *RELAUNCH)
    assert run.returncode == 0, run.stdout[-8000:]
    assert main_pid() != pid and runs_of(first["tmp"] / "results") == before
    assert host_json("/var/lib/topolaunch/current_plan.json")["layout"]["name"] == TRUE_WINNER
    assert healthy()


@pytest.mark.full
def test_an_interrupted_tune_goes_on_from_what_was_measured(first, tmp_path):
    # Ctrl-C once the first candidate's run is stored (its meta file is written last), then the same command again
    extra = {"layout": "tune", "topolaunch_results_dir": str(tmp_path / "results"),
             "topolaunch_artifacts_dir": str(tmp_path / "artifacts")}
    proc = TUNE.popen("deploy.yml", extra=extra)
    try:
        deadline = time.monotonic() + 600
        while not list((tmp_path / "results").rglob(MODEL_PICK + "/*.meta.json")):
            assert proc.poll() is None and time.monotonic() < deadline, "the first candidate was never stored"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode != 0
    run = tune(tmp_path)
    assert run.returncode == 0, run.stdout[-8000:]
    measuring = re.search(r"measuring ([a-z0-9, ]+)", " ".join(run.stdout.split())).group(1).split(", ")
    assert TRUE_WINNER in measuring and MODEL_PICK not in measuring, measuring
    assert len(list((tmp_path / "results").rglob(MODEL_PICK + "/*.jsonl"))) == 1   # not measured again
    assert host_json("/var/lib/topolaunch/current_plan.json")["layout"]["name"] == TRUE_WINNER and healthy()


def test_a_candidate_that_crashes_is_recorded_and_the_tune_goes_on(first, tmp_path):
    TUNE.write_inventory(lab_sim_layout_speed=SPEED, lab_sim_fault="crash_during_load@" + TRUE_WINNER)
    run = tune(tmp_path, *RELAUNCH)
    assert run.returncode == 0, run.stdout[-8000:]
    assert "%s FAILED at health" % TRUE_WINNER in run.stdout
    [error] = list((tmp_path / "results").rglob(TRUE_WINNER + "/*.error.json"))
    record = json.loads(error.read_text())
    assert record["stage"] == "health" and "illegal memory access" in json.dumps(record)  # the log excerpt
    current = host_json("/var/lib/topolaunch/current_plan.json")
    assert current["layout"]["name"] in CANDIDATES and current["layout"]["name"] != TRUE_WINNER
    assert healthy()
    findings = (tmp_path / "results" / "FINDINGS.md").read_text()
    assert TRUE_WINNER in findings and "failed" in findings


def test_every_candidate_failing_relaunches_the_last_good_plan_and_fails(first, tmp_path):
    good = host_json("/var/lib/topolaunch/last_good_plan.json")["layout"]["name"]
    others = [name for name in CANDIDATES if name != good]
    TUNE.write_inventory(lab_sim_layout_speed=SPEED,
                         lab_sim_fault=",".join("crash_during_load@" + name for name in others))
    try:
        run = tune(tmp_path, *RELAUNCH, tune_layouts=others)
        assert run.returncode != 0
        assert "every layout it tried failed" in run.stdout and "the last known good plan (%s) was relaunched" % good \
            in " ".join(run.stdout.split())
        assert host_json("/var/lib/topolaunch/current_plan.json")["layout"]["name"] == good
        assert healthy()
        assert len(list((tmp_path / "results").rglob("*.error.json"))) == len(others)
    finally:
        TUNE.write_inventory(lab_sim_layout_speed=SPEED)


# An SLO the fastest layout misses: the model plans tp4pp2 near the workload's 32 requests and tp1pp8 at 3 or fewer
# (tests/unit/plugins/module_utils/test_plan_score_objective.py pins it); the simulator slows tp4pp2 until its median TPOT
# is ~2x the target while it still serves the most tokens, and speeds tp1pp8 until it meets both targets.
SLO_WORKLOAD = {"input_len": 64, "output_len": 16, "concurrency": 32, "slo": {"ttft_ms": 400, "tpot_ms": 60}}
SLO_SPEED, SLO_FAST, SLO_MEETS = "tp4pp2=0.1,tp1pp8=0.7", "tp4pp2", "tp1pp8"


def test_a_tune_with_an_slo_ends_on_the_fastest_layout_that_meets_it(lab_host, tmp_path):
    TUNE.write_inventory(lab_sim_layout_speed=SLO_SPEED)
    try:
        run = tune(tmp_path, *RELAUNCH, topolaunch_workload=SLO_WORKLOAD, tune_layouts=[SLO_FAST, SLO_MEETS])
        assert run.returncode == 0, run.stdout[-8000:]
        plan = json.loads((tmp_path / "artifacts" / TUNE.host / "plan.json").read_text())
        candidates = {c["name"]: c for c in json.loads(
            (tmp_path / "artifacts" / TUNE.host / "candidates.json").read_text())}
        fast, meets = candidates[SLO_FAST]["measured"], candidates[SLO_MEETS]["measured"]
        assert fast["output_throughput"] > meets["output_throughput"]          # the fastest ...
        assert fast["slo_met"] is False and "TPOT" in " ".join(fast["slo_misses"])   # ... missed it
        assert meets["slo_met"] is True and meets["max_concurrency"] < fast["max_concurrency"]
        assert plan["layout"]["name"] == SLO_MEETS and plan["source"] == "measured"
        assert plan["concurrency"] == meets["max_concurrency"]
        assert host_json("/var/lib/topolaunch/current_plan.json")["layout"]["name"] == SLO_MEETS and healthy()
        said = " ".join(run.stdout.split())
        assert "the fastest measured layout that met the SLO" in said and "%s missed it" % SLO_FAST in said
        assert "SLO p99 TTFT <= 400 ms, p50 TPOT <= 60 ms missed" in said    # the bench's check
        assert list((tmp_path / "results").rglob("*_interactivity.png"))
    finally:
        TUNE.write_inventory(lab_sim_layout_speed=SPEED)


def test_concurrency_max_plans_what_every_replica_admits(lab_host, tmp_path):
    run = TUNE.playbook("deploy.yml", "--tags", "plan", extra={
        "topolaunch_artifacts_dir": str(tmp_path / "artifacts"), "topolaunch_results_dir": str(tmp_path / "results"),
        "topolaunch_workload": dict(SLO_WORKLOAD, concurrency="max", slo={})})
    assert run.returncode == 0, run.stdout[-8000:]
    plan = json.loads((tmp_path / "artifacts" / TUNE.host / "plan.json").read_text())
    est = plan["estimate"]
    admitted = min(est["kv_capacity_requests"] // plan["layout"]["dp"], 4096) * plan["layout"]["dp"]
    assert plan["concurrency"] == est["concurrency"] == min(admitted, 1024) > 1
    assert "max: what every replica admits" in plan["reason"]


# Backends as candidates (topolaunch_tune_backends): the field spec (SM120) + GLM-5 NVFP4, where the known-combinations
# table ranks the MoE runners cutlass, flashinfer_cutlass close; the lab's truth (SGLANG_SIM_BACKEND_SPEED) runs
# cutlass at 1.5x and the release's default (auto) at 0.25x the performance model: the non-default one is faster.
# The host runs the simulator wheel of build/repo: `make repo` after a change to lab/sglang_sim.
BACKEND, BACKEND_VARIANT = "cutlass", TRUE_WINNER + "+moe_runner_backend.cutlass"
BACKEND_SPEED = "moe_runner_backend:auto=0.25,moe_runner_backend:cutlass=1.5"


def test_a_tune_over_moe_runner_backends_runs_the_faster_one(lab_host, tmp_path):
    run = tune(tmp_path, *RELAUNCH, tune_layouts=[TRUE_WINNER], topolaunch_tune_max=2,
               topolaunch_tune_backends=["moe_runner_backend"],
               lab_sim_backend_speed=BACKEND_SPEED)
    assert run.returncode == 0, run.stdout[-8000:]
    said = " ".join(run.stdout.split())
    assert "measuring %s, %s" % (TRUE_WINNER, BACKEND_VARIANT) in said
    plan = json.loads((tmp_path / "artifacts" / TUNE.host / "plan.json").read_text())
    row = next(c for c in json.loads((tmp_path / "artifacts" / TUNE.host / "candidates.json").read_text())
               if c["name"] == TRUE_WINNER)
    variants = row["measured"].get("variants")
    assert plan["source"] == "measured" and plan["layout"]["name"] == TRUE_WINNER
    assert plan.get("backends") == {"moe_runner_backend": BACKEND}, (variants, plan["reason"])
    assert plan["layout"]["variant"] == BACKEND_VARIANT
    current = host_json("/var/lib/topolaunch/current_plan.json")
    argv = current["argv"]
    assert argv[argv.index("--moe-runner-backend") + 1] == BACKEND and healthy()
    rc, cmdline = TUNE.ssh("tr '\\0' ' ' < /proc/%d/cmdline" % main_pid())
    assert rc == 0 and "--moe-runner-backend %s" % BACKEND in cmdline, cmdline
    assert variants[BACKEND_VARIANT] > 1.5 * variants[TRUE_WINNER], variants   # both measured, the knob's truth
    [record] = list((tmp_path / "results").rglob("tune-*.json"))
    assert BACKEND_VARIANT in record.read_text()                               # the tune's record names it
    assert BACKEND_VARIANT in (tmp_path / "results" / "FINDINGS.md").read_text()


# Speculative decoding (issue 28 item 2): the lab model with its MTP layer (layer 78, num_hidden_layers, in the weight
# index). The operator's accept length 2.2 makes the model predict tp8ep8 about as fast with NEXTN as without at the
# lab workload (within its error, so both are measured); the simulator's truth (accept length 4) is faster with it.
MTP_MODEL, SPEC_LAYOUT = "/srv/models/glm-5-mtp", "tp8ep8"
MTP_INDEX = ("import json; p = '/srv/models/glm-5-nvfp4/model.safetensors.index.json'; i = json.load(open(p)); "
             "i['weight_map'] = {'model.layers.%d.eh_proj.weight' % k: 'model-1.safetensors' for k in range(79)}; "
             "json.dump(i, open('" + MTP_MODEL + "/model.safetensors.index.json', 'w'))")


def test_a_tune_measures_speculative_decoding_on_and_off_and_keeps_the_faster(lab_host, tmp_path):
    rc, out = TUNE.ssh("rm -rf %s && cp -a /srv/models/glm-5-nvfp4 %s && python3 -c \"%s\"" % (MTP_MODEL, MTP_MODEL,
                                                                                               MTP_INDEX))
    assert rc == 0, out
    TUNE.write_inventory(lab_sim_layout_speed=SPEED, lab_sim_accept_length=4)
    try:
        run = tune(tmp_path, *RELAUNCH, topolaunch_model_path=MTP_MODEL, model_weights_source="path",
                   topolaunch_speculative="auto", topolaunch_speculative_accept_length=2.2,
                   tune_layouts=[SPEC_LAYOUT, SPEC_LAYOUT + "+nextn"])
        assert run.returncode == 0, run.stdout[-8000:]
        results = tmp_path / "results"
        assert list(results.rglob(SPEC_LAYOUT + "/*.jsonl")) and list(results.rglob(SPEC_LAYOUT + "+nextn/*.jsonl"))
        plan = json.loads((tmp_path / "artifacts" / TUNE.host / "plan.json").read_text())
        spec = plan["speculative"]
        assert plan["source"] == "measured" and spec["measured_on"] and spec["measured_off"]
        assert spec["measured_on"] > spec["measured_off"] and spec["on"]          # the faster measured is kept
        said = " ".join(run.stdout.split())
        assert "measuring %s, %s+nextn" % (SPEC_LAYOUT, SPEC_LAYOUT) in said, said[-4000:]
        current = host_json("/var/lib/topolaunch/current_plan.json")
        assert current["layout"]["name"] == SPEC_LAYOUT + "+nextn"
        assert current["argv"][current["argv"].index("--speculative-algorithm") + 1] == "NEXTN"
        assert healthy()
    finally:
        TUNE.write_inventory(lab_sim_layout_speed=SPEED)
