#!/usr/bin/env python3
"""A fake preflight worker for the orchestrator's tests: the real worker's command line and JSON lines, with
behaviour chosen by the JSON in $FAKE_WORKER (stdlib only, starts in milliseconds):

    {"start": "crash" | "hang",          before anything (torch missing / CUDA init stuck)
     "gbps": 50.0, "latency_us": 0.5,    every pair, unless "pairs": {"0:1": {"gbps": 10, "latency_us": 3}}
     "busbw": 30.0,                      every group, unless "groups": {"0,1": {"busbw": 5}}
     "hang": ["0:1", "0,1,2,3"],         items that print begin and never finish (with P2P on; "off:..." with off)
     "die": ["1:0"], "wrong": ["2:3"],   items after whose begin the process exits 3 / whose data is wrong
     "noise": true,                      NCCL-like lines between the JSON lines
     "child": true}                      start a child process that lives on (the kill must take it too)
NCCL_P2P_DISABLE=1 in the environment answers "off_gbps" / "off_busbw" (default 10 / 5) and uses "off:" keys;
NCCL_P2P_LEVEL=SYS answers "sys_busbw" (default: as without it) and uses "sys:" keys.
"""
import json
import os
import signal
import subprocess
import sys


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main(argv):
    plan = json.loads(os.environ.get("FAKE_WORKER", "{}"))
    off = os.environ.get("NCCL_P2P_DISABLE") == "1"
    sys_level = os.environ.get("NCCL_P2P_LEVEL") == "SYS"
    prefix = "off:" if off else "sys:" if sys_level else ""
    if plan.get("child"):
        child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
        emit({"event": "child", "pid": child.pid})
    if plan.get("start") == "crash":
        emit({"event": "error", "step": argv[0], "message": "ModuleNotFoundError: No module named 'torch'"})
        return 1
    if plan.get("start") == "hang":
        signal.pause()
    items = [argv[i + 1] for i, a in enumerate(argv) if a in ("--pair", "--group", "--gpus")]
    if "--src" in argv:
        items.insert(0, "%s:%s" % (argv[argv.index("--src") + 1], argv[argv.index("--dst") + 1]))
    if argv[0] == "p2p" and "--env" in argv:
        emit({"event": "result", "step": "env", "torch": "fake", "cuda": "13.0", "nccl": "2.28.9", "device_count": 8})
    for item in items:
        key = prefix + item
        if argv[0] == "p2p":
            src, dst = (int(x) for x in item.split(":"))
            emit({"event": "begin", "step": "p2p", "src": src, "dst": dst})
        else:
            gpus = [int(x) for x in item.split(",")]
            emit({"event": "begin", "step": "allreduce", "gpus": gpus})
        if plan.get("noise"):
            print("vm:1:1 [0] NCCL INFO not json", flush=True)
        if key in plan.get("hang", []):
            while True:
                signal.pause()
        if key in plan.get("die", []):
            sys.stderr.write("Segmentation fault in %s\n" % item)
            return 3
        wrong = 7 if key in plan.get("wrong", []) else 0
        status = "wrong" if wrong else "ok"
        if argv[0] == "p2p":
            figures = dict({"gbps": plan.get("off_gbps", 10.0) if off else plan.get("gbps", 50.0),
                            "latency_us": 14.0 if off else plan.get("latency_us", 0.5)},
                           **plan.get("pairs", {}).get(key, {}))
            if src == dst:
                figures = {"gbps": 2000.0, "latency_us": 1.5}
            emit(dict({"event": "result", "step": "p2p", "src": src, "dst": dst, "local": src == dst,
                       "peer_access": True, "p2p_disabled": off and src != dst, "wrong": wrong, "status": status},
                      **figures))
        else:
            n = len(gpus)
            default = plan.get("off_busbw", 5.0) if off else plan.get("busbw", 30.0)
            if sys_level:
                default = plan.get("sys_busbw", default)
            busbw = plan.get("groups", {}).get(key, {}).get("busbw", default)
            factor = 2.0 * (n - 1) / n if n > 1 else 1.0
            emit({"event": "result", "step": "allreduce", "gpus": gpus, "size": n, "bytes": 1 << 20,
                  "small_bytes": 8192, "busbw_gbps": busbw if n > 1 else 0.0, "algbw_gbps": busbw / factor,
                  "latency_us": 3.4 * n * (4 if off else 1), "call_us": 15.0, "init_seconds": 0.1, "wrong": wrong,
                  "status": status, "p2p_disabled": off})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
