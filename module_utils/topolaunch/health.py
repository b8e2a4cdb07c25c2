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
200, /model_info names our model, one /generate returns tokens, the answer probe passes (`answer_probe`: a question
whose answer is known, greedy; a plain function a watchdog can call too); then it records the plan as last known
good.
Every failure carries the plan in its result when it was read, so the caller knows which plan failed, and the last
known good plan with whether it runs another server (`last_good_plan`, `last_good_differs`): what a rollback needs,
without reading files back. Mode `serving` (the bench stage's question "does the server serve the plan health
passed for, now?") looks once: ready, /health 200, and the plan it runs is the last known good one.

Plain stdlib; commands go through `run(argv) -> (rc, out, err)`, HTTP through
`http(method, url, body=None, headers=None, timeout=60) -> (status, text)` (status 0: no HTTP answer, text says why).
"""
import http.client
import json
import os
import random
import re
import signal
import socket
import time
import urllib.error
import urllib.request

from . import health_nodes
from .constants import base_version, server_view
from .system import file_differs, journal, run as _run, show, write_atomic
from .text import shown

__all__ = ["HealthError", "MILESTONES", "milestones", "milestone", "milestone_pattern", "label", "error_lines",
           "port_open", "wait_chunk", "read_plan", "read_last_good", "last_good_record", "last_good_facts", "http_request", "verify",
           "record_last_good", "check",
           "probe_settings", "chat_template_source", "answer_probe"]

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
    """The furthest milestone key (in the table's order: a start reaches them in turn) that a log line shows (of that
    SGLang version, or of `table`), or 'started'. The furthest, not the last line's: ranks log the same milestones
    at their own pace, and journalctl --grep -n prints its matches newest first (systemd 252)."""
    table = table or milestones(version)
    reached = -1
    for line in lines:
        for i, (_key, words) in enumerate(table):
            if i > reached and words in line:
                reached = i
    return table[reached][0] if reached >= 0 else "started"


def milestone_pattern(table):
    """The regular expression of a milestone table's log lines (journalctl --grep)."""
    return "|".join(re.escape(words) for _key, words in table)


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
        # The milestones alone: a busy server logs a line per batch, and its start's lines would soon be older
        # than any last-N window (a deploy or a bench on a server up for hours read "started (no milestone yet)")
        reached = milestone(journal(unit, 400, run, HealthError, invocation_id, grep=milestone_pattern(table)),
                            table=table)
        result = {"milestone": reached, "label": labels[reached], "invocation_id": invocation_id,
                  "active_state": state.get("ActiveState"), "port_open": False,
                  "since_start_s": _since_start(state, clock), "looks": looks}
        why = _dead_reason(state, invocation_id)
        if why:
            lines = journal(unit, 400, run, HealthError, invocation_id)
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
            lines = journal(unit, 400, run, HealthError, invocation_id)
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


# ------------------------------------------------------------------------------------------ the answer probe
# "Tokens came out" passes a server that answers garbage (a KV cache dtype or a kernel the GPU mishandles garbles
# output, or emits one token and stops). The answer probe asks a question whose answer is known, greedily
# (temperature 0): an instruct model is asked to repeat a random 8-digit number, and its answer must contain it.
# Plain functions, no Ansible: the health stage calls answer_probe() after every launch, a watchdog may call it as
# it is (answer_probe(plan) with the default settings).
PROBE_MODES = ("auto", "on", "off")
PROBE_ENDPOINTS = ("auto", "chat", "generate")
PROBE_KEYS = ("mode", "prompt", "expect", "endpoint", "max_tokens")
PROBE_NUMBER = "{number}"           # in a prompt or an expected answer: the probe's random 8-digit number
PROBE_PROMPTS = {
    # an instruct model, through its chat template
    "chat": "Repeat this number exactly, digits only, and say nothing else: {number}",
    # a base model (mode on), a text to continue
    "generate": "Repeat the number {number}.\nThe number is",
}
PROBE_MAX_TOKENS = 64
PROBE_MAX_TOKENS_LIMIT = 4096
PROBE_PATHS = {"chat": "/v1/chat/completions", "generate": "/generate"}
_BOOL_WORDS = {"true": "on", "yes": "on", "on": "on", "false": "off", "no": "off", "off": "off", "auto": "auto"}
# Where Hugging Face transformers (and so SGLang, which asks the processor first, then the tokenizer:
# 523:sglang/srt/parser/template_manager.py _resolve_hf_chat_template) finds a model's chat template: the key
# chat_template of these JSON files, a chat_template.jinja, named templates in chat_templates/*.jinja.
TEMPLATE_JSON = ("processor_config.json", "chat_template.json", "tokenizer_config.json")
TEMPLATE_FILE = "chat_template.jinja"
TEMPLATE_DIR = "chat_templates"
# Digit groups an answer may write the number with ("48,213,077", "48 213 077"): not a wrong answer.
_DIGIT_GROUPS = re.compile(r"(?<=\d)[,_' \u2009\u202f](?=\d)")


def _mode(value, field):
    if isinstance(value, bool):
        return "on" if value else "off"
    word = _BOOL_WORDS.get(str(value).strip().lower()) if isinstance(value, str) else None
    if word is None:
        raise ValueError("%s: %r is not auto, on, off (true, false) or a mapping {prompt, expect}" % (field, value))
    return word


def _text(value, field):
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError("%s: %r is not a text" % (field, value))
    return value if value.strip() else ""


def probe_settings(value, field="answer_probe"):
    """The answer probe's settings {mode, prompt, expect, endpoint, max_tokens} from what a user wrote: auto (the
    default: instruct models only), on (every model; a base model through /generate), off, a boolean, or a mapping
    of those keys (a prompt makes the mode on unless it says otherwise). `{number}` in prompt and expect is the
    probe's random number. Raises ValueError with one line naming the field: a prompt without expect (nothing to
    check), expect without a prompt, an unknown key, a bad mode, endpoint or max_tokens."""
    if value is None or value == "":
        value = "auto"
    if not isinstance(value, dict):
        return {"mode": _mode(value, field), "prompt": "", "expect": "", "endpoint": "auto",
                "max_tokens": PROBE_MAX_TOKENS}
    unknown = sorted(str(k) for k in value if k not in PROBE_KEYS)
    if unknown:
        raise ValueError("%s.%s: unknown key (the keys are %s)" % (field, unknown[0], ", ".join(PROBE_KEYS)))
    prompt = _text(value.get("prompt"), field + ".prompt")
    expect = _text(value.get("expect"), field + ".expect")
    if prompt and not expect:
        raise ValueError("%s.expect: missing: a probe with a prompt needs the text its answer must contain "
                         "(expect; {number} is the probe's random number)" % field)
    if expect and not prompt:
        raise ValueError("%s.prompt: missing: expect %r needs the prompt it is the answer to" % (field, expect))
    mode = value.get("mode")
    mode = _mode(mode, field + ".mode") if mode not in (None, "") else ("on" if prompt else "auto")
    endpoint = value.get("endpoint") or "auto"
    if endpoint not in PROBE_ENDPOINTS:
        raise ValueError("%s.endpoint: %r is not one of %s" % (field, endpoint, ", ".join(PROBE_ENDPOINTS)))
    tokens = value.get("max_tokens")
    tokens = PROBE_MAX_TOKENS if tokens in (None, "") else tokens
    if isinstance(tokens, str) and tokens.strip().isdigit():
        tokens = int(tokens)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or not 0 < tokens <= PROBE_MAX_TOKENS_LIMIT:
        raise ValueError("%s.max_tokens: %r is not a number of tokens from 1 to %d"
                         % (field, tokens, PROBE_MAX_TOKENS_LIMIT))
    return {"mode": mode, "prompt": prompt, "expect": expect, "endpoint": endpoint, "max_tokens": tokens}


def _flag(argv, name):
    """The value of `name` in a command line (`--name value` or `--name=value`), or ''."""
    argv = [str(a) for a in argv or []]
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg[len(name) + 1:]
    return ""


def _json_template(path):
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and bool(data.get("chat_template"))


def chat_template_source(plan):
    """Where the server of `plan` gets its chat template, as SGLang decides (its --chat-template, else the Hugging
    Face template of the tokenizer directory: --tokenizer-path, else the model directory), or None: a base model.
    SGLang's guess from the model path's name is not followed (a name says nothing certain)."""
    argv = plan.get("argv") or []
    explicit = _flag(argv, "--chat-template")
    if explicit:
        return "--chat-template " + explicit
    directory = _flag(argv, "--tokenizer-path") or plan.get("model_path") or _flag(argv, "--model-path")
    if not directory:
        return None
    for name in TEMPLATE_JSON:
        path = os.path.join(directory, name)
        if _json_template(path):
            return path + " (chat_template)"
    try:
        path = os.path.join(directory, TEMPLATE_FILE)
        if os.path.isfile(path) and os.path.getsize(path) > 0:
            return path
        path = os.path.join(directory, TEMPLATE_DIR)
        if os.path.isdir(path) and any(n.endswith(".jinja") for n in os.listdir(path)):
            return path
    except OSError:         # unreadable: no template found (SGLang would not read one either)
        pass
    return None


def _template_places(plan):
    directory = _flag(plan.get("argv") or [], "--tokenizer-path") or plan.get("model_path") or "?"
    return "no --chat-template, no chat_template in %s's %s, no %s or %s/" % (
        directory, ", ".join(TEMPLATE_JSON), TEMPLATE_FILE, TEMPLATE_DIR)


def _probe_answer(endpoint, data):
    """(answer text, finish reason, completion tokens) of a chat completion or a /generate answer, or None."""
    if endpoint == "chat":
        choices = data.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
        parts = [message.get(k) for k in ("reasoning_content", "content") if isinstance(message.get(k), str)]
        if not choice or not isinstance(message, dict) or ("content" not in message and not parts):
            return None
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        return "\n".join(parts), choice.get("finish_reason"), usage.get("completion_tokens")
    if not isinstance(data.get("text"), str):
        return None
    meta = data.get("meta_info") if isinstance(data.get("meta_info"), dict) else {}
    finish = meta.get("finish_reason")
    return data["text"], finish.get("type") if isinstance(finish, dict) else finish, meta.get("completion_tokens")


def answer_probe(plan, settings=None, http=http_request, api_key="", timeout=60.0, rng=None):
    """Ask the server of `plan` (host, port, model_path, argv, served_model_name) a question whose answer is known,
    with greedy decoding. `settings`: what probe_settings() accepts (default auto). An instruct model (a chat template,
    chat_template_source) is asked through /v1/chat/completions (thinking off: enable_thinking and thinking false in
    chat_template_kwargs), a base model through /generate (mode on or endpoint generate; mode auto skips it).
    Returns {state: passed or skipped, summary, ...: endpoint, number, prompt, expect, answer, finish_reason,
    completion_tokens when asked; why when skipped}. Raises HealthError when the answer lacks what it must contain
    (naming the number and what came back, shortened, control characters escaped) or the request failed; its result
    has answer_probe, what was asked and answered. No Ansible: a watchdog calls it as it is."""
    settings = probe_settings(settings)
    if settings["mode"] == "off":
        return {"state": "skipped", "why": "the answer probe is off",
                "summary": "the answer probe is off"}
    template = chat_template_source(plan)
    if settings["mode"] == "auto" and not template:
        why = "a base model (%s)" % _template_places(plan)
        return {"state": "skipped", "why": why, "summary": "the answer probe was skipped: " + why}
    endpoint = settings["endpoint"] if settings["endpoint"] != "auto" else ("chat" if template else "generate")
    number = "%d" % (rng or random.SystemRandom()).randrange(10 ** 7, 10 ** 8)
    prompt = (settings["prompt"] or PROBE_PROMPTS[endpoint]).replace(PROBE_NUMBER, number)
    expect = (settings["expect"] or PROBE_NUMBER).replace(PROBE_NUMBER, number)
    tokens = settings["max_tokens"]
    if endpoint == "chat":
        body = {"messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": tokens,
                "chat_template_kwargs": {"enable_thinking": False, "thinking": False}}
        if plan.get("served_model_name"):
            body["model"] = plan["served_model_name"]
    else:
        body = {"text": prompt, "sampling_params": {"max_new_tokens": tokens, "temperature": 0}}
    url = base_url(plan.get("host"), plan["port"]) + PROBE_PATHS[endpoint]
    asked = ("asked to repeat %s" % number if not settings["prompt"] else
             "asked %s, expecting %s" % (shown(prompt, 120), shown(expect, 60)))
    how = "POST %s, temperature 0, at most %d tokens" % (url, tokens)
    result = {"endpoint": PROBE_PATHS[endpoint], "number": number, "prompt": prompt, "expect": expect}
    headers = {"Authorization": "Bearer " + api_key} if api_key else {}
    status, text = http("POST", url, body=body, headers=headers, timeout=timeout)
    if status != 200:
        why = _answer(status, text) + _key_hint(status, api_key)
        raise HealthError("The answer probe (%s; %s) %s" % (asked, how, why),
                          {"answer_probe": dict(result, state="failed")})
    parsed = _probe_answer(endpoint, _json(text))
    if parsed is None:
        raise HealthError("The answer probe (%s; %s) got no answer in SGLang's shape: %s"
                          % (asked, how, _short(text) or "(empty body)"),
                          {"answer_probe": dict(result, state="failed")})
    answer, finish, completion = parsed
    result.update(answer=answer, finish_reason=finish, completion_tokens=completion)
    said = "%s (%s tokens, finish reason %s)" % (shown(answer, 160), completion if completion is not None else "?",
                                                 finish or "?")
    wanted = expect.casefold()
    if wanted not in answer.casefold() and wanted not in _DIGIT_GROUPS.sub("", answer).casefold():
        raise HealthError(
            "The answer probe failed: %s (%s), the server answered %s, without %s. A server that answers wrongly "
            "does not serve: a setting it runs with garbles its output (a KV cache dtype or a kernel the GPU "
            "mishandles, for one)." % (asked, how, said, shown(expect, 60)),
            {"answer_probe": dict(result, state="failed")})
    summary = "the answer probe passed (%s through %s: %s)" % (asked, PROBE_PATHS[endpoint], shown(answer, 80))
    return dict(result, state="passed", summary=summary)


def _key_hint(status, api_key):
    if status != 401:
        return ""
    return (" (the server refused our API key: check topolaunch_api_key)" if api_key else
            " (the server wants an API key: set topolaunch_api_key)")


def verify(plan, http=http_request, api_key="", ready_timeout=30.0, http_timeout=60.0,
           prompt="The capital of France is", max_new_tokens=8, poll_s=0.5, clock=time.monotonic, sleep=time.sleep,
           probe=None, rng=None):
    """Ask a ready server whether it really serves the plan: /health until 200 (it answers 503 for a moment after
    its port opened; up to ready_timeout s), /model_info names the plan's model, one /generate returns tokens, and
    with `probe` (probe_settings) the answer probe passes (answer_probe; `rng` draws its number).
    The API key, when set, goes as a Bearer token to /model_info, /generate and the probe (/health needs none).
    Returns {url, health_s, generated_tokens, generated_text, answer_probe (with probe)}; raises HealthError saying
    what failed."""
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

    status, text = http("GET", url + "/model_info", headers=headers, timeout=http_timeout)
    if status != 200:
        raise HealthError("GET %s/model_info %s%s" % (url, _answer(status, text), _key_hint(status, api_key)))
    served = _json(text).get("model_path")
    ours = [name for name in (plan.get("model_path"), plan.get("served_model_name")) if name]
    if served not in ours:
        raise HealthError("The server on port %s serves %s, not %s: is another server on this port?"
                          % (plan["port"], served or "?", plan.get("model_path") or "?"))

    body = {"text": prompt, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}
    status, text = http("POST", url + "/generate", body=body, headers=headers, timeout=http_timeout)
    if status != 200:
        raise HealthError("POST %s/generate %s%s" % (url, _answer(status, text), _key_hint(status, api_key)))
    answer = _json(text)
    meta = answer.get("meta_info") if isinstance(answer.get("meta_info"), dict) else {}
    tokens = meta.get("completion_tokens")
    if not isinstance(answer.get("text"), str) or isinstance(tokens, bool) or not isinstance(tokens, int) \
            or tokens <= 0:
        raise HealthError("/generate returned no tokens: %s" % (_short(text) or "(empty body)"))
    result = {"url": url, "health_s": health_s, "generated_tokens": tokens, "generated_text": answer["text"]}
    if probe is not None:
        try:
            result["answer_probe"] = answer_probe(plan, probe, http=http, api_key=api_key, timeout=http_timeout,
                                                  rng=rng)
        except HealthError as exc:
            exc.result.update(result, state="answer")
            raise
    return result


# ------------------------------------------------------------------------------------------ last known good
def record_last_good(text, path, check_mode=False, owner=(0, 0), warnings=None):
    """Write `text` (the plan file's content) to `path`, mode 0644 and `owner` (root in production), unless it is
    there already; True when changed (in check mode: would change; nothing is written). A write that fails (a full
    disk: issue 25) never costs the healthy server it records: with `warnings` (a list) it says so there and returns
    False; without, HealthError."""
    if not file_differs(path, text, 0o644, owner):
        return False
    if not check_mode:
        try:
            write_atomic(path, text, 0o644, owner)
        except OSError as err:
            why = ("The server is healthy, but recording it as the last known good plan failed: %s: %s"
                   % (path, err.strerror or err))
            if warnings is None:
                raise HealthError(why) from None
            warnings.append(why + ". It keeps running; a later rollback goes back to the plan recorded before. "
                            "Free space there, then run deploy.yml --tags health to record it.")
            return False
    return True


# ------------------------------------------------------------------------------------------ the module
def last_good_record(path):
    """(the last known good plan, why it cannot be read): ({}, None) when there is none; ({}, a line naming the
    file) when it is unreadable or no JSON object (then there is nothing to go back to, and the user is told why)."""
    try:
        with open(path, encoding="utf-8") as f:
            plan = json.load(f)
    except FileNotFoundError:
        return {}, None
    except (OSError, ValueError) as exc:
        return {}, "the last known good plan %s cannot be read (%s): remove it, or run deploy.yml --tags health " \
                   "once a server serves, which writes it again" % (path, exc)
    if not isinstance(plan, dict):
        return {}, "the last known good plan %s is not a JSON object: remove it, or run deploy.yml --tags health " \
                   "once a server serves, which writes it again" % path
    return plan, None


def read_last_good(path):
    """The last known good plan ({} when there is none, or it cannot be read: then there is nothing to go back to)."""
    return last_good_record(path)[0]


def last_good_facts(path, plan):
    """{last_good_plan, last_good_differs} and, when the record is unreadable, last_good_problem (naming the file):
    what a rollback from `plan` would go back to."""
    last_good, problem = last_good_record(path)
    out = {"last_good_plan": last_good,
           "last_good_differs": bool(last_good) and server_view(last_good) != server_view(plan)}
    if problem:
        out["last_good_problem"] = problem
    return out


def check(unit, plan_path, last_good_path, invocation_id=None, known="started", chunk_s=20.0, startup_timeout=0,
          journal_lines=50, verify_server=False, check_mode=False, api_key="", ready_timeout=30.0, http_timeout=60.0,
          prompt="The capital of France is", max_new_tokens=8, owner=(0, 0), run=_run, http=http_request,
          clock=time.monotonic, sleep=time.sleep, mode="start", record=True, proc_root="/proc", probe=None,
          rng=None, sysfs_root="/sys"):
    """One call of sglang_health.

    mode start: read the plan, wait one chunk; when ready and verify_server, verify the server (and on a server
    across nodes, this node's rank processes) and, with `record`, record the plan as last known good (mode 0644,
    `owner`). Returns the wait's result plus plan, already_serving (the first look of a new wait found it serving:
    since_start_s is its uptime) and, verified: verified, last_good_changed, url, health_s, generated_tokens,
    generated_text, answer_probe (with `probe`, the answer probe's settings: its result; a worker node: url,
    health_s, worker), numa_bind (with --numa-node in the plan: one line per scheduler, its binding checked by
    numa_bind.check; a binding other than the plan's fails, state numa). A wrong answer fails like any unhealthy
    server (state answer). Without `record` every result
    also carries the last known good plan (last_good_plan, last_good_differs), as failures do: the nodes of one
    server record only once every node passed (mode record), and roll back together when one did not.
    mode serving: one look; the server must be ready, answer /health 200 and run the last known good plan. Nothing
    is written.
    mode record: record the plan the unit runs as the last known good one, and nothing else.
    A HealthError carries the plan in its result once it was read, and the last known good plan."""
    plan, text = read_plan(plan_path)
    try:
        if mode == "serving":
            return _serving(unit, plan, last_good_path, http, http_timeout, run, clock, sleep)
        if mode == "record":
            warnings = []
            changed = record_last_good(text, last_good_path, check_mode=check_mode, owner=owner, warnings=warnings)
            return dict({"state": "recorded", "plan": plan, "last_good_changed": changed},
                        **({"warnings": warnings} if warnings else {}))
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
                                 clock=clock, sleep=sleep, probe=probe, rng=rng))
            problem = health_nodes.rank_problem(unit, plan, proc_root)
            if problem:
                raise HealthError(problem, dict(result, state="ranks"))
            # imported here: the watchdog's package (watchdog_install) carries this module for the answer probe
            # only, without the planner modules numa_bind needs (plan_nodes)
            from . import numa_bind  # pylint: disable=import-outside-toplevel
            bound, unbound = numa_bind.check(plan, health_nodes.unit_schedulers(unit, proc_root, pids=True),
                                             proc_root, sysfs_root) if numa_bind.planned(plan) else ([], [])
            if unbound:
                raise HealthError("The NUMA binding is not the plan's: %s" % "; ".join(unbound),
                                  dict(result, state="numa", numa_bind=bound + unbound))
            if bound:
                result["numa_bind"] = bound
            warnings = []
            result["last_good_changed"] = (record_last_good(text, last_good_path, check_mode=check_mode, owner=owner,
                                                            warnings=warnings) if record else False)
            if warnings:
                result["warnings"] = warnings
            result["verified"] = True
        if not record:
            result.update(last_good_facts(last_good_path, plan))
        return result
    except HealthError as exc:
        exc.result.update(plan=plan, **last_good_facts(last_good_path, plan))
        raise


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
    last_good, problem = last_good_record(last_good_path)
    if server_view(last_good) != server_view(plan):
        raise HealthError("Health has not passed for the plan this server runs: it runs layout %s (current_plan.json) "
                          "but %s. Run deploy.yml --tags health first."
                          % (plan.get("layout", {}).get("name", "?"), problem or "health last passed for %s "
                             "(last_good_plan.json)" % ("layout " + last_good.get("layout", {}).get("name", "?")
                                                        if last_good else "no plan")),
                          result)
    result.update(plan=plan, url=url)
    return result
