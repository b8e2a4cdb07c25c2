"""results.py: bench_serving lines in SGLang's documented schema, storage that never overwrites, summary math."""
import json
import math
import os

import pytest

from ansible_collections.topolaunch.sglang.plugins.plugin_utils import results
from bench_cases import SERVER_INFO_REAL, SERVER_INFO_SIM, bench_line, tune_data

# ------------------------------------------------------------------------------------------------ parsing


def test_parse_line_maps_sglang_fields():
    point = results.parse_line(bench_line(concurrency=32, completed=128, output_throughput=4180.5), num_prompts=128)
    assert point["max_concurrency"] == 32
    assert point["completed"] == 128
    assert point["status"] == results.STATUS_OK
    assert point["output_throughput"] == 4180.5
    assert point["total_throughput"] == pytest.approx(4180.5 * 3)
    assert (point["ttft_p50_ms"], point["ttft_p99_ms"]) == (100.0, 250.0)
    assert (point["itl_p50_ms"], point["itl_p99_ms"]) == (11.5, 19.0)
    assert point["e2e_p50_ms"] == 480.0
    assert (point["input_len"], point["output_len"]) == (64, 32)
    assert point["server_version"] == "0.5.9"
    assert point["simulated"] is False


def test_partial_failure_line_is_recorded_as_partial():
    point = results.parse_line(bench_line(concurrency=8, completed=20), num_prompts=32)
    assert point["status"] == results.STATUS_PARTIAL
    assert point["completed"] == 20 and point["num_prompts"] == 32


def test_all_failed_line_with_nan_statistics():
    # bench_serving writes NaN statistics when nothing completed
    line = bench_line(completed=0, output_throughput=0.0, median_ttft_ms=float("nan"), p99_itl_ms=float("nan"))
    point = results.parse_line(line, num_prompts=32)
    assert point["status"] == results.STATUS_FAILED
    assert point["ttft_p50_ms"] is None and point["itl_p99_ms"] is None


def test_unknown_prompt_count_is_ok_when_something_completed():
    assert results.parse_line(bench_line(completed=5))["status"] == results.STATUS_OK


def test_simulated_server_info_is_detected():
    assert results.parse_line(bench_line(server_info=SERVER_INFO_SIM))["simulated"] is True
    assert results.parse_line(bench_line(server_info={"version": "0.5.9+sim"}))["simulated"] is True
    assert results.is_simulated({}, "0.5.9+sim") is True
    assert results.is_simulated({"version": "0.5.9"}, "0.5.9") is False


@pytest.mark.parametrize("text, needle", [
    ("not json", "not JSON"),
    ("[1, 2]", "JSON object"),
    (json.dumps({"completed": 3}), "missing max_concurrency, output_throughput, duration"),
    (bench_line(concurrency=0), "max_concurrency must be a positive integer, got 0"),
    (bench_line(completed=-1), "completed must be a non-negative integer, got -1"),
    (bench_line(total_throughput="fast"), "'total_throughput' must be a number, got 'fast'"),
])
def test_bad_lines_are_rejected_by_name(text, needle):
    with pytest.raises(results.ResultsError, match="where-7") as info:
        results.parse_line(text, where="where-7")
    assert needle in str(info.value)


def test_parse_jsonl_numbers_lines_and_applies_prompt_counts():
    text = bench_line(concurrency=1, completed=8) + "\n\n" + bench_line(concurrency=8, completed=30) + "\n"
    points = results.parse_jsonl(text, {1: 8, 8: 32})
    assert [(p["max_concurrency"], p["status"], p["line"]) for p in points] == [(1, "ok", 1), (8, "partial", 3)]


def test_check_points_names_every_kind_of_failure():
    asked = [{"max_concurrency": 1, "num_prompts": 8}, {"max_concurrency": 8, "num_prompts": 32},
             {"max_concurrency": 32, "num_prompts": 64}]
    points = results.parse_jsonl(bench_line(concurrency=1, completed=8) + "\n" + bench_line(concurrency=8, completed=31),
                                 {1: 8, 8: 32})
    assert results.check_points(asked[:1], points) == []
    got = results.check_points(asked, points, {"max_concurrency": 32, "rc": 1, "stderr": "boom\nConnectionRefused"})
    assert [(f["max_concurrency"], f["reason"]) for f in got] == [
        (8, "completed 31 of 32 prompts"),
        (32, "client failed (exit code 1): ConnectionRefused"),
    ]
    timed_out = results.check_points(asked[2:], [], {"max_concurrency": 32, "rc": 124, "stderr": "",
                                                     "msg": "timed out after 120 s (bench_point_timeout)"})
    assert timed_out[0]["reason"] == "client failed (exit code 124): timed out after 120 s (bench_point_timeout)"
    generic = results.check_points(asked[2:], [], {"max_concurrency": 32, "rc": 1, "msg": "non-zero return code"})
    assert generic[0]["reason"] == "client failed (exit code 1): no output"
    on_stdout = results.check_points(asked[2:], [], {"max_concurrency": 32, "rc": 1, "msg": "non-zero return code",
                                                     "stderr": "", "stdout": "args...\nFailed to fetch model"})
    assert on_stdout[0]["reason"] == "client failed (exit code 1): Failed to fetch model"
    missing = results.check_points(asked, points[:1])
    assert [f["max_concurrency"] for f in missing] == [8, 32]
    assert missing[1]["reason"] == "no result line from bench_serving"


# ------------------------------------------------------------------------------------------------ storage


def record(tmp_path, layout="tp8", started="2026-11-30T10:15:02Z", points=((1, 8, 900.0), (8, 32, 3000.0)),
           completed=None, **kwargs):
    requested = [{"max_concurrency": c, "num_prompts": n} for c, n, _ in points]
    lines = "".join(bench_line(concurrency=c, completed=(completed or {}).get(c, n), output_throughput=tp) + "\n"
                    for c, n, tp in points)
    kwargs.setdefault("plan", {"layout": {"name": layout}, "model_name": "glm-5-nvfp4"})
    kwargs.setdefault("versions", {"sglang": "0.5.9"})
    kwargs.setdefault("topology", {"fingerprint": "a1b2c3d4e5f6", "gpu_count": 8})
    return results.record_run(str(tmp_path), "glm-5-nvfp4", "a1b2c3d4e5f6", layout, started, requested, lines,
                              meta={"bench": {"seed": 1}}, **kwargs)


def test_record_run_writes_the_run_beside_its_provenance(tmp_path):
    out = record(tmp_path)
    assert out["run_id"] == "20261130T101502Z"
    assert out["failures"] == []
    directory = tmp_path / "glm-5-nvfp4" / "a1b2c3d4e5f6" / "tp8"
    assert sorted(os.listdir(directory)) == [
        "20261130T101502Z.jsonl", "20261130T101502Z.meta.json", "20261130T101502Z.plan.json",
        "20261130T101502Z.topology.json", "20261130T101502Z.versions.json"]
    meta = json.loads((directory / "20261130T101502Z.meta.json").read_text())
    assert meta["points"] == [{"max_concurrency": 1, "num_prompts": 8}, {"max_concurrency": 8, "num_prompts": 32}]
    assert meta["bench"] == {"seed": 1} and meta["layout"] == "tp8"
    assert len((directory / "20261130T101502Z.jsonl").read_text().splitlines()) == 2


def test_results_are_never_overwritten(tmp_path):
    first = record(tmp_path, points=((1, 8, 900.0),))
    directory = tmp_path / "glm-5-nvfp4" / "a1b2c3d4e5f6" / "tp8"
    before = (directory / "20261130T101502Z.jsonl").read_text()
    second = record(tmp_path, points=((1, 8, 950.0),))  # same second
    third = record(tmp_path, points=((1, 8, 990.0),))
    assert (first["run_id"], second["run_id"], third["run_id"]) == (
        "20261130T101502Z", "20261130T101502Z-2", "20261130T101502Z-3")
    assert (directory / "20261130T101502Z.jsonl").read_text() == before
    assert "950.0" in (directory / "20261130T101502Z-2.jsonl").read_text()


def test_write_new_refuses_an_existing_file(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text("keep")
    with pytest.raises(FileExistsError):
        results._write_new(str(path), "other")
    assert path.read_text() == "keep"


def test_check_mode_writes_nothing(tmp_path):
    out = record(tmp_path, write=False)
    assert out["run_id"] == "20261130T101502Z"
    assert not os.path.exists(tmp_path / "glm-5-nvfp4")


def test_partial_run_is_kept_with_an_error_marker(tmp_path):
    out = record(tmp_path, completed={8: 20})
    assert [(f["max_concurrency"], f["completed"]) for f in out["failures"]] == [(8, 20)]
    directory = tmp_path / "glm-5-nvfp4" / "a1b2c3d4e5f6" / "tp8"
    error = json.loads((directory / "20261130T101502Z.error.json").read_text())
    assert error["stage"] == "bench"
    assert error["message"] == "bench of tp8 failed at concurrency 8: completed 20 of 32 prompts"
    assert len((directory / "20261130T101502Z.jsonl").read_text().splitlines()) == 2  # the line is kept


def test_failed_layout_without_bench_is_recorded(tmp_path):
    out = results.record_run(str(tmp_path), "glm-5-nvfp4", "a1b2c3d4e5f6", "tp3", "2026-11-30T10:15:02+00:00", [],
                             error={"stage": "plan", "message": "tp 3 does not divide 64 attention heads"})
    assert [os.path.basename(f) for f in out["files"]] == ["20261130T101502Z.error.json"]
    runs = results.load_runs(str(tmp_path))
    assert results.failures(runs) == [{
        "model": "glm-5-nvfp4", "topology_fingerprint": "a1b2c3d4e5f6", "layout": "tp3",
        "run_id": "20261130T101502Z", "stage": "plan", "message": "tp 3 does not divide 64 attention heads"}]


def test_nothing_to_record_is_an_error(tmp_path):
    with pytest.raises(results.ResultsError, match="nothing to record for layout tp8"):
        results.record_run(str(tmp_path), "m", "fp", "tp8", "2026-11-30T10:15:02Z", [])


@pytest.mark.parametrize("bad, needle", [
    ("yesterday", "not an ISO 8601 time: 'yesterday'"),
    ("2026-11-30T10:15:02", "has no time zone"),
])
def test_run_id_needs_a_utc_time(bad, needle):
    with pytest.raises(results.ResultsError, match=needle):
        results.run_id_for(bad)


def test_run_id_converts_to_utc():
    assert results.run_id_for("2026-11-30T12:15:02+02:00") == "20261130T101502Z"


@pytest.mark.parametrize("name, safe", [("glm-5-nvfp4", "glm-5-nvfp4"), ("zai-org/GLM-5", "zai-org_GLM-5"),
                                        ("a b", "a_b")])
def test_safe_name(name, safe):
    assert results.safe_name(name) == safe


@pytest.mark.parametrize("bad", ["", "..", None])
def test_safe_name_rejects(bad):
    with pytest.raises(results.ResultsError):
        results.safe_name(bad)


def test_requested_points_are_validated(tmp_path):
    with pytest.raises(results.ResultsError, match="num_prompts must be a positive integer, got 0"):
        results.record_run(str(tmp_path), "m", "fp", "tp8", "2026-11-30T10:15:02Z",
                           [{"max_concurrency": 1, "num_prompts": 0}])


# ------------------------------------------------------------------------------------------------ summary


def field_results(tmp_path):
    """tp8 ahead at high concurrency, tp4pp2 ahead at concurrency 1, like nothing in particular."""
    record(tmp_path, "tp8", "2026-11-30T10:00:00Z", ((1, 8, 100.0), (8, 32, 800.0), (32, 64, 2000.0)))
    record(tmp_path, "tp4pp2", "2026-11-30T10:05:00Z", ((1, 8, 110.0), (8, 32, 700.0), (32, 64, 1600.0)))


def test_best_layout_per_concurrency_and_margin(tmp_path):
    field_results(tmp_path)
    [group] = results.summarize(results.load_runs(str(tmp_path)))
    assert (group["model"], group["topology_fingerprint"], group["input_len"], group["output_len"]) == (
        "glm-5-nvfp4", "a1b2c3d4e5f6", 64, 32)
    best = {(r["max_concurrency"]): (r["best"], r["runner_up"], round(r["margin_pct"], 3)) for r in group["best"]}
    assert best == {1: ("tp4pp2", "tp8", 10.0), 8: ("tp8", "tp4pp2", round(100 / 7, 3)), 32: ("tp8", "tp4pp2", 25.0)}
    assert group["winner"]["layout"] == "tp8"
    assert group["winner"]["max_concurrency"] == 32
    assert group["winner"]["margin_pct"] == pytest.approx(25.0)
    assert group["simulated"] is False


def test_newest_complete_point_wins_and_partial_points_never_count(tmp_path):
    field_results(tmp_path)
    record(tmp_path, "tp4pp2", "2026-11-30T11:00:00Z", ((32, 64, 2500.0),))  # newer and faster: counts
    record(tmp_path, "tp8", "2026-11-30T11:05:00Z", ((32, 64, 9999.0),), completed={32: 10})  # partial: ignored
    [group] = results.summarize(results.load_runs(str(tmp_path)))
    assert group["layouts"]["tp4pp2"][32]["output_throughput"] == 2500.0
    assert group["layouts"]["tp8"][32]["output_throughput"] == 2000.0
    assert group["winner"]["layout"] == "tp4pp2"
    assert group["winner"]["margin_pct"] == pytest.approx(25.0)
    fails = results.failures(results.load_runs(str(tmp_path)))
    assert [(f["layout"], f["message"]) for f in fails] == [
        ("tp8", "bench of tp8 failed at concurrency 32: completed 10 of 64 prompts")]


def test_single_layout_has_no_margin(tmp_path):
    record(tmp_path, "tp8", points=((1, 8, 100.0),))
    [group] = results.summarize(results.load_runs(str(tmp_path)))
    assert group["best"][0]["runner_up"] is None and group["best"][0]["margin_pct"] is None
    assert group["winner"]["runner_up"] is None


def test_workloads_are_never_mixed(tmp_path):
    record(tmp_path, "tp8", points=((1, 8, 100.0),))
    other = results.record_run(str(tmp_path), "glm-5-nvfp4", "a1b2c3d4e5f6", "tp4pp2", "2026-11-30T12:00:00Z",
                               [{"max_concurrency": 1, "num_prompts": 8}],
                               bench_line(concurrency=1, completed=8, output_throughput=500.0, input_len=1024))
    assert other["failures"] == []
    groups = results.summarize(results.load_runs(str(tmp_path)))
    assert [(g["input_len"], sorted(g["layouts"])) for g in groups] == [(64, ["tp8"]), (1024, ["tp4pp2"])]


def test_simulated_runs_are_marked(tmp_path):
    record(tmp_path, "tp8", points=((1, 8, 100.0),), versions={"sglang": "0.5.9+sim"})
    [group] = results.summarize(results.load_runs(str(tmp_path)))
    assert group["simulated"] is True
    assert results.measured_records(results.load_runs(str(tmp_path)))[0]["simulated"] is True


def test_measured_records_for_the_planner(tmp_path):
    field_results(tmp_path)
    record(tmp_path, "tp8", "2026-11-30T11:05:00Z", ((32, 64, 9999.0),), completed={32: 10})
    runs = results.load_runs(str(tmp_path))
    records = results.measured_records(runs, model="glm-5-nvfp4", fingerprint="a1b2c3d4e5f6")
    assert len(records) == 6
    tp8_32 = [r for r in records if r["layout"] == "tp8" and r["max_concurrency"] == 32]
    assert len(tp8_32) == 1 and tp8_32[0]["output_throughput"] == 2000.0  # the partial 9999 never counts
    for key in ("model", "topology_fingerprint", "layout", "max_concurrency", "output_throughput", "source"):
        assert key in tp8_32[0]
    assert tp8_32[0]["source"] == "measured"
    assert results.measured_records(runs, fingerprint="000000000000") == []
    assert results.measured_records(runs, model="glm-4.7") == []


def test_load_runs_filters_and_rejects_corrupt_files(tmp_path):
    field_results(tmp_path)
    assert {r["layout"] for r in results.load_runs(str(tmp_path), fingerprint="a1b2c3d4e5f6")} == {"tp8", "tp4pp2"}
    assert results.load_runs(str(tmp_path), fingerprint="ffffffffffff") == []
    assert results.load_runs(str(tmp_path / "missing")) == []
    bad = tmp_path / "glm-5-nvfp4" / "a1b2c3d4e5f6" / "tp8" / "20261130T120000Z.jsonl"
    bad.write_text("{broken\n")
    bad.with_name("20261130T120000Z.meta.json").write_text('{"points": []}')  # stored in full: read
    with pytest.raises(results.ResultsError, match="20261130T120000Z.jsonl line 1: not JSON"):
        results.load_runs(str(tmp_path))


def test_nan_throughput_never_wins():
    point = results.parse_line(bench_line(output_throughput=float("nan")))
    assert point["output_throughput"] is None
    layouts = {"a": {1: dict(point, max_concurrency=1)}, "b": {1: dict(point, max_concurrency=1, output_throughput=5.0)}}
    assert results.winner(layouts)["layout"] == "b"
    assert not math.isnan(results.best_per_concurrency(layouts)[0]["output_throughput"])


def test_broken_client_output_is_kept_and_marked(tmp_path):
    text = bench_line(concurrency=1, completed=8) + "\n" + bench_line(concurrency=8)[:40]  # killed mid-write
    out = results.record_run(str(tmp_path), "m", "fp", "tp8", "2026-11-30T10:15:02Z",
                             [{"max_concurrency": 1, "num_prompts": 8}, {"max_concurrency": 8, "num_prompts": 32}],
                             text, client_error={"max_concurrency": 8, "rc": -9, "msg": "killed"})
    directory = tmp_path / "m" / "fp" / "tp8"
    assert (directory / "20261130T101502Z.jsonl").read_text() == text
    error = json.loads((directory / "20261130T101502Z.error.json").read_text())
    assert error["message"].startswith("unreadable bench_serving output: bench_serving output line 2: not JSON")
    assert [f["max_concurrency"] for f in out["failures"]] == [1, 8]
    runs = results.load_runs(str(tmp_path))
    assert runs[0]["points"] == [] and results.failures(runs)[0]["message"] == error["message"]


def test_the_api_key_bench_serving_copies_from_server_info_is_not_stored(tmp_path):
    # SGLang 0.5.9 returns every server arg in /server_info, --api-key in clear; bench_serving copies it per line.
    info = dict(SERVER_INFO_REAL, api_key="sk-secret-123", admin_api_key=None)
    lines = bench_line(concurrency=1, completed=8, server_info=info) + "\n" + "not json\n"
    out = results.record_run(str(tmp_path), "glm-5-nvfp4", "a1b2c3d4e5f6", "tp8", "2026-11-30T10:15:02Z",
                             [{"max_concurrency": 1, "num_prompts": 8}], lines)
    stored = (tmp_path / "glm-5-nvfp4" / "a1b2c3d4e5f6" / "tp8" / (out["run_id"] + ".jsonl")).read_text()
    assert "sk-secret-123" not in stored
    first, second = stored.splitlines()
    assert json.loads(first)["server_info"]["api_key"] == "<redacted>" and second == "not json"
    assert json.loads(first)["server_info"]["tp_size"] == 8


# A 0.5.23 client line's server_info as the server answers /server_info (523:sglang/srt/utils/common.py:3584-3593,
# 523:http_server.py:853-895): the resolved fields, launch_command (the argv after the --config merge: the config
# file's options first, joined by spaces; 523:server_args.py:717-719), internal_states with the fields again.
def server_info_0_5_23(key):
    fields = {"model_path": "/srv/models/glm-5-nvfp4", "tp_size": 8, "pp_size": 1, "api_key": key,
              "admin_api_key": None, "ssl_keyfile_password": "pem-pass-77", "watermark_config": None}
    return dict(fields, launch_command=(
        "--api-key %s --ssl-keyfile-password=pem-pass-77 --model-path /srv/models/glm-5-nvfp4 --tp-size 8 "
        "--host 127.0.0.1 --port 30000 --config /etc/topolaunch/sglang-args.yaml" % key),
        status="ready", max_total_num_tokens=1200000, kv_events=None, startup_time=12.5,
        internal_states=[dict(fields, last_gen_throughput=812.5, memory_usage={"weight": 51.5})],
        version="0.5.23", frontend="python")


@pytest.mark.parametrize("info", [
    server_info_0_5_23("sk-secret-123"),
    # 0.5.9: asdict(server_args) + internal_states + version, the key in both (59:http_server.py:583-610)
    dict(SERVER_INFO_REAL, api_key="sk-secret-123", internal_states=[dict(SERVER_INFO_REAL, api_key="sk-secret-123")]),
])
def test_every_copy_of_the_api_key_in_a_client_line_is_redacted(tmp_path, info):
    """Top level, each internal_states entry and 0.5.23's launch_command: nothing of the key (or the TLS key's
    password) is stored; everything else is as the client wrote it."""
    line = bench_line(concurrency=1, completed=8, server_info=info)
    out = results.record_run(str(tmp_path), "glm-5-nvfp4", "a1b2c3d4e5f6", "tp8", "2026-11-30T10:15:02Z",
                             [{"max_concurrency": 1, "num_prompts": 8}], line + "\n")
    stored = (tmp_path / "glm-5-nvfp4" / "a1b2c3d4e5f6" / "tp8" / (out["run_id"] + ".jsonl")).read_text()
    assert "sk-secret-123" not in stored and "pem-pass-77" not in stored
    got = json.loads(stored)["server_info"]
    assert got["api_key"] == got["internal_states"][0]["api_key"] == "<redacted>"
    if "launch_command" in info:
        assert got["launch_command"] == (
            "--api-key <redacted> --ssl-keyfile-password=<redacted> --model-path /srv/models/glm-5-nvfp4 "
            "--tp-size 8 --host 127.0.0.1 --port 30000 --config /etc/topolaunch/sglang-args.yaml")
        assert got["ssl_keyfile_password"] == "<redacted>" and got["admin_api_key"] is None
    expected = json.loads(line)
    for key in ("api_key", "ssl_keyfile_password", "launch_command", "internal_states"):
        expected["server_info"].pop(key, None)
        got.pop(key, None)
    assert dict(json.loads(stored), server_info=got) == expected
    assert out["points"][0]["status"] == "ok"


def test_a_key_only_in_the_launch_command_is_redacted_too():
    """A key in launch_command alone (any spelling of the flag) goes as well; a line without secrets is untouched."""
    info = {"launch_command": "--model-path /m --api_key=abc123 --admin-api-key root-k3y", "version": "0.5.23"}
    line = bench_line(server_info=info) + "\n"
    got = json.loads(results.scrub_secrets(line))["server_info"]["launch_command"]
    assert got == "--model-path /m --api_key=<redacted> --admin-api-key <redacted>"
    clean = bench_line(server_info=dict(info, launch_command="--model-path /m --tp-size 8")) + "\n"
    assert results.scrub_secrets(clean) == clean


def test_every_copy_of_a_secret_in_server_info_is_redacted(tmp_path):
    """Both versions repeat the server args in internal_states; 0.5.23 returns its launch command (a --config file's
    options merged in) as launch_command."""
    info = dict(SERVER_INFO_REAL, api_key="sk-secret-123", ssl_keyfile_password="pw-456",
                internal_states=[{"api_key": "sk-secret-123", "last_gen_throughput": 1.0}],
                launch_command=["python", "-m", "sglang.launch_server", "--api-key", "sk-secret-123",
                                "--ssl-keyfile-password=pw-456", "--tp-size", "8"])
    lines = bench_line(concurrency=1, completed=8, server_info=info) + "\n"
    out = results.record_run(str(tmp_path), "glm-5-nvfp4", "a1b2c3d4e5f6", "tp8", "2026-11-30T10:15:02Z",
                             [{"max_concurrency": 1, "num_prompts": 8}], lines)
    stored = (tmp_path / "glm-5-nvfp4" / "a1b2c3d4e5f6" / "tp8" / (out["run_id"] + ".jsonl")).read_text()
    assert "sk-secret-123" not in stored and "pw-456" not in stored
    kept = json.loads(stored)["server_info"]
    assert kept["internal_states"][0] == {"api_key": "<redacted>", "last_gen_throughput": 1.0}
    assert kept["launch_command"] == ["python", "-m", "sglang.launch_server", "--api-key", "<redacted>",
                                      "--ssl-keyfile-password=<redacted>", "--tp-size", "8"]


# ------------------------------------------------------------------------------------------ cut short, fits, tunes


def test_a_run_whose_storing_was_cut_short_counts_for_nothing(tmp_path):
    out = record(tmp_path)
    directory = tmp_path / "glm-5-nvfp4" / "a1b2c3d4e5f6" / "tp8"
    assert os.path.basename(out["files"][-1]).endswith(".meta.json")    # the meta file is written last
    (directory / (out["run_id"] + ".meta.json")).unlink()               # as if interrupted before it
    runs = results.load_runs(str(tmp_path))
    assert runs[0]["incomplete"] is True and runs[0]["points"] == []
    assert results.measured_records(runs) == []
    assert results.measured_run(runs, runs[0]["plan"], [{"max_concurrency": 1, "num_prompts": 8}], {"seed": 1}) is None
    assert results.failures(runs)[0]["message"].startswith("incomplete: storing the run was cut short")


def test_latest_failures_are_those_of_the_newest_run(tmp_path):
    def fail(layout, when):
        results.record_run(str(tmp_path), "glm-5-nvfp4", "a1b2c3d4e5f6", layout, when, [],
                           error={"stage": "health", "message": "died while starting"})
    fail("tp8", "2026-11-30T10:00:00Z")
    record(tmp_path, "tp8", "2026-11-30T11:00:00Z")                     # measured since: no longer failed
    record(tmp_path, "tp4pp2", "2026-11-30T10:00:00Z")
    fail("tp4pp2", "2026-11-30T11:00:00Z")                              # failed since it was measured
    found = results.latest_failures(results.load_runs(str(tmp_path)))
    assert [(f["layout"], f["stage"], f["run_id"]) for f in found] == [("tp4pp2", "health", "20261130T110000Z")]


def test_fits_are_read_per_machine(tmp_path):
    assert results.load_fits(str(tmp_path / "none")) == []
    record(tmp_path)
    path = results.fit_path(str(tmp_path), "glm-5-nvfp4", "a1b2c3d4e5f6")
    assert path == str(tmp_path / "glm-5-nvfp4" / "a1b2c3d4e5f6" / "fit.json")
    with open(path, "w") as handle:
        json.dump({"model": "glm-5-nvfp4", "efficiency": {"step_ms": 3.0}}, handle)
    assert results.load_fits(str(tmp_path)) == [{"model": "glm-5-nvfp4", "efficiency": {"step_ms": 3.0}}]
    assert [r["layout"] for r in results.load_runs(str(tmp_path))] == ["tp8"]   # not a layout
    with open(path, "w") as handle:
        handle.write("[1]")
    with pytest.raises(results.ResultsError, match="fit.json: a fit must be a JSON object"):
        results.load_fits(str(tmp_path))


def test_a_tune_record_has_the_prediction_and_the_measurement_per_layout():
    data = tune_data()
    assert [(r["layout"], r["predicted"], r["measured"], r["status"]) for r in data["layouts"]] == [
        ("tp4pp2", 217.0, 700.0, "measured"), ("tp8", 212.0, 1800.0, "measured"),
        ("tp2pp4", 188.0, None, "failed"), ("tp1pp8", 113.0, 300.0, "measured before")]
    assert data["layouts"][2]["message"] == "died while starting: OOM"
    assert (data["layouts"][0]["stage_started"], data["layouts"][0]["finished"], data["layouts"][0]["server_ready_s"]) \
        == ({"plan": 1.0, "relaunch": 2.0, "bench": 30.0}, 41.0, 20.0)   # the timings perf/tune_overhead.py reads
    assert (data["predicted_winner"], data["winner"], data["winner_source"]) == ("tp4pp2", "tp8", "measured")
    assert data["fit"]["error_after"] == 0.1 and data["simulated"] is True and data["error"] == 0.183


def test_a_tune_record_gives_each_backend_variant_its_own_figure():
    """A backend variant (tune_backends.py) is its layout's candidate with its own measured figure; the winner is
    named with its backend."""
    variant = "tp8+moe_runner_backend.cutlass"
    selection = {"rows": [{"name": "tp8", "estimate": 212.0}, {"name": variant, "estimate": 212.0}],
                 "chosen": ["tp8", variant], "model_pick": "tp8", "error": 0.183, "scale": 1.0}
    candidates = [{"name": "tp8", "valid": True, "tp": 8, "pp": 1, "dp": 1,
                   "measured": {"output_throughput": 1800.0, "backends": {"moe_runner_backend": "cutlass"},
                                "variants": {"tp8": 900.0, variant: 1800.0}}}]
    outcomes = [{"layout": "tp8", "status": "ok"}, {"layout": variant, "status": "ok"}]
    plan = {"layout": {"name": "tp8", "variant": variant}, "source": "measured"}
    data = results.tune_record(selection, outcomes, candidates, plan, {})
    assert [(r["layout"], r["measured"], r["status"], r["backends"], r["gpus"]) for r in data["layouts"]] == [
        ("tp8", 900.0, "measured", None, 8), (variant, 1800.0, "measured", {"moe_runner_backend": "cutlass"}, 8)]
    assert data["winner"] == variant


def test_tunes_are_kept_never_overwritten_and_read_back(tmp_path):
    first = results.record_tune(str(tmp_path), "glm-5-nvfp4", "a1b2c3d4e5f6", "2026-11-30T10:00:00Z", tune_data())
    second = results.record_tune(str(tmp_path), "glm-5-nvfp4", "a1b2c3d4e5f6", "2026-11-30T10:00:00Z", tune_data())
    assert (first["run_id"], second["run_id"]) == ("20261130T100000Z", "20261130T100000Z-2")
    assert first["file"].endswith("glm-5-nvfp4/a1b2c3d4e5f6/tune-20261130T100000Z.json")
    dry = results.record_tune(str(tmp_path), "glm-5-nvfp4", "a1b2c3d4e5f6", "2026-11-30T10:00:00Z", {}, write=False)
    assert dry["run_id"] == "20261130T100000Z-3" and not os.path.exists(dry["file"])
    tunes = results.load_tunes(str(tmp_path))
    assert [t["run_id"] for t in tunes] == ["20261130T100000Z", "20261130T100000Z-2"]
    assert tunes[0]["model"] == "glm-5-nvfp4" and tunes[0]["layouts"][0]["layout"] == "tp4pp2"
    assert results.load_tunes(str(tmp_path), fingerprint="ffffffffffff") == []
    assert results.load_runs(str(tmp_path)) == []                       # a tune record is not a run


# ------------------------------------------------------------------------- the topology a run is recorded with
def test_the_topology_of_a_plan_comes_from_this_run_else_the_topology_stage(tmp_path):
    facts = {"fingerprint": "a1b2c3d4e5f6", "gpu_count": 8, "driver_version": "580.95.05"}
    plan = {"topology_fingerprint": "a1b2c3d4e5f6"}
    assert results.planned_topology(plan, ["field"], lambda h: facts, str(tmp_path)) == facts
    (tmp_path / "field").mkdir()
    (tmp_path / "field" / "topology.json").write_text(json.dumps(facts))
    assert results.planned_topology(plan, ["field"], lambda h: None, str(tmp_path)) == facts
    with pytest.raises(results.ResultsError, match="bench refuses to run on field: the plan was made for topology "
                                                   "a1b2c3d4e5f6 but the topology now has fingerprint 0000"):
        results.planned_topology(plan, ["field"], lambda h: dict(facts, fingerprint="0000"), str(tmp_path))
    with pytest.raises(results.ResultsError, match="but %s is missing" % (tmp_path / "other" / "topology.json")):
        results.planned_topology(plan, ["other"], lambda h: None, str(tmp_path))


def test_replicas_on_several_nodes_are_recorded_with_every_nodes_topology(tmp_path):
    nodes = {"n0": {"fingerprint": "f0", "gpu_count": 8}, "n1": {"fingerprint": "f1", "gpu_count": 8}}
    plan = {"topology_fingerprint": "f0", "cluster_fingerprint": "c0",
            "replica_nodes": [{"node_rank": 0, "topology_fingerprint": "f0"},
                              {"node_rank": 1, "topology_fingerprint": "f1"}]}
    assert results.plan_hosts(plan, ["n0", "n1"], "n0") == ["n0", "n1"]
    got = results.planned_topology(plan, results.plan_hosts(plan, ["n0", "n1"], "n0"), nodes.get, str(tmp_path))
    assert (got["fingerprint"], got["nnodes"], got["gpu_count"]) == ("c0", 2, 16)
    assert results.plan_hosts({"topology_fingerprint": "f0"}, ["n0", "n1"], "n1") == ["n1"]


def test_a_server_across_nodes_is_recorded_with_every_nodes_topology(tmp_path):
    nodes = {"n0": {"fingerprint": "f0", "gpu_count": 8, "gpus": [{"index": 0}], "driver_version": "580"},
             "n1": {"fingerprint": "f1", "gpu_count": 8, "gpus": [{"index": 0}]}}
    plan = {"topology_fingerprint": "f0", "cluster_fingerprint": "c0",
            "per_node": [{"topology_fingerprint": "f0"}, {"topology_fingerprint": "f1"}]}
    got = results.planned_topology(plan, ["n0", "n1"], nodes.get, str(tmp_path))
    assert (got["fingerprint"], got["nnodes"], got["node_fingerprints"], got["gpu_count"], len(got["gpus"]),
            got["driver_version"]) == ("c0", 2, ["f0", "f1"], 16, 2, "580")
    with pytest.raises(results.ResultsError, match="bench refuses to run on n1: the plan was made for topology c0"):
        results.planned_topology(plan, ["n0", "n1"], {"n0": nodes["n0"], "n1": dict(nodes["n1"], fingerprint="x")}.get,
                                 str(tmp_path))
