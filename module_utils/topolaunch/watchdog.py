"""The watchdog: a systemd timer on the server host probes generation health and restarts a hung server.

Why: systemd's Restart=on-failure catches a server that exits; the failure seen most on these boxes is a hang (an
NCCL collective that never returns, a scheduler stuck while the process lives and the port stays open).

The probe is the release's own generation health check, `GET /health_generate` on the plan's host and port: in
both supported releases `/health` and `/health_generate` are one handler that sends a one-token generation and
answers 200 once the scheduler produced output, 503 after SGLANG_HEALTH_CHECK_TIMEOUT (20 s) without any, 503 at
once while the server is starting or draining; `/health` skips the generation when
SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is false, `/health_generate` never does (59:sglang/srt/entrypoints/
http_server.py:464-530, 523:sglang/srt/entrypoints/http_server.py:721-800); 0.5.23's `/ready` never generates.
A probe fails on anything but 200 in `probe_timeout` seconds (503, a timeout, a refused connection).

One run (`run_once`, every `interval` seconds) per watched server (`servers`: unit name and its current plan
file; a replica is one more entry, its own unit), `decide()` is the rule:

1. The relaunch lock (`lock_file`, an flock the relaunch holds from validate to health) is held: skip.
2. The unit is not active or activating: skip (a stop is the operator's or systemd's; a crash is systemd's).
3. A new start of the unit (its InvocationID changed): the count starts again.
4. The probe passed: the count is 0, the server has served since this start.
5. It failed while the server has not served since this start and the start is younger than `load_timeout`
   (the launch's load timeout, health_startup_timeout): loading, not a failure.
6. The answer probe (issue 28: health.answer_probe, the health stage's known-answer question, greedy) runs after a
   passing probe when it is due: at the first pass of each start (a launch, a crash's restart, the watchdog's own
   restart), after each of its failures (until it passes again or the server is restarted), and every
   `answer_every`-th pass besides (0: only then). A wrong answer is a failure like a hung probe (the server has
   served, so no loading grace). Why not every run: the probe decodes up to its max_tokens (64) greedily, where
   /health_generate decodes one token; every 30 s that would be ~120 requests of 64 tokens an hour in the batch,
   for a fault (a garbling setting) that shows at the first answer after a start and does not come by itself.
7. Otherwise a failure; at `failures` consecutive failures the server is restarted: its unit is stopped and
   what is left of it on its GPUs and port stopped and the memory verified released, by the project's cleanup
   (cleanup.py: the unit's exact cgroup, SIGTERM then SIGKILL on deadlines), then the unit is started; unless
   `max_restarts` restarts happened in the last hour: then the server is stopped the same way and left down,
   the journal says so and the metrics file has topolaunch_watchdog_gave_up 1 (until the unit is started again).

Every run writes `metrics_file` in node exporter's textfile format (METRICS). Plain Python 3.9+ stdlib; NVML
only through the `nvml` argument of run_once, systemctl through `run`, the clocks injectable.
"""
import errno
import fcntl
import json
import os
import re
import socket
import sys
import time
import urllib.error
import urllib.request

from . import health as _health
from .cleanup import CleanupError, cleanup
from .constants import CURRENT_PLAN, SERVER_CONFIG, SERVICE_USER, STATE_DIR, UNIT_NAME, state_file
from .system import run as _run, show

__all__ = ["DEFAULTS", "SettingsError", "check_settings", "probe", "decide", "run_once", "render_metrics",
           "PROBE_PATH", "METRICS"]

PROBE_PATH = "/health_generate"
HOUR = 3600.0
DEFAULTS = {
    "servers": [{"unit": UNIT_NAME, "current_plan": state_file(STATE_DIR, CURRENT_PLAN)}],
    "interval": 30,
    "failures": 3,
    "max_restarts": 3,
    "load_timeout": 1200,
    "probe_timeout": 30,
    "lock_file": "/run/topolaunch/relaunch.lock",
    "state_dir": STATE_DIR,
    "metrics_file": "/var/lib/topolaunch/metrics/topolaunch_watchdog.prom",
    "service_user": SERVICE_USER,
    "term_timeout": 30,
    "kill_timeout": 10,
    "release_timeout": 60,
    # the answer probe's settings (health.probe_settings: auto, on, off, {prompt, expect, ...}); every N-th pass
    "answer_probe": "auto",
    "answer_every": 120,
}
# name -> (type, help): the metrics file, one series per watched unit (label unit)
METRICS = {
    "topolaunch_watchdog_healthy": ("gauge", "1 when the last probe passed, 0 otherwise"),
    "topolaunch_watchdog_loading": ("gauge", "1 while the server is starting (not served since its start, younger "
                                             "than the load timeout)"),
    "topolaunch_watchdog_consecutive_failures": ("gauge", "Failed probes in a row since the last pass or restart"),
    "topolaunch_watchdog_restarts_last_hour": ("gauge", "Restarts by the watchdog in the last hour"),
    "topolaunch_watchdog_restarts_total": ("counter", "Restarts by the watchdog since its state was created"),
    "topolaunch_watchdog_max_restarts": ("gauge", "The restart limit per hour"),
    "topolaunch_watchdog_gave_up": ("gauge", "1 when the restart limit was reached and the server was left down"),
    "topolaunch_watchdog_relaunch_lock_held": ("gauge", "1 when the last run skipped: a relaunch held the lock"),
    "topolaunch_watchdog_last_run_timestamp_seconds": ("gauge", "Unix time of the last watchdog run"),
}
UNIT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:_.@-]*\.service$")
ACTIVE = ("active", "activating", "reloading")
UNIT_PROPS = ["ActiveState", "SubState", "InvocationID", "ExecMainStartTimestampMonotonic", "MainPID"]


class SettingsError(Exception):
    """A bad setting: the message names it."""


def _number(value, field, integer, minimum, errors, strict=True):
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or (value <= minimum if strict else value < minimum):
        errors.append("%s must be %s %s %s, got %r" % (field, "an integer" if integer else "a number",
                                                       ">" if strict else ">=", minimum, value))


def _path(value, field, errors):
    if not isinstance(value, str) or not value.startswith("/") or any(ord(c) < 32 or ord(c) == 127 for c in value):
        errors.append("%s must be an absolute path without control characters, got %r" % (field, value))


def check_settings(settings):
    """The settings with defaults filled in; SettingsError naming every bad field (topolaunch_watchdog_<field>)."""
    s = dict(DEFAULTS)
    s.update({k: v for k, v in (settings or {}).items() if v is not None})
    errors = []
    unknown = sorted(set(s) - set(DEFAULTS))
    if unknown:
        errors.append("unknown watchdog setting(s) %s" % ", ".join(unknown))
    _number(s["interval"], "interval", False, 0, errors)
    _number(s["failures"], "failures", True, 0, errors)
    _number(s["max_restarts"], "max_restarts", True, 0, errors, strict=False)
    _number(s["answer_every"], "answer_every", True, 0, errors, strict=False)
    try:
        _health.probe_settings(s["answer_probe"])
    except ValueError as err:
        errors.append(str(err))
    for field in ("load_timeout", "probe_timeout", "term_timeout", "kill_timeout", "release_timeout"):
        _number(s[field], field, False, 0, errors)
    for field in ("lock_file", "state_dir", "metrics_file"):
        _path(s[field], field, errors)
    if not isinstance(s["service_user"], str) or not re.match(r"^[a-z_][a-z0-9_-]*$", s["service_user"]):
        errors.append("service_user must be a user name, got %r" % (s["service_user"],))
    servers = s["servers"]
    if not isinstance(servers, list) or not servers:
        errors.append("servers must be a non-empty list of {unit, current_plan}, got %r" % (servers,))
        servers = []
    units = set()
    for i, server in enumerate(servers):
        where = "servers[%d]" % i
        if not isinstance(server, dict) or set(server) - {"unit", "current_plan"}:
            errors.append("%s must be a mapping with unit and current_plan, got %r" % (where, server))
            continue
        unit = server.get("unit")
        if not isinstance(unit, str) or not UNIT_RE.match(unit):
            errors.append("%s.unit must be a systemd service name (topolaunch-sglang.service, "
                          "topolaunch-sglang@1.service), got %r" % (where, unit))
        elif unit in units:
            errors.append("%s.unit %s is named twice" % (where, unit))
        units.add(unit)
        _path(server.get("current_plan"), where + ".current_plan", errors)
    if errors:
        raise SettingsError("; ".join(errors))
    return s


def probe_address(plan):
    """(host, port) the probe asks: the plan's; a wildcard address is asked on loopback."""
    host = str(plan.get("host") or "127.0.0.1")
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return host, int(plan.get("port") or 30000)


# What opens the probe's URL: urllib's default opener (proxies from the environment, as the module's own calls).
_OPENER = urllib.request.build_opener()


def probe(host, port, timeout, opener=None):
    """(passed, detail) of one GET /health_generate."""
    url = "http://%s:%d%s" % ("[%s]" % host if ":" in host else host, port, PROBE_PATH)
    try:
        with (opener or _OPENER.open)(url, timeout=timeout) as resp:
            status = resp.status
    except urllib.error.HTTPError as err:
        status = err.code
    except (urllib.error.URLError, OSError, socket.timeout) as err:
        reason = getattr(err, "reason", err)
        if isinstance(reason, socket.timeout) or "timed out" in str(reason):
            return False, "%s timed out after %gs" % (PROBE_PATH, timeout)
        return False, "%s: %s" % (PROBE_PATH, reason)
    return status == 200, "%s answered %d" % (PROBE_PATH, status)


def new_state():
    return {"invocation": None, "served": False, "failures": 0, "restarts": [], "restarts_total": 0,
            "gave_up": False, "last": None, "answered": None, "answer_failed": False, "since_answer": 0}


def new_start(state, unit):
    """A new start of the unit (its InvocationID changed): the counts start again. Idempotent."""
    invocation = unit.get("InvocationID") or None
    if invocation != state["invocation"]:
        state.update(invocation=invocation, served=False, failures=0, gave_up=False, answer_failed=False)


def answer_due(state, s):
    """Whether this run asks the answer probe after a passing probe: not yet answered since this start, its last
    answer was wrong, or `answer_every` passes since the last answer (0: never for that reason)."""
    if state["answered"] != state["invocation"] or state["answer_failed"]:
        return True
    return s["answer_every"] > 0 and state["since_answer"] + 1 >= s["answer_every"]


def server_api_key(plan_path):
    """The server's API key as the launch wrote it (`api-key: "<JSON string>"` in SERVER_CONFIG beside the plan
    record), or '' when it has none."""
    try:
        with open(os.path.join(os.path.dirname(plan_path), SERVER_CONFIG), encoding="utf-8") as f:
            for line in f:
                if line.startswith("api-key: "):
                    return json.loads(line.partition(": ")[2])
    except (OSError, ValueError):
        pass
    return ""


def check_answer(state, plan, plan_path, s, http=None):
    """(passed, detail) of the answer probe, updating `state` (answered, answer_failed, since_answer, served)."""
    try:
        out = _health.answer_probe(plan, s["answer_probe"], http=http or _health.http_request,
                                   api_key=server_api_key(plan_path), timeout=s["probe_timeout"])
    except _health.HealthError as err:
        state.update(answer_failed=True, served=True)     # it generated: a wrong answer is no loading
        return False, "%s answered 200, but %s" % (PROBE_PATH, str(err)[:1].lower() + str(err)[1:])
    state.update(answered=state["invocation"], answer_failed=False, since_answer=0)
    return True, "%s answered 200; %s" % (PROBE_PATH, out["summary"])


def decide(state, unit, probe_result, now, mono, s, lock_held):
    """(action, message) for one run, updating `state` (a copy is the caller's business).

    unit: systemctl show properties (UNIT_PROPS); probe_result: (passed, detail) or None when not probed;
    now: wall clock (the restarts' hour), mono: CLOCK_MONOTONIC seconds (systemd's start timestamp's clock).
    Actions: skip_lock, skip_inactive, down (gave up, unit stopped), ok, loading, fail, restart, give_up."""
    state["restarts"] = [t for t in state["restarts"] if now - t < HOUR]
    if lock_held:
        return "skip_lock", "a relaunch holds %s: not probing" % s["lock_file"]
    active = unit.get("ActiveState")
    if active not in ACTIVE:
        if state["gave_up"]:
            return "down", "left down after %d restarts in the last hour (limit %d)" % (
                len(state["restarts"]), s["max_restarts"])
        return "skip_inactive", "the unit is %s: not watched until it runs" % active
    new_start(state, unit)
    started = int(unit.get("ExecMainStartTimestampMonotonic") or 0) / 1e6
    age = mono - started if started else None
    passed, detail = probe_result
    if passed:
        state.update(failures=0, served=True)
        return "ok", detail
    if not state["served"] and (age is None or age < s["load_timeout"]):
        return "loading", "%s; loading (%s of the load timeout %gs)" % (
            detail, "%.0fs" % age if age is not None else "start time unknown", s["load_timeout"])
    state["failures"] += 1
    if state["failures"] < s["failures"]:
        return "fail", "%s (failure %d of %d)" % (detail, state["failures"], s["failures"])
    if len(state["restarts"]) >= s["max_restarts"]:
        state.update(gave_up=True, failures=0)
        return "give_up", "%s (failure %d of %d); %d restarts in the last hour reach the limit %d: stopping the " \
            "server and leaving it down" % (detail, s["failures"], s["failures"], len(state["restarts"]),
                                            s["max_restarts"])
    state["restarts"].append(now)
    state["restarts_total"] += 1
    state["failures"] = 0
    return "restart", "%s (failure %d of %d): restarting (%d of %d this hour)" % (
        detail, s["failures"], s["failures"], len(state["restarts"]), s["max_restarts"])


# ---------------------------------------------------------------------------------------------- files


def _state_path(s, unit):
    return os.path.join(s["state_dir"], "watchdog-%s.json" % unit)


def load_state(s, unit):
    try:
        with open(_state_path(s, unit), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return new_state()
    state = new_state()
    state.update({k: data[k] for k in state if k in data})
    return state


def _write(path, text, mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = "%s.tmp.%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def render_metrics(rows, s, now):
    """Node exporter textfile text: rows = [(unit, state, action)]."""
    lines = []
    for name, (kind, help_text) in METRICS.items():
        lines += ["# HELP %s %s" % (name, help_text), "# TYPE %s %s" % (name, kind)]
        for unit, state, action in rows:
            value = {
                "topolaunch_watchdog_healthy": 1 if action == "ok" else 0,
                "topolaunch_watchdog_loading": 1 if action == "loading" else 0,
                "topolaunch_watchdog_consecutive_failures": state["failures"],
                "topolaunch_watchdog_restarts_last_hour": len(state["restarts"]),
                "topolaunch_watchdog_restarts_total": state["restarts_total"],
                "topolaunch_watchdog_max_restarts": s["max_restarts"],
                "topolaunch_watchdog_gave_up": 1 if state["gave_up"] else 0,
                "topolaunch_watchdog_relaunch_lock_held": 1 if action == "skip_lock" else 0,
                "topolaunch_watchdog_last_run_timestamp_seconds": round(now, 3),
            }[name]
            lines.append('%s{unit="%s"} %s' % (name, unit, value))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- the run


def try_lock(path):
    """An fd holding `path` exclusively, or None when another process (the relaunch) holds it."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise
    return fd


def _read_plan(path):
    try:
        with open(path, encoding="utf-8") as f:
            plan = json.load(f)
    except FileNotFoundError:
        return None, "no plan at %s: nothing launched here yet" % path
    except (OSError, ValueError) as err:
        return None, "the plan %s is unreadable: %s" % (path, err)
    if not isinstance(plan, dict):
        return None, "the plan %s is not a mapping" % path
    if int((plan.get("layout") or {}).get("nnodes") or 1) > 1:
        return None, "a server across nodes is not watched (restarting one node would not restart it)"
    return plan, None


def stop_server(unit, plan, plan_path, s, nvml, run, clock, sleep):
    """Stop a hung server: SIGTERM to its launcher (SGLang drains), SIGKILL to the unit's cgroup after
    term_timeout, then the project's cleanup (the unit stopped, what escaped it on the plan's GPUs and port
    SIGTERMed then SIGKILLed, the GPU memory verified released). Returns cleanup's result."""
    if nvml is None:
        raise CleanupError("nvidia-ml-py is not importable: the GPUs cannot be verified released")
    state = show(unit, ["ActiveState"], run, CleanupError).get("ActiveState")
    if state in ACTIVE:
        run(["systemctl", "kill", "--kill-who=main", "--signal=SIGTERM", unit])
        deadline = clock() + s["term_timeout"]
        while clock() < deadline and show(unit, ["ActiveState"], run, CleanupError).get("ActiveState") in ACTIVE:
            sleep(0.5)
        if show(unit, ["ActiveState"], run, CleanupError).get("ActiveState") in ACTIVE:
            run(["systemctl", "kill", "--kill-who=all", "--signal=SIGKILL", unit])
    return cleanup({"unit_name": unit, "stop_unit": True, "gpu_indices": list(plan.get("gpu_indices") or []),
                    "ports": [probe_address(plan)[1]], "current_plan_path": plan_path,
                    "service_user": s["service_user"], "term_timeout": s["term_timeout"],
                    "kill_timeout": s["kill_timeout"], "release_timeout": s["release_timeout"]}, nvml)


def _say(line, stream=None):
    """One line to the journal (stdout of the oneshot service; its <N> prefix is the priority)."""
    stream = stream or sys.stdout
    stream.write(line + "\n")
    stream.flush()


def run_once(settings, nvml=None, run=_run, opener=None, log=_say, clock=time.monotonic,
             wall=time.time, sleep=time.sleep, http=None):
    """One watchdog run over every server; returns [(unit, action, message)]. Logs one line per server (a
    restart and a give-up at error priority, `<3>`: the journal's sd-daemon prefix)."""
    s = check_settings(settings)
    fd = try_lock(s["lock_file"])
    rows, out = [], []
    try:
        for server in s["servers"]:
            unit, plan_path = server["unit"], server["current_plan"]
            state = load_state(s, unit)
            plan, why = _read_plan(plan_path)
            if plan is None:
                action, message = "skip_inactive", why
            else:
                info = show(unit, UNIT_PROPS, run, CleanupError) if fd is not None else {}
                result = None
                if fd is not None and info.get("ActiveState") in ACTIVE:
                    host, port = probe_address(plan)
                    result = probe(host, port, s["probe_timeout"], opener)
                    new_start(state, info)
                    if result[0] and answer_due(state, s):
                        result = check_answer(state, plan, plan_path, s, http)
                    elif result[0]:
                        state["since_answer"] += 1
                action, message = decide(state, info, result, wall(), clock(), s, fd is None)
                if action in ("restart", "give_up"):
                    try:
                        done = stop_server(unit, plan, plan_path, s, nvml, run, clock, sleep)
                        message += "; stopped (%s)" % done.get("summary", "cleanup done")
                        if action == "restart":
                            run(["systemctl", "reset-failed", unit])
                            rc, _o, err = run(["systemctl", "start", "--no-block", unit])
                            message += "; started" if rc == 0 else "; systemctl start failed: %s" % err.strip()
                    except CleanupError as err:
                        message += "; the cleanup failed: %s" % err
            state["last"] = {"time": round(wall(), 3), "action": action, "message": message}
            _write(_state_path(s, unit), json.dumps(state, sort_keys=True) + "\n")
            rows.append((unit, state, action))
            prefix = "<3>" if action in ("restart", "give_up") else "<4>" if action == "fail" else ""
            log("%stopolaunch-watchdog: %s: %s: %s" % (prefix, unit, action, message))
            out.append((unit, action, message))
        _write(s["metrics_file"], render_metrics(rows, s, wall()))
    finally:
        if fd is not None:
            os.close(fd)
    return out


def main(argv=None):
    """`python -m <package>.watchdog CONFIG.json`: what the timer's oneshot service runs (the tools python, for
    nvidia-ml-py). Exit 0 after a run (what it did is in the journal and the metrics file), 2 on bad settings."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        _say("usage: watchdog.py CONFIG.json", sys.stderr)
        return 2
    try:
        with open(argv[0], encoding="utf-8") as f:
            settings = json.load(f)
        check_settings(settings)
    except (OSError, ValueError, SettingsError) as err:
        _say("<3>topolaunch-watchdog: %s: %s" % (argv[0], err))
        return 2
    try:
        import pynvml as nvml  # the tools venv's nvidia-ml-py: the cleanup verifies the GPUs are released
    except ImportError:
        nvml = None
    run_once(settings, nvml)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
