"""bench_record module: a thin wrapper, run through main() as Ansible would; what it records is measured."""
import json

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.topolaunch.sglang.plugins.modules import bench_record
from ansible_collections.topolaunch.sglang.plugins.plugin_utils.bench import load_runs, measured_records
from test_results import bench_line


def run(module, args, capsys, check_mode=False):
    if check_mode:
        args = dict(args, _ansible_check_mode=True)
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        module.main()
    return exc.value.code, json.loads(capsys.readouterr().out)


def record_args(tmp_path, completed=8):
    return {"results_dir": str(tmp_path), "model": "glm-5-nvfp4", "topology_fingerprint": "a1b2c3d4e5f6",
            "layout": "tp8", "started": "2026-11-30T10:15:02Z",
            "points": [{"max_concurrency": 1, "num_prompts": 8}],
            "lines": bench_line(concurrency=1, completed=completed, output_throughput=321.0) + "\n",
            "meta": {"host": "field"}, "versions": {"sglang": "0.5.9"}}


def test_record_then_measured(tmp_path, capsys):
    rc, out = run(bench_record, record_args(tmp_path), capsys)
    assert rc == 0 and out["changed"] is True and out["failures"] == [] and out["message"] == ""
    assert out["run_id"] == "20261130T101502Z"
    measured = measured_records(load_runs(str(tmp_path)), fingerprint="a1b2c3d4e5f6")
    assert [(m["layout"], m["max_concurrency"], m["output_throughput"]) for m in measured] == [("tp8", 1, 321.0)]


def test_record_partial_reports_the_failure(tmp_path, capsys):
    rc, out = run(bench_record, record_args(tmp_path, completed=3), capsys)
    assert rc == 0
    assert out["message"] == "bench of tp8 failed at concurrency 1: completed 3 of 8 prompts"
    assert any(f.endswith(".error.json") for f in out["files"])
    assert measured_records(load_runs(str(tmp_path))) == []  # a partial point is not a fair number


def test_record_check_mode_writes_nothing(tmp_path, capsys):
    rc, out = run(bench_record, record_args(tmp_path), capsys, check_mode=True)
    assert rc == 0 and out["run_id"] == "20261130T101502Z"
    assert list(tmp_path.iterdir()) == []


def test_record_bad_input_fails_by_name(tmp_path, capsys):
    args = dict(record_args(tmp_path), started="yesterday")
    rc, out = run(bench_record, args, capsys)
    assert rc == 1 and out["msg"] == "bench_record: not an ISO 8601 time: 'yesterday'"
    assert list(tmp_path.iterdir()) == []
