"""topolaunch preflight worker: one measuring step per invocation, JSON lines on stdout.

Runs under the SGLang venv's python (its own torch and NCCL); started by the orchestrator
(module_utils/topolaunch/preflight.py), which puts a hard deadline on every step and kills the step's
process group when it passes (a hang is a result). GPU numbers are NVML indices: the orchestrator sets
CUDA_DEVICE_ORDER=PCI_BUS_ID and removes CUDA_VISIBLE_DEVICES.

    preflight_worker.py env
    preflight_worker.py p2p [--env] --src A --dst B [--pair C:D ...] [--bytes N] [--small-bytes 4] [--iters K]
                        [--warmup W] [--via-host]
    preflight_worker.py allreduce --gpus 0,1,2,3 [--group 0,1 ...] [--bytes N] [--small-bytes 8192] [--iters K]
                        [--warmup W]

Every line is one JSON object with "event": "begin" (a measurement starts; the orchestrator's deadline
restarts), "result" (its figures) or "error" (it failed: "message"). One invocation is a session: `p2p`
measures each listed directed pair in one process (src == dst is a copy within one GPU: the local copy
bandwidth, not P2P); --env prints the env step's line first, saving a process start (torch import and CUDA
contexts cost seconds). `allreduce` starts one process per GPU of all its groups (torch.distributed: gloo over
all of them for coordination, which puts no traffic on the GPU links, and one NCCL group per measured group)
and measures the groups one after the other; the first GPU of each group prints that group's lines.

Timing: CUDA events on the stream doing the work; a spin kernel (torch.cuda._sleep) holds the stream while
the timed launches are queued, so Python's launch cost is not counted. Results are checked: the copy must
equal the source pattern, the allreduce (sum) must give n(n+1)/2 for ranks contributing 1..n.
Figures follow nccl-tests: algbw = bytes / time; allreduce busbw = algbw * 2(n-1)/n.

NCCL variables come from the environment and are honoured by NCCL itself (NCCL_P2P_DISABLE, NCCL_P2P_LEVEL,
NCCL_TOPO_FILE, NCCL_DEBUG...). The p2p step honours NCCL_P2P_DISABLE=1 too: it then copies through pinned
host memory (device to host, then host to device), the path NCCL takes without P2P (--via-host asks for the
same path explicitly, also for a GPU to itself: its PCIe round trip).

--test-hang (tests only): after the "begin" line the step launches a GPU kernel that never ends and waits
for it, so the orchestrator's deadline is proven against a process blocked on the GPU.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

SPIN_CYCLES = 20_000_000          # ~10 ms at 2 GHz: covers queueing the timed launches
LATENCY_COPIES = 200
FOREVER_CYCLES = 1 << 62
P2P_DISABLED = os.environ.get("NCCL_P2P_DISABLE", "") == "1"


def emit(obj):
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def nccl_env():
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")}


def hang_forever(torch, device):
    """Test only: a kernel that spins for ~2^62 cycles, then wait for it (blocked on the GPU, killable)."""
    with torch.cuda.device(device):
        torch.cuda._sleep(FOREVER_CYCLES)
        torch.cuda.synchronize()


class Spin:
    """Holds a stream with a spin kernel while launches are queued; says whether it lasted long enough."""

    def __init__(self, torch, device):
        self.torch = torch
        self.device = device
        self.cycles = SPIN_CYCLES
        with torch.cuda.device(device):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(self.cycles)
            end.record()
            end.synchronize()
            self.ms = start.elapsed_time(end)

    def hold(self):
        self.queued_at = time.perf_counter()
        self.torch.cuda._sleep(self.cycles)

    def covered(self):
        """True when queueing finished before the spin ended (the timing saw only GPU work)."""
        return (time.perf_counter() - self.queued_at) * 1000.0 < self.ms


# ------------------------------------------------------------------------------------------------ env

def cmd_env(_args):
    import torch
    emit(env_result(torch))


def env_result(torch):
    count = torch.cuda.device_count()
    devices = []
    for i in range(count):
        p = torch.cuda.get_device_properties(i)
        bus = None
        if hasattr(p, "pci_bus_id"):
            bus = "%04x:%02x:%02x.0" % (getattr(p, "pci_domain_id", 0), p.pci_bus_id, getattr(p, "pci_device_id", 0))
        devices.append({"index": i, "name": p.name, "capability": "%d.%d" % (p.major, p.minor),
                        "memory_bytes": int(p.total_memory), "pci_bus_id": bus})
    peer = [[i == j or bool(torch.cuda.can_device_access_peer(i, j)) for j in range(count)] for i in range(count)]
    try:
        nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
    except Exception:  # noqa: BLE001 - a torch without NCCL: say so, the allreduce step will fail by itself
        nccl = None
    return {"event": "result", "step": "env", "python": sys.version.split()[0], "torch": torch.__version__,
            "cuda": torch.version.cuda, "nccl": nccl, "device_count": count, "devices": devices,
            "peer_access": peer, "nccl_env": nccl_env(), "simulated": False}


# ------------------------------------------------------------------------------------------------ p2p

def _time_copies(torch, stream, spin, copy, count):
    """Milliseconds per copy on `stream` (events), queued behind the spin kernel."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    spin.hold()
    start.record(stream)
    for _rep in range(count):
        copy()
    end.record(stream)
    covered = spin.covered()
    end.synchronize()
    return start.elapsed_time(end) / count, covered


def measure_copy(torch, src, dst, nbytes, small_bytes, iters, warmup, via_host):
    """Copy bandwidth src -> dst at nbytes and per-copy latency at small_bytes, checked."""
    n = max(1, nbytes // 4)
    small = max(1, small_bytes // 4)
    peer = src == dst or bool(torch.cuda.can_device_access_peer(src, dst))
    a = torch.arange(n, dtype=torch.int32, device="cuda:%d" % src)
    b = torch.empty(n, dtype=torch.int32, device="cuda:%d" % dst)
    sa = torch.arange(small, dtype=torch.int32, device="cuda:%d" % src)
    sb = torch.empty(small, dtype=torch.int32, device="cuda:%d" % dst)
    out = {"event": "result", "step": "p2p", "src": src, "dst": dst, "bytes": n * 4, "small_bytes": small * 4,
           "iters": iters, "local": src == dst, "peer_access": peer, "p2p_disabled": via_host}
    if via_host:
        # Two halves, each timed with events on its own device's stream: D2H on src, H2D on dst.
        host = torch.empty(n, dtype=torch.int32, pin_memory=True)
        shost = torch.empty(small, dtype=torch.int32, pin_memory=True)
        spins = {src: Spin(torch, src), dst: Spin(torch, dst)}
        halves = {}
        for name, device, copy, scopy in (
                ("d2h", src, lambda: host.copy_(a, non_blocking=True), lambda: shost.copy_(sa, non_blocking=True)),
                ("h2d", dst, lambda: b.copy_(host, non_blocking=True), lambda: sb.copy_(shost, non_blocking=True))):
            with torch.cuda.device(device):
                stream = torch.cuda.current_stream(device)
                for _rep in range(warmup):
                    copy()
                big_ms, ok1 = _time_copies(torch, stream, spins[device], copy, iters)
                small_ms, ok2 = _time_copies(torch, stream, spins[device], scopy, LATENCY_COPIES)
                halves[name] = (big_ms, small_ms, ok1 and ok2)
        big_ms = halves["d2h"][0] + halves["h2d"][0]
        small_ms = halves["d2h"][1] + halves["h2d"][1]
        covered = halves["d2h"][2] and halves["h2d"][2]
        out["d2h_gbps"] = round(n * 4 / (halves["d2h"][0] / 1000.0) / 1e9, 3)
        out["h2d_gbps"] = round(n * 4 / (halves["h2d"][0] / 1000.0) / 1e9, 3)
    else:
        spin = Spin(torch, src)
        with torch.cuda.device(src):
            stream = torch.cuda.current_stream(src)
            for _rep in range(warmup):
                b.copy_(a, non_blocking=True)
                sb.copy_(sa, non_blocking=True)
            big_ms, ok1 = _time_copies(torch, stream, spin, lambda: b.copy_(a, non_blocking=True), iters)
            small_ms, ok2 = _time_copies(torch, stream, spin, lambda: sb.copy_(sa, non_blocking=True), LATENCY_COPIES)
            covered = ok1 and ok2
    torch.cuda.synchronize(src)
    torch.cuda.synchronize(dst)
    expect = torch.arange(n, dtype=torch.int32, device="cuda:%d" % dst)
    wrong = int((b != expect).sum().item()) + int((sb != expect[:small]).sum().item())
    out.update({"gbps": round(n * 4 / (big_ms / 1000.0) / 1e9, 3), "time_us": round(big_ms * 1000.0, 3),
                "latency_us": round(small_ms * 1000.0, 3), "wrong": wrong, "spin_covered": covered,
                "status": "ok" if wrong == 0 else "wrong"})
    del a, b, sa, sb
    return out


def cmd_p2p(args):
    import torch
    pairs = ([(args.src, args.dst)] if args.src is not None else []) + [tuple(p) for p in args.pair]
    count = torch.cuda.device_count()
    started = time.monotonic()
    for device in sorted({g for pair in pairs for g in pair if 0 <= g < count}):
        torch.zeros(1, device="cuda:%d" % device)      # CUDA context of every GPU used, before any timing
    cuda_init = round(time.monotonic() - started, 4)
    if args.env:
        emit(env_result(torch))
    for src, dst in pairs:
        emit({"event": "begin", "step": "p2p", "src": src, "dst": dst, "cuda_init_seconds": cuda_init})
        if not (0 <= src < count and 0 <= dst < count):
            emit({"event": "error", "step": "p2p", "src": src, "dst": dst,
                  "message": "GPU %d or %d does not exist (torch sees %d)" % (src, dst, count)})
            continue
        if args.test_hang:
            hang_forever(torch, src)
        started = time.monotonic()
        out = measure_copy(torch, src, dst, args.bytes, args.small_bytes, args.iters, args.warmup,
                           args.via_host or (P2P_DISABLED and src != dst))
        out["seconds"] = round(time.monotonic() - started, 4)
        emit(out)


# ------------------------------------------------------------------------------------------ allreduce

def world_gpus(groups):
    """Every GPU of the groups, in order of first appearance: rank r of the session drives world[r]."""
    world = []
    for group in groups:
        world += [g for g in group if g not in world]
    return world


def cmd_allreduce(args):
    """Parent: stdlib only. One child per GPU of all groups, all writing to this stdout (the leader of each
    group, its first GPU's rank, prints that group's lines). The first child to fail ends the session."""
    groups = ([args.gpus] if args.gpus else []) + args.group
    world = world_gpus(groups)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="topolaunch-preflight-") as tmp:
        children = []
        for rank in range(len(world)):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(len(world)), LOCAL_RANK=str(rank))
            env.setdefault("GLOO_SOCKET_IFNAME", "lo")     # all ranks are on this host
            argv = [sys.executable, os.path.abspath(__file__), "_rank", "--store", os.path.join(tmp, "store")]
            argv += sum((["--group", ",".join(map(str, g))] for g in groups), [])
            argv += ["--bytes", str(args.bytes), "--small-bytes", str(args.small_bytes), "--iters", str(args.iters),
                     "--warmup", str(args.warmup)] + (["--test-hang"] if args.test_hang else [])
            children.append(subprocess.Popen(argv, env=env))
        failed = None
        running = {child.pid: rank for rank, child in enumerate(children)}
        while running:
            pid, status = os.wait()          # blocks until a child ends; the orchestrator owns the deadline
            rank = running.pop(pid, None)
            if rank is None:
                continue
            children[rank].returncode = code = os.waitstatus_to_exitcode(status)
            if code != 0 and failed is None:
                failed = (rank, code)
                for other in running:          # one rank gone: the others would wait for it forever
                    os.kill(other, signal.SIGKILL)
    if failed is not None:
        emit({"event": "error", "step": "allreduce", "message": "rank %d (GPU %d) exited with %d"
              % (failed[0], world[failed[0]], failed[1]), "seconds": round(time.monotonic() - started, 4)})
        return 1
    return 0


def _allreduce_time(torch, dist, spin, buf, iters, group):
    """(ms per in-place allreduce on the current stream, spin covered, host us per call); launches queued
    behind the spin kernel."""
    stream = torch.cuda.current_stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    spin.hold()
    dist.all_reduce(buf, group=group)      # absorbs the ranks' skew after the spin
    start.record(stream)
    queued = time.perf_counter()
    for _rep in range(iters):
        dist.all_reduce(buf, group=group)
    call_us = (time.perf_counter() - queued) * 1e6 / iters
    end.record(stream)
    covered = spin.covered()
    end.synchronize()
    return start.elapsed_time(end) / iters, covered, call_us


def measure_group(torch, dist, group, pg, gpu, args, spin):
    """This rank's part of one group's measurement; the figures of the group's leader are the group's."""
    me = group.index(gpu)
    n = len(group)
    started = time.monotonic()
    one = torch.ones(1, device="cuda:%d" % gpu)
    dist.all_reduce(one, group=pg)         # the group's NCCL communicator is made here
    torch.cuda.synchronize()
    init_seconds = time.monotonic() - started
    if args.test_hang and me == 0:
        hang_forever(torch, gpu)
    figures = {}
    covered = True
    for key, nbytes, iters in (("small", args.small_bytes, max(args.iters, 20) * 2), ("large", args.bytes, args.iters)):
        buf = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device="cuda:%d" % gpu)
        for _rep in range(args.warmup):
            dist.all_reduce(buf, group=pg)
        ms, ok, call_us = _allreduce_time(torch, dist, spin, buf, iters, pg)
        covered = covered and ok
        figures[key] = (buf.numel() * 4, ms, call_us)
    # Checked result: member i contributes i+1 everywhere; the sum is n(n+1)/2 on every member.
    buf.fill_(me + 1)
    dist.all_reduce(buf, group=pg)
    wrong = torch.tensor([float((buf != n * (n + 1) / 2).sum().item())], device="cuda:%d" % gpu)
    dist.all_reduce(wrong, group=pg)
    torch.cuda.synchronize()
    if me != 0:
        return None
    factor = 2.0 * (n - 1) / n
    small_bytes, small_ms, call_us = figures["small"]
    large_bytes, large_ms = figures["large"][:2]
    algbw = large_bytes / (large_ms / 1000.0) / 1e9
    return {"event": "result", "step": "allreduce", "gpus": group, "size": n,
            "bytes": large_bytes, "time_us": round(large_ms * 1000.0, 3), "algbw_gbps": round(algbw, 3),
            "busbw_gbps": round(algbw * factor, 3), "small_bytes": small_bytes, "latency_us": round(small_ms * 1000.0, 3),
            "small_busbw_gbps": round(small_bytes / (small_ms / 1000.0) / 1e9 * factor, 3), "call_us": round(call_us, 3),
            "wrong": int(wrong.item()), "status": "ok" if int(wrong.item()) == 0 else "wrong",
            "p2p_disabled": P2P_DISABLED, "init_seconds": round(init_seconds, 4), "spin_covered": covered,
            "nccl": ".".join(str(v) for v in torch.cuda.nccl.version()), "nccl_env": nccl_env(),
            "seconds": round(time.monotonic() - started, 4)}


def cmd_rank(args):
    """One rank of a session: gloo over all ranks for coordination (no GPU traffic, so a bad P2P link cannot
    hang it), one NCCL group per measured group, measured one after the other."""
    import torch
    import torch.distributed as dist
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    world = world_gpus(args.group)
    gpu = world[rank]
    torch.cuda.set_device(gpu)
    torch.zeros(1, device="cuda:%d" % gpu)
    dist.init_process_group(backend="gloo", init_method="file://" + args.store, rank=rank, world_size=size)
    spin = Spin(torch, gpu)
    for group in args.group:
        pg = dist.new_group([world.index(g) for g in group], backend="nccl")
        dist.barrier()                      # the group before is done everywhere
        if gpu == group[0]:
            emit({"event": "begin", "step": "allreduce", "gpus": group})
        if gpu in group:
            out = measure_group(torch, dist, group, pg, gpu, args, spin)
            if out is not None:
                emit(out)
            dist.destroy_process_group(pg)
        dist.barrier()
    dist.destroy_process_group()


# ------------------------------------------------------------------------------------------------ cli

def _pair(text):
    try:
        a, b = text.split(":")
        return int(a), int(b)
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a pair like 0:1" % text) from None


def _gpus(text):
    try:
        gpus = [int(g) for g in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError("%r is not a GPU list like 0,1,2,3" % text) from None
    if len(set(gpus)) != len(gpus) or any(g < 0 for g in gpus):
        raise argparse.ArgumentTypeError("%r: GPUs must be distinct and >= 0" % text)
    return gpus


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    sub = p.add_subparsers(dest="step", required=True)
    sub.add_parser("env", help="torch, CUDA and NCCL versions, devices, CUDA peer access matrix")
    for name, small in (("p2p", 4), ("allreduce", 8192), ("_rank", 8192)):
        s = sub.add_parser(name)
        s.add_argument("--bytes", type=int, default=256 << 20)
        s.add_argument("--small-bytes", type=int, default=small)
        s.add_argument("--iters", type=int, default=10)
        s.add_argument("--warmup", type=int, default=3)
        s.add_argument("--test-hang", action="store_true", help=argparse.SUPPRESS)
        if name == "p2p":
            s.add_argument("--src", type=int)
            s.add_argument("--dst", type=int)
            s.add_argument("--pair", type=_pair, action="append", default=[], help="another pair A:B (repeatable)")
            s.add_argument("--env", action="store_true", help="first print the env step's line (saves a process)")
            s.add_argument("--via-host", action="store_true",
                           help="copy through pinned host memory (as with NCCL_P2P_DISABLE=1), also for A == B")
        elif name == "allreduce":
            s.add_argument("--gpus", type=_gpus, help="one group")
            s.add_argument("--group", type=_gpus, action="append", default=[], help="another group (repeatable)")
        else:
            s.add_argument("--group", type=_gpus, action="append", required=True)
            s.add_argument("--store", required=True)
    return p


def parse_args(argv=None):
    """The command line, checked (the lab's stand-in parses with this too)."""
    args = parser().parse_args(argv)
    if args.step == "p2p" and (args.src is None) != (args.dst is None):
        parser().error("--src and --dst go together")
    if args.step == "p2p" and args.src is None and not args.pair:
        parser().error("p2p needs --src A --dst B or --pair A:B")
    if args.step == "allreduce" and not args.gpus and not args.group:
        parser().error("allreduce needs --gpus A,B,... or --group A,B,...")
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        return {"env": cmd_env, "p2p": cmd_p2p, "allreduce": cmd_allreduce, "_rank": cmd_rank}[args.step](args) or 0
    except Exception as exc:  # noqa: BLE001 - one JSON line for the orchestrator, then a non-zero exit
        emit({"event": "error", "step": args.step, "message": "%s: %s" % (type(exc).__name__, exc)})
        return 1


if __name__ == "__main__":
    sys.exit(main())
