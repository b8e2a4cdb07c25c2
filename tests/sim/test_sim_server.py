"""SGLang simulator end to end: the wheel as built, real processes on 127.0.0.1:33000-33999 (tests/unit/simlab.py).

Each test gets a private fake-NVML state directory, a GPU spec copied from lab/specs and model directories
copied from tests/fixtures/models. Load times are tiny; every wait is a condition polled until a deadline.
"""
import json
import os
import signal
import threading
import time
import urllib.request

import pytest
from simlab import GIB, Lab, alive, children_of, cmdline, holds_for, port_open, wait_for

MILESTONES = ["Load weight begin", "Load weight end", "Capture cuda graph begin", "Capture cuda graph end",
              "The server is fired up and ready to roll!"]
# bench_serving's JSON line: the fields the project's results parser and reports rely on
BENCH_FIELDS = [
    "backend", "dataset_name", "request_rate", "max_concurrency", "random_input_len", "random_output_len",
    "random_range_ratio", "server_info", "duration", "completed", "total_input_tokens", "total_output_tokens",
    "request_throughput", "input_throughput", "output_throughput", "total_throughput", "mean_ttft_ms",
    "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "std_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "std_itl_ms", "p95_itl_ms", "p99_itl_ms", "mean_e2e_latency_ms",
    "median_e2e_latency_ms", "std_e2e_latency_ms", "p90_e2e_latency_ms", "p99_e2e_latency_ms", "concurrency",
    "max_output_tokens_per_s", "max_concurrent_requests"]


# ------------------------------------------------------------------------------------------ command line
def test_argparse_errors_exit_2_with_sglangs_message(lab):
    model = lab.model("llama-2-7b")
    res = lab.run("sglang.launch_server", "--model-path", model, "--pp", "2")
    assert res.returncode == 2
    assert "launch_server.py: error: ambiguous option: --pp could match --pp-size" in res.stderr
    res = lab.run("sglang.launch_server", "--model-path", model, "--moe-runner-backend", "flashinfer_cutlas")
    assert res.returncode == 2 and "invalid choice: 'flashinfer_cutlas'" in res.stderr
    res = lab.run("sglang.launch_server", "--help")
    assert res.returncode == 0 and "--nsa-prefill-backend" in res.stdout


def test_bad_lab_knob_is_named(lab):
    res = lab.run("sglang.launch_server", "--model-path", lab.model("llama-2-7b"), SGLANG_SIM_FAULT="crash")
    assert res.returncode == 1 and "unknown fault 'crash'" in res.stderr


# ------------------------------------------------------------------------------------------ lifecycle
def test_start_serve_drain_exit(lab):
    server = lab.launch("--model-path", lab.model("llama-2-7b"), "--tp-size", "2", SGLANG_SIM_LOAD_SECONDS="1.0",
                        SGLANG_SIM_TIME_SCALE="0.5")
    wait_for(lambda: "Load weight begin" in server.log(), 15, "Load weight begin")
    assert server.proc.poll() is None and not port_open(server.port), "port must stay closed while loading"
    server.wait_ready()
    log = server.log()
    positions = [log.index(m) for m in MILESTONES]
    assert positions == sorted(positions), "milestones out of order:\n" + log
    assert log.count("Every number in this log is simulated") == 1
    assert log.index("SGLang simulator 0.5.9+sim") < positions[0]
    assert server.get("/health")[0] == 200

    regs = lab.registrations()
    assert sorted(gpu for per_pid in regs.values() for gpu in per_pid) == [0, 1]
    assert all(nbytes > 13476839424 / 2 for per_pid in regs.values() for nbytes in per_pid.values())
    titles = sorted(cmdline(pid).split()[0] for pid in children_of(server.proc.pid))
    assert titles == ["sglang::detokenizer", "sglang::scheduler_TP0", "sglang::scheduler_TP1"]

    # SIGTERM while a request streams: /health 503 while draining, the request completes, then everything ends
    events = []

    def stream():
        req = urllib.request.Request(server.url + "/generate", method="POST", headers={
            "Content-Type": "application/json"}, data=json.dumps(
            {"text": "a b c", "sampling_params": {"max_new_tokens": 300}, "stream": True}).encode())
        with urllib.request.urlopen(req, timeout=60) as resp:
            for line in resp:
                if line.strip():
                    events.append(line.decode().strip())

    reader = threading.Thread(target=stream)
    reader.start()
    wait_for(lambda: events, 10, "the first streamed token")
    server.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: server.get("/health")[0] == 503, 10, "/health 503 while draining")
    reader.join(timeout=30)
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2][len("data: "):])
    assert last["meta_info"]["completion_tokens"] == 300 and last["meta_info"]["finish_reason"]["type"] == "length"
    assert server.wait_exit() == -signal.SIGKILL  # SGLang's kill_process_tree ends the launcher with SIGKILL
    assert "Gracefully exiting... Remaining number of requests 0" in server.log()
    wait_for(lambda: not lab.registrations(), 10, "GPU memory to be released")
    assert not children_of(server.proc.pid)


# ------------------------------------------------------------------------------------------ validations
@pytest.mark.parametrize("case", ["world_size", "pp_partition", "experts", "oom", "unbalanced"])
def test_sglang_validations_fail_like_sglang(lab, case):
    llama = lab.model("llama-2-7b")
    env = {}
    if case == "world_size":
        argv, env["CUDA_VISIBLE_DEVICES"] = ["--model-path", llama, "--tp-size", "4"], "0,1"
        expect = "RuntimeError: CUDA error: invalid device ordinal"
    elif case == "pp_partition":
        argv, env["SGLANG_PP_LAYER_PARTITION"] = ["--model-path", llama, "--pp-size", "2"], "16,15"
        expect = "ValueError: sum(partitions)=31 does not match num_layers=32."
    elif case == "experts":
        argv = ["--model-path", lab.model("glm-4.7", n_routed_experts=4), "--tp-size", "8"]
        expect = "ValueError: Tensor parallel size 8 is greater than the number of experts 4."
    elif case == "oom":
        argv = ["--model-path", lab.model("glm-5-nvfp4"), "--tp-size", "4"]  # 110 GB per 96 GB GPU
        expect = "torch.OutOfMemoryError: CUDA out of memory."
    else:
        lab.foreign_holder(1, 40 * GIB)
        argv = ["--model-path", llama, "--tp-size", "2"]
        expect = "The memory capacity is unbalanced. Some GPUs may be occupied by other processes."
    server = lab.launch(*argv, **env)
    assert server.wait_exit() == -signal.SIGKILL
    log = server.log()
    assert expect in log, log
    assert "Scheduler hit an exception: Traceback (most recent call last):" in log
    assert "Received sigquit from a child process. It usually means the child failed." in log
    assert "ready to roll" not in log and not port_open(server.port)
    wait_for(lambda: all(not cmdline(pid).startswith("sglang::") for pid in lab.registrations()), 10,
             "the failed ranks' memory to be released")
    if case == "unbalanced":
        assert [g for per_pid in lab.registrations().values() for g in per_pid] == [1], "the foreign holder survives"


# ------------------------------------------------------------------------------------------ faults
def test_crash_during_load(lab):
    server = lab.launch("--model-path", lab.model("llama-2-7b"), "--tp-size", "2",
                        SGLANG_SIM_FAULT="crash_during_load")
    assert server.wait_exit() != 0
    log = server.log()
    # rank 0 crashes half-way through its weights; rank 1 may finish its own first (it does on a loaded machine)
    assert "TP0] Load weight begin" in log and "TP0] Load weight end" not in log
    assert "Traceback (most recent call last):" in log and "RuntimeError: CUDA error: an illegal memory access" in log
    wait_for(lambda: not lab.registrations(), 10, "GPU memory to be released")


def test_a_fault_for_another_layout_leaves_this_server_alone(lab):
    # SGLANG_SIM_FAULT=crash_during_load@tp2: the tp2 server crashes at load, a tp1 server with the same env serves
    env = {"SGLANG_SIM_FAULT": "crash_during_load@tp2"}
    crashing = lab.launch("--model-path", lab.model("llama-2-7b"), "--tp-size", "2", **env)
    assert crashing.wait_exit() != 0 and "RuntimeError: CUDA error: an illegal memory access" in crashing.log()
    wait_for(lambda: not lab.registrations(), 10, "GPU memory to be released")
    lab.launch("--model-path", lab.model("llama-2-7b"), **env).wait_ready()


def test_hang_during_load_never_opens_the_port(lab):
    server = lab.launch("--model-path", lab.model("llama-2-7b"), "--tp-size", "2",
                        SGLANG_SIM_FAULT="hang_during_load")
    wait_for(lambda: len(lab.registrations()) == 2, 10, "both ranks holding memory")
    holds_for(lambda: server.proc.poll() is None and not port_open(server.port), 1.0,
              "a hung load keeps the launcher alive and the port closed")
    assert "Load weight end" not in server.log()
    server.proc.send_signal(signal.SIGTERM)  # during load SGLang has no handler yet: the launcher just dies
    assert server.wait_exit() == -signal.SIGTERM
    wait_for(lambda: not lab.registrations(), 10, "the ranks to die with the launcher")


def test_ignore_sigterm(lab):
    server = lab.launch("--model-path", lab.model("llama-2-7b"), "--tp-size", "2",
                        SGLANG_SIM_FAULT="ignore_sigterm").wait_ready()
    ranks = list(lab.registrations())
    for pid in [server.proc.pid] + ranks:
        os.kill(pid, signal.SIGTERM)
    holds_for(lambda: server.proc.poll() is None and all(alive(p) for p in ranks), 1.0,
              "SIGTERM must be ignored by the launcher and its ranks")
    assert server.get("/health")[0] == 200
    server.proc.kill()
    wait_for(lambda: not lab.registrations(), 10, "the ranks to die with the launcher (SIGKILL)")


def test_orphan_schedulers_outlive_the_launcher(lab):
    server = lab.launch("--model-path", lab.model("llama-2-7b"), "--tp-size", "2",
                        SGLANG_SIM_FAULT="orphan_schedulers").wait_ready()
    ranks = sorted(lab.registrations())
    assert len(ranks) == 2 and not set(ranks) & set(children_of(server.proc.pid))
    server.proc.send_signal(signal.SIGTERM)
    server.wait_exit()
    holds_for(lambda: sorted(lab.registrations()) == ranks, 0.5, "orphaned schedulers keep their GPU memory")
    assert all(cmdline(pid).startswith("sglang::scheduler_TP") for pid in ranks)
    for pid in ranks:
        os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not lab.registrations(), 10, "orphans to end on SIGTERM")


def test_die_after_requests_gives_a_partial_benchmark(lab):
    server = lab.launch("--model-path", lab.model("llama-2-7b"), SGLANG_SIM_FAULT="die_after_requests:4")
    server.wait_ready()
    out = lab.tmp / "bench.jsonl"
    res = lab.run("sglang.bench_serving", "--backend", "sglang", "--base-url", server.url, "--dataset-name",
                  "random-ids", "--random-input-len", "32", "--random-output-len", "16", "--random-range-ratio", "1.0",
                  "--num-prompts", "8", "--max-concurrency", "1", "--disable-tqdm", "--output-file", str(out))
    assert res.returncode == 0, res.stdout + res.stderr
    line = json.loads(out.read_text().splitlines()[-1])
    assert line["completed"] == 3  # warmup + 3 benchmark requests = 4 answered, then the server died
    assert line["server_info"] is None and server.wait_exit() == -signal.SIGKILL
    assert "Successful requests:                     3" in res.stdout
    wait_for(lambda: not lab.registrations(), 10, "GPU memory to be released")


def test_hang_after_requests_keeps_the_process_and_port_but_not_generation(lab):
    """hang_after_requests:2: two answers, then generation and /health_generate hang (503 after
    SGLANG_HEALTH_CHECK_TIMEOUT) while the launcher lives and the port stays open."""
    server = lab.launch("--model-path", lab.model("llama-2-7b"), SGLANG_SIM_FAULT="hang_after_requests:2",
                        SGLANG_HEALTH_CHECK_TIMEOUT="1").wait_ready()
    body = {"text": "a b", "sampling_params": {"max_new_tokens": 2}}
    assert [server.post("/generate", body)[0] for _ in range(2)] == [200, 200]
    # the simulator counts a request once its answer is sent (after it, as SGLang's scheduler would hang after the
    # batch it finished): the line may follow the second answer by a moment (CI at load 10 read the log before it)
    hangs = "hang_after_requests:2: 2 generation requests answered, the scheduler hangs now"
    wait_for(lambda: hangs in server.log(), 10, "the hang's log line")
    with pytest.raises(OSError):  # socket.timeout / URLError: no answer
        server.post("/generate", body, timeout=2)
    t0 = time.monotonic()
    assert server.get("/health_generate")[0] == 503 and time.monotonic() - t0 >= 1
    assert server.get("/health")[0] == 503
    assert server.proc.poll() is None and port_open(server.port)


def test_hang_after_zero_requests_never_gets_ready(lab):
    """hang_after_requests:0: the warmup hangs: the port opens, the ready line never comes, /health says starting."""
    server = lab.launch("--model-path", lab.model("llama-2-7b"), SGLANG_SIM_FAULT="hang_after_requests:0")
    wait_for(lambda: port_open(server.port), 20, "the port to open")
    holds_for(lambda: server.proc.poll() is None and "ready to roll" not in server.log(), 2,
              "the server stays up and never ready")
    assert server.get("/health")[0] == 503 and server.get("/health_generate", timeout=5)[0] == 503


# ------------------------------------------------------------------------------------------ endpoints
@pytest.fixture(scope="module")
def served(tmp_path_factory, sim_site):
    the_lab = Lab(tmp_path_factory.mktemp("endpoints"), sim_site)
    server = the_lab.launch("--model-path", the_lab.model("llama-2-7b"), "--served-model-name", "llama",
                            "--api-key", "sekrit", "--enable-metrics").wait_ready()
    yield server
    the_lab.cleanup()


KEY = {"Authorization": "Bearer sekrit"}


def test_auth_health_and_metrics(served):
    assert served.get("/health")[0] == 200 and served.get("/health_generate")[0] == 200
    assert served.get("/model_info") == (401, b'{"error": "Unauthorized"}')
    assert served.get("/model_info", headers={"Authorization": "Bearer wrong"})[0] == 401
    status, body = served.get("/metrics")
    text = body.decode()
    assert status == 200 and "simulated" in text
    # a labelled histogram has no samples before its first observation (prometheus_client); test_sim_metrics.py
    # checks every sample against SGLang's table
    for metric in ("sglang:num_running_reqs{", "sglang:gen_throughput{",
                   "# TYPE sglang:time_to_first_token_seconds histogram"):
        assert metric in text


def test_info_endpoints(served):
    status, body = served.get("/model_info", headers=KEY)
    info = json.loads(body)
    assert status == 200 and info["model_path"].endswith("llama-2-7b") and info["architectures"] == ["LlamaForCausalLM"]
    assert served.get("/get_model_info", headers=KEY)[0] == 200
    for path in ("/server_info", "/get_server_info"):
        status, body = served.get(path, headers=KEY)
        info = json.loads(body)
        assert status == 200 and info["version"] == "0.5.9+sim" and info["simulated"] is True
        assert info["tp_size"] == 1 and info["served_model_name"] == "llama" and info["max_total_num_tokens"] > 0
        assert info["status"] == "ready" and info["internal_states"][0]["memory_usage"]["token_capacity"] > 0
    status, body = served.get("/v1/models", headers=KEY)
    assert status == 200 and json.loads(body)["data"][0]["id"] == "llama"
    assert served.get("/nope", headers=KEY) == (404, b'{"detail": "Not Found"}')
    assert served.get("/generate", headers=KEY)[0] == 405
    assert served.post("/flush_cache", None, headers=KEY)[0] == 200


def test_generate(served):
    status, body = served.post("/generate", {"text": "a b c", "sampling_params": {"max_new_tokens": 5}}, headers=KEY)
    out = json.loads(body)
    assert status == 200 and len(out["text"].split()) == 5
    assert out["meta_info"]["prompt_tokens"] == 3 and out["meta_info"]["completion_tokens"] == 5
    assert out["meta_info"]["e2e_latency"] > 0
    status, body = served.post("/generate", {"input_ids": [1, 2, 3, 4], "sampling_params": {"max_new_tokens": 4},
                                             "stream": True}, headers=KEY)
    events = [line for line in body.decode().split("\n\n") if line]
    # One event per token when the client keeps up; tokens that piled up meanwhile come coalesced (as SGLang
    # streams what it has), so under load there may be fewer events: never more, never none.
    assert status == 200 and events[-1] == "data: [DONE]" and 2 <= len(events) <= 5
    final = json.loads(events[-2][len("data: "):])["meta_info"]
    assert final["completion_tokens"] == 4 and final["prompt_tokens"] == 4 and final["finish_reason"]["length"] == 4
    assert served.post("/generate", {"sampling_params": {}}, headers=KEY)[0] == 400
    assert served.post("/generate", b"{not json", headers=KEY)[0] == 400
    status, body = served.post("/generate", {"input_ids": list(range(5000))}, headers=KEY)
    assert status == 400 and "longer than the model's context length (4096 tokens)" in body.decode()


def test_openai_endpoints(served):
    status, body = served.post("/v1/completions", {"model": "llama", "prompt": "hello there", "max_tokens": 3},
                               headers=KEY)
    out = json.loads(body)
    assert status == 200 and out["object"] == "text_completion" and out["usage"]["completion_tokens"] == 3
    status, body = served.post("/v1/chat/completions", {"model": "llama", "max_tokens": 4, "stream": True,
                                                        "messages": [{"role": "user", "content": "hi"}]}, headers=KEY)
    chunks = [json.loads(e[len("data: "):]) for e in body.decode().split("\n\n") if e and e != "data: [DONE]"]
    assert status == 200 and body.decode().rstrip().endswith("data: [DONE]")
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks).split() and \
        chunks[-1]["choices"][0]["finish_reason"] == "length"
    status, _ = served.post("/v1/chat/completions", b'{"messages": []}', headers=dict(KEY, **{"Content-Type":
                                                                                             "text/plain"}))
    assert status == 400


def test_bench_serving_line_schema_and_append(served):
    out = served.lab.tmp / "bench.jsonl"
    out.write_text('{"earlier": "run"}\n')
    res = served.lab.run("sglang.bench_serving", "--backend", "sglang", "--host", "127.0.0.1", "--port",
                         str(served.port), "--dataset-name", "random-ids", "--random-input-len", "64",
                         "--random-output-len", "8", "--random-range-ratio", "1.0", "--num-prompts", "6",
                         "--max-concurrency", "3", "--seed", "7", "--warmup-requests", "1", "--disable-tqdm",
                         "--output-file", str(out), OPENAI_API_KEY="sekrit")
    assert res.returncode == 0, res.stdout + res.stderr
    lines = out.read_text().splitlines()
    assert lines[0] == '{"earlier": "run"}' and len(lines) == 2
    line = json.loads(lines[1])
    assert [f for f in BENCH_FIELDS if f not in line] == []
    assert line["completed"] == 6 and line["total_input_tokens"] == 6 * 64 and line["total_output_tokens"] == 6 * 8
    assert line["max_concurrency"] == 3 and line["server_info"]["version"] == "0.5.9+sim"
    assert line["median_ttft_ms"] > 0 and line["output_throughput"] > 0
    assert "============ Serving Benchmark Result ============" in res.stdout


def test_bench_serving_refuses_downloading_datasets(lab):
    res = lab.run("sglang.bench_serving", "--dataset-name", "sharegpt", "--num-prompts", "1")
    assert res.returncode == 1 and "no network" in res.stdout


# ------------------------------------------------------------------------------------------ performance
def test_glm5_tp8_serves_faster_than_tp4pp2_on_the_field_spec(lab):
    glm5 = lab.model("glm-5-nvfp4")
    throughput = {}
    for layout in (["--tp-size", "8"], ["--tp-size", "4", "--pp-size", "2"]):
        server = lab.launch("--model-path", glm5, *layout, SGLANG_SIM_TIME_SCALE="1.0").wait_ready()
        out = lab.tmp / "perf.jsonl"
        res = lab.run("sglang.bench_serving", "--backend", "sglang", "--base-url", server.url, "--dataset-name",
                      "random-ids", "--random-input-len", "128", "--random-output-len", "24", "--random-range-ratio",
                      "1.0", "--num-prompts", "16", "--max-concurrency", "8", "--disable-tqdm", "--output-file",
                      str(out))
        assert res.returncode == 0, res.stdout
        throughput[" ".join(layout)] = json.loads(out.read_text().splitlines()[-1])["output_throughput"]
        server.proc.send_signal(signal.SIGTERM)
        server.wait_exit()
        wait_for(lambda: not lab.registrations(), 10, "GPU memory to be released between layouts")
    assert throughput["--tp-size 8"] > 1.3 * throughput["--tp-size 4 --pp-size 2"], throughput
