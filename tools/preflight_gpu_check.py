#!/usr/bin/env python3
"""Run the preflight (orchestrator + worker) on a real GPU machine and prove its parts; everything lands in --out.

    python3 tools/preflight_gpu_check.py --out DIR [--worker roles/preflight/files/preflight_worker.py]

Needs torch (with CUDA and NCCL) and nvidia-ml-py in this python; no Ansible, no SGLang. What it does:
1. facts.json: the gpu_topology facts through NVML (module_utils/topolaunch/topology.py).
2. preflight.json: run_preflight over every GPU with the default groups (on one GPU: the env step, the local
   copy, a one-rank allreduce; on two or more also every pair and the multi-GPU allreduces).
3. costs.json: the per-step costs: the env step, a p2p session of 8 pairs (startup and seconds per pair), an
   allreduce session measuring the largest group 4 times (startup and seconds per group); plus one host-path
   copy (--via-host) to exercise that code on the GPU, and the estimate for 8 GPUs from these costs.
4. hangs.json: a p2p step and an allreduce step told to hang (--test-hang: a GPU kernel that never ends) must
   come back as `hang` after the deadline, killed, leaving no worker process and no NVML compute process; the
   next step on the same GPU must work.
5. nccl/: NCCL run (one-rank allreduce through the worker, NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,GRAPH,ENV)
   without a topology file, with a file generated from the facts (GPU under a made-up switch, the CPU node of
   the facts), with a variant that puts the GPU straight on the CPU, and with a file of the wrong version
   (must be refused: proves NCCL reads the file); each with NCCL_TOPO_DUMP_FILE. nccl-proof.json compares.
"""
import argparse
import json
import os
import pathlib
import re
import sys
import time

from ansible_collections.topolaunch.sglang.plugins.module_utils import nccl_topo, preflight
from ansible_collections.topolaunch.sglang.plugins.module_utils.topology import import_nvml, read_topology

ROOT = pathlib.Path(__file__).resolve().parent.parent


def dump(path, data):
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def worker_processes(worker):
    """pids whose command line names the worker script (leftovers after a kill)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmd = pathlib.Path("/proc", entry, "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if worker in cmd:
            found.append(int(entry))
    return found


def compute_pids():
    nvml = import_nvml()
    nvml.nvmlInit()
    try:
        return [p.pid for i in range(nvml.nvmlDeviceGetCount())
                for p in nvml.nvmlDeviceGetComputeRunningProcesses(nvml.nvmlDeviceGetHandleByIndex(i))]
    finally:
        nvml.nvmlShutdown()


def step(worker, argv, timeout, env=None):
    started = time.monotonic()
    out = preflight.run_step([sys.executable, worker] + argv, timeout, preflight.worker_env(env), tail_chars=1 << 22)
    out["wall"] = round(time.monotonic() - started, 3)
    return out


def xml_summary(path):
    """What matters in an NCCL XML: cpu nodes (numaid, affinity), pci nodes (busid, class), gpu nodes."""
    if not path.exists():
        return None
    text = path.read_text()
    return {"cpu": re.findall(r"<cpu ([^>]*)>", text), "pci": re.findall(r"<pci (busid=\"[^\"]*\" class=\"[^\"]*\")", text),
            "gpu": re.findall(r"<gpu ([^>]*)", text), "bytes": len(text)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--worker", default=str(ROOT / "roles" / "preflight" / "files" / "preflight_worker.py"))
    args = ap.parse_args()
    out = pathlib.Path(args.out)
    (out / "nccl").mkdir(parents=True, exist_ok=True)
    worker = args.worker
    summary = {}

    try:
        facts = read_topology(import_nvml(), "/sys")
    except Exception as exc:  # noqa: BLE001 - keep going: the rest does not need the facts
        facts = None
        summary["facts_error"] = repr(exc)
    if facts:
        dump(out / "facts.json", facts)
    gpus = list(range(facts["gpu_count"])) if facts else [0]
    print("facts:", facts and facts["fingerprint"], gpus, flush=True)

    # 2. the preflight itself
    record = preflight.run_preflight(sys.executable, worker, gpus, fingerprint=facts and facts["fingerprint"],
                                     facts=facts)
    dump(out / "preflight.json", record)
    print("\n".join(record["tables"]["report"]), flush=True)

    # 3. per-step costs
    costs = {"env": step(worker, ["env"], 120)["wall"]}
    batch = step(worker, ["p2p"] + sum([["--pair", "%d:%d" % (g, g)] for g in gpus * 8][:8], []) +
                 ["--bytes", str(preflight.DEFAULTS["bytes"]), "--iters", "10", "--warmup", "3"], 120)
    begins = [l["t"] for l in batch["lines"] if l["event"] == "begin"]
    costs["p2p_batch"] = {"status": batch["status"], "wall": batch["wall"], "startup": begins[0] if begins else None,
                          "per_pair": round((batch["lines"][-1]["t"] - begins[0]) / len(begins), 4) if begins else None,
                          "results": [l for l in batch["lines"] if l["event"] == "result"]}
    largest = ",".join(map(str, preflight.default_groups(gpus)[-1]))
    session = step(worker, ["allreduce"] + ["--group", largest] * 4, 120)
    begins = [l["t"] for l in session["lines"] if l["event"] == "begin"]
    results = [l for l in session["lines"] if l["event"] == "result"]
    costs["allreduce_session"] = {"status": session["status"], "wall": session["wall"], "group": largest,
                                  "startup": begins[0] if begins else None,
                                  "per_group": [round(r["t"] - b, 4) for b, r in zip(begins, results)],
                                  "results": results, "stderr_tail": session["stderr_tail"][-1000:]}
    host = step(worker, ["p2p", "--src", "0", "--dst", "0", "--via-host"], 120)
    costs["via_host"] = {"status": host["status"], "results": [l for l in host["lines"] if l["event"] == "result"],
                         "stderr_tail": host["stderr_tail"]}
    per_group = costs["allreduce_session"]["per_group"]
    measured = {"p2p_startup_seconds": costs["p2p_batch"]["startup"], "per_pair_seconds": costs["p2p_batch"]["per_pair"],
                "per_local_seconds": costs["p2p_batch"]["per_pair"],
                "allreduce_startup_seconds": costs["allreduce_session"]["startup"],
                "per_group_seconds": {str(len(largest.split(","))): max(per_group) if per_group else None}}
    if per_group:
        costs["estimate_8_gpus_seconds"] = preflight.estimate_seconds(measured, 8, [2, 2, 2, 2, 4, 4, 8])
    dump(out / "costs.json", costs)
    print("costs:", json.dumps({k: v for k, v in costs.items() if k != "via_host"})[:2000], flush=True)

    # 4. hangs
    hangs = {}
    for name, argv, timeout in (("p2p", ["p2p", "--src", "0", "--dst", "0", "--test-hang"], 8.0),
                                ("allreduce", ["allreduce", "--group", "0", "--test-hang"], 15.0)):
        res = step(worker, argv, timeout)
        hangs[name] = {"status": res["status"], "wall": res["wall"], "timeout": timeout, "unkillable": res["unkillable"],
                       "lines": res["lines"], "leftover_worker_pids": worker_processes(worker),
                       "nvml_compute_pids_after": compute_pids(), "stderr_tail": res["stderr_tail"][-500:]}
        after = step(worker, ["p2p", "--src", "0", "--dst", "0"], 60)
        hangs[name]["next_step"] = {"status": after["status"], "results": [l for l in after["lines"]
                                                                           if l["event"] == "result"]}
    dump(out / "hangs.json", hangs)
    print("hangs:", json.dumps({k: {x: v[x] for x in ("status", "wall", "unkillable", "leftover_worker_pids",
                                                      "nvml_compute_pids_after")} for k, v in hangs.items()}), flush=True)

    # 5. NCCL topology file
    proof = {}
    if facts:
        cpu = nccl_topo.cpu_info()
        files = {
            "bridge": nccl_topo.render(facts, [gpus], [gpus], cpu=cpu, name="topolaunch-proof-bridge"),
            "direct": nccl_topo.render(facts, [gpus], [], cpu=cpu, name="topolaunch-proof-direct"),
        }
        files["badversion"] = files["bridge"].replace('version="1"', 'version="2"', 1)
        for name in ("default", "bridge", "direct", "badversion"):
            env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,GRAPH,ENV",
                   "NCCL_TOPO_DUMP_FILE": str(out / "nccl" / ("dump-%s.xml" % name))}
            if name != "default":
                topo = out / "nccl" / ("topo-%s.xml" % name)
                topo.write_text(files[name])
                env["NCCL_TOPO_FILE"] = str(topo)
            res = step(worker, ["allreduce", "--gpus", ",".join(map(str, gpus)), "--bytes", str(1 << 20),
                                "--iters", "2", "--warmup", "1"], 60, env)
            (out / "nccl" / ("log-%s.txt" % name)).write_text(
                "status %s rc %s\n--- stdout (NCCL lines) ---\n%s\n--- stderr ---\n%s\n--- json ---\n%s\n" % (
                    res["status"], res["returncode"], res["output_tail"], res["stderr_tail"],
                    "\n".join(json.dumps(l) for l in res["lines"])))
            proof[name] = {"status": res["status"], "returncode": res["returncode"],
                           "loading_line": [l for l in (res["output_tail"] + res["stderr_tail"]).splitlines()
                                            if "opology" in l and ("Loading" in l or "version" in l or "TOPO" in l)],
                           "dump": xml_summary(out / "nccl" / ("dump-%s.xml" % name))}
    dump(out / "nccl-proof.json", proof)
    print("nccl:", json.dumps(proof, indent=1)[:6000], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
