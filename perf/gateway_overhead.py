#!/usr/bin/env python3
"""What the model gateway costs: throughput and time to first token through smg vs straight to the replicas.

    .venv/bin/python perf/gateway_overhead.py [--requests 200] [--concurrency 16] [--tokens 32]

Starts two SGLang simulator replicas (0.5.23, the 70B stand-in, TP4 on GPUs 0-3 and 4-7 of the field spec) and the
real gateway (smg, installed offline from the lab repository's pip/ with the release table's hashes, the command
line topolaunch renders: gateway.argv, cache-aware policy, health checks on, the API key through its credential).
Then, in the same run and alternating, the same load - `--requests` streamed /generate requests, `--concurrency`
at a time, distinct prompts - goes once through the gateway and once straight to the replicas (the client spreads
them round robin). Throughput: output tokens per second of the whole load; TTFT: median time from sending a
request to its first streamed chunk. Goal (issue 22): throughput through the gateway >= 95% of direct.
"""
import argparse
import concurrent.futures
import http.client
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import _common

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "sim"))
import simlab  # noqa: E402  pylint: disable=wrong-import-position
import yaml  # noqa: E402  pylint: disable=wrong-import-position
from ansible_collections.topolaunch.sglang.plugins.module_utils import gateway  # noqa: E402

KEY = "perf-gateway-key"
GOAL = 0.95


def gateway_venv(tmp):
    defaults = yaml.safe_load((ROOT / "roles/topolaunch/defaults/main.yml").read_text())
    row = gateway.release_for(defaults["topolaunch_gateway_releases"], defaults["topolaunch_gateway_version"],
                              "0.5.23")
    (tmp / "req.txt").write_text("".join(r + "\n" for r in row["requirements"]))
    subprocess.run([sys.executable, "-m", "venv", str(tmp / "gw")], check=True, timeout=120)
    subprocess.run([str(tmp / "gw/bin/python"), "-m", "pip", "install", "--quiet", "--no-index", "--find-links",
                    str(ROOT / "build/repo/pip"), "--require-hashes", "-r", str(tmp / "req.txt")], check=True,
                   timeout=300, env=dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_CONFIG_FILE=os.devnull))
    return tmp / "gw/bin/python"


def one(port, i, tokens):
    """One streamed /generate: (seconds to the first chunk, output tokens)."""
    body = json.dumps({"text": "%08x p%d" % (i * 2654435761 % 2 ** 32, i), "stream": True,
                       "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    start = time.monotonic()
    conn.request("POST", "/generate", body, {"Content-Type": "application/json", "Authorization": "Bearer " + KEY})
    resp = conn.getresponse()
    first = None
    while True:
        line = resp.readline()
        if not line:
            break
        if first is None and line.strip():
            first = time.monotonic() - start
    conn.close()
    if resp.status != 200:
        raise RuntimeError("port %d answered %d" % (port, resp.status))
    return first, tokens


def load(ports, n, concurrency, tokens, offset):
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        out = list(pool.map(lambda i: one(ports[i % len(ports)], offset + i, tokens), range(n)))
    wall = time.monotonic() - start
    return sum(t for _, t in out) / wall, statistics.median(f for f, _ in out)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        wheels = tmp / "wheels"
        subprocess.run([sys.executable, str(ROOT / "lab/sglang_sim/build_wheel.py"), "--out", str(wheels)],
                       check=True, capture_output=True, timeout=120)
        site = simlab.unpack(next(wheels.glob("sglang-0.5.23+sim-*.whl")), tmp / "site")
        lab = simlab.Lab(tmp / "lab", site)
        try:
            model = lab.model("llama-3.1-70b")
            reps = []
            for i, gpus in enumerate(("0,1,2,3", "4,5,6,7")):
                port = simlab.free_port()
                log = open(tmp / ("replica-%d.log" % i), "wb")
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--tp-size", "4",
                     "--host", "127.0.0.1", "--port", str(port), "--api-key", KEY], stdout=log,
                    stderr=subprocess.STDOUT, cwd=str(lab.tmp), env=lab.env(CUDA_VISIBLE_DEVICES=gpus),
                    start_new_session=True))
                reps.append({"index": i, "port": port, "url": "http://127.0.0.1:%d" % port})
            for r in reps:
                simlab.wait_for(lambda r=r: simlab.port_open(r["port"]), 60, "replica %d" % r["index"])
            python = gateway_venv(tmp)
            gw_port = simlab.free_port()
            creds = tmp / "creds"
            creds.mkdir(mode=0o700)
            (creds / "api-key").write_text(KEY + "\n")
            argv = gateway.argv(reps, "127.0.0.1", gw_port, "cache_aware", 1, {"log_level": "warn"},
                                simlab.free_port())
            procs.append(subprocess.Popen(
                [str(python), str(ROOT / "roles/gateway/files/gateway_launcher.py"), *argv],
                stdout=open(tmp / "gateway.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True,
                env=dict({k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_", "CUDA_"))},
                         CREDENTIALS_DIRECTORY=str(creds))))

            def ready():
                try:
                    status, body = simlab.http("GET", "http://127.0.0.1:%d/readiness" % gw_port)[:2]
                except OSError:
                    return False
                return status == 200 and json.loads(body).get("healthy_workers") == 2
            simlab.wait_for(ready, 60, "the gateway ready with both replicas", interval=0.2)
            load([gw_port], args.concurrency, args.concurrency, args.tokens, 10 ** 6)      # warm-up
            via, direct = [], []
            for k in range(args.rounds):
                off = (2 * k + 1) * 10 ** 5
                via.append(load([gw_port], args.requests, args.concurrency, args.tokens, off))
                direct.append(load([r["port"] for r in reps], args.requests, args.concurrency, args.tokens,
                                   off + 10 ** 5 // 2))
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            lab.cleanup()
    thr_gw, thr_direct = statistics.median(v[0] for v in via), statistics.median(d[0] for d in direct)
    ttft_gw, ttft_direct = statistics.median(v[1] for v in via), statistics.median(d[1] for d in direct)
    ratio = thr_gw / thr_direct
    rows = [_common.row("gateway: throughput through smg vs direct (2 sim replicas, c=%d)" % args.concurrency,
                        "%.0f vs %.0f tok/s (%.1f%%)" % (thr_gw, thr_direct, 100 * ratio),
                        ">= %d%%" % (100 * GOAL), ratio >= GOAL),
            _common.row("gateway: median TTFT through smg vs direct", "%.1f vs %.1f ms" % (
                1000 * ttft_gw, 1000 * ttft_direct), "-", True)]
    _common.record("gateway_overhead", rows, via=via, direct=direct, requests=args.requests,
                   concurrency=args.concurrency, tokens=args.tokens)
    for r in rows:
        print("%s: %s (goal %s)%s" % (r["what"], r["figure"], r["goal"], "" if r["met"] else "  NOT MET"))


if __name__ == "__main__":
    main()
