"""SGLang simulator across nodes (--nnodes 2): two launchers on 127.0.0.1, each with its own fake-NVML state
directory, GPU spec and port, meeting at a real TCP rendezvous on 127.0.0.1:53000-53099.

What is checked against SGLang 0.5.9 / torch 2.9.1 (see lab/sglang_sim/sglang/_sim/dist.py): which ranks each
node runs, that node 0 opens its API only once every node's ranks are ready and node 1 serves SGLang's dummy
health check server only, torch's texts when a worker never joins or cannot reach node 0 or the port is taken,
and how a lost node takes the others down. --dist-timeout is 2 s in the failure tests, so each takes a few seconds.
"""
import argparse
import json
import re
import signal
import socket
import time

import pytest
from simlab import ROOT, SPECS, Lab, children_of, cmdline, free_port, holds_for, port_open, wait_for


from sglang._sim import dist, hardware, modelcfg, perf, validate  # noqa: E402
from sglang._sim.launcher import Launcher, node_ranks  # noqa: E402

TP8PP2 = ["--tp-size", "8", "--pp-size", "2"]
TP2PP2 = ["--tp-size", "2", "--pp-size", "2"]
LLAMA = "llama-2-7b"


@pytest.fixture
def nodes(tmp_path, sim_site):
    pair = [Lab(tmp_path / "node0", sim_site), Lab(tmp_path / "node1", sim_site)]
    yield pair
    for node in pair:
        node.cleanup()


def start(node, rank, model, layout, addr, timeout=10, **env):
    return node.launch("--model-path", node.model(model), *layout, "--nnodes", "2", "--node-rank", str(rank),
                       "--dist-init-addr", addr, "--dist-timeout", str(timeout), **env)


def rendezvous():
    port = free_port(53000, 53099)
    return "127.0.0.1:%d" % port, port


def gpus(node):
    return sorted(gpu for per_pid in node.registrations().values() for gpu in per_pid)


def titles(server):
    return sorted(cmdline(pid).split()[0] for pid in children_of(server.proc.pid))


# ------------------------------------------------------------------------------------------ without processes
@pytest.mark.parametrize("tp, pp, nnodes, node, expect", [
    (8, 2, 2, 0, [(0, t, t) for t in range(8)]),
    (8, 2, 2, 1, [(1, t, t) for t in range(8)]),  # PP across nodes: node 1 holds stage 1 on its GPUs 0-7
    (16, 1, 2, 1, [(0, 8 + t, t) for t in range(8)]),  # TP across nodes: TP8-15 on node 1's GPUs 0-7
    (4, 4, 2, 1, [(s, t, (s - 2) * 4 + t) for s in (2, 3) for t in range(4)]),
    (4, 2, 1, 0, [(s, t, s * 4 + t) for s in range(2) for t in range(4)]),  # one node, as before
])
def test_each_node_runs_the_ranks_sglang_maps_to_it(tp, pp, nnodes, node, expect):
    args = argparse.Namespace(tp_size=tp, pp_size=pp, nnodes=nnodes, node_rank=node, base_gpu_id=0, gpu_id_step=1)
    assert node_ranks(args) == expect


def test_node1_plans_pp1_with_global_ranks_and_sends_its_spec_once(monkeypatch, tmp_path):
    monkeypatch.setenv("SGLANG_SIM_GPU_SPEC", str(SPECS / "proxmox-8x-rtx-pro-6000-vnuma.json"))
    monkeypatch.setenv("FAKE_NVML_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    launcher = Launcher(["--model-path", str(ROOT / "tests/fixtures/models/glm-5-nvfp4"), *TP8PP2, "--nnodes", "2",
                         "--node-rank", "1", "--dist-init-addr", "10.0.0.1:53000"])
    launcher.prepare()
    plans = launcher.plan_ranks()
    assert [p["title"] for p in plans] == ["sglang::scheduler_PP1_TP%d" % t for t in range(8)]
    assert [(p["dist"]["rank"], p["gpu"]) for p in plans] == [(8 + t, t) for t in range(8)]
    assert {(p["dist"]["init_method"], p["dist"]["world_size"], p["dist"]["timeout"]) for p in plans} == {
        ("tcp://10.0.0.1:53000", 16, 600)}  # torch's NCCL default timeout without --dist-timeout
    assert [p["dist"]["spec"] is not None for p in plans] == [True] + [False] * 7


def test_init_method_as_torch_parses_it():
    assert dist.init_method("10.0.0.1:5000", 1234) == "tcp://10.0.0.1:5000"
    assert dist.init_method(None, 1234) == "tcp://127.0.0.1:1234"  # no --dist-init-addr: this node's nccl port
    assert dist.parse_init_method("tcp://[::1]:5000") == ("::1", 5000)
    with pytest.raises(ValueError, match="tcp:// rendezvous: port number missing"):
        dist.parse_init_method("tcp://node0")


def test_a_tp_group_across_nodes_pays_the_network():
    spec = hardware.load_spec(str(SPECS / "proxmox-8x-rtx-pro-6000-vnuma.json"))
    model = modelcfg.load(str(ROOT / "tests/fixtures/models/glm-5-nvfp4"))
    stages = validate.pp_layer_split(model.layers, 1)

    def step(gpus, network=None):
        layout = perf.Layout(8, 1, 1, gpus, stages, kv_dtype_bytes=2)
        pm = perf.PerfModel(model, {0: spec, 1: spec}, layout, network=network)
        return pm.decode_step(8, 8 * 1024), pm.stage_links[0][2]

    inside, links = step([(0, i) for i in range(8)])
    across, links_across = step([(0, i) for i in range(4)] + [(1, i) for i in range(4)])
    assert "NET" not in links and "NET" in links_across
    assert across > inside * 1.1, (inside, across)
    slow, _ = step([(0, i) for i in range(4)] + [(1, i) for i in range(4)], perf.Network(gbps=25, latency_us=50))
    assert slow > across * 1.5, (across, slow)


# ------------------------------------------------------------------------------------------ real processes
def test_two_nodes_serve_tp8pp2_node0_api_node1_dummy_health(nodes):
    n0, n1 = nodes
    addr, _ = rendezvous()
    head = start(n0, 0, "glm-5-nvfp4", TP8PP2, addr)
    wait_for(lambda: head.log().count("Init torch distributed begin.") == 8, 20, "node 0's ranks at the rendezvous")
    holds_for(lambda: head.proc.poll() is None and not port_open(head.port), 1.0,
              "node 0 waits for node 1 with its port closed")
    worker = start(n1, 1, "glm-5-nvfp4", TP8PP2, addr)
    head.wait_ready(timeout=60)

    assert titles(head) == sorted(["sglang::detokenizer"] + ["sglang::scheduler_PP0_TP%d" % t for t in range(8)])
    assert titles(worker) == sorted("sglang::scheduler_PP1_TP%d" % t for t in range(8))
    assert gpus(n0) == list(range(8)) and gpus(n1) == list(range(8))

    # node 0 serves the API; node 1 only SGLang's dummy health check server (node_rank >= 1)
    assert head.get("/health")[0] == 200
    status, body = head.post("/generate", {"text": "a b c", "sampling_params": {"max_new_tokens": 8}})
    assert status == 200 and json.loads(body)["meta_info"]["completion_tokens"] == 8
    model = json.loads(head.get("/server_info")[1])["simulation"]["performance_model"]
    assert (model["nodes"], model["pp_boundary_links"], model["layout"]) == (2, [["NET"]], "tp8pp2")
    assert "Dummy health check server started in background thread at 127.0.0.1:%d" % worker.port in worker.log()
    assert worker.get("/health") == (200, b"") and worker.get("/ping") == (200, b"")
    assert worker.get("/model_info") == (404, b'{"detail":"Not Found"}')
    assert worker.post("/generate", {"text": "a"})[0] == 404

    # SIGTERM on node 0: it drains and ends; node 1's ranks lose their peer and node 1 ends too
    head.proc.send_signal(signal.SIGTERM)
    assert head.wait_exit() == -signal.SIGKILL
    tic = time.monotonic()
    assert worker.wait_exit(timeout=10) == -signal.SIGKILL
    assert time.monotonic() - tic < 5
    log = worker.log()
    assert "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer" in log
    assert "Received sigquit from a child process. It usually means the child failed." in log
    wait_for(lambda: not gpus(n0) and not gpus(n1), 10, "GPU memory released on both nodes")


def test_a_worker_that_never_joins_fails_node0_after_dist_timeout(nodes):
    n0, n1 = nodes
    addr, port = rendezvous()
    head = start(n0, 0, LLAMA, TP2PP2, addr, timeout=2)
    worker = start(n1, 1, LLAMA, TP2PP2, addr, timeout=2, SGLANG_SIM_FAULT="never_join")
    assert head.wait_exit() == -signal.SIGKILL
    log = head.log()
    # torch fails once the whole seconds elapsed exceed the timeout: 3 > 2 (4 if this machine was that late)
    assert re.search(r"torch\.distributed\.DistStoreError: Timed out after [34] seconds waiting for clients\. "
                     r"2/4 clients joined\.", log), log
    assert "Received sigquit from a child process. It usually means the child failed." in log
    assert "Uvicorn running" not in log
    assert worker.wait_exit() == -signal.SIGKILL
    assert ("torch.distributed.DistNetworkError: The client socket has timed out after 2000ms while trying to "
            "connect to (127.0.0.1, %d)." % port) in worker.log()


def test_a_worker_that_cannot_reach_node0_fails_like_torch(nodes):
    addr, port = rendezvous()  # nothing listens there
    tic = time.monotonic()
    worker = start(nodes[1], 1, LLAMA, TP2PP2, addr, timeout=2)
    assert worker.wait_exit() == -signal.SIGKILL
    assert time.monotonic() - tic < 15
    log = worker.log()
    msg = "The client socket has timed out after 2000ms while trying to connect to (127.0.0.1, %d)." % port
    assert "socket.cpp:1023] [c10d] " + msg in log
    assert ("TCP client failed to connect/validate to host 127.0.0.1:%d - timed out (try=0, timeout=2000ms): %s"
            % (port, msg)) in log
    assert "torch.distributed.DistNetworkError: " + msg in log
    assert "Received sigquit from a child process. It usually means the child failed." in log
    assert "has failed to connect" not in log, "a refused connection is retried without a word, as torch does"
    assert "Dummy health check server" not in log


def test_a_node_crashing_at_load_takes_the_server_down(nodes):
    n0, n1 = nodes
    addr, _ = rendezvous()
    head = start(n0, 0, LLAMA, TP2PP2, addr)
    worker = start(n1, 1, LLAMA, TP2PP2, addr, SGLANG_SIM_FAULT="crash_during_load")
    assert worker.wait_exit() == -signal.SIGKILL
    assert "simulated fault SGLANG_SIM_FAULT=crash_during_load" in worker.log()
    assert head.wait_exit() == -signal.SIGKILL
    log = head.log()
    assert "PP0 TP0] Scheduler hit an exception: Traceback" in log
    assert "Connection closed by peer [127.0.0.1]:" in log
    assert "Received sigquit from a child process. It usually means the child failed." in log
    assert "The server is fired up" not in log
    wait_for(lambda: not gpus(n0) and not gpus(n1), 10, "GPU memory released on both nodes")


def test_sigterm_on_a_worker_ends_it_and_node0_dies(nodes):
    n0, n1 = nodes
    addr, _ = rendezvous()
    head = start(n0, 0, LLAMA, TP2PP2, addr)
    worker = start(n1, 1, LLAMA, TP2PP2, addr)
    head.wait_ready(timeout=30)
    worker.proc.send_signal(signal.SIGTERM)
    assert worker.wait_exit() == -signal.SIGTERM  # no SIGTERM handler on node_rank >= 1: the default action
    assert head.wait_exit(timeout=10) == -signal.SIGKILL
    log = head.log()
    assert "SIGQUIT received. signum=" in log and "It usually means one child failed." in log
    wait_for(lambda: not gpus(n0) and not gpus(n1), 10, "GPU memory released on both nodes")


def test_rendezvous_port_taken_fails_node0_with_torchs_text(nodes):
    addr, port = rendezvous()
    with socket.socket() as stale:  # a stale process holding the port
        stale.bind(("0.0.0.0", port))
        stale.listen()
        head = start(nodes[0], 0, LLAMA, TP2PP2, addr, timeout=2)
        assert head.wait_exit() == -signal.SIGKILL
    assert ("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
            "address. port: %d, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use"
            % port) in head.log()


def test_a_worker_of_another_job_is_not_counted(nodes):
    n0, n1 = nodes
    addr, _ = rendezvous()
    head = start(n0, 0, LLAMA, TP2PP2, addr, timeout=2)
    n1.model(LLAMA, num_hidden_layers=30)  # node 1's copy of the model differs
    worker = start(n1, 1, LLAMA, TP2PP2, addr, timeout=2)
    assert head.wait_exit() == -signal.SIGKILL
    log = head.log()
    assert re.search(r"Timed out after [34] seconds waiting for clients\. 2/4 clients joined\.", log), log
    assert re.search(r"simulator: node 1 rank [23] joined the rendezvous with model='LlamaForCausalLM, 30 layers", log)
    assert worker.wait_exit() == -signal.SIGKILL
    assert "DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed." in worker.log()
