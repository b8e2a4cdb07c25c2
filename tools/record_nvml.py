#!/usr/bin/env python3
"""Record what a real GPU machine answers, for tests/fixtures/nvml/ (run on the GPU machine).

Writes into --out:
  <name>.json        every NVML call read_topology makes, plus a full walk (all links, all P2P indices),
                     each with its answer or NVML error code; meta has versions, timings and sysfs numa_node
  <name>-busy.json   the same while a torch process holds 4 GiB on GPU 0 (with --busy)
  topo_m.txt         `nvidia-smi topo -m`, raw bytes
  topo_p2p_r.txt     `nvidia-smi topo -p2p r`, raw bytes
  smi.txt            nvidia-smi, topo -p2p w/n/a/p, nvlink -s, -q, sysfs, for the record
  facts.json         read_topology's facts on this machine, timings
Needs nvidia-ml-py (and torch for --busy).
"""
import argparse
from importlib import metadata
import json
import os
import pathlib
import platform
import subprocess
import sys
import time


from ansible_collections.topolaunch.sglang.plugins.module_utils import topology
from ansible_collections.topolaunch.sglang.plugins.plugin_utils.topology_replay import Recorder

HOLDER = ("import sys, torch; x = torch.empty(4 << 30, dtype=torch.uint8, device='cuda:0'); "
          "print('holding', flush=True); sys.stdin.read()")


def full_walk(rec, count):
    """Ask everything read_topology might ask, whatever it answered, so replays never miss an answer."""
    handles = [rec.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    for h in handles:
        for link in range(topology.NVLINK_MAX_LINKS):
            for fn in ("nvmlDeviceGetNvLinkState", "nvmlDeviceGetNvLinkRemoteDeviceType",
                       "nvmlDeviceGetNvLinkRemotePciInfo", "nvmlDeviceGetNvLinkVersion"):
                try:
                    getattr(rec, fn)(h, link)
                except rec.NVMLError:
                    pass  # recorded by the Recorder: the error code is the answer we want
    for i, a in enumerate(handles):
        for j, b in enumerate(handles):
            if i != j:
                for index in range(6):
                    try:
                        rec.nvmlDeviceGetP2PStatus(a, b, index)
                    except rec.NVMLError:
                        pass  # recorded
    try:
        rec.nvmlDeviceGetHandleByIndex(count)
    except rec.NVMLError:
        pass  # recorded: what asking past the last GPU answers


def sysfs_numa(raw):
    out = {}
    for g in raw["gpus"]:
        node = topology.sysfs_numa_node("/sys", g["pci_bus_id"])
        out[g["index"]] = -1 if node is None else node
    return out


def record(nvml, meta):
    rec = Recorder(nvml)
    start = time.perf_counter()
    facts = topology.read_topology(rec, "/sys")
    meta["read_topology_seconds_recorded"] = round(time.perf_counter() - start, 4)
    rec.nvmlInit()
    full_walk(rec, facts["gpu_count"])
    rec.nvmlShutdown()
    meta["sysfs_numa_node"] = sysfs_numa(facts)
    return rec.recording(meta), facts


def smi(*args):
    proc = subprocess.run(["nvidia-smi", *args], capture_output=True, check=False)
    return proc.stdout + (b"" if not proc.stderr else b"\n[stderr]\n" + proc.stderr)


def hold_gpu0(nvml, deadline_s=180):
    """Start a torch process holding 4 GiB on GPU 0; return it once NVML lists its pid (or raise)."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0")
    child = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, env=env)
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    deadline = time.monotonic() + deadline_s
    try:
        while time.monotonic() < deadline:
            if child.poll() is not None:
                raise RuntimeError("torch holder exited with %s before NVML saw it" % child.returncode)
            pids = [p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
            if child.pid in pids:
                return child
            time.sleep(0.2)   # poll interval of the condition above, bounded by the deadline
    finally:
        nvml.nvmlShutdown()
    child.kill()
    raise RuntimeError("pid %d did not appear in GPU 0's compute processes within %ds" % (child.pid, deadline_s))


def write(path, data):
    with open(path, "wb") as handle:
        handle.write(data if isinstance(data, bytes) else data.encode())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--busy", action="store_true", help="also record with a torch process on GPU 0")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    nvml = topology.import_nvml()
    try:
        pynvml_version = metadata.version("nvidia-ml-py")
    except metadata.PackageNotFoundError:
        pynvml_version = "unknown (no nvidia-ml-py distribution metadata)"
    meta = {"host": platform.node(), "kernel": platform.release(), "python": sys.version.split()[0],
            "nvidia_ml_py": pynvml_version, "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    recording, facts = record(nvml, dict(meta))
    write(out / ("%s.json" % args.name), json.dumps(recording, indent=1))
    timings = []
    for _ in range(5):
        start = time.perf_counter()
        topology.read_topology(nvml, "/sys")
        timings.append(round(time.perf_counter() - start, 4))
    print("read_topology on this machine (direct pynvml), 5 runs, seconds:", timings)
    write(out / "topo_m.txt", smi("topo", "-m"))
    write(out / "topo_p2p_r.txt", smi("topo", "-p2p", "r"))
    bundle = [b"### nvidia-smi\n", smi()]
    for kind in "wnap":
        bundle += [b"### nvidia-smi topo -p2p %s\n" % kind.encode(), smi("topo", "-p2p", kind)]
    bundle += [b"### nvidia-smi nvlink -s\n", smi("nvlink", "-s"), b"### nvidia-smi -q\n", smi("-q")]
    for g in facts["gpus"]:
        bus = topology.sysfs_bus_id(g["pci_bus_id"])
        for leaf in ("numa_node", "local_cpulist"):
            path = "/sys/bus/pci/devices/%s/%s" % (bus, leaf)
            try:
                content = pathlib.Path(path).read_bytes()
            except OSError as exc:
                content = ("unreadable: %s\n" % exc).encode()
            bundle += [b"### %s\n" % path.encode(), content]
    busy_facts = None
    if args.busy:
        child = hold_gpu0(nvml)
        try:
            busy, busy_facts = record(nvml, dict(meta, holder_pid=child.pid))
            bundle += [b"### nvidia-smi (torch holding 4 GiB on GPU 0)\n", smi()]
        finally:
            child.stdin.close()
            child.wait(timeout=60)
        write(out / ("%s-busy.json" % args.name), json.dumps(busy, indent=1))
    write(out / "smi.txt", b"".join(bundle))
    write(out / "facts.json", json.dumps({"facts": facts, "busy_facts": busy_facts, "direct_seconds": timings},
                                         indent=1))
    print(facts["rendered"]["matrix"])
    print(facts["rendered"]["p2p_read"])
    print(json.dumps(facts["findings"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
