"""The real model gateway (smg, installed offline from the lab repository's pip/ with the release table's hashes)
in front of simulator replicas: what smg probes and calls is answered as SGLang answers it, the command line
topolaunch renders (gateway.py) is the one smg parses, the API key reaches smg only through the credential file,
requests reach every replica, and a replica killed with SIGKILL is routed around and used again once it is back."""
import itertools
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time
import urllib.error

import pytest
import yaml

from simlab import Lab, free_port, http, wait_for
from ansible_collections.topolaunch.sglang.plugins.module_utils import gateway, rolling

ROOT = pathlib.Path(__file__).resolve().parents[2]
PIP = ROOT / "build/repo/pip"
DEFAULTS = yaml.safe_load((ROOT / "roles/topolaunch/defaults/main.yml").read_text())
LAUNCHER = ROOT / "roles/gateway/files/gateway_launcher.py"
KEY = "sekrit-gw"
AUTH = {"Authorization": "Bearer %s" % KEY}

pytestmark = pytest.mark.skipif(not list(PIP.glob("smg-*.whl")), reason="needs the lab repository (make repo)")


@pytest.fixture(scope="module")
def gateway_python(tmp_path_factory):
    """The gateway's venv as provisioning makes it: offline, every wheel checked against the table's hash."""
    tmp = tmp_path_factory.mktemp("gateway")
    row = gateway.release_for(DEFAULTS["topolaunch_gateway_releases"], DEFAULTS["topolaunch_gateway_version"],
                              "0.5.23")
    req = tmp / "requirements.txt"
    req.write_text("".join(line + "\n" for line in row["requirements"]))
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    res = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "--quiet", "--no-index", "--find-links",
                          str(PIP), "--require-hashes", "-r", str(req)], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_CONFIG_FILE=os.devnull))
    assert res.returncode == 0, res.stdout + res.stderr
    return venv / "bin/python"


class Replica:
    def __init__(self, lab, index, port, gpus, model):
        self.lab, self.index, self.port, self.gpus, self.model = lab, index, port, gpus, model
        self.url = "http://127.0.0.1:%d" % port
        self.proc = None

    def start(self):
        log = self.lab.tmp / ("replica-%d-%d.log" % (self.index, time.time_ns()))
        self.log_path = log
        with open(log, "wb") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sglang.launch_server", "--model-path", self.model, "--served-model-name",
                 "llama70", "--tp-size", "4", "--host", "127.0.0.1", "--port", str(self.port), "--api-key", KEY,
                 "--enable-metrics"], stdout=f, stderr=subprocess.STDOUT, cwd=str(self.lab.tmp),
                env=self.lab.env(CUDA_VISIBLE_DEVICES=self.gpus), start_new_session=True)
        return self

    def wait_ready(self):
        wait_for(lambda: "The server is fired up and ready to roll!" in self.log_path.read_text(errors="replace"),
                 60, "replica %d ready" % self.index)

    def requests(self):
        """The replica's own request counter (sglang:num_requests_total, summed over its label sets). A labelled
        counter has no sample before its first request (prometheus_client, and so SGLang and the simulator): 0."""
        status, body = http("GET", self.url + "/metrics")[:2]
        assert status == 200
        lines = [l for l in body.decode().splitlines() if l.startswith("sglang:num_requests_total{")]
        return sum(float(l.rsplit(" ", 1)[1]) for l in lines)

    def kill(self):
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@pytest.fixture
def served(tmp_path, sim_site_0523, gateway_python):
    lab = Lab(tmp_path / "lab", sim_site_0523)
    model = lab.model("llama-3.1-70b")
    reps = [Replica(lab, 0, free_port(), "0,1,2,3", model).start(),
            Replica(lab, 1, free_port(), "4,5,6,7", model).start()]
    for r in reps:
        r.wait_ready()
    port = free_port()
    argv = gateway.argv([{"index": r.index, "url": r.url, "port": r.port} for r in reps], "127.0.0.1", port,
                        "cache_aware", 1, {"log_level": "warn"}, free_port())
    creds = tmp_path / "credentials"
    creds.mkdir(mode=0o700)
    (creds / "api-key").write_text(KEY + "\n")
    (creds / "api-key").chmod(0o600)
    log = open(tmp_path / "gateway.log", "wb")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "CUDA_"))}
    proc = subprocess.Popen([str(gateway_python), str(LAUNCHER), *argv], stdout=log, stderr=subprocess.STDOUT,
                            env=dict(env, CREDENTIALS_DIRECTORY=str(creds)), start_new_session=True)
    url = "http://127.0.0.1:%d" % port

    def ready():
        assert proc.poll() is None, (tmp_path / "gateway.log").read_text(errors="replace")[-3000:]
        try:
            status, body = http("GET", url + "/readiness")[:2]
        except (OSError, urllib.error.URLError):
            return False
        return status == 200 and json.loads(body)["healthy_workers"] == 2
    wait_for(ready, 60, "the gateway ready with both replicas", interval=0.2)
    yield {"url": url, "proc": proc, "replicas": reps, "log": tmp_path / "gateway.log"}
    for p in [proc] + [r.proc for r in reps if r.proc]:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    log.close()
    lab.cleanup()


def ask(url, i):
    # no two prompts share a prefix: the cache-aware policy then balances by load instead of by prefix
    body = {"text": "%08x %s" % (i * 2654435761 % 2 ** 32, " ".join("w%d" % ((i * 7 + k) % 97) for k in range(5))),
            "sampling_params": {"max_new_tokens": 4}}
    return http("POST", url + "/generate", body, headers=AUTH, timeout=20)


def test_requests_through_the_gateway_reach_both_replicas(served):
    url, reps = served["url"], served["replicas"]
    cmdline = pathlib.Path("/proc/%d/cmdline" % served["proc"].pid).read_bytes()
    assert KEY.encode() not in cmdline                              # the key never on a command line
    assert http("POST", url + "/generate", {"text": "x"}, timeout=20)[0] == 401        # enforced at the gateway
    before = [r.requests() for r in reps]
    for i in range(24):
        status, body = ask(url, i)[:2]
        assert status == 200, body
        assert len(json.loads(body)["text"].split()) == 4
    status, body = http("POST", url + "/v1/chat/completions", {"model": "llama70", "max_tokens": 3, "messages": [
        {"role": "user", "content": "hi"}]}, headers=AUTH, timeout=20)[:2]
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 3
    grown = [r.requests() - b for r, b in zip(reps, before)]
    assert all(g > 0 for g in grown), grown                         # each replica's own counter grew
    # /v1/loads as SGLang's v1_loads.py answers it (smg's load monitor polls it)
    status, body = http("GET", reps[0].url + "/v1/loads?include=core,queues", headers=AUTH)[:2]
    loads = json.loads(body)
    assert status == 200 and loads["num_accelerators"] == 4 and loads["version"] == "0.5.23+sim"
    assert loads["loads"][0]["dp_rank"] == 0 and loads["loads"][0]["queues"]["waiting"] >= 0
    assert "max_total_num_tokens" in loads["loads"][0] and "memory" not in loads["loads"][0]
    assert http("GET", reps[0].url + "/v1/loads?include=bogus", headers=AUTH)[0] == 400
    assert http("GET", reps[0].url + "/v1/loads")[0] == 401


def test_a_killed_replica_is_routed_around_and_used_again(served):
    url, reps = served["url"], served["replicas"]
    reps[1].kill()                                                  # SIGKILL, the whole replica
    failures = [ask(url, i)[0] for i in range(16)]
    assert failures == [200] * 16
    reps[1].start().wait_ready()                                    # systemd's restart, on the same port
    fresh = itertools.count(100)

    def used_again():   # new prompts each round: one the gateway saw before goes where its prefix is cached
        before = reps[1].requests()
        for _ in range(8):
            assert ask(url, next(fresh))[0] == 200
        return reps[1].requests() > before
    wait_for(used_again, 60, "the gateway routing to the restarted replica again", interval=0.5)


def test_a_replica_taken_out_restarted_and_put_back_is_routed_again_and_no_request_fails(served):
    """A rolling relaunch's gateway steps (rolling.worker, the module sglang_gateway_worker's logic) against the real
    smg: it lists a removed worker "draining" for its drain settle time (5 s) and refuses to add its URL meanwhile,
    so "present" must wait for that entry to go; before, it took the draining entry for the worker and smg dropped
    it, leaving one healthy worker. A client sends requests the whole time."""
    url, reps = served["url"], served["replicas"]
    gw = rolling.Gateway(url, api_key=KEY)
    codes, stop = [], threading.Event()

    def client():
        for i in itertools.count(500):
            if stop.is_set():
                return
            codes.append(ask(url, i)[0])
    thread = threading.Thread(target=client)
    thread.start()
    try:
        for r in reps:
            assert rolling.worker(gw, r.url, "absent", 30)["changed"] is True
            assert rolling.status(gw.entry(r.url)) in (None, "draining")
            r.kill()                                                # the replica's relaunch: down, then up again
            r.start().wait_ready()
            assert rolling.worker(gw, r.url, "present", 30)["changed"] is True
            assert rolling.status(gw.entry(r.url)) == "ready"
    finally:
        stop.set()
        thread.join(60)
    status, body = http("GET", url + "/readiness")[:2]
    assert status == 200 and json.loads(body)["healthy_workers"] == 2, body
    assert len(codes) > 10 and set(codes) == {200}, codes


def test_the_launcher_refuses_the_key_on_its_command_line(gateway_python, tmp_path):
    res = subprocess.run([str(gateway_python), str(LAUNCHER), "--port", "1", "--api-key", "x"], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 1 and "give it as the credential api-key" in res.stderr
