"""Wait for a starting SGLang unit, one chunk at a time, and say how far it got.

`wait_chunk(...)` is the wait of the `sglang_health` module. Each call watches the unit for at most `chunk_s`
seconds and returns as soon as something worth printing happened:

- `ready`: the port accepts connections and the journal of this start has SGLang's ready line;
- `progress`: a new milestone was reached, in the words of the SGLang version the plan runs (0.5.9: Init torch
  distributed begin, Load weight begin/end, Capture cuda graph begin/end; 0.5.23: Init parallel begin, Load weight
  begin/end, Capture target prefill CUDA graph begin/end, Capture target decode CUDA graph begin/end);
- `waiting`: the chunk ran out with nothing new (the caller prints a heartbeat and calls again);
- a dead start (the unit inactive, failed, waiting to be restarted by systemd, or restarted already) raises
  HealthError at once, with the journal lines of this start that carry the error. A restart that happened before
  the start we follow (NRestarts > 0 while it runs) is not a death.

"This start" is the unit's InvocationID when the wait began: the journal is read only for it, so a milestone or
an error of an earlier run never counts.

`check(...)` is the whole `sglang_health` module: it reads the plan the unit runs (current_plan.json: host, port,
model), calls `wait_chunk`, and once the server is ready (with `verify`) asks it in the same call: /health until
200, /model_info names our model, one /generate returns tokens; then it records the plan as last known good.
Every failure carries the plan in its result when it was read, so the caller knows which plan failed, and the last
known good plan with whether it runs another server (`last_good_plan`, `last_good_differs`): what a rollback needs,
without reading files back. Mode `serving` (the bench stage's question "does the server serve the plan health
passed for, now?") looks once: ready, /health 200, and the plan it runs is the last known good one.

Plain stdlib; commands go through `run(argv) -> (rc, out, err)`, HTTP through
`http(method, url, body=None, headers=None, timeout=60) -> (status, text)` (status 0: no HTTP answer, text says why).
"""
import http.client
import json
import re
import signal
import socket
import time
import urllib.error
import urllib.request

from . import health_nodes
from .constants import base_version, server_view
from .system import file_differs, journal, run as _run, show, write_atomic

__all__ = ["HealthError", "MILESTONES", "milestones", "milestone", "label", "error_lines", "port_open",
           "wait_chunk", "read_plan", "read_last_good", "http_request", "verify", "record_last_good", "check"]

# Per SGLang release: (key, words in SGLang's log line) in the order a start reaches them (docs/sglang-versions.md,
# "Launch, log lines"). 0.5.9: model_runner.py:731, 899, 1041, 2146, 2160; http_server.py:1836. 0.5.23:
# distributed/bootstrap.py:115; model_runner.py:1274, 1372; model_runner_components/cuda_graph_setup.py:684, 697
# (the prefill graph, captured first), 757, 787 (decode: the last one); http_server.py:2600.
MILESTONES = {
    "0.5.9": [
        ("init_distributed_begin", "Init torch distributed begin."),
        ("load_weight_begin", "Load weight begin"),
        ("load_weight_end", "Load weight end"),
        ("capture_cuda_graph_begin", "Capture cuda graph begin"),
        ("capture_cuda_graph_end", "Capture cuda graph end"),
        ("ready", "The server is fired up and ready to roll!"),
    ],
    "0.5.23": [
        ("init_parallel_begin", "Init parallel begin."),
        ("load_weight_begin", "Load weight begin"),
        ("load_weight_end", "Load weight end"),
        ("capture_prefill_graph_begin", "Capture target prefill CUDA graph begin"),
        ("capture_prefill_graph_end", "Capture target prefill CUDA graph end"),
        ("capture_decode_graph_begin", "Capture target decode CUDA graph begin"),
        ("capture_decode_graph_end", "Capture target decode CUDA graph end"),
        ("ready", "The server is fired up and ready to roll!"),
    ],
}
# Seconds after a start during which the wait looks quick_poll_s apart (see wait_chunk).
QUICK_START_S = 10
STARTED = "started (no milestone yet)"
ERROR_RE = re.compile(r"Error|Traceback|OutOfMemory|out of memory|Exception|CUDA error|Killed|"
                      r"Main process exited|Failed with result|status=\d+/", re.IGNORECASE)
SHOW_PROPS = ["LoadState", "ActiveState", "SubState", "Result", "NRestarts", "InvocationID", "ExecMainStatus",
              "ExecMainCode", "ExecMainStartTimestampMonotonic"]


class HealthError(Exception):
    """The server will not come up; `result` has what the caller prints (milestone, log lines)."""

    def __init__(self, msg, result=None):
        super().__init__(msg)
        self.result = result or {}


def milestones(version=None):
    """The milestones of an SGLang version (a local label such as +sim ignored); for a release without a table of
    its own, every known release's (a start logs only its own release's lines)."""
    table = MILESTONES.get(base_version(version or ""))
    if table is None:
        table = []
        for rows in MILESTONES.values():
            table.extend(row for row in rows if row not in table)
    return table


def milestone(lines, version=None, table=None):
    """The milestone key of the last log line that is one (of that SGLang version, or of `table`), or 'started'."""
    table = table or milestones(version)
    reached = "started"
    for line in lines:
        for key, words in table:
            if words in line:
                reached = key
    return reached


def label(key, version=None):
    """A milestone key in SGLang's words."""
    return dict(milestones(version)).get(key, STARTED)


def error_lines(lines, limit=20):
    """The last `limit` log lines that look like an error (a Traceback's last lines included)."""
    hits = [line for line in lines if ERROR_RE.search(line)]
    return hits[-limit:]


def connect_host(host):
    """The address to reach a server listening on `host`: a wildcard listen address is reached via loopback."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def port_open(host, port, timeout=1.0):
    """True when a TCP connect to host:port succeeds."""
    try:
        with socket.create_connection((connect_host(host), port), timeout=timeout):
            return True
    except OSError:
        return False


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
               poll_s=0.5, quick_poll_s=0.1, journal_lines=50, run=_run, clock=time.monotonic, sleep=time.sleep,
               version=None, table=None):
    """Watch the unit for up to chunk_s; return {state, milestone, label, invocation_id, port_open, since_start_s}.
    `version`: the SGLang version the unit runs, whose log lines are the milestones; `table`: the milestones
    themselves when they differ (a worker node's ready line, health_nodes.milestones).

    Looks every quick_poll_s during the first QUICK_START_S seconds of the start and once the port is open (a
    server that starts fast, or is about to be ready, is caught at once), every poll_s during a long load.
    Raises HealthError when the unit died, or when it is not ready startup_timeout seconds after its start
    (0 = no limit)."""
    table = table or milestones(version)
    labels = dict(table, started=STARTED)
    deadline = clock() + chunk_s
    looks = 0
    while True:
        looks += 1
        state = show(unit, SHOW_PROPS, run, HealthError)
        if invocation_id is None:
            invocation_id = state.get("InvocationID") or None
        lines = journal(unit, 400, run, HealthError, invocation_id)
        reached = milestone(lines, table=table)
        result = {"milestone": reached, "label": labels[reached], "invocation_id": invocation_id,
                  "active_state": state.get("ActiveState"), "port_open": False,
                  "since_start_s": _since_start(state, clock), "looks": looks}
        why = _dead_reason(state, invocation_id)
        if why:
            errors = error_lines(lines, journal_lines)
            result.update(state="dead", error_lines=errors, last_lines=lines[-journal_lines:])
            raise HealthError(
                "%s died while starting: %s. Last milestone: %s. Log lines with the error (journalctl -u %s):\n%s"
                % (unit, why, labels[reached], unit, "\n".join(errors or lines[-15:]) or "(no log lines)"), result)
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
                % (unit, result["since_start_s"], startup_timeout, labels[reached], port,
                   "open" if result["port_open"] else "still closed", unit, "\n".join(lines[-15:]) or "(no log lines)"),
                result)
        if clock() >= deadline:
            result["state"] = "waiting"
            return result
        quick = result["port_open"] or result["since_start_s"] < QUICK_START_S
        sleep(quick_poll_s if quick else poll_s)


# ------------------------------------------------------------------------------------------ the plan
def read_plan(path):
    """The plan the unit runs, as (plan, file content). Raises HealthError naming the file when it is missing or bad."""
    why = None
    try:
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
        plan = json.loads(text)
    except OSError as err:
        why = err.strerror or str(err)
    except ValueError as err:  # UnicodeDecodeError included
        why = "not JSON (%s)" % err
    else:
        port = plan.get("port") if isinstance(plan, dict) else None
        if not isinstance(plan, dict):
            why = "not a JSON object"
        elif isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            why = "its port %r is not a port number (1-65535)" % (port,)
        else:
            return plan, text
    raise HealthError("Cannot read the plan the unit runs, %s: %s. The launch stage writes it "
                      "(deploy.yml --tags relaunch, or --tags launch)." % (path, why))


# ------------------------------------------------------------------------------------------ asking the server
def http_request(method, url, body=None, headers=None, timeout=60.0):
    """One HTTP request, never through a proxy -> (status, text); status 0 when no HTTP answer came (text: why)."""
    hdrs = dict(headers or {})
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        hdrs["Content-Type"] = "application/json"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(url, data=data, headers=hdrs, method=method), timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode("utf-8", "replace")
    except urllib.error.URLError as err:
        return 0, str(err.reason)
    except (OSError, http.client.HTTPException) as err:
        return 0, "%s: %s" % (type(err).__name__, err)


def base_url(host, port):
    host = connect_host(host or "127.0.0.1")
    return "http://%s:%d" % ("[%s]" % host if ":" in host else host, port)


def _short(text, limit=300):
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _answer(status, text):
    """How a response reads in a message: 'answered 503: <body>' or 'got no answer (<why>)'."""
    if status == 0:
        return "got no answer (%s)" % _short(text)
    return "answered %s%s" % (status, ": " + _short(text) if text.strip() else " with an empty body")


def _json(text):
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def verify(plan, http=http_request, api_key="", ready_timeout=30.0, http_timeout=60.0,
           prompt="The capital of France is", max_new_tokens=8, poll_s=0.5, clock=time.monotonic, sleep=time.sleep):
    """Ask a ready server whether it really serves the plan: /health until 200 (it answers 503 for a moment after
    its port opened; up to ready_timeout s), /model_info names the plan's model, one /generate returns tokens.
    The API key, when set, goes as a Bearer token to /model_info and /generate (/health needs none).
    Returns {url, health_s, generated_tokens, generated_text}; raises HealthError saying what failed."""
    url = base_url(plan.get("host"), plan["port"])
    started = clock()
    deadline = started + ready_timeout
    tries = 0
    while True:
        status, text = http("GET", url + "/health", timeout=http_timeout)
        tries += 1
        if status == 200:
            break
        if clock() >= deadline:
            raise HealthError("GET %s/health did not answer 200 within %s s after the server's ready line "
                              "(%d tries; the last one %s)" % (url, ready_timeout, tries, _answer(status, text)))
        sleep(poll_s)
    health_s = round(clock() - started, 1)
    if health_nodes.is_worker(plan):    # SGLang's health check server of a node >= 1: nothing else to ask
        return {"url": url, "health_s": health_s, "worker": True}
    headers = {"Authorization": "Bearer " + api_key} if api_key else {}
    key_hint = " (the server wants an API key: set topolaunch_api_key)" if not api_key else \
        " (the server refused our API key: check topolaunch_api_key)"

    status, text = http("GET", url + "/model_info", headers=headers, timeout=http_timeout)
    if status != 200:
        raise HealthError("GET %s/model_info %s%s" % (url, _answer(status, text), key_hint if status == 401 else ""))
    served = _json(text).get("model_path")
    ours = [name for name in (plan.get("model_path"), plan.get("served_model_name")) if name]
    if served not in ours:
        raise HealthError("The server on port %s serves %s, not %s: is another server on this port?"
                          % (plan["port"], served or "?", plan.get("model_path") or "?"))

    body = {"text": prompt, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}
    status, text = http("POST", url + "/generate", body=body, headers=headers, timeout=http_timeout)
    if status != 200:
        raise HealthError("POST %s/generate %s%s" % (url, _answer(status, text), key_hint if status == 401 else ""))
    answer = _json(text)
    meta = answer.get("meta_info") if isinstance(answer.get("meta_info"), dict) else {}
    tokens = meta.get("completion_tokens")
    if not isinstance(answer.get("text"), str) or isinstance(tokens, bool) or not isinstance(tokens, int) \
            or tokens <= 0:
        raise HealthError("/generate returned no tokens: %s" % (_short(text) or "(empty body)"))
    return {"url": url, "health_s": health_s, "generated_tokens": tokens, "generated_text": answer["text"]}


# ------------------------------------------------------------------------------------------ last known good
def record_last_good(text, path, check_mode=False, owner=(0, 0)):
    """Write `text` (the plan file's content) to `path`, mode 0644 and `owner` (root in production), unless it is
    there already; True when changed (in check mode: would change; nothing is written)."""
    if not file_differs(path, text, 0o644, owner):
        return False
    if not check_mode:
        try:
            write_atomic(path, text, 0o644, owner)
        except OSError as err:
            raise HealthError("The server is healthy but recording it as the last known good plan failed: %s: %s"
                              % (path, err.strerror or err)) from None
    return True


# ------------------------------------------------------------------------------------------ the module
def read_last_good(path):
    """The last known good plan ({} when there is none, or it cannot be read: then there is nothing to go back to)."""
    try:
        with open(path, encoding="utf-8") as f:
            plan = json.load(f)
    except (OSError, ValueError):
        return {}
    return plan if isinstance(plan, dict) else {}


def check(unit, plan_path, last_good_path, invocation_id=None, known="started", chunk_s=20.0, startup_timeout=0,
          journal_lines=50, verify_server=False, check_mode=False, api_key="", ready_timeout=30.0, http_timeout=60.0,
          prompt="The capital of France is", max_new_tokens=8, owner=(0, 0), run=_run, http=http_request,
          clock=time.monotonic, sleep=time.sleep, mode="start", record=True, proc_root="/proc"):
    """One call of sglang_health.

    mode start: read the plan, wait one chunk; when ready and verify_server, verify the server (and on a server
    across nodes, this node's rank processes) and, with `record`, record the plan as last known good (mode 0644,
    `owner`). Returns the wait's result plus plan, already_serving (the first look of a new wait found it serving:
    since_start_s is its uptime) and, verified: verified, last_good_changed, url, health_s, generated_tokens,
    generated_text (a worker node: url, health_s, worker). Without `record` every result also carries the last
    known good plan (last_good_plan, last_good_differs), as failures do: the nodes of one server record only once
    every node passed (mode record), and roll back together when one did not.
    mode serving: one look; the server must be ready, answer /health 200 and run the last known good plan. Nothing
    is written.
    mode record: record the plan the unit runs as the last known good one, and nothing else.
    A HealthError carries the plan in its result once it was read, and the last known good plan."""
    plan, text = read_plan(plan_path)
    try:
        if mode == "serving":
            return _serving(unit, plan, last_good_path, http, http_timeout, run, clock, sleep)
        if mode == "record":
            return {"state": "recorded", "plan": plan,
                    "last_good_changed": record_last_good(text, last_good_path, check_mode=check_mode, owner=owner)}
        result = wait_chunk(unit, plan.get("host") or "127.0.0.1", plan["port"], invocation_id=invocation_id,
                            known=known, chunk_s=chunk_s, startup_timeout=startup_timeout,
                            journal_lines=journal_lines, run=run, clock=clock, sleep=sleep,
                            version=plan.get("sglang_version"),
                            table=health_nodes.milestones(plan, milestones(plan.get("sglang_version"))))
        result["plan"] = plan
        result["already_serving"] = (invocation_id is None and known == "started" and result["state"] == "ready"
                                     and result["looks"] == 1)
        if result["state"] == "ready" and verify_server:
            result.update(verify(plan, http=http, api_key=api_key, ready_timeout=ready_timeout,
                                 http_timeout=http_timeout, prompt=prompt, max_new_tokens=max_new_tokens,
                                 clock=clock, sleep=sleep))
            problem = health_nodes.rank_problem(unit, plan, proc_root)
            if problem:
                raise HealthError(problem, dict(result, state="ranks"))
            result["last_good_changed"] = (record_last_good(text, last_good_path, check_mode=check_mode, owner=owner)
                                           if record else False)
            result["verified"] = True
        if not record:
            result.update(_last_good(last_good_path, plan))
        return result
    except HealthError as exc:
        exc.result.update(plan=plan, **_last_good(last_good_path, plan))
        raise


def _last_good(last_good_path, plan):
    """{last_good_plan, last_good_differs}: what a rollback from `plan` would go back to."""
    last_good = read_last_good(last_good_path)
    return {"last_good_plan": last_good,
            "last_good_differs": bool(last_good) and server_view(last_good) != server_view(plan)}


def _serving(unit, plan, last_good_path, http, http_timeout, run, clock, sleep):
    """Mode serving: ready now, /health 200 now, and health passed for this very server."""
    try:
        result = wait_chunk(unit, plan.get("host") or "127.0.0.1", plan["port"], chunk_s=0, run=run, clock=clock,
                            sleep=sleep, version=plan.get("sglang_version"))
    except HealthError as exc:
        raise HealthError("The server is not serving: %s" % exc, exc.result) from None
    if result["state"] != "ready":
        raise HealthError("The server is not serving yet: %s is at '%s' (port %s %s). Run deploy.yml --tags health."
                          % (unit, result["label"], plan["port"], "open" if result["port_open"] else "closed"), result)
    url = base_url(plan.get("host"), plan["port"])
    status, answer = http("GET", url + "/health", timeout=http_timeout)
    if status != 200:
        raise HealthError("GET %s/health %s, not 200: the server is starting, draining or unhealthy. Run "
                          "deploy.yml --tags relaunch (or health)." % (url, _answer(status, answer)), result)
    last_good = read_last_good(last_good_path)
    if server_view(last_good) != server_view(plan):
        raise HealthError("Health has not passed for the plan this server runs: it runs layout %s (current_plan.json) "
                          "but health last passed for %s (last_good_plan.json). Run deploy.yml --tags health first."
                          % (plan.get("layout", {}).get("name", "?"),
                             "layout " + last_good.get("layout", {}).get("name", "?") if last_good else "no plan"),
                          result)
    result.update(plan=plan, url=url)
    return result
