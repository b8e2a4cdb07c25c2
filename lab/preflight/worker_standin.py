#!/usr/bin/env python3
"""The lab's stand-in for roles/preflight/files/preflight_worker.py: the same command line (taken from the real
worker script, which the lab installs beside this one) and the same JSON lines, answered from the lab GPU spec
(FAKE_NVML_SPEC, default /etc/fake-nvml/spec.json) instead of measured.

Stdlib only. It reads the spec's `links` section (lab/specs/README.md) and nothing of the planner: the spec is
the lab's truth. What it answers:

- env: the spec's GPUs, CUDA peer access = the spec's P2P word is OK, "simulated": true.
- p2p A B: a local copy (A == B) answers `links.local`; with P2P (NCCL_P2P_DISABLE unset) a pair whose P2P word
  is OK answers its `links.pairs` entry (else `links.default`); a pair whose word is not OK has no peer access and
  answers the host path `links.p2p_disabled`, as a real copy through host memory does; with NCCL_P2P_DISABLE=1
  every pair answers the host path. A pair with "hangs": true prints its begin line and then never answers
  (with P2P only), so the orchestrator's real deadline and kill are exercised.
- allreduce G: the ring formula below over the group in the given order; it hangs (with P2P) when any pair
  inside the group hangs, since NCCL may route through any of them.

Ring formula (the lab's truth, documented here and in docs/preflight.md):
    edge(a, b)   = the pair's figures a -> b as the p2p step answers them (P2P or host path)
    busbw_ring   = RING_EFFICIENCY x min over ring edges g[i] -> g[i+1 mod n] of edge GB/s
    latency_us   = BASE_US + 2(n-1) x (max over ring edges of edge latency + STEP_US)
    time(bytes)  = latency_us + bytes x 2(n-1)/n / busbw_ring
    busbw        = bytes x 2(n-1)/n / time(bytes), algbw = bytes / time(bytes)   (as nccl-tests reports)
RING_EFFICIENCY, BASE_US and STEP_US were chosen so that the field box's pair figures (53-56 GB/s and ~0.4 us
within a socket, 39-51 across) give about its measured allreduce figures (busbw 38.6 / 26.4 / 24.7 GB/s at
512 MB and 6.8 / 13.5 / 26.7 us at 8 KB for 2 / 4 / 8 GPUs).
"""
import importlib.util
import json
import os
import signal
import sys

RING_EFFICIENCY = 0.6
BASE_US = 3.0
STEP_US = 1.5
DEFAULT_SPEC = "/etc/fake-nvml/spec.json"


class SpecError(Exception):
    pass


def emit(obj):
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def p2p_disabled_env():
    return os.environ.get("NCCL_P2P_DISABLE", "") == "1"


def nccl_env():
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")}


def load_spec():
    path = os.environ.get("FAKE_NVML_SPEC") or DEFAULT_SPEC
    try:
        with open(path, encoding="utf-8") as f:
            spec = json.load(f)
    except (OSError, ValueError) as exc:
        raise SpecError("GPU spec %s: %s" % (path, exc)) from exc
    if "links" not in spec:
        raise SpecError("GPU spec %s has no links section: the stand-in answers from it (lab/specs/README.md)" % path)
    return path, spec


class Links:
    """The spec's link figures: directed pair -> {gbps, latency_us, hangs}, host path, local copy."""

    def __init__(self, spec):
        links = spec["links"]
        self.count = len(spec["gpus"])
        p2p = spec.get("p2p", {})
        words = {}
        for a, b, word in p2p.get("pairs", []):
            words[(a, b)] = words[(b, a)] = word
        self.p2p_ok = {(a, b): words.get((a, b), p2p.get("default", "OK")) == "OK"
                       for a in range(self.count) for b in range(self.count)}
        default = links["default"]
        self.local = links.get("local", {"gbps": 1000.0, "latency_us": 1.5})
        self.host = {"gbps": _direction(links["p2p_disabled"]["gbps"], 0),
                     "latency_us": links["p2p_disabled"]["latency_us"], "hangs": False}
        self.on, self.off = {}, {}
        for a in range(self.count):
            for b in range(self.count):
                if a != b:
                    self.on[(a, b)] = {"gbps": _direction(default["gbps"], 0), "latency_us": default["latency_us"],
                                       "hangs": bool(default.get("hangs", False))}
                    self.off[(a, b)] = {"gbps": _direction(links["p2p_disabled"]["gbps"], 0),
                                        "latency_us": links["p2p_disabled"]["latency_us"], "hangs": False}
        for entry in links.get("pairs", []):
            a, b = entry["gpus"]
            for k, (x, y) in enumerate(((a, b), (b, a))):
                if "gbps" in entry:
                    self.on[(x, y)]["gbps"] = _direction(entry["gbps"], k)
                if "latency_us" in entry:
                    self.on[(x, y)]["latency_us"] = entry["latency_us"]
                if "hangs" in entry:
                    self.on[(x, y)]["hangs"] = bool(entry["hangs"])
                if "p2p_disabled" in entry:
                    off = entry["p2p_disabled"]
                    self.off[(x, y)].update({"gbps": _direction(off["gbps"], k), "latency_us": off["latency_us"]})

    def edge(self, a, b, p2p_off):
        """(figures, peer_access, via host) of a copy a -> b as the p2p step sees it (a GPU to itself through the
        host answers the host path)."""
        if a == b and not p2p_off:
            return dict(self.local, hangs=False), True, False
        peer = a == b or self.p2p_ok[(a, b)]
        if p2p_off or not peer:
            return self.off.get((a, b), self.host), peer, True
        return self.on[(a, b)], True, False


def _direction(value, k):
    return float(value[k] if isinstance(value, list) else value)


def hang():
    """Sleep past any timeout: wait for a signal that the orchestrator's SIGKILL makes the last one."""
    while True:
        signal.pause()


def cmd_env(spec, links, _args):
    emit(env_result(spec, links))


def env_result(spec, links):
    return {"event": "result", "step": "env", "python": sys.version.split()[0], "torch": None, "cuda": None,
            "nccl": "stand-in", "device_count": links.count, "simulated": True,
            "devices": [{"index": i, "name": g["name"], "capability": "%d.%d" % tuple(g["compute_capability"]),
                         "memory_bytes": g["memory_total_mib"] << 20, "pci_bus_id": g["pci_bus_id"]}
                        for i, g in enumerate(spec["gpus"])],
            "peer_access": [[i == j or links.p2p_ok[(i, j)] for j in range(links.count)] for i in range(links.count)],
            "nccl_env": nccl_env()}


def cmd_p2p(spec, links, args):
    p2p_off = p2p_disabled_env()
    pairs = ([(args.src, args.dst)] if args.src is not None else []) + [tuple(p) for p in args.pair]
    if args.env:
        emit(env_result(spec, links))
    for src, dst in pairs:
        emit({"event": "begin", "step": "p2p", "src": src, "dst": dst, "cuda_init_seconds": 0.0})
        if not (0 <= src < links.count and 0 <= dst < links.count):
            emit({"event": "error", "step": "p2p", "src": src, "dst": dst,
                  "message": "GPU %d or %d does not exist (the spec has %d)" % (src, dst, links.count)})
            continue
        figures, peer, via_host = links.edge(src, dst, args.via_host or (p2p_off and src != dst))
        if args.test_hang or (figures["hangs"] and not via_host):
            hang()
        seconds = figures["latency_us"] / 1e6 + args.bytes / (figures["gbps"] * 1e9)
        emit({"event": "result", "step": "p2p", "src": src, "dst": dst, "bytes": args.bytes,
              "small_bytes": args.small_bytes, "iters": args.iters, "local": src == dst, "peer_access": peer,
              "p2p_disabled": args.via_host or (p2p_off and src != dst), "gbps": figures["gbps"], "latency_us": figures["latency_us"],
              "time_us": round(seconds * 1e6, 3), "wrong": 0, "spin_covered": True, "status": "ok",
              "seconds": 0.0, "simulated": True})


def ring(links, gpus, p2p_off, nbytes):
    """(busbw GB/s, algbw GB/s, latency us, hangs) of a ring allreduce over gpus in this order (module docstring)."""
    n = len(gpus)
    if n == 1:
        return 0.0, nbytes / (BASE_US / 1e6) / 1e9, BASE_US, False
    edges = [links.edge(gpus[i], gpus[(i + 1) % n], p2p_off) for i in range(n)]
    hangs = not p2p_off and any(links.on[(a, b)]["hangs"] and links.p2p_ok[(a, b)]
                                for a in gpus for b in gpus if a != b)
    bandwidth = RING_EFFICIENCY * min(e[0]["gbps"] for e in edges)
    latency = BASE_US + 2 * (n - 1) * (max(e[0]["latency_us"] for e in edges) + STEP_US)
    factor = 2.0 * (n - 1) / n
    seconds = latency / 1e6 + nbytes * factor / (bandwidth * 1e9)
    return nbytes * factor / seconds / 1e9, nbytes / seconds / 1e9, latency, hangs


def cmd_allreduce(_spec, links, args):
    """The groups one after the other, as the real worker's session measures them."""
    p2p_off = p2p_disabled_env()
    for gpus in ([args.gpus] if args.gpus else []) + args.group:
        missing = [g for g in gpus if g >= links.count]
        if missing:
            emit({"event": "error", "step": "allreduce", "message": "rank of GPU %d failed: the spec has %d GPUs"
                  % (missing[0], links.count)})
            return 1
        emit({"event": "begin", "step": "allreduce", "gpus": gpus})
        busbw, algbw, latency, hangs = ring(links, gpus, p2p_off, args.bytes)
        if hangs or args.test_hang:
            hang()
        small_busbw = ring(links, gpus, p2p_off, args.small_bytes)[0]
        emit({"event": "result", "step": "allreduce", "gpus": gpus, "size": len(gpus), "bytes": args.bytes,
              "time_us": round(args.bytes / (algbw * 1e9) * 1e6, 3), "algbw_gbps": round(algbw, 3),
              "busbw_gbps": round(busbw, 3), "small_bytes": args.small_bytes, "latency_us": round(latency, 3),
              "small_busbw_gbps": round(small_busbw, 3), "call_us": 0.0, "wrong": 0, "status": "ok",
              "p2p_disabled": p2p_off, "init_seconds": 0.0, "spin_covered": True, "nccl": "stand-in",
              "nccl_env": nccl_env(), "seconds": 0.0, "simulated": True})
    return 0


def real_worker():
    """The real worker script, whose command line the stand-in takes as it is (one definition of the CLI): beside
    this file (how the lab installs them), or in the repository, or at $PREFLIGHT_WORKER. Importing it runs no
    torch: the worker imports torch inside its steps only."""
    here = os.path.dirname(os.path.abspath(__file__))
    for path in (os.environ.get("PREFLIGHT_WORKER"), os.path.join(here, "preflight_worker.py"),
                 os.path.join(here, "..", "..", "roles", "preflight", "files", "preflight_worker.py")):
        if path and os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("preflight_worker", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    raise SpecError("preflight_worker.py is neither beside %s nor in the repository: the stand-in takes its command "
                    "line from it" % here)


def main(argv=None):
    try:
        worker = real_worker()
    except SpecError as exc:
        emit({"event": "error", "step": "start", "message": "stand-in: %s" % exc})
        return 1
    args = worker.parse_args(argv)
    if args.step == "_rank":
        worker.parser().error("the stand-in has no ranks: allreduce answers for its groups")
    try:
        _path, spec = load_spec()
        links = Links(spec)
    except (SpecError, KeyError, TypeError, ValueError) as exc:
        emit({"event": "error", "step": args.step, "message": "stand-in: %s" % exc})
        return 1
    return {"env": cmd_env, "p2p": cmd_p2p, "allreduce": cmd_allreduce}[args.step](spec, links, args) or 0


if __name__ == "__main__":
    sys.exit(main())
