"""Stop what is left of our SGLang server on our GPUs, and nothing else.

`cleanup(opts, nvml, check_mode)` is the logic of the `gpu_cleanup` module. With `stop_unit` it first stops our
systemd unit (whose cgroup holds the whole process tree; systemd escalates SIGTERM to SIGKILL after the unit's
TimeoutStopSec), then deals with what escaped it: schedulers re-parented to PID 1 after their launcher died
(sgl-project/sglang#23627), a server started by hand as the service user, a launcher that still listens on our port.

1. Find the processes that hold memory on *our* GPUs (NVML compute processes) or listen on our port(s).
2. Classify each one. Ours: in our system unit's cgroup exactly (`/system.slice/<unit>` or below it: a user's
   `user@1000.service/.../<unit>` or a container's nested copy is not ours), or running as our service user
   (compared by name; a process with SGLang's titles, `sglang::*` or `sglang.launch_server` in its command line,
   is reported as such but still has to run as our service user: another user's SGLang is not ours). Everything
   else is foreign. A foreign process on one of our GPUs or on our port fails the run before anything is
   signalled, naming pid, user, command line and GPU, unless `stop_foreign` is set. A pid NVML reports that this
   /proc does not have (a process of another PID namespace: NVML names processes by the driver's pids) is never
   acted on, not even with `stop_foreign` (that number may be another process here): the run fails naming it.
   Processes on other GPUs are never looked at beyond being listed.
   This check runs before the unit is stopped: a foreign process on our GPUs leaves our server running.
3. Stop the unit (`stop_unit`): `systemctl stop`, then its Result says whether systemd had to SIGKILL it.
4. SIGTERM ours, wait until they are gone (deadline `term_timeout`), SIGKILL the survivors (deadline
   `kill_timeout`).
5. Wait until NVML lists no process on our GPUs, their used memory is at or below `memory_threshold_mib`,
   and nothing listens on our port(s) (deadline `release_timeout`). Every timeout says what it waited for.

Processes are identified by (pid, starttime) so that a reused pid is never signalled; signals go through a
pidfd where the kernel has them. Plain Python 3.9+ stdlib; NVML only through the `nvml` argument (pynvml or
anything with the same functions), /proc through `proc_root`, systemctl through `run(argv) -> (rc, out, err)`.
"""
import errno
import json
import os
import pwd
import signal
import socket
import time

from .constants import CURRENT_PLAN, SERVICE_USER, STATE_DIR, UNIT_NAME, state_file
from .system import run as _run, service_user_problem, show

__all__ = ["CleanupError", "cleanup", "classify", "in_unit_cgroup", "read_process", "listening_inodes",
           "socket_holders", "port_holders", "port_problem", "gpu_holders", "union_with_current_plan", "stop_unit", "DEFAULTS"]

DEFAULTS = {
    "gpu_indices": [],
    "state_dir": STATE_DIR,
    "current_plan_path": None,               # default <state_dir>/current_plan.json
    "service_user": SERVICE_USER,
    "force_service_user": False,             # root or a login user as the service user (system.service_user_problem)
    "unit_name": UNIT_NAME,
    "title_prefixes": ["sglang::"],
    "cmdline_markers": ["sglang.launch_server"],
    "ports": [],
    "term_timeout": 30.0,
    "kill_timeout": 10.0,
    "release_timeout": 60.0,
    "poll_interval": 0.2,
    "stop_foreign": False,
    "memory_threshold_mib": 2048,
    "stop_unit": False,
}
MIB = 1024 * 1024
TCP_LISTEN = "0A"            # st column of /proc/net/tcp{,6}
UNIT_PROPS = ["LoadState", "ActiveState", "SubState", "Result"]
MAX_ROUNDS = 5               # find-and-stop passes (a process may start while we stop the others)


class CleanupError(Exception):
    """A failure the user must act on; `result` carries what was done before it happened."""

    def __init__(self, msg, result=None):
        super().__init__(msg)
        self.result = result or {}


# ---------------------------------------------------------------------------------------------------- /proc

def _read(path, mode="r"):
    try:
        with open(path, mode) as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError):
        return None


def _stat_fields(pid, proc_root):
    """(state, starttime) from /proc/<pid>/stat, or None when the pid does not exist."""
    text = _read(os.path.join(proc_root, str(pid), "stat"))
    if text is None:
        return None
    # comm (field 2) may contain spaces and parentheses: split after the last ')'.
    rest = text[text.rfind(")") + 2:].split()
    return rest[0], rest[19]


def _user_name(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def read_process(pid, proc_root="/proc"):
    """What /proc says about a pid: dict with pid, starttime, state, uid, user, cmdline, title, cgroup; or None."""
    st = _stat_fields(pid, proc_root)
    status = _read(os.path.join(proc_root, str(pid), "status"))
    if st is None or status is None:
        return None
    uid = None
    for line in status.splitlines():
        if line.startswith("Uid:"):
            uid = int(line.split()[1])           # real uid
            break
    raw = _read(os.path.join(proc_root, str(pid), "cmdline"), "rb") or b""
    argv = [a.decode("utf-8", "replace") for a in raw.split(b"\0")]
    while argv and argv[-1] == "":
        argv.pop()
    comm = (_read(os.path.join(proc_root, str(pid), "comm")) or "").strip()
    # setproctitle writes the title over argv[0] (padded with spaces or NULs).
    title = argv[0].strip() if argv else comm
    return {
        "pid": pid,
        "starttime": st[1],
        "state": st[0],
        "uid": uid,
        "user": _user_name(uid) if uid is not None else "?",
        "cmdline": " ".join(a.strip() for a in argv) if argv else "[%s]" % comm,
        "title": title,
        "cgroup": _read(os.path.join(proc_root, str(pid), "cgroup")) or "",
    }


def _alive(pid, starttime, proc_root):
    """True while this very process (same starttime) exists and is not a zombie."""
    st = _stat_fields(pid, proc_root)
    return st is not None and st[1] == starttime and st[0] not in ("Z", "X")


def in_unit_cgroup(cgroup_text, unit_name):
    """True when a hierarchy of a /proc/<pid>/cgroup text (v1 or v2) places the process in our system unit exactly:
    /system.slice/<unit_name> or a cgroup below it. The name elsewhere in the path (a user's or a container's unit
    of the same name) is not ours."""
    unit = "/system.slice/" + unit_name
    for line in cgroup_text.splitlines():
        path = line.split(":", 2)[-1]
        if path == unit or path.startswith(unit + "/"):
            return True
    return False


def classify(info, unit_name, service_user, title_prefixes, cmdline_markers):
    """(ours, reasons): reasons are the words of the report ('unit cgroup', 'service user', 'sglang title').
    The user is compared by name (`info["user"]`, the name of the process's uid here)."""
    reasons = []
    if in_unit_cgroup(info["cgroup"], unit_name):
        reasons.append("unit cgroup")
    own_user = bool(service_user) and info["user"] == service_user
    if own_user:
        reasons.append("service user")
    if any(info["title"].startswith(p) for p in title_prefixes) or any(m in info["cmdline"] for m in cmdline_markers):
        reasons.append("sglang title")
    ours = "unit cgroup" in reasons or own_user
    return ours, reasons


# ---------------------------------------------------------------------------------------------------- port

def listening_inodes(port, proc_root="/proc"):
    """Socket inodes listening on TCP `port` (IPv4 and IPv6) in our network namespace."""
    inodes = set()
    for name in ("tcp", "tcp6"):
        text = _read(os.path.join(proc_root, "net", name)) or ""
        for line in text.splitlines()[1:]:
            cols = line.split()
            if len(cols) > 9 and cols[3] == TCP_LISTEN and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(cols[9])
    return inodes


def socket_holders(inodes, proc_root="/proc"):
    """{pid: the socket inodes among `inodes` it has open} of the processes this /proc shows."""
    wanted = {"socket:[%s]" % i: i for i in inodes}
    held = {}
    for entry in os.listdir(proc_root) if wanted else []:
        if not entry.isdigit():
            continue
        fd_dir = os.path.join(proc_root, entry, "fd")
        try:
            fds = os.listdir(fd_dir)
        except (FileNotFoundError, PermissionError, NotADirectoryError):
            continue
        for fd in fds:
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target in wanted:
                held.setdefault(int(entry), set()).add(wanted[target])
    return held


def port_holders(port, proc_root="/proc"):
    """Pids with an open fd on a socket that listens on `port`."""
    return sorted(socket_holders(listening_inodes(port, proc_root), proc_root))


def _answers(host, port, timeout=1.0):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        return s.connect_ex((host, port)) == 0


def _bind_error(host, port):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.strerror if exc.errno == errno.EADDRINUSE else ""
    return ""


def port_problem(port, host="127.0.0.1", proc_root="/proc", probe=True):
    """Why stopping our server would not give the server `port` (host:port), found without stopping anything; ''
    when nothing stands in the way. A socket listens on the port that no process of this /proc holds (a process of
    another container or PID namespace sharing this network: cleanup could neither stop it nor see the port freed);
    with `probe`, when nothing here listens on it: something answers on host:port all the same (a forward, another
    network namespace), or the address cannot be bound. A holder this /proc shows is left to the cleanup, which
    stops ours and refuses a foreign one before stopping anything."""
    inodes = listening_inodes(port, proc_root)
    if inodes:
        held = set().union(*socket_holders(inodes, proc_root).values())
        if inodes - held:
            return ("port %s: something listens on it that no process this host's /proc shows holds (a process "
                    "of another container or PID namespace sharing this network): stopping our server would not "
                    "free it" % port)
        return ""
    if not probe:
        return ""
    address = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    try:
        if _answers(address, port):
            return ("port %s on %s answers, but nothing on this host listens on it (a forward, or a process in "
                    "another network namespace): it is not our server" % (port, address))
        error = _bind_error(host or "0.0.0.0", port)
    except OSError:
        return ""                  # an address this host cannot probe: validate's other checks speak for it
    return "port %s on %s cannot be bound: %s" % (port, host, error) if error else ""


# ---------------------------------------------------------------------------------------------------- NVML

def gpu_holders(nvml, handles):
    """{pid: {gpu index: used bytes}} of the NVML compute processes on the given {index: handle}."""
    found = {}
    for index, handle in handles.items():
        for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            used = p.usedGpuMemory if isinstance(p.usedGpuMemory, int) else 0   # None when not available
            found.setdefault(int(p.pid), {})[index] = used
    return found


def _used_bytes(nvml, handle):
    return int(nvml.nvmlDeviceGetMemoryInfo(handle).used)


def union_with_current_plan(gpu_indices, ports, current_plan_path):
    """Add the GPUs and port of the plan the unit currently runs (if its state file exists): (GPUs, ports, the state
    file or None, the running plan or {})."""
    gpus, prts = set(gpu_indices), set(ports)
    source, plan = None, {}
    if current_plan_path and os.path.exists(current_plan_path):
        hint = " (remove it if the server it describes is gone)"
        try:
            with open(current_plan_path, encoding="utf-8") as f:
                plan = json.load(f)
        except (OSError, ValueError) as exc:
            raise CleanupError("cannot read the running plan %s: %s%s" % (current_plan_path, exc, hint)) from None
        if not isinstance(plan, dict):
            raise CleanupError("the running plan %s is not a JSON object but %s%s"
                               % (current_plan_path, type(plan).__name__, hint))
        indices = plan.get("gpu_indices", [])
        if not isinstance(indices, list) or not all(_is_index(i) for i in indices):
            raise CleanupError("the running plan %s: gpu_indices %s is not a list of GPU indices%s"
                               % (current_plan_path, json.dumps(indices), hint))
        port = plan.get("port")
        if port is not None and not (_is_index(port) and 0 < port < 65536):
            raise CleanupError("the running plan %s: port %s is not a port number%s"
                               % (current_plan_path, json.dumps(port), hint))
        gpus.update(indices)
        if port:
            prts.add(port)
        source = current_plan_path
    return sorted(gpus), sorted(prts), source, plan


def _is_index(value):
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# ---------------------------------------------------------------------------------------------------- signals

def _signal(pid, starttime, sig, proc_root):
    """Send sig to pid if it is still the same process; False when it is already gone."""
    if hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal") and proc_root == "/proc":
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        try:
            if not _alive(pid, starttime, proc_root):     # the pidfd now pins the process we checked
                return False
            signal.pidfd_send_signal(fd, sig)
            return True
        except ProcessLookupError:
            return False
        finally:
            os.close(fd)
    if not _alive(pid, starttime, proc_root):
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def _wait_gone(victims, timeout, interval, proc_root, clock, sleep):
    """Poll until every victim is gone or the deadline passes; mark each with `ended_after_s`. Returns survivors."""
    start = clock()
    deadline = start + timeout
    left = list(victims)
    while True:
        still = []
        for v in left:
            if _alive(v["pid"], v["starttime"], proc_root):
                still.append(v)
            else:
                v["ended_after_s"] = round(clock() - v["_t0"], 3)
        left = still
        if not left or clock() >= deadline:
            return left
        sleep(interval)


def _stop(victims, opts, proc_root, clock, sleep):
    """SIGTERM, wait, SIGKILL, wait. Each victim gets `signal` (what ended it). Raises on a process that outlives SIGKILL."""
    t0 = clock()
    for v in victims:
        v["_t0"] = t0
        v["signal"] = "SIGTERM" if _signal(v["pid"], v["starttime"], signal.SIGTERM, proc_root) else "exited"
    survivors = _wait_gone(victims, opts["term_timeout"], opts["poll_interval"], proc_root, clock, sleep)
    for v in survivors:
        if _signal(v["pid"], v["starttime"], signal.SIGKILL, proc_root):
            v["signal"] = "SIGKILL"
    survivors = _wait_gone(survivors, opts["kill_timeout"], opts["poll_interval"], proc_root, clock, sleep)
    if survivors:
        raise CleanupError(
            "timed out after %ss waiting for SIGKILLed processes to exit (SIGTERM deadline was %ss): %s. "
            "A process stuck in the kernel (state D) usually means a hung GPU: check dmesg and nvidia-smi."
            % (opts["kill_timeout"], opts["term_timeout"],
               "; ".join("pid %s (%s, state %s)" % (v["pid"], v["title"], (_stat_fields(v["pid"], proc_root) or "?")[0])
                         for v in survivors)))


# ---------------------------------------------------------------------------------------------------- main

def _describe(p):
    gpus = ", ".join("GPU %s (%d MiB)" % (g, b // MIB) for g, b in sorted(p["gpus"].items()))
    where = gpus or "no GPU memory"
    if p["ports"]:
        where += ", listening on port %s" % ", ".join(str(x) for x in p["ports"])
    return "pid %s user %s cmdline '%s' on %s" % (p["pid"], p["user"], p["cmdline"], where)


def _public(p):
    return {k: v for k, v in p.items() if not k.startswith("_") and k not in ("cgroup", "starttime", "state", "uid")}


def _validate(opts, gpu_count):
    bad = [i for i in opts["gpu_indices"] if not isinstance(i, int) or i < 0 or i >= gpu_count]
    if bad:
        raise CleanupError("gpu_indices %s: this host has %d GPUs (valid indices 0-%d)" % (bad, gpu_count, gpu_count - 1))
    bad_ports = [p for p in opts["ports"] if not isinstance(p, int) or not 0 < p < 65536]
    if bad_ports:
        raise CleanupError("ports %s: a port is an integer in 1-65535" % bad_ports)
    for key in ("term_timeout", "kill_timeout", "release_timeout"):
        if opts[key] < 0:
            raise CleanupError("%s %s: a timeout is a number of seconds >= 0" % (key, opts[key]))
    if opts["memory_threshold_mib"] < 0:
        raise CleanupError("memory_threshold_mib %s: must be >= 0" % opts["memory_threshold_mib"])
    problem = opts["service_user"] and service_user_problem(opts["service_user"], opts["force_service_user"])
    if problem:
        raise CleanupError("%s; nothing was stopped" % problem)


def _scan(nvml, handles, all_handles, opts, proc_root):
    """Holders of our GPUs/ports (with /proc info and classification), the pids NVML reports on our GPUs that this
    /proc does not have ({pid: {gpu: bytes}}), and, for the record, holders of other GPUs."""
    ours_gpu = gpu_holders(nvml, handles)
    by_port = {}
    for port in opts["ports"]:
        for pid in port_holders(port, proc_root):
            by_port.setdefault(pid, []).append(port)
    found, missing = [], []
    for pid in sorted(set(ours_gpu) | set(by_port)):
        info = read_process(pid, proc_root)
        if info is None:
            missing.append(pid)
            continue
        if info["state"] in ("Z", "X"):
            continue                                      # exited: the driver frees its memory
        ours, reasons = classify(info, opts["unit_name"], opts["service_user"], opts["title_prefixes"],
                                 opts["cmdline_markers"])
        info.update(gpus=ours_gpu.get(pid, {}), ports=by_port.get(pid, []), ours=ours, reasons=reasons)
        found.append(info)
    # Gone between NVML's answer and our look, or never in this /proc: NVML is asked again, and what it still
    # reports is a process of another PID namespace.
    again = gpu_holders(nvml, handles) if missing else {}
    unresolved = {pid: again[pid] for pid in missing if pid in again and read_process(pid, proc_root) is None}
    others = []
    other_handles = {i: h for i, h in all_handles.items() if i not in handles}
    for pid, gpus in sorted(gpu_holders(nvml, other_handles).items()):
        if pid in ours_gpu:
            continue
        info = read_process(pid, proc_root)
        others.append({"pid": pid, "user": info["user"] if info else "?", "title": info["title"] if info else "?",
                       "gpus": gpus})
    return found, unresolved, others


def _refuse_unresolved(unresolved, opts, result):
    """Fail, naming them, when NVML reports pids on our GPUs that this /proc does not have: never acted on."""
    if not unresolved:
        return
    stopped = ([opts["unit_name"]] if result.get("unit", {}).get("stopped") else []) + \
        [str(p["pid"]) for p in result["stopped"]]
    raise CleanupError(
        "NVML reports %s on our GPUs that this host's /proc does not have: %s. They belong to another PID namespace "
        "(a container on this host, or this cleanup runs inside one while NVML names the driver's pids) and were "
        "not touched, not even with cleanup_stop_foreign (the number may name another process here)%s. Stop them "
        "where they run, or run the cleanup where their pids resolve."
        % ("pids" if len(unresolved) > 1 else "a pid",
           "; ".join("pid %s on %s" % (pid, ", ".join("GPU %s (%d MiB)" % (g, b // MIB) for g, b in sorted(gpus.items())))
                     for pid, gpus in sorted(unresolved.items())),
           "; already stopped: %s" % ", ".join(stopped) if stopped
           else "; our server was left running" if opts["stop_unit"] else ""),
        result)


def _refuse_foreign(found, opts, result):
    """Fail, naming them, when processes that are not ours hold our GPUs/port (unless stop_foreign)."""
    foreign = [p for p in found if not p["ours"]]
    if not foreign or opts["stop_foreign"]:
        return
    done = []
    if result.get("unit", {}).get("stopped"):
        done.append(opts["unit_name"])
    done += [str(p["pid"]) for p in result["stopped"]]
    raise CleanupError(
        "a process that is not ours holds %s: %s. Nothing of it was touched%s. Stop it yourself, or let "
        "cleanup stop it with cleanup_stop_foreign=true (ours = in %s, or running as user %s)."
        % ("our GPU/port" if len(foreign) == 1 else "our GPUs/port", "; ".join(_describe(p) for p in foreign),
           " (already stopped: %s)" % ", ".join(done) if done
           else "; our server was left running" if opts["stop_unit"] else "",
           opts["unit_name"], opts["service_user"]),
        result)


def stop_unit(unit, run=_run, check_mode=False, clock=time.monotonic):
    """Stop our unit and with it its whole cgroup; systemd SIGKILLs what did not end on SIGTERM in TimeoutStopSec.

    Returns {name, load_state, was, stopped, would_stop, seconds, result, sigkilled}; a unit that is not loaded,
    inactive or failed has nothing to stop."""
    before = show(unit, UNIT_PROPS, run, CleanupError)
    out = {"name": unit, "load_state": before.get("LoadState"), "was": before.get("ActiveState"),
           "stopped": False, "would_stop": False, "sigkilled": False}
    if before.get("LoadState") != "loaded" or before.get("ActiveState") in ("inactive", "failed"):
        return out
    if check_mode:
        out["would_stop"] = True
        return out
    t0 = clock()
    rc, _out, err = run(["systemctl", "stop", unit])
    after = show(unit, UNIT_PROPS, run, CleanupError)
    out.update(stopped=rc == 0, seconds=round(clock() - t0, 2), result=after.get("Result"),
               sigkilled=after.get("Result") == "timeout")
    if rc != 0:
        raise CleanupError("systemctl stop %s failed (rc %s): %s; it is %s now" % (
            unit, rc, err.strip(), after.get("ActiveState")), {"unit": out})
    return out


def _release_state(nvml, handles, opts, threshold, proc_root):
    """What still blocks: list of human-readable reasons (empty when released), and per-GPU memory."""
    blocking, memory = [], {}
    for index, handle in handles.items():
        used = _used_bytes(nvml, handle)
        memory[index] = used
        pids = [int(p.pid) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        if pids:
            blocking.append("GPU %s still lists processes %s" % (index, pids))
        elif used > threshold:
            blocking.append("GPU %s used memory %d MiB > threshold %d MiB" % (index, used // MIB, threshold // MIB))
    for port in opts["ports"]:
        if listening_inodes(port, proc_root):
            holders = port_holders(port, proc_root)
            blocking.append("port %s still listening%s" % (port, " (pid %s)" % holders if holders else ""))
    return blocking, memory


def cleanup(opts, nvml, check_mode=False, proc_root="/proc", clock=time.monotonic, sleep=time.sleep, run=_run):
    """Run the cleanup; returns the result dict of the module. Raises CleanupError (with .result) on failure."""
    o = dict(DEFAULTS)
    o.update({k: v for k, v in opts.items() if v is not None})
    t_start = clock()
    gpu_indices, ports, plan_source, running = union_with_current_plan(
        o["gpu_indices"], o["ports"], o["current_plan_path"] or state_file(o["state_dir"], CURRENT_PLAN))
    o["gpu_indices"], o["ports"] = gpu_indices, ports
    threshold = int(o["memory_threshold_mib"]) * MIB

    nvml.nvmlInit()
    try:
        count = nvml.nvmlDeviceGetCount()
        _validate(o, count)
        all_handles = {i: nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)}
        handles = {i: all_handles[i] for i in gpu_indices}
        result = {"changed": False, "gpu_indices": gpu_indices, "ports": ports, "running_plan": plan_source,
                  "plan": running, "stopped": [], "would_stop": [], "left_alone": [], "gpus": []}
        memory_before = {i: _used_bytes(nvml, h) for i, h in handles.items()}
        if o["stop_unit"]:
            found, unresolved, _others = _scan(nvml, handles, all_handles, o, proc_root)
            _refuse_unresolved(unresolved, o, result)
            _refuse_foreign(found, o, result)
            result["unit"] = stop_unit(o["unit_name"], run, check_mode, clock)
            result["changed"] = result["unit"]["stopped"] or result["unit"]["would_stop"]

        rounds = 0
        release_deadline = None
        while True:
            found, unresolved, others = _scan(nvml, handles, all_handles, o, proc_root)
            if rounds == 0:
                result["left_alone"] = others
            _refuse_unresolved(unresolved, o, result)
            _refuse_foreign(found, o, result)
            if found and check_mode:
                result["would_stop"] = [_public(p) for p in found]
                result["changed"] = True
                break
            if found:
                rounds += 1
                if rounds > MAX_ROUNDS:
                    raise CleanupError("processes keep appearing on GPUs %s after %d rounds of stopping: %s"
                                       % (gpu_indices, MAX_ROUNDS, "; ".join(_describe(p) for p in found)), result)
                try:
                    _stop(found, o, proc_root, clock, sleep)
                finally:
                    result["stopped"].extend(_public(p) for p in found if "signal" in p)
                    result["changed"] = result["changed"] or bool(result["stopped"])
                release_deadline = None
                continue
            if check_mode:
                break
            if release_deadline is None:
                release_deadline = clock() + o["release_timeout"]
            blocking, memory = _release_state(nvml, handles, o, threshold, proc_root)
            if not blocking:
                break
            if clock() >= release_deadline:
                result["elapsed_s"] = round(clock() - t_start, 3)
                raise CleanupError(
                    "timed out after %ss waiting for GPUs %s to be released and port(s) %s closed: %s"
                    % (o["release_timeout"], gpu_indices, ports, "; ".join(blocking)), result)
            sleep(o["poll_interval"])

        result["gpus"] = [{"index": i, "used_bytes_before": memory_before[i], "used_bytes": _used_bytes(nvml, h)}
                          for i, h in handles.items()]
        result["elapsed_s"] = round(clock() - t_start, 3)
        result["summary"] = _summary(result, check_mode)
        return result
    finally:
        nvml.nvmlShutdown()


def _summary(result, check_mode):
    unit = result.get("unit") or {}
    if unit.get("would_stop"):
        head = "would stop %s; " % unit["name"]
    elif unit.get("sigkilled"):
        head = ("%s did not stop on SIGTERM within its TimeoutStopSec: systemd SIGKILLed its processes (Result=%s); "
                % (unit["name"], unit["result"]))
    elif unit.get("stopped"):
        head = "stopped %s in %.1f s; " % (unit["name"], unit["seconds"])
    else:
        head = "%s was not running; " % unit["name"] if unit else ""
    return head + _summary_processes(result, check_mode)


def _summary_processes(result, check_mode):
    gpus = ",".join(str(i) for i in result["gpu_indices"]) or "none"
    if check_mode:
        items = result["would_stop"]
        if not items:
            return "nothing to stop on GPUs %s (check mode)" % gpus
        return "would stop %d process(es) on GPUs %s: %s" % (
            len(items), gpus, "; ".join("pid %s %s (%s)" % (p["pid"], p["title"], p["user"]) for p in items))
    items = result["stopped"]
    if not items:
        return "nothing left on GPUs %s; released in %.1f s" % (gpus, result["elapsed_s"])
    stopped = ["pid %s %s (%s) GPU %s by %s"
               % (p["pid"], p["title"], p["user"], ",".join(str(g) for g in sorted(p["gpus"])) or "-", p["signal"])
               for p in items]
    return "stopped %d process(es) on GPUs %s in %.1f s: %s" % (len(items), gpus, result["elapsed_s"], "; ".join(stopped))
