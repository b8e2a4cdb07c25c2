#!/usr/bin/env python3
"""A rolling restart of a DP layout behind the model gateway: how long it takes and how many requests fail (goal 0).

    .venv/bin/python perf/rolling_restart.py [--runs 3] [--concurrency 4] [--keep]

Uses the private lab host of tests/lab/sweeplab.py (booted from the provisioned layer when needed; the simulator
loads instantly: SGLANG_SIM_LOAD_SECONDS=0, SGLANG_SIM_CAPTURE_SECONDS=0), deploys tp4dp2 of the 70B stand-in on
the field spec (two TP4 replicas behind the real smg), then runs --runs times the user's restart,
`deploy.yml --tags relaunch -e layout=tp4dp2 -e launch_force=true` (rolling: each replica taken out of the gateway,
drained, replaced, put back), while a client on the controller (the lab host shares its network) sends /generate
requests through the gateway the whole time, --concurrency at a time, each with its own 20 s timeout. Then once the
same restart with topolaunch_rolling_relaunch=false (every replica replaced at once), for comparison. Per run: the
playbook's wall time, requests sent and failed, and the endpoint's outage (first to last failed request). Back to
tp8 at the end (one server, no gateway left), and the lab host taken down unless --keep.
Needs root, systemd-nspawn, debootstrap.
"""
import argparse
import http.client
import json
import pathlib
import statistics
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "lab"))

import _common  # noqa: E402  pylint: disable=wrong-import-position
import sweeplab  # noqa: E402  pylint: disable=wrong-import-position

MODEL = "llama-3.1-70b"                 # the 70B stand-in: one TP4 replica per socket of the field spec
EXTRA = {"launch_extra_env": {"SGLANG_SIM_LOAD_SECONDS": "0", "SGLANG_SIM_CAPTURE_SECONDS": "0"},
         "topolaunch_model_path": "/srv/models/" + MODEL}
REQUEST_TIMEOUT_S = 20


def copy_model():
    model = ROOT / "tests" / "fixtures" / "models" / MODEL
    tar = subprocess.run(["tar", "-C", str(model), "-cf", "-", "."], capture_output=True, check=True).stdout
    subprocess.run(["ssh", "-F", "/dev/null", "-i", str(sweeplab.SSH_KEY), "-p", str(sweeplab.SSH_PORT),
                    "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                    "-o", "LogLevel=ERROR", "root@127.0.0.1",
                    "mkdir -p /srv/models/%s && tar -C /srv/models/%s -xf -" % (MODEL, MODEL)],
                   input=tar, check=True, timeout=120)


def relaunch(*args, extra=None):
    run = sweeplab.playbook("deploy.yml", "--tags", "relaunch", "-e", "layout=tp4dp2", *args,
                            extra=dict(EXTRA, **(extra or {})))
    if run.returncode != 0:
        raise SystemExit("rolling_restart: the relaunch failed:\n" + run.stdout[-4000:])
    return run.stdout


class Client:
    """Requests through the gateway back to back from `concurrency` threads until stopped; each answer's time and
    whether it failed (not 200, or no answer within REQUEST_TIMEOUT_S)."""

    def __init__(self, port, concurrency):
        self.port, self.concurrency = port, concurrency
        self.stop, self.lock, self.results, self.threads = threading.Event(), threading.Lock(), [], []

    def _one(self, i):
        body = json.dumps({"text": "rolling %d" % i, "sampling_params": {"max_new_tokens": 4}})
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQUEST_TIMEOUT_S)
            conn.request("POST", "/generate", body, {"Content-Type": "application/json"})
            ok = conn.getresponse().status == 200
            conn.close()
        except OSError:
            ok = False
        with self.lock:
            self.results.append((time.monotonic(), ok))

    def _loop(self, k):
        i = k
        while not self.stop.is_set():
            self._one(i)
            i += self.concurrency

    def __enter__(self):
        self.threads = [threading.Thread(target=self._loop, args=(k,)) for k in range(self.concurrency)]
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(REQUEST_TIMEOUT_S + 10)

    def figures(self):
        failed = [t for t, ok in self.results if not ok]
        return {"requests": len(self.results), "failed": len(failed),
                "outage_s": round(failed[-1] - failed[0], 2) if failed else 0.0}


def restart(concurrency, rolling):
    with Client(sweeplab.SERVER_PORT, concurrency) as client:
        start = time.monotonic()
        out = relaunch("-e", "launch_force=true", "-e", "topolaunch_rolling_relaunch=%s" % str(rolling).lower())
        wall = time.monotonic() - start
    said = "Rolling relaunch: " in out
    if said != rolling:
        raise SystemExit("rolling_restart: the relaunch did not go %s:\n%s" % (
            "one replica at a time" if rolling else "all at once", out[-4000:]))
    figures = dict(client.figures(), wall_s=round(wall, 1))
    print("%s restart: %.1f s, %d of %d requests failed, outage %.1f s" % (
        "rolling" if rolling else "all-at-once", wall, figures["failed"], figures["requests"], figures["outage_s"]))
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--keep", action="store_true", help="leave the lab host running")
    args = parser.parse_args()
    try:
        sweeplab.up_and_provisioned()
        copy_model()
        relaunch()                                           # tp4dp2 up: two replicas behind the gateway
        rolling = [restart(args.concurrency, True) for _ in range(args.runs)]
        at_once = restart(args.concurrency, False)
        sweeplab.playbook("deploy.yml", "--tags", "relaunch", "-e", "layout=tp8", extra=EXTRA)
    finally:
        if not _common.keep(args.keep):
            sweeplab.lab("down")
    failed = sum(r["failed"] for r in rolling)
    rows = [_common.row("rolling restart of tp4dp2 (2 sim replicas behind smg; `--tags relaunch -e launch_force=true`) "
                        "while a client sends requests through the gateway (c=%d)" % args.concurrency,
                        "%.1f s (median of %d), %d of %d requests failed" % (
                            statistics.median(r["wall_s"] for r in rolling), len(rolling), failed,
                            sum(r["requests"] for r in rolling)), "0 failed", failed == 0),
            _common.row("the same restart replacing every replica at once (topolaunch_rolling_relaunch: false)",
                        "%.1f s, endpoint down %.1f s (%d of %d requests failed: a refused one is sent again at "
                        "once)" % (at_once["wall_s"], at_once["outage_s"], at_once["failed"], at_once["requests"]),
                        "-", True)]
    _common.record("rolling_restart", rows, rolling=rolling, all_at_once=at_once, concurrency=args.concurrency)
    for r in rows:
        print("%s: %s (goal %s)%s" % (r["what"], r["figure"], r["goal"], "" if r["met"] else "  NOT MET"))


if __name__ == "__main__":
    main()
