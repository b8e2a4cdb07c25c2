"""SGLang's HTTP API over the simulated engine (stdlib http.server, one thread per connection), as the release
in sglang.version serves it (0.5.9's or 0.5.23's answers where they differ; docs/sglang-versions.md).

Routes, status codes and bodies follow sglang/srt/entrypoints/http_server.py: /health and /health_generate
answer 503 while starting or draining and otherwise wait for any engine output after a 1-token health request
(polling every SGLANG_SIM_HEALTH_POLL_SECONDS, 1 s as SGLang), --api-key guards everything but /health* and
/metrics*, unknown paths 404 {"detail": "Not Found"}, bad requests 400.
"""
import datetime
import http
import http.server
import json
import logging
import os
import socket
import threading
import time
import urllib.parse
import uuid

from sglang._sim import answers, logutil, release
from sglang._sim.engine import GenRequest

logger = logging.getLogger("sglang.srt.entrypoints.http_server")
INTERNAL_HEADER = "X-SGLang-Sim-Internal"


class BadRequest(Exception):
    pass


class State:
    """What the handlers share: the launcher fills it in."""

    def __init__(self, server_args, model, engine, scheduler_info, perf_description, time_scale):
        self.args = server_args
        self.model = model
        self.engine = engine
        self.scheduler_info = scheduler_info
        self.perf_description = perf_description
        self.time_scale = time_scale
        self.status = "starting"  # starting | up | unhealthy
        self.draining = False
        self.context_len = server_args.context_length or model.context_len
        self.health_poll = float(os.environ.get("SGLANG_SIM_HEALTH_POLL_SECONDS", "1"))
        self.health_timeout = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
        self.health_generates = os.environ.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "true").lower() in (
            "1", "true")
        self.started = time.time()
        self.generation_requests = 0
        self.lock = threading.Lock()
        self.after_generation = None  # callback(count) once a user generation request is answered
        self.startup_time = None  # 0.5.23 /server_info: the ranks' start-up durations
        self.answers = answers.Answers(model.path)  # what the model says (the launcher sets garbage_output)
        self.recorder = None  # metrics.Recorder with --enable-metrics


def count_tokens(text):
    """The simulator's tokenizer: one token per whitespace-separated word."""
    return max(1, len(text.split())) if text else 0


def chat_text(messages):
    """What the model reads of a chat: the messages' texts, one per line."""
    texts = []
    for message in messages or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        texts.append(str(content or ""))
    return "\n".join(texts)


def chat_prompt_tokens(messages):
    total = 3
    for message in messages or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        total += 4 + count_tokens(str(content or ""))
    return total


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, format, *args):  # noqa: A002 - http.server's signature; access lines are ours
        pass

    # ------------------------------------------------------------------ plumbing
    @property
    def state(self):
        return self.server.state

    def _headers(self, status, content_type, length=None, chunked=False):
        self.send_response_only(status)
        self.send_header("date", self.date_time_string())
        self.send_header("server", "uvicorn")
        self.send_header("content-type", content_type)
        if chunked:
            self.send_header("transfer-encoding", "chunked")
        else:
            self.send_header("content-length", str(length))
        self.end_headers()
        logutil.access(self.client_address, self.command, self.path, status, http.HTTPStatus(status).phrase)

    def send_bytes(self, status, body, content_type):
        self._headers(status, content_type, len(body))
        self.wfile.write(body)

    def send_json(self, status, obj):
        self.send_bytes(status, json.dumps(obj).encode(), "application/json")

    def send_empty(self, status):
        self.send_bytes(status, b"", "text/plain; charset=utf-8")

    def start_stream(self):
        self._headers(200, "text/event-stream; charset=utf-8", chunked=True)

    def chunk(self, data):
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def end_stream(self):
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def read_json(self):
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError as err:
            raise BadRequest("JSON decode error: %s" % err) from None
        if not isinstance(body, dict):
            raise BadRequest("Input should be a valid dictionary or object to extract fields from")
        return body

    def error_400(self, message):
        """FastAPI validation errors as SGLang's handler renders them."""
        self.send_json(400, {"object": "error", "message": message, "type": "Bad Request", "param": None,
                             "code": 400})

    def authorized(self, path):
        args = self.state.args
        if path.startswith(("/health", "/metrics")) or (path.startswith("/ready") and release.at_least("0.5.23")):
            return True  # open to probes (523:sglang/srt/utils/auth.py:101-106)
        admin = path in ("/flush_cache", "/freeze_gc")  # ADMIN_OPTIONAL: the admin key when set, else the API key
        key = args.admin_api_key if (admin and args.admin_api_key) else args.api_key
        if not key:
            return True
        header = self.headers.get("authorization") or ""
        scheme, _, token = header.partition(" ")
        return scheme.lower() == "bearer" and token == key

    # ------------------------------------------------------------------ dispatch
    def do_GET(self):
        self.dispatch("GET")

    def do_POST(self):
        self.dispatch("POST")

    def do_PUT(self):
        self.dispatch("PUT")

    def do_DELETE(self):
        self.dispatch("DELETE")

    def dispatch(self, method):
        path = self.path.split("?", 1)[0]
        route = ROUTES.get(path)
        if route is None and path.startswith("/v1/models/"):
            route = ROUTES["/v1/models/{model}"]
        if path in SINCE and not release.at_least(SINCE[path]):
            route = None
        try:
            if route is None:
                self.send_json(404, {"detail": "Not Found"})
                return
            methods, func = route
            if method not in methods:
                self.send_json(405, {"detail": "Method Not Allowed"})
                return
            if not self.authorized(path):
                self.send_json(401, {"error": "Unauthorized"})
                return
            func(self)
        except BadRequest as err:
            self.error_400(str(err))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # ------------------------------------------------------------------ native endpoints
    def health(self):
        st = self.state
        if st.draining:
            logger.info("Health check request received during shutdown. Returning 503.")
            self.send_empty(503)
            return
        if st.status == "starting":
            self.send_empty(503)
            return
        if not st.health_generates and self.path.split("?")[0] == "/health":
            self.send_empty(200)
            return
        tic = time.time()
        req = st.engine.submit(GenRequest("HEALTH_CHECK_%s" % tic, 1, 1, internal=True))
        while time.time() < tic + st.health_timeout:
            time.sleep(st.health_poll)  # SGLang polls once a second
            if st.engine.last_output > tic:
                st.engine.abort(req)
                st.status = "up"
                self.send_empty(200)
                return
        st.engine.abort(req)
        logger.error("Health check failed. Server couldn't get a response from detokenizer for last %s seconds. "
                     "tic start time: %s. last_heartbeat time: %s", int(st.health_timeout),
                     time.strftime("%H:%M:%S", time.localtime(tic)),
                     time.strftime("%H:%M:%S", time.localtime(st.engine.last_output)))
        st.status = "unhealthy"
        self.send_empty(503)

    def model_info(self):
        if self.path.startswith("/get_model_info"):
            logger.warning("Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
                           "Please use '/model_info' instead.")
        st = self.state
        self.send_json(200, {
            "model_path": st.args.model_path,
            **({"served_model_name": st.args.served_model_name} if release.at_least("0.5.23") else {}),
            "tokenizer_path": st.args.tokenizer_path,
            "is_generation": True,
            "preferred_sampling_params": st.args.preferred_sampling_params,
            "weight_version": st.args.weight_version,
            # 0.5.23 adds these (523:sglang/srt/entrypoints/http_server.py:812-850)
            **({key: st.args.get(key) for key in ("load_format", "reasoning_parser", "tool_call_parser",
                                                   "disaggregation_mode")} if release.at_least("0.5.23") else {}),
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": st.model.model_type,
            "architectures": st.model.architectures,
        })

    def server_info(self):
        """0.5.9: dataclasses.asdict(server_args) + scheduler_info + internal_states + version
        (59:sglang/srt/entrypoints/http_server.py:583-610). 0.5.23: the resolved fields + launch_command +
        scheduler_info + kv_events + startup_time + internal_states + version + frontend, only the watermark
        secrets redacted (523:http_server.py:853-895, 523:sglang/srt/utils/common.py:3584-3593): api_key and the
        launch command (a --config file's options included) come back in clear in both."""
        if self.path.startswith("/get_server_info"):
            logger.warning("Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
                           "Please use '/server_info' instead.")
        st = self.state
        args = st.args.as_dict()
        internal = dict(args)
        internal.update({
            "last_gen_throughput": st.engine.gen_throughput,
            "memory_usage": st.scheduler_info["memory_usage"],
            "effective_max_running_requests_per_dp": st.engine.max_running,
        })
        info = dict(args)
        if release.at_least("0.5.23"):
            info["launch_command"] = st.args.launch_command
        info.update({
            "status": "ready",
            "max_total_num_tokens": st.scheduler_info["max_total_num_tokens"],
            "max_req_input_len": st.scheduler_info["max_req_input_len"],
        })
        if release.at_least("0.5.23"):
            info.update({"kv_events": None, "startup_time": st.startup_time})
        info.update({"internal_states": [internal], "version": release.sim_version()})
        if release.at_least("0.5.23"):
            info["frontend"] = "python"
            for key in ("watermark_key", "watermark_key_b", "watermark_config"):
                if info.get(key) is not None:
                    info[key] = "<redacted>"
        info.update({
            "simulated": True,
            "simulation": {
                "time_scale": st.time_scale,
                "performance_model": st.perf_description,
                "model": st.model.summary(),
                "fault": os.environ.get("SGLANG_SIM_FAULT") or None,
            },
        })
        self.send_json(200, info)

    def ready(self):
        """0.5.23 /ready: 200 once the server is up and not shutting down, else 503 (523:http_server.py:713-718)."""
        st = self.state
        self.send_empty(200 if st.status == "up" and not st.draining else 503)

    def loads(self):
        """/v1/loads (both releases: sglang/srt/entrypoints/v1_loads.py): one LoadSnapshot per DP rank, the core
        fields always, the `queues` and `memory` sections when `include` asks (default all); an unknown section is
        SGLang's 400. The model gateway polls it for its load-aware policies."""
        st = self.state
        query = urllib.parse.parse_qs(self.path.partition("?")[2])
        include = {s.strip() for s in query.get("include", [""])[0].split(",") if s.strip()} or None
        valid = {"core", "memory", "spec", "lora", "disagg", "queues", "all"}
        if include is not None and not include <= valid:
            self.send_json(400, {"detail": "Invalid include sections: %s. Valid options: %s" % (
                include - valid, sorted(valid))})
            return
        running, waiting, used = st.engine.load()
        capacity = st.scheduler_info["max_total_num_tokens"]
        core = {"timestamp": time.time(), "dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": waiting,
                "num_waiting_uncached_tokens": 0, "num_used_tokens": used, "num_total_tokens": capacity,
                "num_active_tokens": used, "num_prealloc_ready_tokens": 0, "max_total_num_tokens": capacity,
                "max_running_requests": st.engine.max_running,
                "token_usage": round(used / float(capacity), 4) if capacity else 0.0,
                "gen_throughput": 0.0, "cache_hit_rate": 0.0, "utilization": 0.0,
                "total_prefill_uncached_tokens": 0, "total_prefill_busy_us": 0, "decode_moments": None}
        every = include is None or "all" in include
        if every or "queues" in (include or ()):
            core["queues"] = {"waiting": waiting, "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0}
        tp = int(getattr(st.args, "tp_size", 1) or 1) * int(getattr(st.args, "pp_size", 1) or 1)
        self.send_json(200, {"timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                             "version": release.sim_version(), "accelerator": None, "num_accelerators": tp,
                             "loads": [core]})

    def freeze_gc(self):
        """/freeze_gc (GET or POST, admin key optional): 0.5.23's warmup calls it (523:http_server.py:1254-1264)."""
        self.send_bytes(200, b"Garbage collection frozen.\n", "text/plain; charset=utf-8")

    def models(self):
        st = self.state
        card = {"id": st.args.served_model_name, "object": "model", "created": int(st.started),
                "owned_by": "sglang", "root": st.args.served_model_name, "parent": None,
                "max_model_len": st.context_len}
        if self.path.startswith("/v1/models/"):
            name = self.path[len("/v1/models/"):].split("?")[0]
            if name != st.args.served_model_name:
                self.send_json(404, {"error": {"message": "The model `%s` does not exist." % name,
                                               "type": "NotFoundError", "param": "model", "code": 404}})
                return
            self.send_json(200, card)
            return
        self.send_json(200, {"object": "list", "data": [card]})

    def flush_cache(self):
        running, waiting, _ = self.state.engine.load()
        ok = running == 0 and waiting == 0
        body = (b"Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
                b"requests, the operation will not be performed.)\n")
        self.send_bytes(200 if ok else 400, body, "text/plain; charset=utf-8")

    def metrics(self):
        st = self.state
        if st.recorder is None:
            self.send_json(404, {"detail": "Not Found"})
            return
        self.send_bytes(200, render_metrics(st).encode(), "text/plain; version=0.0.4; charset=utf-8")

    # ------------------------------------------------------------------ generation
    def _prompt(self, body):
        text, ids = body.get("text"), body.get("input_ids")
        if text is None and ids is None and body.get("input_embeds") is None:
            raise BadRequest("Either text, input_ids or input_embeds should be provided.")
        if isinstance(text, list) or (isinstance(ids, list) and ids and isinstance(ids[0], list)):
            raise BadRequest("the simulator serves one prompt per request (batched text/input_ids lists are not "
                             "simulated)")
        if ids is not None:
            return len(ids)
        return count_tokens(str(text))

    def _check_lengths(self, prompt_tokens, max_new):
        ctx = self.state.context_len
        if isinstance(max_new, bool) or not isinstance(max_new, int) or max_new < 0:
            raise ValueError("max_new_tokens must be at least 0, got %s." % (max_new,))
        if prompt_tokens >= ctx:
            raise ValueError("The input (%d tokens) is longer than the model's context length (%d tokens)."
                             % (prompt_tokens, ctx))
        if max_new + prompt_tokens >= ctx:
            raise ValueError(
                "Requested token count exceeds the model's maximum context length of %d tokens. You requested a "
                "total of %d tokens: %d tokens from the input messages and %d tokens for the completion. Please "
                "reduce the number of tokens in the input messages or the completion to fit within the limit."
                % (ctx, max_new + prompt_tokens, prompt_tokens, max_new))

    def _submit(self, rid, prompt_tokens, max_new, prompt=None, stream=False):
        internal = INTERNAL_HEADER in self.headers
        return self.state.engine.submit(self.state.answers.request(rid, prompt, prompt_tokens, max_new,
                                                                   internal=internal, stream=bool(stream)))

    def _events(self, req):
        """Yield (kind, n_done, t) until the end; abort the request if the client goes away."""
        while True:
            kind, done, t = req.events.get()
            # coalesce what piled up while the client was slow (SGLang streams what it has)
            while kind != "end" and not req.events.empty():
                kind, done, t = req.events.get_nowait()
            yield kind, done, t
            if kind == "end":
                return

    def _answered(self):
        if INTERNAL_HEADER in self.headers:
            return
        st = self.state
        with st.lock:
            st.generation_requests += 1
            count = st.generation_requests
        if st.after_generation:
            st.after_generation(count)

    def _meta(self, req, done, finished, t):
        meta = {"id": req.rid, "finish_reason": answers.finish_reason(req, done) if finished else None,
                "prompt_tokens": req.prompt_tokens, "weight_version": self.state.args.weight_version,
                "total_retractions": 0, "completion_tokens": done, "cached_tokens": 0}
        if finished:
            meta["e2e_latency"] = t - req.created
        return meta

    def generate(self):
        body = self.read_json()
        if release.at_least("0.5.23"):
            problem = contract_error(body)
            if problem is not None:
                self.send_json(400, {"error": problem})
                return
        prompt_tokens = self._prompt(body)
        params = body.get("sampling_params") or {}
        max_new = params.get("max_new_tokens", 128)
        try:
            self._check_lengths(prompt_tokens, max_new)
        except ValueError as err:
            logger.error("[http_server] Error: %s", err)
            self.send_json(400, {"error": {"message": str(err)}})
            return
        rid = str(body.get("rid") or uuid.uuid4().hex)
        text = body.get("text")
        req = self._submit(rid, prompt_tokens, max_new, text if isinstance(text, str) else None, body.get("stream"))
        try:
            if body.get("stream"):
                self.start_stream()
                for kind, done, t in self._events(req):
                    out = {"text": req.text(done), "output_ids": [req.token_id(i) for i in range(done)],
                           "meta_info": self._meta(req, done, kind == "end", t)}
                    self.chunk(b"data: " + json.dumps(out).encode() + b"\n\n")
                self.chunk(b"data: [DONE]\n\n")
                self.end_stream()
            else:
                for kind, done, t in self._events(req):
                    pass
                self.send_json(200, {"text": req.text(done), "output_ids": [req.token_id(i) for i in range(done)],
                                     "meta_info": self._meta(req, done, True, t)})
        except (BrokenPipeError, ConnectionResetError):
            self.state.engine.abort(req)
            raise
        self._answered()

    def _openai(self, chat):
        st = self.state
        if (self.headers.get("content-type") or "").split(";")[0].strip().lower() != "application/json":
            self.error_400("Unsupported Media Type: Only 'application/json' is allowed")
            return
        body = self.read_json()
        if chat:
            if not isinstance(body.get("messages"), list):
                raise BadRequest("Field required: messages")
            prompt_tokens = chat_prompt_tokens(body["messages"])
            prompt_text = chat_text(body["messages"])
            max_new = body.get("max_completion_tokens", body.get("max_tokens"))
            max_new = 128 if max_new is None else max_new
        else:
            prompt = body.get("prompt")
            if prompt is None:
                raise BadRequest("Field required: prompt")
            prompt_text = None
            if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
                prompt_tokens = len(prompt)
            elif isinstance(prompt, list):
                if len(prompt) != 1:
                    raise BadRequest("the simulator serves one prompt per request")
                prompt_text = str(prompt[0])
                prompt_tokens = count_tokens(prompt_text)
            else:
                prompt_text = str(prompt)
                prompt_tokens = count_tokens(prompt_text)
            max_new = body.get("max_tokens", 16)
        try:
            self._check_lengths(prompt_tokens, max_new)
        except ValueError as err:
            self.send_json(400, {"object": "error", "message": str(err), "type": "BadRequestError", "param": None,
                                 "code": 400})
            return
        rid = uuid.uuid4().hex
        req = self._submit(rid, prompt_tokens, max_new, prompt_text, body.get("stream"))
        created = int(time.time())
        kind_name = "chat.completion" if chat else "text_completion"
        model = body.get("model") or st.args.served_model_name
        usage_of = lambda done: {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + done,  # noqa: E731
                                 "completion_tokens": done, "prompt_tokens_details": None}
        try:
            if body.get("stream"):
                self.start_stream()
                sent = 0
                if chat:
                    first = {"role": "assistant", "content": ""}
                    self._sse({"id": rid, "object": "chat.completion.chunk", "created": created, "model": model,
                               "choices": [{"index": 0, "delta": first, "logprobs": None, "finish_reason": None}]})
                for kind, done, _ in self._events(req):
                    piece = req.text(done)[len(req.text(sent)):]
                    sent = done
                    finish = answers.finish_reason(req, done)["type"] if kind == "end" else None
                    if chat:
                        choice = {"index": 0, "delta": {"role": None, "content": piece}, "logprobs": None,
                                  "finish_reason": finish}
                        obj = "chat.completion.chunk"
                    else:
                        choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": finish}
                        obj = "text_completion"
                    self._sse({"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]})
                if (body.get("stream_options") or {}).get("include_usage"):
                    self._sse({"id": rid, "object": obj, "created": created, "model": model, "choices": [],
                               "usage": usage_of(sent)})
                self.chunk(b"data: [DONE]\n\n")
                self.end_stream()
            else:
                for kind, done, _ in self._events(req):
                    pass
                # SGLang's choice: finish_reason["type"], matched_stop its "matched" (59:/523:sglang/srt/
                # entrypoints/openai/serving_chat.py, serving_completions.py); content null when the text is empty
                finish = answers.finish_reason(req, done)
                if chat:
                    choice = {"index": 0, "message": {"role": "assistant", "content": req.text(done) or None,
                                                      "reasoning_content": None, "tool_calls": None},
                              "logprobs": None, "finish_reason": finish["type"], "matched_stop": finish.get("matched")}
                else:
                    choice = {"index": 0, "text": req.text(done), "logprobs": None, "finish_reason": finish["type"],
                              "matched_stop": finish.get("matched")}
                self.send_json(200, {"id": rid, "object": kind_name, "created": created, "model": model,
                                     "choices": [choice], "usage": usage_of(done)})
        except (BrokenPipeError, ConnectionResetError):
            st.engine.abort(req)
            raise
        self._answered()

    def _sse(self, obj):
        self.chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")

    def completions(self):
        self._openai(chat=False)

    def chat_completions(self):
        self._openai(chat=True)


def _unexpected(value):
    """serde's `Unexpected` display (523:sglang/api/v1/api_types.py:31-47)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean `%s`" % ("true" if value else "false")
    if isinstance(value, int):
        return "integer `%d`" % value
    if isinstance(value, float):
        return "floating point `%r`" % value
    if isinstance(value, str):
        return 'string "%s"' % value
    return "sequence" if isinstance(value, list) else "map" if isinstance(value, dict) else type(value).__name__


def contract_error(body):
    """0.5.23's JSON contract check of a /generate body, for the fields the lab's clients send: the schema's own
    text, answered as 400 {"error": ...} (523:sglang/entrypoints/api_contract.py, 523:sglang/api/v1/api_types.py:
    decode_GenerateRequest, decode_StringOrList, decode_TokenIdsOrList, decode_SamplingParams)."""
    def bad(value, expected):
        return "invalid type: %s, expected %s" % (_unexpected(value), expected)

    def is_int(value):
        return isinstance(value, int) and not isinstance(value, bool)

    for key in ("rid", "text"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, list):
            for item in value:
                if not isinstance(item, str):
                    return bad(item, "a string")
        elif not isinstance(value, str):
            return bad(value, "a value or an array of values for StringOrList")
    ids = body.get("input_ids")
    if ids is not None:
        if not isinstance(ids, list):
            return bad(ids, "a value or an array of values for TokenIdsOrList")
        flat = not ids or (isinstance(ids[0], (int, float)) and not isinstance(ids[0], bool))
        for row in [ids] if flat else ids:
            if not isinstance(row, list):
                return bad(row, "a sequence")
            for item in row:
                if not is_int(item):
                    return bad(item, "i64")
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        return bad(body["stream"], "a boolean")
    params = body.get("sampling_params")
    if params is not None:
        for one in params if isinstance(params, list) else [params]:
            if not isinstance(one, dict):
                return bad(one, "a value or an array of values for SamplingParamsOrList" if one is params else
                           "struct SamplingParams")
            if one.get("max_new_tokens") is not None and not is_int(one["max_new_tokens"]):
                return bad(one["max_new_tokens"], "i64")
    return None


ROUTES = {
    "/health": (("GET",), Handler.health),
    "/health_generate": (("GET",), Handler.health),
    "/model_info": (("GET",), Handler.model_info),
    "/get_model_info": (("GET",), Handler.model_info),
    "/server_info": (("GET",), Handler.server_info),
    "/get_server_info": (("GET",), Handler.server_info),
    "/v1/models": (("GET",), Handler.models),
    "/v1/models/{model}": (("GET",), Handler.models),
    "/flush_cache": (("GET", "POST"), Handler.flush_cache),
    "/freeze_gc": (("GET", "POST"), Handler.freeze_gc),
    "/ready": (("GET",), Handler.ready),
    "/metrics": (("GET",), Handler.metrics),
    "/v1/loads": (("GET",), Handler.loads),
    "/generate": (("POST", "PUT"), Handler.generate),
    "/v1/completions": (("POST",), Handler.completions),
    "/v1/chat/completions": (("POST",), Handler.chat_completions),
}


SINCE = {"/ready": "0.5.23"}  # routes a release added


def render_metrics(st):
    """GET /metrics: the lab's marker (a comment and sglang_sim_info), then SGLang's metrics (metrics.py)."""
    version = release.sim_version()
    lines = ["# SGLang simulator %s (lab): every value below is simulated." % version,
             "# HELP sglang_sim_info The server is the lab's SGLang simulator.",
             "# TYPE sglang_sim_info gauge",
             'sglang_sim_info{version="%s",model_name="%s"} 1' % (version, st.args.served_model_name)]
    return "\n".join(lines) + "\n" + st.recorder.render(st.engine)


class HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024

    def __init__(self, host, port, state):
        if ":" in host:
            self.address_family = socket.AF_INET6
        self.state = state
        super().__init__((host, port), Handler)


# ---------------------------------------------------------------------------------------------- node_rank >= 1
class DummyHandler(http.server.BaseHTTPRequestHandler):
    """sglang.srt.utils.common.launch_dummy_health_check_server: GET /ping, /health, /health_generate answer 200
    with an empty body (and /metrics with --enable-metrics); FastAPI's 404 / 405 for anything else. Uvicorn runs
    it at log level "warning": no access lines."""
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, format, *args):  # noqa: A002 - http.server's signature
        pass

    def reply(self, status, body=b"", content_type=None):
        self.send_response_only(status)
        self.send_header("date", self.date_time_string())
        self.send_header("server", "uvicorn")
        if content_type:
            self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def dispatch(self, method):
        path = self.path.split("?", 1)[0]
        routes = ("/ping", "/health", "/health_generate") + (("/metrics",) if self.server.enable_metrics else ())
        if path not in routes:
            self.reply(404, b'{"detail":"Not Found"}', "application/json")
        elif method != "GET":
            self.reply(405, b'{"detail":"Method Not Allowed"}', "application/json")
        elif path == "/metrics":
            body = ("# SGLang simulator %s (lab): dummy health check server of a node with --node-rank >= 1.\n"
                    "sglang_sim_info{version=\"%s\"} 1\n" % ((release.sim_version(),) * 2)).encode()
            self.reply(200, body, "text/plain; version=0.0.4; charset=utf-8")
        else:
            self.reply(200)

    def do_GET(self):
        self.dispatch("GET")

    def do_POST(self):
        self.dispatch("POST")


class DummyServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, host, port, enable_metrics):
        if ":" in host:
            self.address_family = socket.AF_INET6
        self.enable_metrics = enable_metrics
        super().__init__((host, port), DummyHandler)


def start_dummy_health_server(host, port, enable_metrics):
    """A daemon thread serving DummyHandler on host:port; a bind failure ends the thread, not the node."""
    common = logging.getLogger("sglang.srt.utils.common")

    def run():
        try:
            try:
                httpd = DummyServer(host, port, enable_metrics)
            except OSError as err:  # uvicorn logs this and exits its server (SystemExit ends the thread)
                logging.getLogger("uvicorn.error").error(
                    "[Errno %s] error while attempting to bind on address (%r, %d): %s", err.errno, host, port,
                    (err.strerror or str(err)).lower())
                return
            httpd.serve_forever(poll_interval=0.5)
        finally:
            common.info("Dummy health check server stopped at %s:%s", host, port)

    threading.Thread(target=run, name="health-check-server", daemon=True).start()
    common.info("Dummy health check server started in background thread at %s:%s", host, port)
