"""The SGLang simulator as 0.5.9 and as 0.5.23: one source, one wheel per release (lab/sglang_sim/build_wheel.py),
behaviour that follows the release where the real wheels differ (docs/sglang-versions.md).

Expected strings are written out here as each real wheel has them (file:line in the comments), so a test fails
when the simulator drifts from SGLang, not only when it disagrees with itself. In-process tests switch the release
with sglang.version.__version__; end-to-end tests run the built wheels (simlab.py) on 127.0.0.1:33000-33999.
"""
import json
import signal
import sys
import zipfile

import pytest
from simlab import ROOT, SPECS, Lab, children_of, cmdline, free_port, holds_for, wait_for


import sglang.version  # noqa: E402
from sglang._sim import flags, rank  # noqa: E402
from sglang._sim.launcher import Launcher  # noqa: E402

LLAMA = "llama-2-7b"
# The JSON line's keys in each real client's order (59:sglang/bench_serving.py:2670-2717,
# 523:sglang/benchmark/serving.py:1855-1907)
KEYS_059 = [
    "tag", "backend", "dataset_name", "request_rate", "max_concurrency", "sharegpt_output_len", "random_input_len",
    "random_output_len", "random_range_ratio", "server_info", "duration", "completed", "total_input_tokens",
    "total_input_text_tokens", "total_input_vision_tokens", "total_output_tokens", "total_output_tokens_retokenized",
    "request_throughput", "input_throughput", "output_throughput", "total_throughput", "mean_e2e_latency_ms",
    "median_e2e_latency_ms", "std_e2e_latency_ms", "p90_e2e_latency_ms", "p99_e2e_latency_ms", "mean_ttft_ms",
    "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "std_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "std_itl_ms", "p95_itl_ms", "p99_itl_ms", "concurrency", "accept_length",
    "max_output_tokens_per_s", "max_concurrent_requests"]
KEYS_0523 = [
    "tag", "backend", "dataset_name", "request_rate", "max_concurrency", "sharegpt_output_len", "random_input_len",
    "random_output_len", "random_range_ratio", "server_info", "duration", "completed", "total_input_tokens",
    "total_input_text_tokens", "total_input_vision_tokens", "total_output_tokens", "total_output_tokens_retokenized",
    "request_throughput", "input_throughput", "output_throughput", "total_throughput", "mean_e2e_latency_ms",
    "median_e2e_latency_ms", "std_e2e_latency_ms", "p90_e2e_latency_ms", "p95_e2e_latency_ms", "p99_e2e_latency_ms",
    "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p90_ttft_ms", "p95_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
    "median_tpot_ms", "std_tpot_ms", "p90_tpot_ms", "p95_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms",
    "std_itl_ms", "p90_itl_ms", "p95_itl_ms", "p99_itl_ms", "concurrency", "accept_length", "max_output_tokens_per_s",
    "max_concurrent_requests"]
# 523:sglang/launch_server.py:70-77
SERVE_WARNING = ("UserWarning: 'python -m sglang.launch_server' is still supported, but 'sglang serve' is the "
                 "recommended entrypoint.\n  Example: sglang serve --model-path <model> [options]")
# 523:sglang/bench_serving.py:13-19
CLIENT_WARNING = ("FutureWarning: `sglang.bench_serving` is deprecated and will be removed in a future release; use "
                  "`sglang.benchmark.serving` instead (e.g. `python -m sglang.benchmark.serving`).")


@pytest.fixture(params=["0.5.9", "0.5.23"])
def release(request, monkeypatch):
    monkeypatch.setattr(sglang.version, "__version__", request.param + "+sim")
    return request.param


def as_release(monkeypatch, version):
    monkeypatch.setattr(sglang.version, "__version__", version + "+sim")


def config(tmp_path, text, name="server.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ------------------------------------------------------------------------------------------ the wheels
def test_one_wheel_per_release_from_the_same_sources(sim_wheels):
    assert sorted(sim_wheels) == ["0.5.23", "0.5.9"]
    contents = {}
    for version, wheel in sim_wheels.items():
        with zipfile.ZipFile(wheel) as zf:
            names = set(zf.namelist())
            meta = zf.read("sglang-%s+sim.dist-info/METADATA" % version).decode()
            contents[version] = names
            assert '__version__ = "%s+sim"' % version in zf.read("sglang/version.py").decode()
        assert "Requires-Dist: PyYAML; extra == \"all\"" in meta and "Requires-Dist: setproctitle; extra" in meta
        # as the real METADATA (59:...dist-info/METADATA:211, 523:...dist-info/METADATA:213)
        assert ("Requires-Python: >=3.11" if version == "0.5.23" else "Requires-Python: >=3.10") in meta
    assert "sglang/benchmark/serving.py" in contents["0.5.23"] and "sglang/benchmark/serving.py" not in contents["0.5.9"]
    assert {n for n in contents["0.5.23"] if "dist-info" not in n and "benchmark/" not in n} == \
        {n for n in contents["0.5.9"] if "dist-info" not in n}


# ------------------------------------------------------------------------------------------ --config FILE.yaml
def test_config_options_go_before_the_command_line_and_the_key_never_reaches_argv(release, tmp_path):
    path = config(tmp_path, "api-key: from-the-file\ntp-size: 2\nenable-metrics: true\nlog-level: warning\n")
    args = flags.prepare_server_args(["--model-path", "/m", "--config", path, "--tp-size", "4"])
    assert (args.api_key, args.tp_size, args.enable_metrics, args.log_level) == ("from-the-file", 4, True, "warning")
    assert "config" not in args.as_dict()  # not a ServerArgs field
    assert args.launch_command == ("--api-key from-the-file --tp-size 2 --enable-metrics --log-level warning "
                                   "--model-path /m --tp-size 4")


def test_a_key_written_with_underscores_is_refused_by_argparse_which_prints_it(release, tmp_path, capsys):
    """The merger writes `--{key}` as spelled: `api_key:` becomes `--api_key`, which argparse does not know and
    prints back, value included (both releases; write `api-key:`)."""
    path = config(tmp_path, "api_key: sekret\n")
    with pytest.raises(SystemExit) as exc:
        flags.prepare_server_args(["--model-path", "/m", "--config", path])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "error: unrecognized arguments: --api_key sekret" in err
    assert ("sglang serve: error:" in err) == (release == "0.5.23")


@pytest.mark.parametrize("version, text, error", [
    ("0.5.9", "hybrid-kvcache-ratio: 0.5\n", "Unsupported config option 'hybrid_kvcache_ratio' with action "
                                             "'DeprecatedAction'"),
    ("0.5.23", "disable-cuda-graph: true\n", "Unsupported config option 'disable_cuda_graph' with action "
                                             "'DeprecatedStoreTrueAction'"),
    ("0.5.23", "enable-fused-qk-norm-rope: true\n", "Unsupported config option 'enable_fused_qk_norm_rope' with "
                                                    "action 'BooleanOptionalAction'"),
])
def test_each_release_refuses_the_config_options_its_parser_refuses(monkeypatch, tmp_path, version, text, error):
    as_release(monkeypatch, version)
    with pytest.raises(ValueError) as exc:
        flags.prepare_server_args(["--model-path", "/m", "--config", config(tmp_path, text)])
    assert str(exc.value) == error


def test_what_0_5_9_accepts_in_a_config_file_and_0_5_23_reads_as_json(monkeypatch, tmp_path):
    as_release(monkeypatch, "0.5.9")
    args = flags.prepare_server_args(["--model-path", "/m", "--config", config(
        tmp_path, "disable-cuda-graph: true\nenable-fused-qk-norm-rope: true\n")])
    assert args.disable_cuda_graph is True and args.enable_fused_qk_norm_rope is True
    args = flags.prepare_server_args(["--model-path", "/m", "--config", config(
        tmp_path, "json-model-override-args:\n  a: 1\n")])
    assert args.json_model_override_args == "{'a': 1}"  # 0.5.9 passes a mapping on as str(value)
    as_release(monkeypatch, "0.5.23")
    args = flags.prepare_server_args(["--model-path", "/m", "--config", config(
        tmp_path, "cuda-graph-config:\n  decode:\n    max_bs: 64\ntensor-parallel-size: 2\n")])
    assert args.cuda_graph_config == {"decode": {"max_bs": 64}} and args.tp_size == 2
    assert args.launch_command == '--cuda-graph-config {"decode": {"max_bs": 64}} --tensor-parallel-size 2 ' \
                                  '--model-path /m'


@pytest.mark.parametrize("name, text, extra, error", [
    ("server.json", "{}", [], "Config file must be YAML format, got: .json"),
    ("server.yaml", "- a\n- b\n", [], "Config file must contain a dictionary at root level"),
    ("server.yaml", "{}", ["--config", "other.yaml"], "Multiple config files specified! Only one allowed."),
])
def test_config_file_errors_are_sglangs(release, tmp_path, name, text, extra, error):
    with pytest.raises(ValueError) as exc:
        flags.prepare_server_args(["--model-path", "/m", "--config", config(tmp_path, text, name), *extra])
    assert str(exc.value) == error
    with pytest.raises(ValueError, match="^Config file not found: /nowhere.yaml$"):
        flags.prepare_server_args(["--config", "/nowhere.yaml"])


# ------------------------------------------------------------------------------------------ start-up, in-process
def test_the_server_args_line_is_each_releases_and_carries_the_key_as_sglang_logs_it(monkeypatch):
    as_release(monkeypatch, "0.5.9")  # f"{server_args=}" of the dataclass (59:sglang/srt/entrypoints/engine.py:1031)
    line = flags.prepare_server_args(["--model-path", "/m", "--api-key", "k1"]).for_logging()
    assert line.startswith("ServerArgs(model_path='/m', ") and "api_key='k1'" in line
    as_release(monkeypatch, "0.5.23")  # the resolved dict, watermark secrets redacted (523:engine.py:173-174, 1185)
    args = flags.prepare_server_args(["--model-path", "/m", "--api-key", "k1", "--watermark-config", "wm-secret"])
    line = args.for_logging()
    assert line.startswith("{'model_path': '/m', ") and "'api_key': 'k1'" in line
    assert "wm-secret" not in line and "'watermark_config': '<redacted>'" in line
    assert args.launch_command == "--model-path /m --api-key k1 --watermark-config <redacted>"


def test_0_5_23_resolves_per_phase_cuda_graphs_and_pp_turns_the_prefill_graph_off(monkeypatch, caplog):
    caplog.set_level("INFO")
    as_release(monkeypatch, "0.5.23")
    args = flags.prepare_server_args(["--model-path", "/m", "--tp-size", "8"])
    args.post_init(97887)  # an RTX PRO 6000: 8k chunked prefill, decode max bs 512 with tp >= 4
    assert args.chunked_prefill_size == 8192 and args.cuda_graph_config["decode"]["max_bs"] == 512
    assert [(phase, backend) for phase, backend, _ in args.graphs()] == [("prefill", "breakable"), ("decode", "full")]
    prefill_sizes = args.cuda_graph_config["prefill"]["bs"]
    assert prefill_sizes[:3] == [4, 8, 12] and prefill_sizes[-1] == 8192 and len(prefill_sizes) == 58
    # 512 + 8192 * 1.5 + 1024 + (512 * 2 + 58 sizes * 8) over 97887 MiB (523:arg_groups/memory_hook.py:280-330)
    assert args.mem_fraction_static == round((97887 - (512 + 8192 * 1.5 + 1024 + 512 * 2 + 58 * 8)) / 97887, 3)
    pp = flags.prepare_server_args(["--model-path", "/m", "--tp-size", "4", "--pp-size", "2"])
    pp.post_init(97887)
    assert [phase for phase, _, _ in pp.graphs()] == ["decode"]
    assert ("Disabling breakable prefill CUDA graph by default for pipeline parallelism. Set "
            "--cuda-graph-backend-prefill=breakable to opt in.") in caplog.messages
    off = flags.prepare_server_args(["--model-path", "/m", "--disable-cuda-graph"])
    off.post_init(97887)
    assert off.graphs() == []
    as_release(monkeypatch, "0.5.9")
    old = flags.prepare_server_args(["--model-path", "/m", "--tp-size", "8"])
    old.post_init(97887)
    assert old.graphs() == [("decode", "full", old.cuda_graph_bs)] and old.cuda_graph_max_bs == 512


@pytest.mark.parametrize("version, flag", [("0.5.9", "--cuda-graph-bs"), ("0.5.23", "--cuda-graph-bs-decode")])
def test_capture_time_follows_the_sizes_the_release_captures(monkeypatch, version, flag):
    """A capture costs per size of the list (SGLang captures one forward per size): the release's default decode
    list on an RTX PRO 6000 at TP 8 (52 sizes up to 512) against a tune candidate's --cuda-graph-bs 4."""
    as_release(monkeypatch, version)
    full = flags.prepare_server_args(["--model-path", "/m", "--tp-size", "8"])
    full.post_init(97887)
    one = flags.prepare_server_args(["--model-path", "/m", "--tp-size", "8", flag, "4"])
    one.post_init(97887)
    decode = {name: [g for g in args.graphs() if g[0] == "decode"][0][2] for name, args in (("full", full),
                                                                                             ("one", one))}
    assert len(decode["full"]) == 52 and decode["full"][-1] == 512 and decode["one"] == [4]
    plan = {"capture_seconds": None, "capture_seconds_per_size": 0.01}
    graphs = {name: [{"sizes": sizes} for _phase, _backend, sizes in args.graphs()]
              for name, args in (("full", full), ("one", one))}
    seconds = {name: sum(rank.capture_seconds(g, gs, plan) for g in gs) for name, gs in graphs.items()}
    prefill = sum(len(g["sizes"]) for g in graphs["one"]) - 1   # 0.5.23's prefill graph stays (0.5.9 has none)
    assert seconds["one"] == pytest.approx(0.01 * (1 + prefill)) and seconds["full"] == pytest.approx(
        0.01 * (52 + prefill))
    # a total given is split over the graphs by their sizes
    total = {"capture_seconds": 1.0, "capture_seconds_per_size": 0.01}
    assert sum(rank.capture_seconds(g, graphs["full"], total) for g in graphs["full"]) == pytest.approx(1.0)


def test_0_5_23_captures_a_max_batch_size_its_list_misses(monkeypatch):
    as_release(monkeypatch, "0.5.23")   # 523:arg_groups/cuda_graph_hook.py: if max_bs not in capture_bs: append
    assert flags.decode_graph_sizes(100)[-2:] == [96, 100]
    as_release(monkeypatch, "0.5.9")
    assert flags.decode_graph_sizes(100)[-1] == 96


@pytest.mark.parametrize("version, numactl, numa_node, expect", [
    ("0.5.23", True, None, {0: "starts through numactl bound to node 0 (node from NVML memory affinity)",
                            4: "bound to node 1"}),
    ("0.5.23", False, None, {0: "no automatic binding (SGLANG_AUTO_NUMA_BIND) for the scheduler on GPU 0: "
                                "numactl is not installed"}),
    ("0.5.9", True, None, {}),
    ("0.5.9", False, "1 1 1 1 0 0 0 0", {0: "bound to node 1 (node from --numa-node)", 7: "bound to node 0"}),
])
def test_numa_binding_follows_the_release(monkeypatch, tmp_path, capsys, version, numactl, numa_node, expect):
    """The vnuma spec: GPUs 0-3 on node 0, 4-7 on node 1 (NVML memory affinity). 0.5.23 binds by itself when numactl
    is installed (523:sglang/srt/utils/numa_utils.py:128-155, 377-445); 0.5.9 only with --numa-node."""
    as_release(monkeypatch, version)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    if numactl:
        (bindir / "numactl").write_text("#!/bin/sh\nexit 0\n")
        (bindir / "numactl").chmod(0o755)
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.setenv("SGLANG_SIM_GPU_SPEC", str(SPECS / "proxmox-8x-rtx-pro-6000-vnuma.json"))
    monkeypatch.setenv("FAKE_NVML_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    argv = ["--model-path", str(ROOT / "tests/fixtures/models" / LLAMA), "--tp-size", "8"]
    launcher = Launcher(argv + (["--numa-node", *numa_node.split()] if numa_node else []))
    launcher.prepare()
    launcher.plan_ranks()
    lines = [line for line in capsys.readouterr().err.splitlines() if "simulator: NUMA" in line]
    for gpu, text in expect.items():
        assert any(("GPU %d" % gpu) in line and text in line for line in lines), lines
    assert bool(lines) == bool(expect)


# ------------------------------------------------------------------------------------------ 0.5.23 end to end
@pytest.fixture
def lab0523(tmp_path, sim_site_0523):
    the_lab = Lab(tmp_path / "v0523", sim_site_0523)
    yield the_lab
    the_lab.cleanup()


def test_0_5_23_command_line_is_sglang_serves(lab0523):
    res = lab0523.run("sglang.launch_server", "--model-path", lab0523.model(LLAMA), "--nsa-prefill-backend", "x")
    assert res.returncode == 2 and SERVE_WARNING in res.stderr
    assert "sglang serve: error: unrecognized arguments: --nsa-prefill-backend x" in res.stderr
    res = lab0523.run("sglang.launch_server", "--help")
    assert res.returncode == 0 and res.stdout.startswith("usage: sglang serve") and "--dsa-prefill-backend" in res.stdout


def test_0_5_23_serves_with_the_key_from_a_config_file_and_shuts_down_by_shutdownreq(lab0523):
    key = "key-from-config-4711"
    path = config(lab0523.tmp, "api-key: %s\ntp-size: 2\n" % key)
    server = lab0523.launch("--model-path", lab0523.model(LLAMA), "--config", path)
    server.wait_ready()
    log = server.log()
    milestones = ["Init parallel begin.", "Memory baseline taken.", "Load weight begin", "Load weight end",
                  "KV Cache is allocated. dtype: torch.bfloat16", "Capture target prefill CUDA graph begin.",
                  "Capture target decode CUDA graph begin.", "Capture target decode CUDA graph end. bs=[1, 2, 4",
                  '"POST /freeze_gc HTTP/1.1" 200', "The server is fired up and ready to roll!"]
    positions = [log.index(m) for m in milestones]
    assert positions == sorted(positions), log
    assert "Init torch distributed" not in log and "Capture cuda graph" not in log
    # the key: not on the command line; in the log once, in the server_args line, as SGLang logs it
    assert key not in cmdline(server.proc.pid)
    assert log.count(key) == 1 and "'api_key': '%s'" % key in log.split("server_args=", 1)[1].split("\n", 1)[0]
    assert server.get("/model_info")[0] == 401
    auth = {"Authorization": "Bearer " + key}
    info = json.loads(server.get("/server_info", headers=auth)[1])
    assert (info["version"], info["frontend"], info["tp_size"], info["api_key"]) == ("0.5.23+sim", "python", 2, key)
    assert info["launch_command"] == "--api-key %s --tp-size 2 --model-path %s --port %d" % (
        key, lab0523.model(LLAMA), server.port)
    assert set(info["startup_time"]) == {"load_weight", "kv_cache_allocation", "scheduler_e2e", "cuda_graph",
                                         "tokenizer_e2e"} and "kv_events" in info
    model = json.loads(server.get("/model_info", headers=auth)[1])
    assert list(model)[:3] == ["model_path", "served_model_name", "tokenizer_path"] and "tool_call_parser" in model
    assert server.get("/ready")[0] == 200  # open to probes like /health
    status, body = server.post("/generate", {"text": 5}, headers=auth)
    assert (status, json.loads(body)) == (400, {"error": "invalid type: integer `5`, expected a value or an array "
                                                         "of values for StringOrList"})
    # SIGTERM: drain, ShutdownReq, the schedulers release their memory and exit, uvicorn stops, exit status 0
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait_exit() == 0
    log = server.log()
    assert "SIGTERM received. signum=None frame=None. Draining requests and shutting down..." in log
    order = ["Gracefully exiting... Remaining number of requests 0", "INFO:     Shutting down",
             "INFO:     Application shutdown complete.", "INFO:     Finished server process [%d]" % server.proc.pid]
    positions = [log.index(m) for m in order]
    assert positions == sorted(positions) and "Schedulers still alive" not in log
    assert not lab0523.registrations()


def test_the_0_5_9_server_still_ends_by_sigkill(lab):
    server = lab.launch("--model-path", lab.model(LLAMA)).wait_ready()
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait_exit() == -signal.SIGKILL  # 59: kill_process_tree(os.getpid(), include_parent=True)
    assert "INFO:     Shutting down" not in server.log() and "Init torch distributed begin." in server.log()


def bench(the_lab, module, server, out):
    return the_lab.run(module, "--backend", "sglang", "--base-url", server.url, "--dataset-name", "random-ids",
                       "--random-input-len", "16", "--random-output-len", "4", "--num-prompts", "4",
                       "--max-concurrency", "2", "--disable-tqdm", "--output-file", str(out))


def test_both_client_modules_of_0_5_23_and_the_one_of_0_5_9(lab0523, lab):
    server = lab0523.launch("--model-path", lab0523.model(LLAMA)).wait_ready()
    new = bench(lab0523, "sglang.benchmark.serving", server, lab0523.tmp / "new.jsonl")
    old = bench(lab0523, "sglang.bench_serving", server, lab0523.tmp / "old.jsonl")
    assert new.returncode == 0 and old.returncode == 0, new.stderr + old.stderr
    assert CLIENT_WARNING in old.stderr and "FutureWarning" not in new.stderr
    assert "Waiting up to 60s for %s/v1/models to become ready..." % server.url in new.stdout  # 523:serving.py:160
    assert "benchmark_args=Namespace(" in new.stdout and "seed=42" in new.stdout
    for out in ("new.jsonl", "old.jsonl"):
        line = json.loads((lab0523.tmp / out).read_text())
        assert list(line) == KEYS_0523 and line["server_info"]["version"] == "0.5.23+sim"
    assert '"GET /server_info HTTP/1.1" 200' in server.log() and "/get_server_info" not in server.log()

    server59 = lab.launch("--model-path", lab.model(LLAMA)).wait_ready()
    res = bench(lab, "sglang.bench_serving", server59, lab.tmp / "59.jsonl")
    assert res.returncode == 0 and "FutureWarning" not in res.stderr and "seed=1," in res.stdout
    line = json.loads((lab.tmp / "59.jsonl").read_text())
    assert list(line) == KEYS_059 and line["server_info"]["version"] == "0.5.9+sim"
    missing = bench(lab, "sglang.benchmark.serving", server59, lab.tmp / "none.jsonl")
    assert missing.returncode == 1 and "No module named 'sglang.benchmark'" in missing.stderr


def test_0_5_23_worker_node_only_logs_sigterm_and_stops_with_rank_0(tmp_path, sim_site_0523):
    nodes = [Lab(tmp_path / "node0", sim_site_0523), Lab(tmp_path / "node1", sim_site_0523)]
    try:
        addr = "127.0.0.1:%d" % free_port(53000, 53099)
        servers = [node.launch("--model-path", node.model(LLAMA), "--tp-size", "2", "--pp-size", "2", "--nnodes",
                               "2", "--node-rank", str(rank), "--dist-init-addr", addr, "--dist-timeout", "20")
                   for rank, node in enumerate(nodes)]
        servers[0].wait_ready(30)
        wait_for(lambda: "Dummy health check server started" in servers[1].log(), 10, "node 1's health server")
        servers[1].proc.send_signal(signal.SIGTERM)  # 523:sglang/srt/entrypoints/engine.py:1259-1273
        wait_for(lambda: "SIGTERM received on node_rank 1; waiting for the rank-0 ShutdownReq broadcast to stop the "
                         "schedulers." in servers[1].log(), 10, "node 1's SIGTERM line")
        holds_for(lambda: servers[1].proc.poll() is None and servers[0].get("/health")[0] == 200, 1.0,
                  "node 1 keeps serving after SIGTERM")
        servers[0].proc.send_signal(signal.SIGTERM)
        assert servers[0].wait_exit(30) == 0
        assert servers[1].wait_exit(30) == 0  # its schedulers got the broadcast ShutdownReq and exited 0
        assert servers[1].log().count(" terminated with 0") == 2 and "Connection closed by peer" not in servers[1].log()
        assert not nodes[0].registrations() and not nodes[1].registrations()
    finally:
        for node in nodes:
            node.cleanup()


def test_sim_rank_processes_keep_their_titles_in_0_5_23(lab0523):
    server = lab0523.launch("--model-path", lab0523.model(LLAMA), "--tp-size", "2").wait_ready()
    titles = sorted(cmdline(pid).split()[0] for pid in children_of(server.proc.pid))
    assert titles == ["sglang::detokenizer", "sglang::scheduler_TP0", "sglang::scheduler_TP1"]  # 523:scheduler.py:6294
    assert "-m sglang.launch_server" in cmdline(server.proc.pid)  # the launcher keeps its command line
