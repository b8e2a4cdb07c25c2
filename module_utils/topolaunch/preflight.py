"""Preflight: prove the GPUs can talk before launching, and measure the links the planner relies on.

Plain Python 3.9+ stdlib; runs on the GPU host under the tools venv. The measuring itself is done by the
worker script (roles/preflight/files/preflight_worker.py) under the SGLang venv's python (its torch and NCCL),
one subprocess per step, each in its own process group with a hard deadline: when a step passes its deadline
its whole process group is killed and the step is recorded as `hang` (a hang is a result, not a stall).

Steps (`plan_steps`):
  env                  torch / CUDA / NCCL versions, CUDA peer access matrix
  p2p                  every ordered GPU pair (and each GPU to itself: the local copy), one worker process for
                       all of them; the deadline restarts at each pair, so a hanging pair is killed after
                       `step_timeout` and the worker restarts with the pairs left
  allreduce <gpus>     NCCL allreduce (sum) on each planned group, one process per GPU
  ... P2P off          the same with NCCL_P2P_DISABLE=1 for the pairs and groups where P2P misbehaved (hang,
                       failure, wrong data, far below its tier), to see whether the fix works and what it costs.
                       A group holding a pair that hung with P2P is not run with P2P at all (it would hang too):
                       the preflight of a box with one bad pair costs one timeout, not one per group.

`run_preflight` returns the record (`derive` adds findings, plan_fixes, figures, tables). Figures follow
nccl-tests: algbw = bytes / time, allreduce busbw = algbw * 2(n-1)/n, latency = time of a small message.
"""
import json
import os
import selectors
import signal
import statistics
import subprocess
import tempfile
import time

from .topology_render import cpulist

__all__ = ["PreflightError", "plan_steps", "default_groups", "check_inputs", "run_step", "run_preflight",
           "derive", "analyze", "expected_gbps", "estimate_seconds", "render_matrix", "render_allreduce",
           "render_report", "RECORD_VERSION", "DEFAULTS"]

RECORD_VERSION = 1
DEFAULTS = {
    "bytes": 256 << 20,         # large message: copy bandwidth and allreduce busbw
    "small_bytes": 8192,        # allreduce latency message (the 8 KB of the field's figures)
    "p2p_small_bytes": 4,       # copy latency: one int32, as p2pBandwidthLatencyTest
    "iters": 10,
    "warmup": 3,
    "step_timeout": 30.0,       # seconds per measured item (a pair, a group), startup included in the first
}
KILL_GRACE_SECONDS = 10.0       # after SIGKILL: a process still there is stuck in the kernel (driver)
TAIL_CHARS = 2000

# What a pair should reach, GB/s one direction, from its link as NVML reports it (not the planner's tables):
# PCIe per lane and direction after encoding, times the share P2P reaches through each kind of path (measured on
# RTX PRO 6000 Gen5 x16: 53-56 GB/s of 63 within a socket, 39-51 across), or NVLink 25 GB/s per link and
# direction (a real H200 NV18 pair copied at ~385 of 450). "Far below" is under SLOW_SHARE of that.
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
PATH_SHARE = {"PIX": 0.85, "PXB": 0.85, "PHB": 0.8, "NODE": 0.8, "SYS": 0.6, "UNK": 0.6}
NVLINK_GBPS_PER_LINK = 25.0
NVLINK_SHARE = 0.85
SLOW_SHARE = 0.5

FIX_ENV = {"NCCL_P2P_DISABLE": "1"}
FIX_SERVER_ARGS = {"disable_custom_all_reduce": True}
# Errors the P2P-off fix does not cure: the record is not fit to launch on (ok: false).
FATAL = {"preflight-no-fix", "preflight-unkillable", "preflight-worker-failed"}

REMEDY_CLIQUE = ("in a Proxmox VM give the GPUs that may talk P2P one clique: add to the VM config "
                 "(/etc/pve/qemu-server/<vmid>.conf) `args: -set device.hostpci0.x-nv-gpudirect-clique=0 "
                 "-set device.hostpci1.x-nv-gpudirect-clique=0 ...` (hostpciN with an explicit .0 function, no "
                 "hidden=1 CPU flag), then restart the VM")
REMEDY_IOMMU = ("boot the host with IOMMU passthrough (kernel command line `iommu=pt` with `intel_iommu=on` or "
                "`amd_iommu=on`) so P2P traffic is not remapped or blocked (ACS) between the GPUs")
REMEDY_P2P_OFF = ("or run without P2P: NCCL_P2P_DISABLE=1 and --disable-custom-all-reduce (the plan applies these "
                  "itself from this record's plan_fixes)")


class PreflightError(Exception):
    """Bad input; the message names the value."""


# ------------------------------------------------------------------------------------------- planning

def default_groups(gpus):
    """Consecutive blocks of 2, 4, 8... GPUs (the layouts TP groups take), then all of them; one GPU: itself."""
    gpus = list(gpus)
    if len(gpus) < 2:
        return [gpus] if gpus else []
    groups, size = [], 2
    while size <= len(gpus):
        groups += [gpus[i:i + size] for i in range(0, len(gpus) - size + 1, size)]
        size *= 2
    if len(gpus) & (len(gpus) - 1):
        groups.append(gpus)
    return groups


def check_inputs(gpus, groups, settings):
    """Raise PreflightError naming the bad value: GPU list, groups, sizes, timeout."""
    if not isinstance(gpus, list) or not gpus or not all(isinstance(g, int) and g >= 0 for g in gpus):
        raise PreflightError("gpus: %r is not a non-empty list of GPU indices (NVML numbering)" % (gpus,))
    if len(set(gpus)) != len(gpus):
        raise PreflightError("gpus: %r lists a GPU twice" % (gpus,))
    for k, group in enumerate(groups):
        if not isinstance(group, list) or not group or not all(isinstance(g, int) for g in group):
            raise PreflightError("groups[%d]: %r is not a non-empty list of GPU indices" % (k, group))
        if len(set(group)) != len(group):
            raise PreflightError("groups[%d]: %r lists a GPU twice" % (k, group))
        missing = [g for g in group if g not in gpus]
        if missing:
            raise PreflightError("groups[%d]: GPU %s is not in gpus %r" % (k, cpulist(missing), gpus))
    for key in ("bytes", "small_bytes", "p2p_small_bytes", "iters", "warmup"):
        value = settings[key]
        if not isinstance(value, int) or value < (0 if key == "warmup" else 1):
            raise PreflightError("%s: %r must be a positive integer" % (key, value))
    if not isinstance(settings["step_timeout"], (int, float)) or settings["step_timeout"] <= 0:
        raise PreflightError("step_timeout: %r must be a positive number of seconds" % (settings["step_timeout"],))


def _size_args(settings, small_key):
    return ["--bytes", str(settings["bytes"]), "--small-bytes", str(settings[small_key]),
            "--iters", str(settings["iters"]), "--warmup", str(settings["warmup"])]


def p2p_step(pairs, settings, p2p_disabled=False, env_first=False):
    """One p2p session: every listed directed pair, in one worker process; env_first: the env line first."""
    argv = ["p2p"] + (["--env"] if env_first else [])
    for src, dst in pairs:
        argv += ["--pair", "%d:%d" % (src, dst)]
    return {"name": "p2p" + (" (P2P off)" if p2p_disabled else ""), "kind": "p2p", "items": [list(p) for p in pairs],
            "argv": argv + _size_args(settings, "p2p_small_bytes"), "env": dict(FIX_ENV) if p2p_disabled else {},
            "p2p_disabled": p2p_disabled}


def allreduce_step(groups, settings, p2p_disabled=False, p2p_level=None):
    """One allreduce session: one process per GPU of the groups, the groups measured one after the other.
    p2p_level: NCCL_P2P_LEVEL for the session (SYS: P2P across the sockets too)."""
    argv = ["allreduce"]
    for group in groups:
        argv += ["--group", ",".join(map(str, group))]
    env = dict(FIX_ENV) if p2p_disabled else {}
    if p2p_level:
        env["NCCL_P2P_LEVEL"] = p2p_level
    name = "allreduce" + (" (P2P off)" if p2p_disabled else "") + (" (P2P level %s)" % p2p_level if p2p_level else "")
    return {"name": name, "kind": "allreduce", "items": [list(g) for g in groups],
            "argv": argv + _size_args(settings, "small_bytes"), "env": env, "p2p_disabled": p2p_disabled,
            "p2p_level": p2p_level}


def all_pairs(gpus):
    """Every ordered pair, each GPU with itself first (its local copy), then the others."""
    return [(a, b) for a in gpus for b in [a] + [g for g in gpus if g != a]]


def plan_steps(gpus, groups, settings):
    """The first pass: a p2p session (the env line first, then all pairs) and an allreduce session over every
    group, P2P as the environment has it. Reruns with P2P off are decided from what this pass finds."""
    return [p2p_step(all_pairs(gpus), settings, env_first=True), allreduce_step(groups, settings)]


def _tail(text, limit=TAIL_CHARS):
    return text[-limit:]


def run_step(command, timeout, env=None, kill_grace=KILL_GRACE_SECONDS, tail_chars=TAIL_CHARS):
    """Run one worker step with a hard deadline; the deadline restarts at every "begin" line.

    Returns {status: ok | failed | hang, returncode, seconds, lines: [{..., "t": seconds}], output_tail,
    stderr_tail, unkillable}. On the deadline the step's process group gets SIGKILL; a process that is still
    there `kill_grace` seconds later is `unkillable` (stuck in the driver)."""
    started = time.monotonic()
    lines, other, buf = [], [], b""
    status = None
    unkillable = False
    with tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, env=env,
                                    start_new_session=True)
        except OSError as exc:
            return {"status": "failed", "returncode": None, "seconds": 0.0, "lines": [], "output_tail": "",
                    "stderr_tail": "cannot start %s: %s" % (command[0], exc), "unkillable": False}
        deadline = started + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    status = "hang"
                    break
                if not sel.select(remaining):
                    continue
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                buf += chunk
                while b"\n" in buf:
                    raw, buf = buf.split(b"\n", 1)
                    text = raw.decode("utf-8", "replace")
                    try:
                        line = json.loads(text)
                    except ValueError:
                        line = None
                    if not isinstance(line, dict) or "event" not in line:
                        other.append(text)          # NCCL_DEBUG output and the like
                        continue
                    line["t"] = round(time.monotonic() - started, 4)
                    lines.append(line)
                    if line["event"] == "begin":
                        deadline = time.monotonic() + timeout
        if status is None:
            # stdout closed: the worker is ending; it gets the rest of its deadline to exit.
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                status = "hang"
        _kill_group(proc.pid)                       # leftovers of the step (ranks), or the hung step itself
        grace = time.monotonic() + kill_grace
        try:
            proc.wait(timeout=kill_grace)
        except subprocess.TimeoutExpired:
            unkillable = True
        # Members of the group that were not our children (the ranks of an allreduce session) must be gone too:
        # a process still exiting may hold its GPU context for a moment.
        while not unkillable and group_alive(proc.pid):
            if time.monotonic() > grace:
                unkillable = True
                break
            time.sleep(0.02)
        proc.stdout.close()
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace")
    if status is None:
        status = "ok" if proc.returncode == 0 else "failed"
    return {"status": status, "returncode": proc.returncode, "seconds": round(time.monotonic() - started, 4),
            "lines": lines, "output_tail": _tail("\n".join(other), tail_chars), "stderr_tail": _tail(stderr, tail_chars),
            "unkillable": unkillable}


def group_alive(pgid, proc_root="/proc"):
    """True while a process of process group `pgid` exists that is not a zombie (it may still hold a GPU)."""
    for entry in os.listdir(proc_root):
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc_root, entry, "stat"), encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def worker_env(extra=None):
    """The worker's environment: ours, NVML numbering for CUDA, no CUDA_VISIBLE_DEVICES, unbuffered output."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update({"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "PYTHONUNBUFFERED": "1"})
    env.update(extra or {})
    return env


def _error_text(outcome, line=None):
    if line and line.get("message"):
        return line["message"]
    text = (outcome["stderr_tail"].strip().splitlines() or outcome["output_tail"].strip().splitlines() or [""])[-1]
    return "worker exited with %s%s" % (outcome["returncode"], ": " + text if text else "")


def _step_log(step, outcome, **extra):
    entry = {"name": step["name"], "argv": step["argv"], "env": step["env"], "status": outcome["status"],
             "returncode": outcome["returncode"], "seconds": outcome["seconds"],
             "stderr_tail": outcome["stderr_tail"], "output_tail": outcome["output_tail"],
             "unkillable": outcome["unkillable"]}
    entry.update(extra)
    return entry


def _pair_entry(key, status, p2p_disabled, line=None, error=None, seconds=None):
    src, dst = key
    line = line or {}
    return {"src": src, "dst": dst, "gbps": line.get("gbps"), "latency_us": line.get("latency_us"),
            "status": status, "p2p_disabled": bool(line.get("p2p_disabled", p2p_disabled)) and src != dst,
            "local": src == dst, "peer_access": line.get("peer_access"), "wrong": line.get("wrong"),
            "seconds": seconds, "error": error}


def _group_entry(key, status, p2p_disabled, line=None, error=None, seconds=None, p2p_level=None):
    line = line or {}
    entry = {"gpus": list(key), "size": len(key), "status": status,
             "p2p_disabled": bool(line.get("p2p_disabled", p2p_disabled)), "seconds": seconds, "error": error,
             "p2p_level": p2p_level}
    for name in ("busbw_gbps", "algbw_gbps", "latency_us", "bytes", "small_bytes", "call_us", "init_seconds", "wrong"):
        entry[name] = line.get(name)
    return entry


class _Runner:
    """Runs worker sessions; a hang or failure ends a session, the items left go to a new one."""

    def __init__(self, command, settings, env, run):
        self.command = command
        self.settings = settings
        self.env = env
        self.run = run
        self.steps = []
        self.env_line = None
        self.stopped = None         # why nothing more can run (an unkillable step)

    def _run(self, step):
        env = dict(self.env)
        env.update(step["env"])
        outcome = self.run(self.command + step["argv"], self.settings["step_timeout"], worker_env(env))
        if outcome["unkillable"]:
            self.stopped = "step %r could not be killed (stuck in the driver): nothing more was run" % step["name"]
        return outcome

    def session(self, kind, items, p2p_disabled, p2p_level=None):
        """Measure `items` (pairs or groups) in as few sessions as possible; entries in the order of items.
        p2p_level (allreduce only): NCCL_P2P_LEVEL of the session, kept in each entry."""
        if kind == "p2p":
            make = _pair_entry
        else:
            def make(*args, **kwargs):
                return _group_entry(*args, p2p_level=p2p_level, **kwargs)
        entries = {}
        todo = [tuple(i) for i in items]
        while todo and not self.stopped:
            env_first = kind == "p2p" and self.env_line is None
            step = (p2p_step(todo, self.settings, p2p_disabled, env_first) if kind == "p2p"
                    else allreduce_step(todo, self.settings, p2p_disabled, p2p_level))
            outcome = self._run(step)
            current, begun_at, done = None, None, []
            for line in outcome["lines"]:
                if line.get("step") == "env" and line["event"] == "result":
                    self.env_line = line
                    continue
                key = (line.get("src"), line.get("dst")) if kind == "p2p" else tuple(line.get("gpus") or ())
                if line["event"] == "begin":
                    current, begun_at = key, line["t"]
                elif line["event"] in ("result", "error") and key in todo and key not in entries:
                    status = line.get("status", "ok") if line["event"] == "result" else "failed"
                    entries[key] = make(key, status, p2p_disabled, line, error=line.get("message"),
                                        seconds=round(line["t"] - begun_at, 4) if begun_at is not None else None)
                    done.append(key)
                    current = None
            first = next((l["t"] for l in outcome["lines"] if l["event"] == "begin"), None)
            self.steps.append(_step_log(step, outcome, items_done=len(done), startup_seconds=first,
                                        hung_on=list(current) if outcome["status"] == "hang" and current else None))
            if outcome["status"] != "ok" and current in todo and current not in entries:
                status = "hang" if outcome["status"] == "hang" else "failed"
                last = next((l for l in reversed(outcome["lines"]) if l["event"] == "error"), None)
                entries[current] = make(current, status, p2p_disabled,
                                        error=None if status == "hang" else _error_text(outcome, last),
                                        seconds=round(outcome["seconds"] - begun_at, 4))
                done.append(current)
            if kind == "p2p":
                for src, dst in [k for k in done if entries[k]["status"] == "hang"]:
                    if (dst, src) in todo and (dst, src) not in entries:
                        # The way back over the same link would most likely hang too: one timeout per link.
                        entries[(dst, src)] = make((dst, src), "skipped", p2p_disabled,
                                                   error="not measured: %d->%d hung" % (src, dst))
            left = [k for k in todo if k not in entries]
            if left and not done:
                # Nothing began (the worker could not start: torch missing, CUDA broken): every item left fails.
                status = "hang" if outcome["status"] == "hang" else "failed"
                last = next((l for l in reversed(outcome["lines"]) if l["event"] == "error"), None)
                error = ("the worker began nothing within %gs" % self.settings["step_timeout"] if status == "hang"
                         else _error_text(outcome, last))
                for key in left:
                    entries[key] = make(key, status, p2p_disabled, error=error)
                left = []
            todo = left
        for key in todo:
            entries[key] = make(key, "skipped", p2p_disabled, error=self.stopped)
        return [entries[tuple(i)] for i in items]


BAD = ("hang", "failed", "wrong")


def run_preflight(python, worker, gpus, groups=None, settings=None, fingerprint=None, facts=None, env=None,
                  p2p_disable="auto", run=run_step, clock=time.time):
    """Measure; returns the record with its analysis (derive). `p2p_disable`: auto (rerun with NCCL_P2P_DISABLE=1
    where P2P misbehaved), always, never. `env`: extra environment for the worker (NCCL_TOPO_FILE, ...)."""
    settings = dict(DEFAULTS, **(settings or {}))
    groups = default_groups(gpus) if groups is None else [list(g) for g in groups]
    check_inputs(gpus, groups, settings)
    if p2p_disable not in ("auto", "always", "never"):
        raise PreflightError("p2p_disable: %r is not one of auto, always, never" % (p2p_disable,))
    started = time.monotonic()
    runner = _Runner([python, worker], settings, env or {}, run)
    record = {"version": RECORD_VERSION, "fingerprint": fingerprint,
              "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(clock())),
              "settings": settings, "gpus": list(gpus), "planned_groups": groups, "p2p_disable": p2p_disable,
              "worker_env": {k: v for k, v in sorted((env or {}).items()) if k.startswith("NCCL_")}}
    record["pairs"] = runner.session("p2p", all_pairs(gpus), False)
    if runner.env_line is not None:
        record["env"] = {k: v for k, v in runner.env_line.items() if k not in ("event", "step", "t")}
        record["env"]["status"] = "ok"
    else:
        first = record["pairs"][0]
        record["env"] = {"status": first["status"], "error": first["error"]}
    hung = {(p["src"], p["dst"]) for p in record["pairs"] if p["status"] == "hang"}
    run_now, skipped = [], {}
    for group in groups:
        inside = sorted((a, b) for a, b in hung if a in group and b in group)
        if record["env"]["status"] != "ok":
            skipped[tuple(group)] = "the worker could not start: %s" % record["env"]["error"]
        elif inside:
            skipped[tuple(group)] = ("P2P between GPUs %s hung: the group would hang too; measured with P2P off "
                                     "instead" % ", ".join("%d->%d" % p for p in inside))
        else:
            run_now.append(group)
    measured = {tuple(e["gpus"]): e for e in runner.session("allreduce", run_now, False)} if run_now else {}
    record["groups"] = [measured.get(tuple(g)) or _group_entry(g, "skipped", False, error=skipped.get(tuple(g)))
                        for g in groups]
    if record["env"]["status"] == "ok" and p2p_disable != "never" and not runner.stopped:
        _p2p_off_pass(record, runner, gpus, facts, p2p_disable)
    if record["env"]["status"] == "ok" and not runner.stopped:
        _p2p_sys_pass(record, runner, facts)
    record["steps"] = runner.steps
    record["stopped"] = runner.stopped
    record["timing"] = timing(record, time.monotonic() - started)
    return derive(record, facts)


def _p2p_off_pass(record, runner, gpus, facts, mode):
    """The second pass with NCCL_P2P_DISABLE=1. Something broken with P2P (hang, failure, wrong data), or mode
    always: every pair and group again, since the fix (P2P off for the whole server) changes every figure the
    planner uses. Only slow pairs: those pairs and the groups holding them, to see whether P2P off is faster."""
    on_pairs = [p for p in record["pairs"] if not p["local"] and not p["p2p_disabled"]]
    broken = any(p["status"] in BAD + ("skipped",) for p in on_pairs) or any(
        g["status"] in BAD + ("skipped",) for g in record["groups"] if len(g["gpus"]) > 1)
    if mode == "always" or broken:
        pairs = [(a, b) for a, b in all_pairs(gpus) if a != b]
    else:
        pairs = sorted(_slow_pairs(record, facts))
    if pairs:
        record["pairs"] += runner.session("p2p", pairs, True)
    again = [g["gpus"] for g in record["groups"] if not g["p2p_disabled"] and len(g["gpus"]) > 1 and (
        mode == "always" or broken or any(a in g["gpus"] and b in g["gpus"] for a, b in pairs))]
    if again:
        record["groups"] += runner.session("allreduce", again, True)


def sys_pairs(facts, group):
    """Pairs of a group whose path crosses the sockets (nvidia-smi SYS) over PCIe, from the facts."""
    links = (facts or {}).get("links") or []
    return [(a, b) for a in group for b in group if a < b and len(links) > max(a, b) and links[a][b] == "SYS"]


def _p2p_sys_pass(record, runner, facts):
    """The proof the planner needs before it sets NCCL_P2P_LEVEL=SYS (P2P across the sockets, which NCCL leaves
    off by itself; faster on some PCIe boxes, reported to hang on others): the groups measured with P2P that cross
    the sockets, once more with NCCL_P2P_LEVEL=SYS. Only on a healthy box: every P2P copy and group worked, no pair
    slow, and every cross-socket copy in those groups had peer access; with a hang it costs one timeout."""
    on_pairs = [p for p in record["pairs"] if not p["local"] and not p["p2p_disabled"]]
    on_groups = [g for g in record["groups"] if _default_group(g)]
    if not facts or any(e["status"] != "ok" for e in on_pairs + on_groups) or _slow_pairs(record, facts):
        return
    peer = {(p["src"], p["dst"]): p.get("peer_access") is not False for p in on_pairs}
    groups = [g["gpus"] for g in on_groups if len(g["gpus"]) > 1 and sys_pairs(facts, g["gpus"])
              and all(peer.get((a, b)) and peer.get((b, a)) for a, b in sys_pairs(facts, g["gpus"]))]
    if groups:
        record["groups"] += runner.session("allreduce", groups, False, "SYS")


def _default_group(g):
    """A group entry measured with NCCL's own P2P level (not the NCCL_P2P_LEVEL=SYS proof)."""
    return not g.get("p2p_level")


def timing(record, total):
    """Per-step costs of this run: session startup (process, torch import, CUDA contexts; for allreduce one
    process per GPU), seconds per pair (directed, and local), seconds per allreduce group by size (NCCL
    communicator of the group and its measurement)."""
    def mean(values):
        return round(statistics.mean(values), 4) if values else None

    startup = {kind: [s["startup_seconds"] for s in record["steps"] if s["name"].startswith(kind)
                      and s.get("startup_seconds") is not None] for kind in ("p2p", "allreduce")}
    pairs = [p for p in record["pairs"] if p["seconds"] is not None and p["status"] == "ok" and not p["p2p_disabled"]]
    by_size = {}
    for g in record["groups"]:
        if g["status"] == "ok" and g["seconds"] is not None and not g["p2p_disabled"] and _default_group(g):
            by_size.setdefault(str(g["size"]), []).append(g["seconds"])
    return {
        "total_seconds": round(total, 3),
        "p2p_startup_seconds": mean(startup["p2p"]),
        "per_pair_seconds": mean([p["seconds"] for p in pairs if not p["local"]]),
        "per_local_seconds": mean([p["seconds"] for p in pairs if p["local"]]),
        "allreduce_startup_seconds": mean(startup["allreduce"]),
        "per_group_seconds": {k: mean(v) for k, v in sorted(by_size.items(), key=lambda kv: int(kv[0]))},
    }


def estimate_seconds(costs, gpu_count, group_sizes):
    """Seconds a preflight of gpu_count GPUs and groups of these sizes takes, from per-step costs (`timing` of
    a run, or figures given): p2p startup + n(n-1) x per pair + n x per local copy + allreduce startup + the
    sum over groups of the group's cost (a size not measured takes the largest size measured)."""
    per_group = {int(k): v for k, v in costs["per_group_seconds"].items()}
    largest = per_group[max(per_group)] if per_group else 0.0
    n = gpu_count
    total = (costs.get("p2p_startup_seconds") or 0.0) + (costs.get("allreduce_startup_seconds") or 0.0)
    total += n * (n - 1) * (costs.get("per_pair_seconds") or 0.0) + n * (costs.get("per_local_seconds") or 0.0)
    total += sum(per_group.get(size, largest) for size in group_sizes)
    return round(total, 1)


# ------------------------------------------------------------------------------------------- analysis

def expected_gbps(facts, a, b):
    """GB/s one direction a P2P copy between GPUs a and b should reach on its link (NVML facts), or None."""
    if not facts or a == b:
        return None
    word = facts["links"][a][b]
    if word.startswith("NV"):
        try:
            return NVLINK_GBPS_PER_LINK * int(word[2:]) * NVLINK_SHARE
        except ValueError:
            return None
    pcie = [facts["gpus"][i]["pcie"] for i in (a, b)]
    gens = [p.get("max_gen") for p in pcie]
    widths = [p.get("max_width") for p in pcie]
    if None in gens or None in widths:
        return None
    return PCIE_LANE_GBPS.get(min(gens), 0.0) * min(widths) * PATH_SHARE.get(word, PATH_SHARE["UNK"])


def _slow_pairs(record, facts):
    """Directed pairs with P2P on whose bandwidth is under SLOW_SHARE of their expectation: the link's tier with
    facts, else the median of the pairs measured. A pair without peer access copied through host memory: it is
    `preflight-p2p-unavailable`, not slow P2P."""
    measured = [p for p in record["pairs"] if p["status"] == "ok" and not p["local"] and not p["p2p_disabled"]
                and p["gbps"] is not None and p.get("peer_access") is not False]
    if not measured:
        return {}
    median = statistics.median(p["gbps"] for p in measured)
    slow = {}
    for p in measured:
        expect = expected_gbps(facts, p["src"], p["dst"]) if facts else None
        basis = "its %s link" % facts["links"][p["src"]][p["dst"]] if expect else "the median pair"
        expect = expect or median
        if p["gbps"] < SLOW_SHARE * expect:
            slow[(p["src"], p["dst"])] = (expect, basis)
    return slow


def _finding(fid, severity, gpus, message, remedy):
    return {"id": fid, "severity": severity, "gpus": sorted(set(gpus)), "message": message, "remedy": remedy}


def _fmt_pairs(pairs):
    return ", ".join("%d->%d" % (p[0], p[1]) for p in pairs)


def analyze(record, facts=None):
    """Findings with remedies, plan_fixes, figures for the planner, estimate. Pure: the same record gives the
    same answer (unit tests replay recorded runs through it)."""
    findings = []
    on_pairs = [p for p in record["pairs"] if not p["local"] and not p["p2p_disabled"]]
    off_pairs = {(p["src"], p["dst"]): p for p in record["pairs"] if p["p2p_disabled"]}
    on_groups = [g for g in record["groups"] if not g["p2p_disabled"] and _default_group(g)]
    off_groups = {tuple(g["gpus"]): g for g in record["groups"] if g["p2p_disabled"]}
    timeout = record["settings"]["step_timeout"]

    if record["env"].get("status") != "ok":
        findings.append(_finding(
            "preflight-worker-failed", "error", record["gpus"],
            "the preflight worker could not run under the SGLang venv's python: %s" % record["env"].get("error"),
            "check the SGLang venv (its python must import torch with CUDA): run the provision stage "
            "(ansible-playbook deploy.yml --tags provision)"))
    if record.get("stopped"):
        findings.append(_finding("preflight-unkillable", "error", record["gpus"], record["stopped"],
                                 "a GPU process that SIGKILL cannot end is stuck in the driver: check `dmesg` for "
                                 "Xid errors, reset the GPUs (`nvidia-smi -r`) or reboot the VM, then run the "
                                 "preflight again"))

    if record["env"].get("status") != "ok":
        return {"findings": findings, "plan_fixes": {"env": {}, "server_args": {}},
                "figures": _figures(record, False), "ok": False}

    hung = [p for p in on_pairs if p["status"] == "hang"]
    failed = [p for p in on_pairs if p["status"] == "failed"]
    wrong = [p for p in on_pairs if p["status"] == "wrong"]
    unavailable = [p for p in on_pairs if p["status"] == "ok" and p.get("peer_access") is False]
    slow = _slow_pairs(record, facts)
    ghung = [g for g in on_groups if g["status"] == "hang"]
    gbad = [g for g in on_groups if g["status"] in ("failed", "wrong")]

    remedy = "; ".join([REMEDY_CLIQUE, REMEDY_IOMMU, REMEDY_P2P_OFF])
    if hung:
        findings.append(_finding(
            "preflight-p2p-hang", "error", [g for p in hung for g in (p["src"], p["dst"])],
            "a P2P copy did not finish within %gs (GPUs %s): NCCL with P2P would hang on these GPUs"
            % (timeout, _fmt_pairs([(p["src"], p["dst"]) for p in hung])), remedy))
    if ghung:
        findings.append(_finding(
            "preflight-allreduce-hang", "error", [x for g in ghung for x in g["gpus"]],
            "NCCL allreduce did not finish within %gs on GPUs %s" % (
                timeout, "; ".join(",".join(map(str, g["gpus"])) for g in ghung)), remedy))
    if wrong or any(g["status"] == "wrong" for g in gbad):
        findings.append(_finding(
            "preflight-wrong-result", "error",
            [g for p in wrong for g in (p["src"], p["dst"])] + [x for g in gbad if g["status"] == "wrong" for x in g["gpus"]],
            "data arrived wrong with P2P (%s)" % "; ".join(
                ["copy %d->%d: %s wrong" % (p["src"], p["dst"], p["wrong"]) for p in wrong] +
                ["allreduce %s: %s wrong" % (",".join(map(str, g["gpus"])), g["wrong"]) for g in gbad
                 if g["status"] == "wrong"]), remedy))
    gfailed = [g for g in gbad if g["status"] == "failed"]
    if failed or gfailed:
        findings.append(_finding(
            "preflight-step-failed", "error",
            [g for p in failed for g in (p["src"], p["dst"])] + [x for g in gfailed for x in g["gpus"]],
            "; ".join(["P2P copy %d->%d failed: %s" % (p["src"], p["dst"], p["error"]) for p in failed[:4]] +
                      ["NCCL allreduce on GPUs %s failed: %s" % (",".join(map(str, g["gpus"])), g["error"])
                       for g in gfailed[:4]]), remedy))
    if slow:
        worst = sorted(slow.items(), key=lambda kv: kv[0])
        findings.append(_finding(
            "preflight-p2p-slow", "warning", [g for (a, b), _gbps in worst for g in (a, b)],
            "P2P far below its tier: %s" % "; ".join(
                "%d->%d %.1f GB/s, expected ~%.0f from %s" % (a, b, _gbps(record, a, b), e, basis)
                for (a, b), (e, basis) in worst[:8]),
            "; ".join([REMEDY_CLIQUE, REMEDY_IOMMU, "check `nvidia-smi topo -p2p r` and the PCIe links "
                       "(`nvidia-smi -q -d PCIE`)"])))
    if unavailable:
        findings.append(_finding(
            "preflight-p2p-unavailable", "warning", [g for p in unavailable for g in (p["src"], p["dst"])],
            "CUDA reports no peer access for %s: copies go through host memory"
            % _fmt_pairs([(p["src"], p["dst"]) for p in unavailable[:8]]), REMEDY_CLIQUE))

    # The fix: P2P off, when P2P misbehaved and the P2P-off runs of the same GPUs worked.
    broken_gpus = {g for p in hung + wrong + failed for g in (p["src"], p["dst"])}
    broken_gpus |= {x for g in ghung + gbad for x in g["gpus"]}
    plan_fixes = {"env": {}, "server_args": {}}
    if broken_gpus:
        off_ok = [g for g in off_groups.values() if g["status"] == "ok"]
        off_bad = [g for g in off_groups.values() if g["status"] in BAD]
        off_pairs_bad = [p for p in off_pairs.values() if p["status"] in BAD]
        if (off_ok or any(p["status"] == "ok" for p in off_pairs.values())) and not off_bad and not off_pairs_bad:
            plan_fixes = {"env": dict(FIX_ENV), "server_args": dict(FIX_SERVER_ARGS)}
        else:
            findings.append(_finding(
                "preflight-no-fix", "error", sorted(broken_gpus),
                "the GPUs misbehave with P2P off too (%s): no setting makes NCCL safe here" % "; ".join(
                    ["copy %d->%d %s" % (p["src"], p["dst"], p["status"]) for p in off_pairs_bad] +
                    ["allreduce %s %s" % (",".join(map(str, g["gpus"])), g["status"]) for g in off_bad]) or "not measured",
                "; ".join([REMEDY_CLIQUE, REMEDY_IOMMU, "check `dmesg` for Xid errors"])))
    elif slow:
        # Slow P2P, nothing broken: P2P off only where measurement says it is faster for every group measured both ways.
        both = [(g, off_groups[tuple(g["gpus"])]) for g in on_groups if g["status"] == "ok"
                and tuple(g["gpus"]) in off_groups and off_groups[tuple(g["gpus"])]["status"] == "ok"]
        if both and all(off["busbw_gbps"] > on["busbw_gbps"] for on, off in both):
            plan_fixes = {"env": dict(FIX_ENV), "server_args": dict(FIX_SERVER_ARGS)}
    if plan_fixes["env"]:
        findings.append(_finding(
            "preflight-p2p-disabled-by-plan", "warning", sorted(broken_gpus) or record["gpus"],
            "the plan runs SGLang with NCCL_P2P_DISABLE=1 and --disable-custom-all-reduce: with P2P off the "
            "measured steps worked%s" % ("" if broken_gpus else " and were faster"),
            "for full speed fix P2P: " + "; ".join([REMEDY_CLIQUE, REMEDY_IOMMU]) + "; then run the preflight again "
            "(ansible-playbook deploy.yml --tags preflight)"))

    cross = _cross_socket(record, on_groups, bool(plan_fixes["env"]))
    bad_sys = [g for g in cross["groups"] if g["status"] != "ok"]
    if bad_sys:
        findings.append(_finding(
            "preflight-p2p-sys-unsafe", "warning", [x for g in bad_sys for x in g["gpus"]],
            "NCCL allreduce with P2P across the sockets (NCCL_P2P_LEVEL=SYS) %s: the plan keeps NCCL's default "
            "(no P2P across the sockets)" % "; ".join("%s on GPUs %s" % (g["status"], ",".join(map(str, g["gpus"])))
                                                      for g in bad_sys),
            "nothing to do: the plan leaves NCCL_P2P_LEVEL unset; with P2P across the sockets fixed (" + REMEDY_CLIQUE +
            "; " + REMEDY_IOMMU + ") run the preflight again (ansible-playbook deploy.yml --tags preflight)"))
    figures = _figures(record, bool(plan_fixes["env"]))
    figures["cross_socket_p2p"] = cross
    errors = [f["id"] for f in findings if f["severity"] == "error"]
    ok = not errors or (bool(plan_fixes["env"]) and not set(errors) & FATAL)
    return {"findings": findings, "plan_fixes": plan_fixes, "figures": figures, "ok": ok}


def _cross_socket(record, on_groups, p2p_off):
    """Whether the record proves P2P across the sockets: every group measured with NCCL_P2P_LEVEL=SYS worked, with
    the right data, faster than the same group at NCCL's own level, and the plan keeps P2P on. `groups`: the
    SYS-level figures (for the planner's groups that cross the sockets)."""
    default = {tuple(g["gpus"]): g for g in on_groups}
    measured = [g for g in record["groups"] if g.get("p2p_level") == "SYS"]
    groups = [{"gpus": g["gpus"], "size": g["size"], "busbw_gbps": g["busbw_gbps"], "latency_us": g["latency_us"],
               "status": g["status"], "default_busbw_gbps": default.get(tuple(g["gpus"]), {}).get("busbw_gbps")}
              for g in measured]
    faster = [g for g in groups if g["status"] == "ok" and g["default_busbw_gbps"] and g["busbw_gbps"]
              and g["busbw_gbps"] > g["default_busbw_gbps"]]
    proven = bool(groups) and not p2p_off and len(faster) == len(groups)
    if not groups:
        why = "not measured (needs a healthy box with topology facts and a measured group across the sockets)"
    elif p2p_off:
        why = "the plan turns P2P off"
    elif proven:
        why = "NCCL_P2P_LEVEL=SYS worked and was faster on every group measured both ways: %s" % "; ".join(
            "%s %.1f vs %.1f GB/s" % (",".join(map(str, g["gpus"])), g["busbw_gbps"], g["default_busbw_gbps"])
            for g in groups)
    else:
        why = "NCCL_P2P_LEVEL=SYS %s" % "; ".join(
            "%s on %s" % (g["status"], ",".join(map(str, g["gpus"]))) if g["status"] != "ok" else
            "%.1f vs %.1f GB/s on %s" % (g["busbw_gbps"] or 0.0, g["default_busbw_gbps"] or 0.0,
                                         ",".join(map(str, g["gpus"]))) for g in groups)
    by_size = {}
    for g in groups if proven else []:
        cur = by_size.setdefault(str(g["size"]), {"busbw_gbps": g["busbw_gbps"], "latency_us": g["latency_us"]})
        cur["busbw_gbps"] = min(cur["busbw_gbps"], g["busbw_gbps"])
        cur["latency_us"] = max(cur["latency_us"], g["latency_us"])
    return {"proven": proven, "reason": why, "groups": groups, "allreduce_by_size": by_size}


def _gbps(record, a, b):
    for p in record["pairs"]:
        if (p["src"], p["dst"]) == (a, b) and not p["p2p_disabled"]:
            return p["gbps"]
    return None


def _pick(entries, p2p_off):
    """The entry the server will see: the P2P-off one when the plan turns P2P off and it exists."""
    wanted = [e for e in entries if e["p2p_disabled"] == p2p_off]
    return (wanted or entries)[-1]


def _figures(record, p2p_off):
    """What the planner uses: per directed pair and per group the measurement matching the plan's P2P setting."""
    pairs, groups, local = {}, {}, []
    for p in record["pairs"]:
        if p["local"]:
            local.append({"gpu": p["src"], "gbps": p["gbps"], "latency_us": p["latency_us"], "status": p["status"]})
        else:
            pairs.setdefault((p["src"], p["dst"]), []).append(p)
    for g in record["groups"]:
        if _default_group(g):
            groups.setdefault(tuple(g["gpus"]), []).append(g)
    keys = ("gbps", "latency_us", "status", "p2p_disabled")
    fig_pairs = [dict({"src": a, "dst": b}, **{k: _pick(v, p2p_off)[k] for k in keys}) for (a, b), v in pairs.items()]
    gkeys = ("size", "busbw_gbps", "latency_us", "status", "p2p_disabled")
    fig_groups = [dict({"gpus": list(k)}, **{x: _pick(v, p2p_off)[x] for x in gkeys}) for k, v in groups.items()]
    by_size = {}
    for g in fig_groups:
        if g["status"] != "ok" or g["size"] < 2:
            continue
        cur = by_size.setdefault(str(g["size"]), {"busbw_gbps": g["busbw_gbps"], "latency_us": g["latency_us"],
                                                  "groups": 0, "p2p_disabled": g["p2p_disabled"]})
        cur["busbw_gbps"] = min(cur["busbw_gbps"], g["busbw_gbps"])     # the slowest group of a size
        cur["latency_us"] = max(cur["latency_us"], g["latency_us"])
        cur["groups"] += 1
    return {"p2p_disabled": p2p_off, "pairs": fig_pairs, "local": local, "groups": fig_groups,
            "allreduce_by_size": dict(sorted(by_size.items(), key=lambda kv: int(kv[0])))}


# ------------------------------------------------------------------------------------------- tables

def render_matrix(record, what="gbps", p2p_disabled=False):
    """p2pBandwidthLatencyTest's matrix layout: `   D\\D` header, "%6d " columns, "%6.02f " cells; the diagonal
    is the local copy (bandwidth tables only); cells that hung read `hang`, failed `fail`, not measured `-`."""
    gpus = record["gpus"]
    cells = {}
    for p in record["pairs"]:
        if p["p2p_disabled"] == p2p_disabled or (p["local"] and what == "gbps"):
            cells[(p["src"], p["dst"])] = p
    if p2p_disabled and not any(p["p2p_disabled"] for p in record["pairs"]):
        return ""
    title = {("gbps", False): "Unidirectional P2P=Enabled Bandwidth Matrix (GB/s)",
             ("gbps", True): "Unidirectional P2P=Disabled Bandwidth Matrix (GB/s)",
             ("latency_us", False): "P2P=Enabled Latency Matrix (us)",
             ("latency_us", True): "P2P=Disabled Latency Matrix (us)"}[(what, p2p_disabled)]
    lines = [title, ("   D\\D" + "".join("%6d " % j for j in gpus)).rstrip()]
    for i in gpus:
        row = "%6d " % i
        for j in gpus:
            p = cells.get((i, j))
            if p is None or (i == j and what != "gbps"):
                row += "%6s " % "-"
            elif p["status"] in ("ok", "wrong") and p[what] is not None:
                row += "%6.02f " % p[what]
            else:
                row += "%6s " % {"hang": "hang", "failed": "fail", "skipped": "skip"}.get(p["status"], "-")
        lines.append(row.rstrip())
    return "\n".join(lines) + "\n"


def render_allreduce(record):
    """nccl-tests' allreduce columns (in-place), two rows per group: the small message and the large one."""
    lines = ["#  allreduce (sum, float)", "#   gpus             p2p         size        count    type   redop"
             "     time   algbw   busbw  #wrong", "#                                 (B)   (elements)                "
             "     (us)  (GB/s)  (GB/s)"]
    for g in record["groups"]:
        name = ",".join(map(str, g["gpus"]))
        p2p = "off" if g["p2p_disabled"] else "on" if _default_group(g) else g["p2p_level"].lower()
        if g["status"] not in ("ok", "wrong"):
            lines.append("    %-16s %-4s %s%s" % (name, p2p, g["status"], ": " + g["error"] if g.get("error") else ""))
            continue
        n = g["size"]
        factor = 2.0 * (n - 1) / n
        for nbytes, time_us in ((g["small_bytes"], g["latency_us"]), (g["bytes"], _large_time_us(g))):
            algbw = nbytes / (time_us / 1e6) / 1e9 if time_us else 0.0
            lines.append("    %-16s %-4s %12d %12d   float     sum %8.2f %7.2f %7.2f  %6s" % (
                name, p2p, nbytes, nbytes // 4, time_us, algbw, algbw * factor, g["wrong"] if g["wrong"] is not None else "-"))
    return "\n".join(lines) + "\n"


def _large_time_us(g):
    return g["bytes"] / (g["algbw_gbps"] * 1e9) * 1e6 if g.get("algbw_gbps") else 0.0


def render_report(record):
    """Lines for a human: versions, the matrices, the allreduce table, findings with fixes, timing."""
    env = record["env"]
    lines = ["preflight %s: torch %s, CUDA %s, NCCL %s, %d GPU(s)" % (
        record.get("fingerprint") or "-", env.get("torch"), env.get("cuda"), env.get("nccl"), len(record["gpus"]))]
    for text in (render_matrix(record), render_matrix(record, "latency_us"), render_matrix(record, p2p_disabled=True),
                 render_matrix(record, "latency_us", True), render_allreduce(record)):
        if text:
            lines += text.rstrip("\n").splitlines() + [""]
    if not record["findings"]:
        lines.append("findings: none")
    for f in record["findings"]:
        lines.append("%s %s (GPU %s): %s" % (f["severity"].upper(), f["id"], cpulist(f["gpus"]), f["message"]))
        lines.append("    fix: " + f["remedy"])
    cross = record["figures"].get("cross_socket_p2p") or {}
    if cross.get("groups"):
        lines.append("P2P across the sockets (NCCL_P2P_LEVEL=SYS): %s: %s" % (
            "proven, the plan sets it" if cross["proven"] else "not proven", cross["reason"]))
    if record["plan_fixes"]["env"]:
        lines.append("plan fixes: env %s, server args %s" % (
            json.dumps(record["plan_fixes"]["env"], sort_keys=True),
            json.dumps(record["plan_fixes"]["server_args"], sort_keys=True)))
    t = record["timing"]
    lines.append("took %.1fs (p2p startup %ss, %ss per pair, %ss per local copy; allreduce startup %ss, per group "
                 "by size %s)" % (t["total_seconds"], t["p2p_startup_seconds"], t["per_pair_seconds"],
                                  t["per_local_seconds"], t["allreduce_startup_seconds"],
                                  json.dumps(t["per_group_seconds"], sort_keys=True)))
    return lines


DERIVED = ("findings", "plan_fixes", "figures", "ok", "tables")


def derive(record, facts=None):
    """The record with its analysis and tables (recomputed from the measurements alone, plus optional facts)."""
    out = {k: v for k, v in record.items() if k not in DERIVED}
    out.update(analyze(out, facts))
    out["tables"] = {"p2p_bandwidth": render_matrix(out), "p2p_latency": render_matrix(out, "latency_us"),
                     "p2p_disabled_bandwidth": render_matrix(out, p2p_disabled=True),
                     "p2p_disabled_latency": render_matrix(out, "latency_us", True),
                     "allreduce": render_allreduce(out)}
    out["tables"]["report"] = render_report(out)
    return out


# ------------------------------------------------------------------------------------------- the module

def load_record(path, fingerprint):
    """(record for this fingerprint or None, why not): a missing file, another fingerprint or a file that is not
    a record all mean: measure."""
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except FileNotFoundError:
        return None, "no record at %s" % path
    except (OSError, ValueError) as exc:
        return None, "the record at %s is unreadable (%s): measuring again" % (path, exc)
    if not isinstance(record, dict) or record.get("version") != RECORD_VERSION or "pairs" not in record:
        return None, "%s is not a preflight record of version %d: measuring again" % (path, RECORD_VERSION)
    if record.get("fingerprint") != fingerprint:
        return None, "the record at %s is for topology %s, this is %s: measuring again" % (
            path, record.get("fingerprint"), fingerprint)
    return record, "record for %s at %s" % (fingerprint, path)


def save_record(path, record, write_atomic):
    """The record as JSON, 0644 (the planner reads it), its directory 0755."""
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    write_atomic(path, json.dumps(record, indent=1, sort_keys=True) + "\n", 0o644, (os.getuid(), os.getgid()))


def _in_use(processes, gpus, proc_root="/proc"):
    """'pid 123 (sglang::scheduler_TP0) on GPU 0, ...' for the processes on the GPUs to measure, "" for none.
    processes: [{gpu, pid}] (the topology facts' processes of each GPU)."""
    out = []
    for p in processes:
        if not isinstance(p, dict) or p.get("gpu") not in gpus:
            continue
        try:
            with open(os.path.join(proc_root, str(int(p["pid"])), "comm"), encoding="utf-8", errors="replace") as f:
                name = " (%s)" % f.read().strip()
        except (OSError, TypeError, ValueError, KeyError):
            name = ""
        out.append("pid %s%s on GPU %s" % (p.get("pid"), name, p["gpu"]))
    return ", ".join(out)


def module_run(params, check_mode, write_atomic, run=run_step, topo_sync=None):
    """What library/gpu_preflight.py returns. Raises PreflightError for bad input (before anything runs).
    With `nccl_topo_path`, `facts` and `topo_sync` (nccl_topo.sync, which imports this module), the NCCL topology
    file there is kept as it says (`nccl_topo`)."""
    topo_path = (params.get("nccl_topo_path") or "") if topo_sync else ""
    settings = {k: params[k] for k in ("bytes", "small_bytes", "iters", "warmup", "step_timeout")}
    settings = dict(DEFAULTS, **settings)
    gpus = params["gpus"]
    groups = default_groups(gpus) if params["groups"] is None else params["groups"]
    check_inputs(gpus, groups, settings)
    if not params["fingerprint"]:
        raise PreflightError("fingerprint: empty; pass the topology fingerprint (ansible_facts.gpu_topology.fingerprint)")
    bad_env = [k for k, v in (params["environment"] or {}).items() if not isinstance(v, str)]
    if bad_env:
        raise PreflightError("environment.%s: %r must be a string" % (bad_env[0], params["environment"][bad_env[0]]))
    existing, why = load_record(params["record_path"], params["fingerprint"])
    result = {"changed": False, "record_path": params["record_path"], "reason": why,
              "steps": [{"name": s["name"], "argv": [params["python"], params["worker"]] + s["argv"], "env": s["env"]}
                        for s in plan_steps(gpus, groups, settings)]}
    in_use = _in_use(params.get("gpu_processes") or [], gpus)
    result["in_use"] = in_use
    if existing is not None and not params["force"]:
        result.update(measured=False, record=derive(existing, params["facts"]))
    elif in_use and params["force"]:
        raise PreflightError("the GPUs to measure are in use (%s): the preflight measures only free GPUs; stop what "
                             "holds them first" % in_use)
    elif in_use:
        result.update(measured=False, record=None, reason=why + "; not measured: the GPUs are in use (%s)"
                      % in_use, warnings=["preflight skipped: no record for topology %s and the GPUs are in use (%s); "
                                          "the plan uses table figures until the preflight runs on free GPUs "
                                          "(ansible-playbook deploy.yml --tags preflight -e preflight_stop_server=true "
                                          "stops our server for it and relaunches it)" % (params["fingerprint"], in_use)])
        return result
    elif check_mode:
        result.update(measured=False, record=None, changed=True,
                      reason=why + "; check mode: would measure (%d GPUs, %d groups)" % (len(gpus), len(groups)))
        return result
    else:
        for option in ("python", "worker"):
            if not os.path.isfile(params[option]):
                raise PreflightError(
                    "%s: %s does not exist: %s" % (option, params[option], "the SGLang venv's python, made by the "
                                                   "provision stage (ansible-playbook deploy.yml --tags provision)"
                                                   if option == "python" else "the worker script the role copies"))
        started = time.monotonic()
        env = dict(params["environment"] or {})
        if topo_path and params["facts"]:
            # A file the facts alone call for (NUMA islands on a flat tree) is there before the measurement, so
            # that NCCL measures as the server will run; one that needs the measured groups comes after it.
            env.update(topo_sync(topo_path, params["facts"], None, remove=False)["env"])
        record = run_preflight(params["python"], params["worker"], gpus, groups, settings, params["fingerprint"],
                               params["facts"], env, params["p2p_disable"], run=run)
        result.update(measured=True, record=record, seconds=round(time.monotonic() - started, 3))
        if existing is not None:
            result["reason"] = why + "; measured again (force)"
        if record["env"].get("status") == "ok":     # a worker that could not start measured nothing: keep no record
            save_record(params["record_path"], record, write_atomic)
            result["changed"] = True
    record = result["record"]
    result.update({k: record[k] for k in ("findings", "plan_fixes", "figures", "ok")})
    result["report"] = list(record["tables"]["report"])
    if topo_path and params["facts"] and record["env"].get("status") == "ok":
        topo = topo_sync(topo_path, params["facts"], record, check_mode)
        result["nccl_topo"] = topo
        result["changed"] = result["changed"] or topo["changed"]
        result["report"].append("NCCL topology file %s: %s (%s)" % (
            topo_path, ("written" if topo["changed"] else "up to date") if topo["needed"] else
            ("removed" if topo["changed"] else "not needed"), topo["reason"]))
    return result
