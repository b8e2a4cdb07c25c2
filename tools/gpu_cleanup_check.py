#!/usr/bin/env python3
"""Check gpu_cleanup's logic on a real GPU machine (run there as root; the lab's fake NVML cannot show this).

    python3 tools/gpu_cleanup_check.py --out DIR

Real CUDA processes (PyTorch holding 4 GiB each) are started as two users: "ours" (the service user) and a
"foreign" one. Then, through the real driver's NVML:
  1. NVML lists each holder with the pid we started (no pid namespace in between) and its memory;
  2. cleanup refuses a foreign holder on our GPU and touches nothing;
  3. with the foreign holder gone, cleanup stops ours with SIGTERM and sees the GPU back at its idle memory;
  4. a foreign holder on another GPU (when there is one) is left alone.
Writes DIR/gpu_cleanup_check.json (every step, the NVML answers, timings) and exits 1 when a check fails.
Needs nvidia-ml-py and torch in this python.
"""
import argparse
import json
import os
import pathlib
import platform
import pwd
import select
import subprocess
import sys
import time


from ansible_collections.topolaunch.sglang.plugins.module_utils.cleanup import CleanupError, cleanup

HOLDER = ("import sys, torch; x = torch.empty(4 << 30, dtype=torch.uint8, device='cuda:0'); "
          "torch.cuda.synchronize(); print('holding', flush=True); sys.stdin.read()")
GIB = 1 << 30


def ensure_user(name):
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)


def holder(user, gpu, timeout=120):
    """A PyTorch process of `user` holding 4 GiB on GPU `gpu`; returns it once the memory is allocated."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu), HOME="/tmp")
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], user=user, env=env, cwd="/tmp", stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ""
    if line.strip() != "holding":
        proc.kill()
        raise RuntimeError("holder as %s on GPU %s did not allocate within %s s: %s %s"
                           % (user, gpu, timeout, line, proc.stderr.read()[-2000:]))
    return proc


def nvml_view(nvml, index):
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    return {"used_bytes": int(nvml.nvmlDeviceGetMemoryInfo(handle).used),
            "processes": [{"pid": int(p.pid), "used_gpu_memory": p.usedGpuMemory} for p in procs]}


def wait_listed(nvml, index, pids, timeout=60):
    """Poll NVML until every pid is listed on GPU `index` (deadline `timeout`); returns the last view."""
    deadline = time.monotonic() + timeout
    while True:
        view = nvml_view(nvml, index)
        if set(pids) <= {p["pid"] for p in view["processes"]}:
            return view
        if time.monotonic() > deadline:
            raise RuntimeError("NVML did not list pids %s on GPU %s within %s s: %s" % (pids, index, timeout, view))
        time.sleep(0.2)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--ours", default="tlours", help="the service user (created when missing)")
    parser.add_argument("--foreign", default="tlforeign", help="another user (created when missing)")
    args = parser.parse_args()
    import pynvml as nvml  # pylint: disable=import-outside-toplevel
    for user in (args.ours, args.foreign):
        ensure_user(user)
    nvml.nvmlInit()
    count = nvml.nvmlDeviceGetCount()
    report = {"machine": {"kernel": platform.release(), "gpus": count,
                          "name": str(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(0))),
                          "driver": str(nvml.nvmlSystemGetDriverVersion())},
              "idle": {i: nvml_view(nvml, i) for i in range(count)}, "checks": {}}
    checks = report["checks"]
    opts = {"gpu_indices": [0], "service_user": args.ours, "current_plan_path": "/nonexistent/current_plan.json",
            "term_timeout": 20, "kill_timeout": 10, "release_timeout": 60}
    procs = []
    try:
        ours = holder(args.ours, 0)
        foreign = holder(args.foreign, 0)
        procs += [ours, foreign]
        other = holder(args.foreign, 1) if count > 1 else None
        if other:
            procs.append(other)
        report["busy"] = {0: wait_listed(nvml, 0, [ours.pid, foreign.pid])}
        if other:
            report["busy"][1] = wait_listed(nvml, 1, [other.pid])
        listed = {p["pid"] for p in report["busy"][0]["processes"]}
        checks["nvml_lists_the_pids_we_started"] = {ours.pid, foreign.pid} <= listed
        try:
            cleanup(opts, nvml)
            checks["foreign_on_our_gpu_refused"] = False
        except CleanupError as exc:
            report["refusal"] = str(exc)
            checks["foreign_on_our_gpu_refused"] = ("pid %d user %s" % (foreign.pid, args.foreign)) in str(exc)
        checks["nothing_touched_after_refusal"] = ours.poll() is None and foreign.poll() is None
        foreign.terminate()
        foreign.wait(timeout=60)
        t0 = time.monotonic()
        result = cleanup(opts, nvml)
        report["cleanup"] = {k: result[k] for k in ("stopped", "left_alone", "gpus", "elapsed_s", "summary")}
        report["cleanup_wall_s"] = round(time.monotonic() - t0, 2)
        ours.wait(timeout=10)
        stopped = {p["pid"]: p for p in result["stopped"]}
        checks["ours_stopped_by_sigterm"] = stopped.get(ours.pid, {}).get("signal") == "SIGTERM"
        checks["ours_gone"] = ours.poll() is not None
        checks["memory_released"] = all(g["used_bytes"] <= 2048 << 20 for g in result["gpus"])
        checks["no_process_left_on_gpu0"] = nvml_view(nvml, 0)["processes"] == []
        if other:
            checks["foreign_on_other_gpu_survives"] = other.poll() is None and other.pid in {
                p["pid"] for p in result["left_alone"]}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
        nvml.nvmlShutdown()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_cleanup_check.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(json.dumps(report["checks"], indent=1))
    print(report.get("cleanup", {}).get("summary"))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
