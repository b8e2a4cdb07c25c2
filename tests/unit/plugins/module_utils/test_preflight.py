"""module_utils/topolaunch/preflight.py: hard deadlines on real subprocesses, sessions that survive a hang,
the P2P-off pass, findings and plan_fixes, tables and figures. The worker is tests/unit/preflight_fake_worker.py
(behaviour from $FAKE_WORKER); the lab stand-in's runs are in test_preflight_standin.py."""
import json
import sys
import time

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import preflight
import paths

HERE = paths.ROOT / "tests" / "unit"
FAKE = str(HERE / "preflight_fake_worker.py")
EIGHT = list(range(8))


def fake(monkeypatch, **plan):
    monkeypatch.setenv("FAKE_WORKER", json.dumps(plan))


def run(gpus, groups=None, timeout=5.0, facts=None, mode="auto", worker=FAKE):
    return preflight.run_preflight(sys.executable, worker, gpus, groups, settings={"step_timeout": timeout},
                                   fingerprint="f00dfeed0001", facts=facts, p2p_disable=mode)


def entry(record, a, b, off=False):
    return next(p for p in record["pairs"] if (p["src"], p["dst"]) == (a, b) and p["p2p_disabled"] == off)


def group(record, gpus, off=False):
    return next(g for g in record["groups"] if g["gpus"] == gpus and g["p2p_disabled"] == off)


def ids(record):
    return [f["id"] for f in record["findings"]]


def alive(pid):
    """True while pid exists and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# ------------------------------------------------------------------------------------------- run_step

def test_run_step_kills_a_hung_step_and_its_children_at_the_deadline(monkeypatch):
    fake(monkeypatch, hang=["0:1"], child=True)
    started = time.monotonic()
    out = preflight.run_step([sys.executable, FAKE, "p2p", "--pair", "0:1"], 1.0, preflight.worker_env())
    took = time.monotonic() - started
    assert out["status"] == "hang" and not out["unkillable"]
    assert 1.0 <= took < 4.0, took
    assert [l["event"] for l in out["lines"]] == ["child", "begin"]
    child = out["lines"][0]["pid"]
    assert not alive(child)                 # the whole process group went, not only the worker
    assert not preflight.group_alive(child)


def test_run_step_deadline_restarts_at_every_begin(monkeypatch, tmp_path):
    script = tmp_path / "slow.py"
    script.write_text("import json, time\nfor i in range(3):\n    print(json.dumps({'event': 'begin'}), flush=True)\n"
                      "    time.sleep(0.6)\n    print(json.dumps({'event': 'result'}), flush=True)\n")
    out = preflight.run_step([sys.executable, str(script)], 1.0)
    assert out["status"] == "ok" and out["seconds"] > 1.5           # longer than one deadline, never stuck
    assert [l["event"] for l in out["lines"]] == ["begin", "result"] * 3


def test_run_step_failure_and_noise(monkeypatch):
    fake(monkeypatch, die=["0:1"], noise=True)
    out = preflight.run_step([sys.executable, FAKE, "p2p", "--pair", "0:1"], 5.0, preflight.worker_env())
    assert out["status"] == "failed" and out["returncode"] == 3
    assert "Segmentation fault in 0:1" in out["stderr_tail"]
    assert "NCCL INFO not json" in out["output_tail"]


def test_run_step_a_command_that_cannot_start():
    out = preflight.run_step(["/nonexistent/python", "x"], 1.0)
    assert out["status"] == "failed" and "cannot start /nonexistent/python" in out["stderr_tail"]


def test_worker_env_uses_nvml_numbering(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    env = preflight.worker_env({"NCCL_TOPO_FILE": "/etc/topolaunch/nccl_topo.xml"})
    assert "CUDA_VISIBLE_DEVICES" not in env
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and env["NCCL_TOPO_FILE"] == "/etc/topolaunch/nccl_topo.xml"


# ------------------------------------------------------------------------------------------- planning

def test_default_groups_and_plan():
    assert preflight.default_groups(EIGHT) == [[0, 1], [2, 3], [4, 5], [6, 7], [0, 1, 2, 3], [4, 5, 6, 7], EIGHT]
    assert preflight.default_groups([0, 1, 2, 3, 4, 5]) == [[0, 1], [2, 3], [4, 5], [0, 1, 2, 3], [0, 1, 2, 3, 4, 5]]
    assert preflight.default_groups([3]) == [[3]]
    steps = preflight.plan_steps([0, 1], [[0, 1]], preflight.DEFAULTS)
    assert steps[0]["argv"][:8] == ["p2p", "--env", "--pair", "0:0", "--pair", "0:1", "--pair", "1:1"]
    assert steps[1]["argv"][:3] == ["allreduce", "--group", "0,1"] and "--bytes" in steps[1]["argv"]


@pytest.mark.parametrize("gpus,groups,settings,message", [
    ([], [], {}, "gpus: [] is not a non-empty list"),
    ([0, 0], [], {}, "gpus: [0, 0] lists a GPU twice"),
    ([0, 1], [[0, 2]], {}, "groups[0]: GPU 2 is not in gpus [0, 1]"),
    ([0, 1], [[0, "1"]], {}, "groups[0]: [0, '1'] is not a non-empty list"),
    ([0, 1], [[1, 1]], {}, "groups[0]: [1, 1] lists a GPU twice"),
    ([0, 1], [], {"bytes": 0}, "bytes: 0 must be a positive integer"),
    ([0, 1], [], {"step_timeout": -1}, "step_timeout: -1 must be a positive number"),
])
def test_bad_input_names_the_value(gpus, groups, settings, message):
    with pytest.raises(preflight.PreflightError, match=None) as exc:
        preflight.check_inputs(gpus, groups, dict(preflight.DEFAULTS, **settings))
    assert message in str(exc.value)


# ------------------------------------------------------------------------------------------- run_preflight

def test_healthy_box(monkeypatch):
    fake(monkeypatch, gbps=50.0, busbw=30.0)
    record = run([0, 1, 2, 3])
    assert record["env"]["status"] == "ok" and record["env"]["torch"] == "fake"
    assert len(record["pairs"]) == 16 and all(p["status"] == "ok" for p in record["pairs"])
    assert [g["gpus"] for g in record["groups"]] == [[0, 1], [2, 3], [0, 1, 2, 3]]
    assert record["findings"] == [] and record["ok"] is True
    assert record["plan_fixes"] == {"env": {}, "server_args": {}}
    # one p2p session (env line included) and one allreduce session: two processes for the whole run
    assert [s["name"] for s in record["steps"]] == ["p2p", "allreduce"]
    fig = record["figures"]
    assert {(p["src"], p["dst"]): p["gbps"] for p in fig["pairs"]}[(2, 1)] == 50.0
    assert fig["allreduce_by_size"] == {"2": {"busbw_gbps": 30.0, "latency_us": 6.8, "groups": 2, "p2p_disabled": False},
                                        "4": {"busbw_gbps": 30.0, "latency_us": 13.6, "groups": 1, "p2p_disabled": False}}
    assert set(record["timing"]) == {"total_seconds", "p2p_startup_seconds", "per_pair_seconds", "per_local_seconds",
                                     "allreduce_startup_seconds", "per_group_seconds"}
    assert set(record["timing"]["per_group_seconds"]) == {"2", "4"}


def test_hanging_pair_costs_one_timeout_and_ends_in_the_fix(monkeypatch):
    fake(monkeypatch, hang=["1:2", "2:1", "0,1,2,3"], gbps=50.0)
    started = time.monotonic()
    record = run([0, 1, 2, 3], timeout=1.0)
    took = time.monotonic() - started
    assert took < 1.0 + 3.0, took              # the reverse pair and the group holding the pair are not waited for
    assert entry(record, 1, 2)["status"] == "hang"
    assert entry(record, 2, 1)["status"] == "skipped" and "1->2 hung" in entry(record, 2, 1)["error"]
    assert entry(record, 1, 3)["status"] == "ok"          # the session went on after the hang
    assert group(record, [0, 1, 2, 3])["status"] == "skipped"
    assert group(record, [0, 1])["status"] == "ok"
    # second pass with NCCL_P2P_DISABLE=1: every pair and group again
    assert entry(record, 1, 2, off=True)["status"] == "ok" and entry(record, 1, 2, off=True)["gbps"] == 10.0
    assert group(record, [0, 1, 2, 3], off=True)["status"] == "ok"
    assert ids(record) == ["preflight-p2p-hang", "preflight-p2p-disabled-by-plan"]
    assert record["plan_fixes"] == {"env": {"NCCL_P2P_DISABLE": "1"}, "server_args": {"disable_custom_all_reduce": True}}
    assert record["ok"] is True
    hang = record["findings"][0]
    assert hang["gpus"] == [1, 2] and "x-nv-gpudirect-clique" in hang["remedy"] and "iommu=pt" in hang["remedy"]
    assert "NCCL_P2P_DISABLE=1" in hang["remedy"] and "--disable-custom-all-reduce" in hang["remedy"]
    # the planner gets the figures of the setting the plan will run with: P2P off everywhere
    assert record["figures"]["p2p_disabled"] is True
    assert all(p["p2p_disabled"] for p in record["figures"]["pairs"])
    assert record["figures"]["allreduce_by_size"]["4"]["p2p_disabled"] is True
    steps = [s for s in record["steps"] if s["status"] == "hang"]
    assert len(steps) == 1 and steps[0]["hung_on"] == [1, 2]


def test_hanging_allreduce_group(monkeypatch):
    fake(monkeypatch, hang=["0,1"])
    record = run([0, 1, 2, 3], timeout=1.0)
    assert group(record, [0, 1])["status"] == "hang"
    assert group(record, [2, 3])["status"] == "ok" and group(record, [0, 1, 2, 3])["status"] == "ok"
    assert group(record, [0, 1], off=True)["status"] == "ok"
    assert "preflight-allreduce-hang" in ids(record)
    assert record["plan_fixes"]["env"] == {"NCCL_P2P_DISABLE": "1"}


def test_no_fix_when_p2p_off_hangs_too(monkeypatch):
    fake(monkeypatch, hang=["0,1", "off:0,1"])
    record = run([0, 1], timeout=1.0)
    assert ids(record) == ["preflight-allreduce-hang", "preflight-no-fix"]
    assert record["plan_fixes"] == {"env": {}, "server_args": {}}
    assert record["ok"] is False


def test_wrong_data_and_a_crashing_pair(monkeypatch):
    fake(monkeypatch, wrong=["0:1"], die=["1:0"])
    record = run([0, 1])
    assert entry(record, 0, 1)["status"] == "wrong" and entry(record, 0, 1)["wrong"] == 7
    failed = entry(record, 1, 0)
    assert failed["status"] == "failed" and "exited with 3" in failed["error"] and "Segmentation fault" in failed["error"]
    assert entry(record, 1, 1)["status"] == "ok"        # measured by the restarted session
    assert ids(record)[:2] == ["preflight-wrong-result", "preflight-step-failed"]
    assert record["plan_fixes"]["env"] == {"NCCL_P2P_DISABLE": "1"}


def test_worker_that_cannot_start(monkeypatch):
    fake(monkeypatch, start="crash")
    record = run([0, 1])
    assert record["env"] == {"status": "failed", "error": "ModuleNotFoundError: No module named 'torch'"}
    assert ids(record) == ["preflight-worker-failed"] and record["ok"] is False
    assert all(g["status"] == "skipped" for g in record["groups"])
    assert len(record["steps"]) == 1                    # one try, not one per pair


def test_worker_stuck_before_the_first_item(monkeypatch):
    fake(monkeypatch, start="hang")
    record = run([0, 1], timeout=1.0)
    assert record["env"]["status"] == "hang" and "began nothing within 1s" in record["env"]["error"]
    assert record["ok"] is False


def test_unkillable_step_stops_the_run(monkeypatch):
    def stuck(command, timeout, env):
        return {"status": "hang", "returncode": None, "seconds": timeout, "lines": [
            {"event": "result", "step": "env", "t": 0.1}, {"event": "begin", "src": 0, "dst": 0, "t": 0.2}],
            "output_tail": "", "stderr_tail": "", "unkillable": True}
    record = preflight.run_preflight(sys.executable, FAKE, [0, 1], settings={"step_timeout": 1}, run=stuck)
    assert entry(record, 0, 0)["status"] == "hang"
    assert {p["status"] for p in record["pairs"][1:]} == {"skipped"}
    assert "preflight-unkillable" in ids(record) and record["ok"] is False
    assert len(record["steps"]) == 1


def test_slow_pair_against_its_tier_and_p2p_off_only_when_faster(monkeypatch):
    facts = {"links": [["X", "NODE"], ["NODE", "X"]],
             "gpus": [{"pcie": {"max_gen": 5, "max_width": 16}}, {"pcie": {"max_gen": 5, "max_width": 16}}]}
    fake(monkeypatch, pairs={"0:1": {"gbps": 12.0}}, busbw=8.0, off_busbw=9.0)
    record = run([0, 1], facts=facts)
    assert "preflight-p2p-slow" in ids(record)
    slow = next(f for f in record["findings"] if f["id"] == "preflight-p2p-slow")
    assert "0->1 12.0 GB/s, expected ~50 from its NODE link" in slow["message"]
    assert entry(record, 0, 1, off=True)["status"] == "ok"          # only the slow pair is measured again
    assert not any(p["p2p_disabled"] for p in record["pairs"] if (p["src"], p["dst"]) == (1, 0))
    assert record["plan_fixes"]["env"] == {"NCCL_P2P_DISABLE": "1"}      # measured 9 > 8 with P2P off
    fake(monkeypatch, pairs={"0:1": {"gbps": 12.0}}, busbw=8.0, off_busbw=4.0)
    record = run([0, 1], facts=facts)
    assert "preflight-p2p-slow" in ids(record) and record["plan_fixes"]["env"] == {}


def test_p2p_disable_never_and_always(monkeypatch):
    fake(monkeypatch, hang=["0:1"])
    never = run([0, 1], timeout=1.0, mode="never")
    assert not any(p["p2p_disabled"] for p in never["pairs"]) and never["plan_fixes"]["env"] == {}
    assert "preflight-no-fix" in ids(never)          # nothing measured with P2P off: no fix to offer
    fake(monkeypatch)
    always = run([0, 1], mode="always")
    assert entry(always, 0, 1, off=True)["gbps"] == 10.0 and group(always, [0, 1], off=True)["busbw_gbps"] == 5.0
    assert always["plan_fixes"]["env"] == {}          # nothing wrong with P2P: keep it


def _two_socket_facts():
    """4 GPUs, 0-1 and 2-3 on their own socket (NODE inside, SYS across), PCIe Gen5 x16."""
    words = [["X", "NODE", "SYS", "SYS"], ["NODE", "X", "SYS", "SYS"], ["SYS", "SYS", "X", "NODE"],
             ["SYS", "SYS", "NODE", "X"]]
    return {"links": words, "gpus": [{"pcie": {"max_gen": 5, "max_width": 16}} for _ in range(4)]}


def test_cross_socket_p2p_proven_only_when_sys_level_works_and_is_faster(monkeypatch):
    facts = _two_socket_facts()
    fake(monkeypatch, gbps=45.0, busbw=24.7, sys_busbw=38.0)
    record = run([0, 1, 2, 3], facts=facts)
    # only the group that crosses the sockets is measured again, with NCCL_P2P_LEVEL=SYS, in one more session
    sys_groups = [g for g in record["groups"] if g["p2p_level"] == "SYS"]
    assert [g["gpus"] for g in sys_groups] == [[0, 1, 2, 3]] and sys_groups[0]["busbw_gbps"] == 38.0
    assert record["steps"][-1]["name"] == "allreduce (P2P level SYS)"
    assert record["steps"][-1]["env"] == {"NCCL_P2P_LEVEL": "SYS"}
    cross = record["figures"]["cross_socket_p2p"]
    assert cross["proven"] is True and cross["allreduce_by_size"] == {"4": {"busbw_gbps": 38.0, "latency_us": 13.6}}
    assert "0,1,2,3 38.0 vs 24.7 GB/s" in cross["reason"]
    # the default figures stay NCCL's own level: the SYS run is not the 4-GPU group's figure
    assert record["figures"]["allreduce_by_size"]["4"]["busbw_gbps"] == 24.7
    assert record["findings"] == [] and any("proven, the plan sets it" in line for line in record["tables"]["report"])
    assert "  sys " in record["tables"]["allreduce"]
    # slower with SYS: not proven; a hang with SYS: a warning, and the default plan stays safe
    fake(monkeypatch, gbps=45.0, busbw=24.7, sys_busbw=20.0)
    assert run([0, 1, 2, 3], facts=facts)["figures"]["cross_socket_p2p"]["proven"] is False
    fake(monkeypatch, gbps=45.0, busbw=24.7, hang=["sys:0,1,2,3"])
    hung = run([0, 1, 2, 3], timeout=1.0, facts=facts)
    assert ids(hung) == ["preflight-p2p-sys-unsafe"] and hung["ok"] is True
    assert hung["figures"]["cross_socket_p2p"]["proven"] is False and hung["plan_fixes"]["env"] == {}


def test_no_cross_socket_run_without_facts_or_on_a_broken_box(monkeypatch):
    fake(monkeypatch, busbw=24.7, sys_busbw=38.0)
    record = run([0, 1, 2, 3])                                   # no facts: nobody knows where the sockets are
    assert not any(g["p2p_level"] for g in record["groups"])
    assert record["figures"]["cross_socket_p2p"]["proven"] is False
    fake(monkeypatch, busbw=24.7, sys_busbw=38.0, hang=["1:2"])
    record = run([0, 1, 2, 3], timeout=1.0, facts=_two_socket_facts())
    assert not any(g["p2p_level"] for g in record["groups"]) and record["plan_fixes"]["env"]


def test_bad_mode():
    with pytest.raises(preflight.PreflightError, match="p2p_disable: 'sometimes' is not one of"):
        preflight.run_preflight(sys.executable, FAKE, [0], p2p_disable="sometimes")


# ------------------------------------------------------------------------------------------- tables, figures

def _small_record():
    return {"gpus": [0, 1], "settings": dict(preflight.DEFAULTS), "env": {"status": "ok"}, "pairs": [
        {"src": 0, "dst": 0, "gbps": 2100.4, "latency_us": 1.5, "status": "ok", "p2p_disabled": False, "local": True},
        {"src": 0, "dst": 1, "gbps": 54.25, "latency_us": 0.41, "status": "ok", "p2p_disabled": False, "local": False},
        {"src": 1, "dst": 1, "gbps": 2099.0, "latency_us": 1.5, "status": "ok", "p2p_disabled": False, "local": True},
        {"src": 1, "dst": 0, "gbps": None, "latency_us": None, "status": "hang", "p2p_disabled": False, "local": False}],
        "groups": [{"gpus": [0, 1], "size": 2, "status": "ok", "p2p_disabled": False, "bytes": 1 << 28,
                    "small_bytes": 8192, "latency_us": 6.8, "algbw_gbps": 38.6, "busbw_gbps": 38.6, "wrong": 0}]}


def test_render_matrix_is_p2p_bandwidth_latency_test_layout():
    record = _small_record()
    assert preflight.render_matrix(record) == (
        "Unidirectional P2P=Enabled Bandwidth Matrix (GB/s)\n"
        "   D\\D     0      1\n"
        "     0 2100.40  54.25\n"
        "     1   hang 2099.00\n")
    assert preflight.render_matrix(record, "latency_us") == (
        "P2P=Enabled Latency Matrix (us)\n   D\\D     0      1\n     0      -   0.41\n     1   hang      -\n")
    assert preflight.render_matrix(record, p2p_disabled=True) == ""


def test_render_allreduce_is_nccl_tests_columns():
    lines = preflight.render_allreduce(_small_record()).splitlines()
    assert lines[1].split() == ["#", "gpus", "p2p", "size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong"]
    assert lines[3].split() == ["0,1", "on", "8192", "2048", "float", "sum", "6.80", "1.20", "1.20", "0"]
    assert lines[4].split() == ["0,1", "on", "268435456", "67108864", "float", "sum", "6954.29", "38.60", "38.60", "0"]


def test_estimate_formula():
    costs = {"p2p_startup_seconds": 4.4, "per_pair_seconds": 0.17, "per_local_seconds": 0.035,
             "allreduce_startup_seconds": 3.5, "per_group_seconds": {"2": 1.0, "8": 2.3}}
    # 4.4 + 56 * 0.17 + 8 * 0.035 + 3.5 + (4 x 1.0 + 2 x 2.3 (4 not measured: the largest) + 2.3)
    assert preflight.estimate_seconds(costs, 8, [2, 2, 2, 2, 4, 4, 8]) == round(
        4.4 + 56 * 0.17 + 8 * 0.035 + 3.5 + 4 * 1.0 + 3 * 2.3, 1)


def test_derive_is_a_pure_function_of_the_measurements(monkeypatch):
    fake(monkeypatch, hang=["0:1"])
    record = run([0, 1], timeout=1.0)
    again = preflight.derive(json.loads(json.dumps(record)))
    assert again == json.loads(json.dumps(record))
