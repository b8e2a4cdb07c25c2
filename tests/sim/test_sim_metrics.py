"""The simulator's /metrics (--enable-metrics): SGLang's names, types and labels of the release it stands in for
(the extracted tables module_utils/topolaunch/sglang_metrics_<release>.py), values that move with the load."""
import importlib
import re
import threading

import pytest

from simlab import Lab, wait_for

LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text):
    """Prometheus text format -> ({family: type}, [(sample name, {labels}, value)]); fails on a malformed line."""
    types, samples = {}, []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split(" ", 3)
            assert family not in types, "family %s typed twice" % family
            types[family] = kind
        elif line.startswith("#") or not line:
            continue
        else:
            match = LINE.match(line)
            assert match, "not a sample line: %r" % line
            name, labels, value = match.groups()
            pairs = dict(PAIR.findall(labels or ""))
            samples.append((name, pairs, float(value)))
    return types, samples


def table(version):
    return importlib.import_module("ansible_collections.topolaunch.sglang.plugins.module_utils.sglang_metrics_"
                                   + version.replace(".", "_"))


def family_of(name, types):
    for suffix in ("_bucket", "_count", "_sum", "_total", ""):
        if suffix and name.endswith(suffix) and name[:-len(suffix)] in types:
            return name[:-len(suffix)]
    return name if name in types else None


def check_shape(text, version):
    """Every sglang: family is in the release's table with its type; every sample carries exactly the labels
    SGLang gives it (the collector's, the metric's own, le on buckets; dp_rank only with DP replicas)."""
    t = table(version)
    types, samples = parse(text)
    seen = set()
    for name, labels, _value in samples:
        if not name.startswith("sglang:"):
            continue
        family = family_of(name, types)
        assert family, "sample %s has no TYPE line" % name
        declared = family + "_total" if types[family] == "counter" else family
        entry = t.METRICS.get(declared)
        assert entry, "%s is not a metric of SGLang %s" % (declared, version)
        assert types[family] == entry["type"], (family, types[family], entry["type"])
        want = set(entry["labels"]) | (set(t.COLLECTOR_LABELS[entry["collector"]]) if entry["own_labels"] else set())
        extra = set(labels) - want
        assert extra <= {"le", "dp_rank"} and (("le" in labels) == name.endswith("_bucket")), (name, labels)
        assert want <= set(labels), (name, labels, want)
        seen.add(declared)
    return seen, samples


def values(samples, name, **match):
    return [v for n, labels, v in samples if n == name and all(labels.get(k) == str(w) for k, w in match.items())]


@pytest.fixture(params=["0.5.9", "0.5.23"])
def site(request, sim_site, sim_site_0523):
    return request.param, {"0.5.9": sim_site, "0.5.23": sim_site_0523}[request.param]


def test_names_types_labels_and_values_follow_the_load(tmp_path, site):
    version, where = site
    lab = Lab(tmp_path, where)
    try:
        server = lab.launch("--model-path", lab.model("llama-2-7b"), "--served-model-name", "llama",
                            "--tp-size", "2", "--enable-metrics", SGLANG_SIM_TIME_SCALE="1.0").wait_ready()
        seen, samples = check_shape(server.get("/metrics")[1].decode(), version)
        # the headline metrics of issue 23, present before any request
        for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                     "sglang:gen_throughput", "sglang:max_total_num_tokens"):
            assert name in seen
        # without --enable-metrics-for-all-schedulers only TP rank 0 reports (attn_tp_rank == 0)
        assert {labels["tp_rank"] for n, labels, _ in samples if n == "sglang:num_running_reqs"} == {"0"}
        assert values(samples, "sglang:num_running_reqs", model_name="llama", pp_rank=0) == [0.0]
        results = []

        def ask(i):
            results.append(server.post("/generate", {"text": "a b c d", "stream": i % 2 == 0,
                                                     "sampling_params": {"max_new_tokens": 200}})[0])
        threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()

        def busy():
            _seen, now = check_shape(server.get("/metrics")[1].decode(), version)
            running = values(now, "sglang:num_running_reqs")
            return now if running and running[0] > 0 and values(now, "sglang:gen_throughput")[0] > 0 else None
        now = wait_for(busy, 20, "running requests and throughput in /metrics", interval=0.1)
        assert values(now, "sglang:token_usage")[0] > 0
        for thread in threads:
            thread.join(60)
        assert results == [200] * 4
        seen, after = check_shape(server.get("/metrics")[1].decode(), version)
        assert values(after, "sglang:num_running_reqs") == [0.0]
        assert sum(values(after, "sglang:num_requests_total")) == 4
        assert sum(values(after, "sglang:generation_tokens_total")) == 800
        assert sum(values(after, "sglang:time_to_first_token_seconds_count")) == 4
        assert sum(values(after, "sglang:time_to_first_token_seconds_bucket", le="+Inf")) == 4
        if version == "0.5.23":  # is_streaming splits the request counters and TTFT
            assert values(after, "sglang:num_requests_total", is_streaming="true") == [2.0]
            assert values(after, "sglang:num_requests_total", is_streaming="false") == [2.0]
        else:
            assert all("is_streaming" not in labels for _n, labels, _v in after)
        series = {}
        for n, labels, _ in after:
            if n == "sglang:time_to_first_token_seconds_bucket" and labels["le"] != "+Inf":
                key = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
                series.setdefault(key, []).append(float(labels["le"]))
        assert len(series) == (2 if version == "0.5.23" else 1)
        for buckets in series.values():
            assert buckets == table(version).METRICS["sglang:time_to_first_token_seconds"]["buckets"]
    finally:
        lab.cleanup()


def test_every_scheduler_reports_with_the_flag(lab):
    server = lab.launch("--model-path", lab.model("llama-2-7b"), "--tp-size", "2", "--pp-size", "2",
                        "--enable-metrics", "--enable-metrics-for-all-schedulers").wait_ready()
    _seen, samples = check_shape(server.get("/metrics")[1].decode(), "0.5.9")
    ranks = {(labels["tp_rank"], labels["pp_rank"]) for n, labels, _ in samples if n == "sglang:num_running_reqs"}
    assert ranks == {("0", "0"), ("1", "0"), ("0", "1"), ("1", "1")}


def test_no_metrics_without_the_flag(lab):
    server = lab.launch("--model-path", lab.model("llama-2-7b")).wait_ready()
    assert server.get("/metrics") == (404, b'{"detail": "Not Found"}')
