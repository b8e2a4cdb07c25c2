"""The simulated scheduler: continuous batching on a clock driven by the performance model.

One thread runs SGLang's loop: admit waiting requests while the running batch and the KV cache have room,
run a prefill step for the newly admitted ones (it yields their first token) or else a decode step for the
running batch (one token each). A step lasts perf-model seconds times SGLANG_SIM_TIME_SCALE of wall clock.
"""
import collections
import queue
import threading
import time
import zlib

WORDS = (
    "the of and to in is was for on that with as by at from it this be are an or which his her had not have "
    "but were their one all been has also they more its other new first after who two when time into may some "
    "only over most such can where these many between both through during each under while same"
).split()


class GenRequest:
    """One generation request. The HTTP handler reads `events`: ("token", n_done, t) ... ("end", n_done, t)."""

    def __init__(self, rid, prompt_tokens, max_new_tokens, internal=False, stream=False):
        self.rid = rid
        self.stream = stream  # the client asked for a stream (0.5.23's is_streaming metric label)
        self.prompt_tokens = prompt_tokens
        self.max_new = max_new_tokens
        self.internal = internal  # health checks and the server's own warmup: not in metrics
        self.created = time.time()
        self.done = 0
        self.credit = 1.0  # tokens this request may emit at its next step (a speculative step accepts several)
        self.first_token_at = None
        self.last_token_at = None
        self.finished_at = None
        self.aborted = False
        self.events = queue.Queue()
        self._seed = zlib.crc32(rid.encode())

    def token_id(self, i):
        return 1000 + (self._seed + 7919 * i) % 100000

    def text(self, n):
        return "".join((" " if i else "") + WORDS[(self._seed + 31 * i) % len(WORDS)] for i in range(n))

    @property
    def finished(self):
        return self.finished_at is not None


class Engine:
    def __init__(self, perf, time_scale, max_running, max_total_tokens):
        self.perf = perf
        self.scale = time_scale
        self.max_running = max_running
        self.max_total_tokens = max_total_tokens
        self.cond = threading.Condition()
        self.waiting = collections.deque()
        self.running = []
        self.stalled = False  # a scheduler process died: nothing comes out any more
        self.last_output = 0.0  # time.time() of the last token of any request (health checks look at it)
        self.gen_throughput = 0.0
        self._throughput_window = collections.deque()
        self.recorder = None  # metrics.Recorder with --enable-metrics: told of user requests' tokens
        # speculative decoding: tokens a request gains per decode (verify) step on average, its accept length
        self.tokens_per_step = 1.0
        self.thread = threading.Thread(target=self._loop, name="scheduler", daemon=True)

    def start(self):
        self.thread.start()

    def submit(self, req):
        with self.cond:
            self.waiting.append(req)
            self.cond.notify()
        return req

    def abort(self, req):
        req.aborted = True

    def stall(self):
        with self.cond:
            self.stalled = True

    def load(self):
        with self.cond:
            used = sum(r.prompt_tokens + r.done for r in self.running)
            return len(self.running), len(self.waiting), used

    def in_flight(self):
        with self.cond:
            return [r.rid for r in self.running] + [r.rid for r in self.waiting]

    # ------------------------------------------------------------------ the loop
    def _admit(self):
        self.running = [r for r in self.running if not (r.aborted or r.finished)]
        new = []
        reserved = sum(r.prompt_tokens + r.max_new for r in self.running)
        while self.waiting and len(self.running) + len(new) < self.max_running:
            req = self.waiting[0]
            if req.aborted:
                self.waiting.popleft()
                continue
            need = req.prompt_tokens + req.max_new
            if reserved + need > self.max_total_tokens and (self.running or new):
                break  # no KV room: wait for running requests to finish
            self.waiting.popleft()
            new.append(req)
            reserved += need
        return new

    def _loop(self):
        clock = None
        while True:
            with self.cond:
                while self.stalled or not (self.waiting or any(not r.aborted for r in self.running)):
                    self.cond.wait()
                    clock = None
                new = self._admit()
                batch = list(self.running)
            if new:
                seconds = self.perf.prefill(sum(r.prompt_tokens for r in new), len(new))
                stepping = new
            elif batch:
                seconds = self.perf.decode_step(len(batch), sum(r.prompt_tokens + r.done for r in batch))
                stepping = batch
                for req in batch:   # the accepted tokens of this verify step (1 without speculative decoding)
                    req.credit += self.tokens_per_step
            else:
                continue
            now = time.monotonic()
            if clock is None or now - clock > 0.005:
                clock = now  # idle, or fell behind: do not make up for lost time by running faster
            clock += seconds * self.scale
            delay = clock - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            self._emit(stepping, time.time())
            with self.cond:
                if self.stalled:
                    continue
                self.running.extend(new)
                self.running = [r for r in self.running if not r.finished]

    def _emit(self, reqs, t):
        produced = 0
        for req in reqs:
            if req.aborted or req.finished:
                continue
            if req.done < req.max_new:
                gained = max(1, int(req.credit))
                req.credit -= gained
                gained = min(gained, req.max_new - req.done)
                req.done += gained
                produced += gained
                recorder = None if req.internal else self.recorder
                if req.first_token_at is None:
                    req.first_token_at = t
                    if recorder:
                        recorder.first_token(req, t - req.created)
                elif recorder:
                    recorder.next_token(req, t - req.last_token_at)
                req.last_token_at = t
            if req.done >= req.max_new:
                req.finished_at = t
                if self.recorder and not req.internal:
                    self.recorder.finished(req, t - req.created)
                req.events.put(("end", req.done, t))
            else:
                req.events.put(("token", req.done, t))
        self.last_output = t
        window = self._throughput_window
        window.append((t, produced))
        while window and t - window[0][0] > 2.0:
            window.popleft()
        span = t - window[0][0] if len(window) > 1 else 0
        self.gen_throughput = sum(n for _, n in list(window)[1:]) / span if span > 0 else 0.0
