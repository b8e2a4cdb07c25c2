"""SGLang's Prometheus metrics (`--enable-metrics`): the names, types, labels and buckets of the release stood in
for, from its extracted table (module_utils/topolaunch/sglang_metrics_<release>.py, tools/sglang_metrics.py,
bundled into the wheel), with values that follow the simulated engine.

What SGLang does and the simulator follows (59:sglang/srt/metrics/collector.py, 523:sglang/srt/observability/
metrics_collector.py, both releases' srt/utils/common.py add_prometheus_middleware): prometheus_client in
multiprocess mode (MultiProcessCollector: every HELP is "Multiprocess metric", no `_created` samples, a gauge
whose multiprocess_mode is not mostrecent/max/min/sum carries a `pid` label), a counter declared `x_total` is
exposed as `# TYPE x counter` with the sample `x_total`. Scheduler metrics come once per scheduler rank that
reports: attn_tp_rank 0 of each TP group (each PP stage and DP replica), every rank with
--enable-metrics-for-all-schedulers (59:scheduler_metrics_mixin.py:100-102, 523:metrics_collector.py:1360-1367);
labels model_name, engine_type ("unified"), tp_rank, pp_rank, moe_ep_rank, dp_rank with DP replicas. Tokenizer
metrics once per server: model_name (0.5.23: engine_type too), plus the metric's own labels (0.5.23:
is_streaming on the request counters, TTFT and E2E latency). Values are recorded when a request finishes, as
SGLang's observe_one_finished_request does; TTFT and inter-token latency as tokens come out.

The simulator exports the metrics in EXPORTED (those its engine has a value for); every one keeps the table's
shape. The engine is one for all DP replicas: a replica's series shows the engine's load divided by the replicas.
"""
import threading

from sglang._sim import release, resources

# name -> where its value comes from (the simulated engine's view)
SCHEDULER_EXPORTED = ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:num_used_tokens",
                      "sglang:token_usage", "sglang:gen_throughput", "sglang:cache_hit_rate",
                      "sglang:max_total_num_tokens")
TOKENIZER_EXPORTED = ("sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:num_requests_total",
                      "sglang:time_to_first_token_seconds", "sglang:inter_token_latency_seconds",
                      "sglang:e2e_request_latency_seconds")
EXPORTED = SCHEDULER_EXPORTED + TOKENIZER_EXPORTED
NO_PID_MODES = ("mostrecent", "livemostrecent", "max", "min", "sum", "livemax", "livemin", "livesum")


def table(of_version=None):
    """The extracted metrics table (its module) of a release, default the one stood in for."""
    return resources.load("sglang_metrics_" + (of_version or release.version()).replace(".", "_"))


def go_float(value):
    """prometheus_client's floatToGoString: 1.0, 0.1, +Inf."""
    value = float(value)
    if value == float("inf"):
        return "+Inf"
    if value == float("-inf"):
        return "-Inf"
    if value != value:
        return "NaN"
    return repr(value)


def _escape(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs):
    return "{%s}" % ",".join('%s="%s"' % (k, _escape(v)) for k, v in pairs) if pairs else ""


class _Histogram:
    def __init__(self, buckets):
        self.buckets = list(buckets)
        self.counts = [0] * len(self.buckets)
        self.total = 0
        self.sum = 0.0

    def observe(self, value):
        self.total += 1
        self.sum += value
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1


class Recorder:
    """The server's metrics: fed by the engine (tokens, finished requests), rendered at GET /metrics.

    ranks: [{tp_rank, pp_rank, moe_ep_rank, dp_rank (None without DP replicas), pid}] of this node's schedulers.
    """

    def __init__(self, args, ranks, max_total_tokens, version=None):
        self.t = table(version)
        missing = [name for name in EXPORTED if name not in self.t.METRICS]
        if missing:
            raise RuntimeError("SGLang %s's metrics table lacks %s" % (self.t.VERSION, ", ".join(missing)))
        self.model_name = args.served_model_name
        self.version = self.t.VERSION
        all_schedulers = bool(args.get("enable_metrics_for_all_schedulers"))
        replicas = max(1, len({r["dp_rank"] for r in ranks if r["dp_rank"] is not None}))
        self.replicas = replicas
        # attn_tp_rank = tp_rank without DP attention (the planner does not use it)
        self.ranks = [r for r in ranks if all_schedulers or r["tp_rank"] == 0]
        self.max_total_tokens = max_total_tokens
        self.lock = threading.Lock()
        self.counters = {}     # (name, labels tuple) -> value
        self.histograms = {}   # (name, labels tuple) -> _Histogram

    # ------------------------------------------------------------------ labels
    def scheduler_labels(self, rank):
        values = {"model_name": self.model_name, "engine_type": "unified", "tp_rank": rank["tp_rank"],
                  "pp_rank": rank["pp_rank"], "moe_ep_rank": rank["moe_ep_rank"]}
        keys = list(self.t.COLLECTOR_LABELS["SchedulerMetricsCollector"])
        if rank["dp_rank"] is not None and "dp_rank" in self.t.OPTIONAL_LABELS["SchedulerMetricsCollector"]:
            values["dp_rank"] = rank["dp_rank"]
            keys.append("dp_rank")
        return [(k, values[k]) for k in keys]

    def tokenizer_labels(self, name, stream):
        entry = self.t.METRICS[name]
        values = {"model_name": self.model_name, "engine_type": "unified",
                  "is_streaming": "true" if stream else "false"}
        keys = (list(self.t.COLLECTOR_LABELS["TokenizerMetricsCollector"]) if entry["own_labels"] else []) + \
            list(entry["labels"])
        return tuple((k, values[k]) for k in keys)

    # ------------------------------------------------------------------ recording (engine thread)
    def _inc(self, name, stream, amount):
        key = (name, self.tokenizer_labels(name, stream))
        self.counters[key] = self.counters.get(key, 0) + amount

    def _observe(self, name, stream, value):
        key = (name, self.tokenizer_labels(name, stream))
        hist = self.histograms.get(key)
        if hist is None:
            hist = self.histograms[key] = _Histogram(self.t.METRICS[name]["buckets"])
        hist.observe(value)

    def first_token(self, req, seconds):
        with self.lock:
            self._observe("sglang:time_to_first_token_seconds", req.stream, seconds)

    def next_token(self, req, gap):
        with self.lock:
            self._observe("sglang:inter_token_latency_seconds", req.stream, gap)

    def finished(self, req, e2e):
        with self.lock:
            self._inc("sglang:prompt_tokens_total", req.stream, req.prompt_tokens)
            self._inc("sglang:generation_tokens_total", req.stream, req.done)
            self._inc("sglang:num_requests_total", req.stream, 1)
            self._observe("sglang:e2e_request_latency_seconds", req.stream, e2e)

    # ------------------------------------------------------------------ rendering
    def _family(self, lines, name, samples):
        entry = self.t.METRICS[name]
        family = name[:-len("_total")] if entry["type"] == "counter" and name.endswith("_total") else name
        lines.append("# HELP %s Multiprocess metric" % family)
        lines.append("# TYPE %s %s" % (family, entry["type"]))
        lines.extend(samples)

    def render(self, engine):
        running, waiting, used = engine.load()
        per = float(self.replicas)
        values = {
            "sglang:num_running_reqs": running / per, "sglang:num_queue_reqs": waiting / per,
            "sglang:num_used_tokens": used / per,
            "sglang:token_usage": (used / self.max_total_tokens) if self.max_total_tokens else 0.0,
            "sglang:gen_throughput": engine.gen_throughput / per, "sglang:cache_hit_rate": 0.0,
            "sglang:max_total_num_tokens": self.max_total_tokens / per,
        }
        lines = []
        for name in SCHEDULER_EXPORTED:
            entry = self.t.METRICS[name]
            samples = []
            for rank in self.ranks:
                pairs = self.scheduler_labels(rank)
                if entry["type"] == "gauge" and entry["multiprocess_mode"] not in NO_PID_MODES:
                    pairs.append(("pid", rank["pid"]))
                samples.append("%s%s %s" % (name, _labels(pairs), go_float(values[name])))
            self._family(lines, name, samples)
        with self.lock:
            counters = dict(self.counters)
            histograms = {k: (list(h.counts), h.total, h.sum) for k, h in self.histograms.items()}
        for name in TOKENIZER_EXPORTED:
            entry = self.t.METRICS[name]
            samples = []
            if entry["type"] == "counter":
                for (metric, pairs), value in sorted(counters.items()):
                    if metric == name:
                        samples.append("%s%s %s" % (name, _labels(pairs), go_float(value)))
            else:
                for (metric, pairs), (counts, total, total_sum) in sorted(histograms.items()):
                    if metric != name:
                        continue
                    for bound, count in zip(entry["buckets"], counts):
                        samples.append("%s_bucket%s %s" % (name, _labels(pairs + (("le", go_float(bound)),)),
                                                          go_float(count)))
                    samples.append("%s_bucket%s %s" % (name, _labels(pairs + (("le", "+Inf"),)), go_float(total)))
                    samples.append("%s_count%s %s" % (name, _labels(pairs), go_float(total)))
                    samples.append("%s_sum%s %s" % (name, _labels(pairs), go_float(total_sum)))
            self._family(lines, name, samples)
        return "\n".join(lines) + "\n"
