"""Action plugin sglang_bench (was the module bench_record): record runs, find a run of this server at this
workload; run as Ansible runs it, what it records is measured."""
import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.topolaunch.sglang.plugins.action import sglang_bench
from ansible_collections.topolaunch.sglang.plugins.plugin_utils.results import load_runs, load_tunes, measured_records
from bench_cases import BENCH, CANDIDATES, FINAL, OUTCOMES, PLAN, SELECTION, record_args

def test_record_then_measured(tmp_path, run_action):
    out = run_action(sglang_bench, record_args(tmp_path))
    assert out["changed"] is True and out["failures"] == [] and out["message"] == "" and out["stage"] == "bench"
    assert out["run_id"] == "20261130T101502Z"
    measured = measured_records(load_runs(str(tmp_path)), fingerprint="a1b2c3d4e5f6")
    assert [(m["layout"], m["max_concurrency"], m["output_throughput"]) for m in measured] == [("tp8", 1, 321.0)]


def test_record_partial_reports_the_failure(tmp_path, run_action):
    out = run_action(sglang_bench, record_args(tmp_path, completed=3))
    assert out["message"] == "bench of tp8 failed at concurrency 1: completed 3 of 8 prompts"
    assert any(f.endswith(".error.json") for f in out["files"])
    assert measured_records(load_runs(str(tmp_path))) == []  # a partial point is not a fair number


def test_record_check_mode_writes_nothing(tmp_path, run_action):
    out = run_action(sglang_bench, record_args(tmp_path), check_mode=True)
    assert out["run_id"] == "20261130T101502Z"
    assert list(tmp_path.iterdir()) == []


def test_record_bad_input_fails_by_name(tmp_path, run_action):
    with pytest.raises(AnsibleActionFail, match="^sglang_bench: not an ISO 8601 time: 'yesterday'$"):
        run_action(sglang_bench, record_args(tmp_path, started="yesterday"))
    with pytest.raises(AnsibleActionFail, match="^sglang_bench: state record needs layout, plan or model$"):
        run_action(sglang_bench, record_args(tmp_path, model="", layout=None, plan=None))
    with pytest.raises(AnsibleActionFail, match="value of state must be one of: record, query, tune, report, got: remember"):
        run_action(sglang_bench, record_args(tmp_path, state="remember"))
    assert list(tmp_path.iterdir()) == []


def _query(tmp_path, run_action, plan=PLAN, points=None, bench=None):
    return run_action(sglang_bench, {"state": "query", "results_dir": str(tmp_path), "plan": plan,
                                     "points": points or [{"max_concurrency": 1, "num_prompts": 8}],
                                     "bench": BENCH if bench is None else bench})


def test_query_finds_this_server_at_this_workload_only(tmp_path, run_action):
    assert _query(tmp_path, run_action) == {"changed": False, "measured_run": None, "stage": "bench"}
    run_id = run_action(sglang_bench, record_args(tmp_path))["run_id"]
    found = _query(tmp_path, run_action)
    assert found["changed"] is False and found["measured_run"]["run_id"] == run_id
    # Another explanation of the same server is the same server.
    assert _query(tmp_path, run_action, plan=dict(PLAN, reason="measured"))["measured_run"]["run_id"] == run_id
    # Another server, other points, another workload: not measured.
    assert _query(tmp_path, run_action, plan=dict(PLAN, argv=["--tp-size", "4"]))["measured_run"] is None
    assert _query(tmp_path, run_action, points=[{"max_concurrency": 4, "num_prompts": 8}])["measured_run"] is None
    assert _query(tmp_path, run_action, bench=dict(BENCH, output_len=32))["measured_run"] is None


def test_query_skips_failed_and_partial_runs(tmp_path, run_action):
    run_action(sglang_bench, record_args(tmp_path, completed=3))
    assert _query(tmp_path, run_action)["measured_run"] is None


def test_tune_and_report_states(tmp_path, run_action):
    run_action(sglang_bench, record_args(tmp_path))
    args = {"state": "tune", "results_dir": str(tmp_path), "model": "glm-5-nvfp4",
            "topology_fingerprint": "a1b2c3d4e5f6", "started": "2026-11-30T10:00:00Z",
            "tune": {"host": "field", "selection": SELECTION, "outcomes": OUTCOMES, "candidates": CANDIDATES,
                     "plan": FINAL, "workload": {"input_len": 64, "output_len": 16, "concurrency": 4}}}
    dry = run_action(sglang_bench, args, check_mode=True)
    assert dry["run_id"] == "20261130T100000Z" and not (tmp_path / "glm-5-nvfp4" / "a1b2c3d4e5f6" /
                                                         "tune-20261130T100000Z.json").exists()
    out = run_action(sglang_bench, args)
    [tune] = load_tunes(str(tmp_path))
    assert out["changed"] and out["files"] == [tune["file"]] and tune["host"] == "field"
    assert "selection" not in tune and tune["winner"] == "tp8" and len(tune["layouts"]) == 4
    with pytest.raises(AnsibleActionFail, match="^sglang_bench: state tune needs tune$"):
        run_action(sglang_bench, dict(args, tune=None))
    assert run_action(sglang_bench, {"state": "report", "results_dir": str(tmp_path)}, check_mode=True)["files"] == []
    assert not (tmp_path / "FINDINGS.md").exists()
    written = run_action(sglang_bench, {"state": "report", "results_dir": str(tmp_path),
                                        "out_dir": str(tmp_path / "out")})["files"]
    assert written[0] == str(tmp_path / "out" / "FINDINGS.md")
    assert "## Tune of glm-5-nvfp4" in (tmp_path / "out" / "FINDINGS.md").read_text()


def test_query_finds_a_server_across_nodes_under_its_cluster_fingerprint(tmp_path, run_action):
    # bench files a server across nodes under the plan's cluster fingerprint, not node 0's topology fingerprint
    plan = dict(PLAN, cluster_fingerprint="c1c2c3c4c5c6", per_node=[{"node_rank": 0}, {"node_rank": 1}])
    run_id = run_action(sglang_bench, record_args(tmp_path, topology_fingerprint="c1c2c3c4c5c6", plan=plan))["run_id"]
    assert _query(tmp_path, run_action, plan=plan)["measured_run"]["run_id"] == run_id
    # a one-node run of node 0's topology says nothing about the server across nodes
    other = tmp_path / "one-node"
    run_action(sglang_bench, record_args(other, plan=plan))
    assert _query(other, run_action, plan=plan)["measured_run"] is None


def test_a_server_across_nodes_is_filed_under_its_cluster_fingerprint(tmp_path, run_action):
    """Without model and topology_fingerprint, a run and a tune are filed under their plan's: a server across nodes
    under its cluster fingerprint, and found there by a query."""
    two = dict(PLAN, cluster_fingerprint="c1c2c3c4c5c6", per_node=[{"node_rank": 0}, {"node_rank": 1}])
    args = record_args(tmp_path, plan=two)
    del args["model"], args["topology_fingerprint"]
    out = run_action(sglang_bench, args)
    assert out["dir"] == str(tmp_path / "glm-5-nvfp4" / "c1c2c3c4c5c6" / "tp8")
    found = run_action(sglang_bench, {"state": "query", "results_dir": str(tmp_path), "plan": two,
                                      "points": args["points"], "bench": BENCH})["measured_run"]
    assert found["run_id"] == out["run_id"]
    tune = run_action(sglang_bench, {"state": "tune", "results_dir": str(tmp_path), "plan": two,
                                     "started": "2026-11-30T10:00:00Z",
                                     "tune": {"selection": SELECTION, "outcomes": OUTCOMES, "candidates": CANDIDATES,
                                              "plan": FINAL, "workload": {"input_len": 64, "output_len": 16}}})
    assert tune["files"] == [str(tmp_path / "glm-5-nvfp4" / "c1c2c3c4c5c6" / "tune-20261130T100000Z.json")]
    assert load_tunes(str(tmp_path), fingerprint="c1c2c3c4c5c6")
