"""Wait for a starting SGLang unit, one chunk at a time, and say how far it got.

`wait_chunk(...)` is the logic of the `sglang_wait` module. Each call watches the unit for at most `chunk_s`
seconds and returns as soon as something worth printing happened:

- `ready`: the port accepts connections and the journal of this start has SGLang's ready line;
- `progress`: a new milestone was reached (Load weight begin/end, Capture cuda graph begin/end);
- `waiting`: the chunk ran out with nothing new (the caller prints a heartbeat and calls again);
- a dead start (the unit inactive, failed, waiting to be restarted by systemd, or restarted already) raises
  HealthError at once, with the journal lines of this start that carry the error. A restart that happened before
  the start we follow (NRestarts > 0 while it runs) is not a death.

"This start" is the unit's InvocationID when the wait began: the journal is read only for it, so a milestone or
an error of an earlier run never counts. Plain stdlib; commands go through `run(argv) -> (rc, out, err)`.
"""
import re
import signal
import socket
import subprocess
import time

__all__ = ["HealthError", "MILESTONES", "milestone", "error_lines", "parse_show", "port_open", "wait_chunk"]

# (key, words in SGLang's log line) in the order a start reaches them.
MILESTONES = [
    ("load_weight_begin", "Load weight begin"),
    ("load_weight_end", "Load weight end"),
    ("capture_cuda_graph_begin", "Capture cuda graph begin"),
    ("capture_cuda_graph_end", "Capture cuda graph end"),
    ("ready", "The server is fired up and ready to roll!"),
]
LABELS = dict(MILESTONES, started="started (no milestone yet)")
ERROR_RE = re.compile(r"Error|Traceback|OutOfMemory|out of memory|Exception|CUDA error|Killed|"
                      r"Main process exited|Failed with result|status=\d+/", re.IGNORECASE)
SHOW_PROPS = ["LoadState", "ActiveState", "SubState", "Result", "NRestarts", "InvocationID", "ExecMainStatus",
              "ExecMainCode", "ExecMainStartTimestampMonotonic"]


class HealthError(Exception):
    """The server will not come up; `result` has what the caller prints (milestone, log lines)."""

    def __init__(self, msg, result=None):
        super().__init__(msg)
        self.result = result or {}


def _run(argv):
    p = subprocess.run(argv, capture_output=True, text=True, check=False)
    return p.returncode, p.stdout, p.stderr


def parse_show(text):
    """`systemctl show` KEY=VALUE lines -> dict."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key] = value
    return out


def milestone(lines):
    """The last milestone key found in log lines, or 'started'."""
    reached = "started"
    for line in lines:
        for key, words in MILESTONES:
            if words in line:
                reached = key
    return reached


def error_lines(lines, limit=20):
    """The last `limit` log lines that look like an error (a Traceback's last lines included)."""
    hits = [line for line in lines if ERROR_RE.search(line)]
    return hits[-limit:]


def port_open(host, port, timeout=1.0):
    """True when a TCP connect to host:port succeeds. A wildcard listen address is reached via loopback."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _journal(unit, invocation_id, run, lines=400):
    """Log lines of one start of the unit: its own output and systemd's messages about it."""
    argv = ["journalctl", "--no-pager", "-o", "cat", "-n", str(lines)]
    if invocation_id:
        argv += ["_SYSTEMD_INVOCATION_ID=%s" % invocation_id, "+", "INVOCATION_ID=%s" % invocation_id]
    else:
        argv += ["-u", unit]
    rc, out, err = run(argv)
    if rc != 0:
        raise HealthError("journalctl failed (rc %s): %s" % (rc, err.strip()))
    return out.splitlines()


def _show(unit, run):
    rc, out, err = run(["systemctl", "show", "--property=" + ",".join(SHOW_PROPS), unit])
    if rc != 0:
        raise HealthError("systemctl show %s failed (rc %s): %s" % (unit, rc, err.strip()))
    return parse_show(out)


def _dead_reason(state, invocation_id):
    """Why the start we follow is not starting any more, or None while it is.

    An earlier restart by systemd (NRestarts > 0) does not count: a server that systemd restarted after a crash
    and that now runs is followed like any other start. What counts is this start: replaced by a new one, or
    its main process ended (auto-restart pending, inactive, failed)."""
    if state.get("LoadState") != "loaded":
        return "the unit is not loaded (LoadState=%s)" % state.get("LoadState")
    if invocation_id and state.get("InvocationID") and state["InvocationID"] != invocation_id:
        return "systemd restarted it (a new start replaced the one we waited for; restarts so far %s)" % (
            state.get("NRestarts") or 0)
    if state.get("SubState") == "auto-restart":
        return "its main process %s and systemd is restarting it (result %s, restarts so far %s)" % (
            _main_exit(state), state.get("Result"), state.get("NRestarts") or 0)
    if state.get("ActiveState") in ("inactive", "failed", "deactivating"):
        return "it is %s (result %s, main process %s)" % (state["ActiveState"], state.get("Result"), _main_exit(state))
    return None


def _main_exit(state):
    """How the main process ended, from ExecMainCode (siginfo si_code: CLD_EXITED=1, CLD_KILLED=2, CLD_DUMPED=3)."""
    word = {"1": "exited with", "2": "killed by signal", "3": "dumped core on signal"}.get(state.get("ExecMainCode"))
    if word is None:
        return "ended without an exit status recorded by systemd"
    status = state.get("ExecMainStatus") or "?"
    names = {str(int(sig)): sig.name for sig in signal.Signals}
    if state["ExecMainCode"] != "1" and status in names:
        status += " (%s)" % names[status]
    return "%s status %s" % (word, status)


def _since_start(state, clock):
    """Seconds since the unit's main process started (systemd's monotonic clock is CLOCK_MONOTONIC)."""
    usec = int(state.get("ExecMainStartTimestampMonotonic") or 0)
    return round(clock() - usec / 1e6, 1) if usec else 0.0


def wait_chunk(unit, host, port, invocation_id=None, known="started", chunk_s=20.0, startup_timeout=0,
               poll_s=0.5, journal_lines=50, run=_run, clock=time.monotonic, sleep=time.sleep):
    """Watch the unit for up to chunk_s; return {state, milestone, label, invocation_id, port_open, since_start_s}.

    Raises HealthError when the unit died, or when it is not ready startup_timeout seconds after its start
    (0 = no limit)."""
    deadline = clock() + chunk_s
    while True:
        state = _show(unit, run)
        if invocation_id is None:
            invocation_id = state.get("InvocationID") or None
        lines = _journal(unit, invocation_id, run)
        reached = milestone(lines)
        result = {"milestone": reached, "label": LABELS[reached], "invocation_id": invocation_id,
                  "active_state": state.get("ActiveState"), "port_open": False,
                  "since_start_s": _since_start(state, clock)}
        why = _dead_reason(state, invocation_id)
        if why:
            errors = error_lines(lines, journal_lines)
            result.update(state="dead", error_lines=errors, last_lines=lines[-journal_lines:])
            raise HealthError(
                "%s died while starting: %s. Last milestone: %s. Log lines with the error (journalctl -u %s):\n%s"
                % (unit, why, LABELS[reached], unit, "\n".join(errors or lines[-15:]) or "(no log lines)"), result)
        result["port_open"] = port_open(host, port)
        if result["port_open"] and reached == "ready":
            result["state"] = "ready"
            return result
        if reached != known:
            result["state"] = "progress"
            return result
        if startup_timeout and result["since_start_s"] >= startup_timeout:
            result.update(state="timeout", last_lines=lines[-journal_lines:])
            raise HealthError(
                "%s is not ready %s s after its start (timeout %s s): last milestone: %s; port %s %s. "
                "Last log lines (journalctl -u %s):\n%s"
                % (unit, result["since_start_s"], startup_timeout, LABELS[reached], port,
                   "open" if result["port_open"] else "still closed", unit, "\n".join(lines[-15:]) or "(no log lines)"),
                result)
        if clock() >= deadline:
            result["state"] = "waiting"
            return result
        sleep(poll_s)
