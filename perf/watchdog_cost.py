#!/usr/bin/env python3
"""What the watchdog costs a host: probe requests per minute and CPU seconds per hour, at the default interval.

    .venv/bin/python perf/watchdog_cost.py [--runs 20] [--interval 30]

Starts the lab's SGLang simulator from the source tree on a free local port (fake GPU spec, private fake-NVML
state), then times what one timer tick does: a new Python (the oneshot service) importing the watchdog package,
and one `run_once` (settings checked, the lock tried, `systemctl show` of the unit, the GET /health_generate probe
with its one-token generation, the state and metrics files written). `systemctl show` is answered by a stub here
(no systemd in the development container): its own cost is one more process start, which the figure for the
Python start bounds. Requests per minute: one probe per watched server per run, each one 1-token generation on
the server (SGLang skips the generation while the server is busy serving); besides, the answer probe (a greedy
generation of at most 64 tokens, here through /generate: mode on) at the first pass of each start and every
answer_every-th pass: its wall and CPU timed too, amortised over answer_every runs.
"""
import argparse
import json
import os
import pathlib
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import _common
from ansible_collections.topolaunch.sglang.plugins.module_utils import watchdog, watchdog_install

ROOT = pathlib.Path(__file__).resolve().parent.parent
TARGET_CPU_S_PER_HOUR = 60.0   # one CPU minute an hour at the default interval


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--interval", type=float, default=watchdog.DEFAULTS["interval"])
    parser.add_argument("--answer-every", type=int, default=watchdog.DEFAULTS["answer_every"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        port = free_port()
        (tmp / "nvml").mkdir()
        env = dict(os.environ, PYTHONPATH=str(ROOT / "lab" / "sglang_sim"), FAKE_NVML_STATE_DIR=str(tmp / "nvml"),
                   SGLANG_SIM_GPU_SPEC=str(ROOT / "lab" / "specs" / "proxmox-8x-rtx-pro-6000-vnuma.json"),
                   SGLANG_SIM_LOAD_SECONDS="0", SGLANG_SIM_CAPTURE_SECONDS="0", SGLANG_SIM_HEALTH_POLL_SECONDS="1")
        log = open(tmp / "server.log", "wb")
        server = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", "--model-path",
                                   str(ROOT / "tests" / "fixtures" / "models" / "llama-2-7b"), "--port", str(port)],
                                  stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(tmp))
        try:
            deadline = time.monotonic() + 60
            while b"ready to roll" not in (tmp / "server.log").read_bytes():
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("watchdog_cost: the simulator did not start:\n%s"
                                     % (tmp / "server.log").read_text()[-2000:])
                time.sleep(0.2)
            plan = tmp / "current_plan.json"
            plan.write_text(json.dumps({"host": "127.0.0.1", "port": port, "gpu_indices": [0],
                                        "layout": {"nnodes": 1}, "model_path": str(ROOT / "tests" / "fixtures"
                                                                                   / "models" / "llama-2-7b")}))
            settings = {"servers": [{"unit": "topolaunch-sglang.service", "current_plan": str(plan)}],
                        "lock_file": str(tmp / "relaunch.lock"), "state_dir": str(tmp / "state"),
                        "metrics_file": str(tmp / "metrics" / "watchdog.prom"), "interval": args.interval}
            show = {"ActiveState": "active", "InvocationID": "perf", "ExecMainStartTimestampMonotonic": "1"}

            def systemctl(argv):
                props = argv[2].split("=", 1)[1].split(",")
                return 0, "".join("%s=%s\n" % (p, show.get(p, "")) for p in props), ""
            # one tick in-process: CPU and wall per run_once
            walls, cpus = [], []
            for _ in range(args.runs):
                c0, t0 = cpu(), time.perf_counter()
                out = watchdog.run_once(settings, run=systemctl, log=lambda line: None)
                walls.append(time.perf_counter() - t0)
                cpus.append(cpu() - c0)
                assert out[0][1] == "ok", out
            # the answer probe: what a run asks besides when it is due (mode on: the fixture is a base model)
            answer_s = dict(watchdog.check_settings(settings), answer_probe="on")
            answer_walls, answer_cpus = [], []
            for _ in range(5):
                c0, t0 = cpu(), time.perf_counter()
                passed, detail = watchdog.check_answer(watchdog.new_state(), json.loads(plan.read_text()),
                                                       str(plan), answer_s)
                answer_walls.append(time.perf_counter() - t0)
                answer_cpus.append(cpu() - c0)
                assert passed, detail
            # the oneshot's own start: a new Python importing the installed package
            pkg = tmp / "pkg" / watchdog_install.PACKAGE
            pkg.mkdir(parents=True)
            for name, text in watchdog_install.package_sources().items():
                (pkg / name).write_text(text)
            c0 = children_cpu()
            starts = 5
            for _ in range(starts):
                subprocess.run([sys.executable, "-c", "import %s.watchdog" % watchdog_install.PACKAGE], check=True,
                               env=dict(os.environ, PYTHONPATH=str(tmp / "pkg")))
            start_cpu = (children_cpu() - c0) / starts
        finally:
            server.terminate()
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            log.close()
    answer_cpu = sum(answer_cpus) / len(answer_cpus)
    answers_per_hour = 3600.0 / args.interval / args.answer_every if args.answer_every else 0.0
    per_run = sum(cpus) / len(cpus) + start_cpu
    runs_per_hour = 3600.0 / args.interval
    cpu_per_hour = per_run * runs_per_hour + answer_cpu * answers_per_hour
    per_minute = 60.0 / args.interval
    walls.sort()
    print("watchdog_cost: one run: %.1f ms wall (median; the probe waits for the 1-token generation), %.1f ms CPU "
          "in-process + %.1f ms CPU for the Python start" % (walls[len(walls) // 2] * 1000,
                                                             sum(cpus) / len(cpus) * 1000, start_cpu * 1000))
    answer_walls.sort()
    print("watchdog_cost: one answer probe: %.1f ms wall (median; up to 64 greedy tokens), %.1f ms CPU; every %d "
          "passes: %.1f an hour, besides one after each start" % (answer_walls[len(answer_walls) // 2] * 1000,
                                                                  answer_cpu * 1000, args.answer_every,
                                                                  answers_per_hour))
    print("watchdog_cost: at interval %g s: %.1f probe requests/min per server (each a 1-token generation), "
          "%.1f CPU s/h on the host (target < %g)" % (args.interval, per_minute, cpu_per_hour, TARGET_CPU_S_PER_HOUR))
    _common.record("watchdog_cost", [
        _common.row("watchdog probe rate at the default interval", "%.1f requests/min per server" % per_minute,
                    "one 1-token generation per interval", True),
        _common.row("watchdog answer probes at the default interval", "%.1f an hour per server (+1 per start)"
                    % answers_per_hour, "one greedy generation of <= 64 tokens every answer_every passes", True),
        _common.row("watchdog CPU on the host (Python start + one run per interval)", "%.1f CPU s/h" % cpu_per_hour,
                    "< %g CPU s/h" % TARGET_CPU_S_PER_HOUR, cpu_per_hour < TARGET_CPU_S_PER_HOUR)],
        interval=args.interval, answer_every=args.answer_every, answer_wall_s=answer_walls,
        answer_cpu_s=answer_cpus, run_wall_s=walls, run_cpu_s=cpus, python_start_cpu_s=start_cpu)
    return 0 if cpu_per_hour < TARGET_CPU_S_PER_HOUR else 1


if __name__ == "__main__":
    sys.exit(main())
