"""The committed SGLang metrics tables equal what tools/sglang_metrics.py extracts from each supported version's
wheel; a few metrics read by hand from each wheel's source are what the tables say; the extractor's rules on a
small wheel of its own."""
import importlib
import zipfile

import pytest

import paths

ROOT = paths.ROOT


def _load_tool():
    return paths.load_script(ROOT / "tools" / "sglang_metrics.py", "sglang_metrics_tool")


tool = _load_tool()
VERSIONS = sorted(tool.WHEELS)


def wheel_of(version):
    path = tool.flags_tool.WHEEL_DIR / tool.WHEELS[version]["file"]
    if not path.is_file():
        pytest.skip("%s not in %s (make sglang-wheel)" % (path.name, path.parent))
    return str(path)


def table(version):
    return importlib.import_module("ansible_collections.topolaunch.sglang.plugins.module_utils.sglang_metrics_"
                                   + version.replace(".", "_"))


@pytest.mark.parametrize("version", VERSIONS)
def test_committed_table_is_what_the_wheel_gives(version, capsys):
    assert tool.write_or_check(wheel_of(version), None, True, version) == 0, capsys.readouterr().err


@pytest.mark.parametrize("version", VERSIONS)
def test_every_table_has_the_metrics_the_simulator_and_alerts_use(version):
    t = table(version)
    assert t.VERSION == version
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:gen_throughput"):
        assert t.METRICS[name]["type"] == "gauge" and t.METRICS[name]["collector"] == "SchedulerMetricsCollector"
        assert t.METRICS[name]["multiprocess_mode"] == "mostrecent" and t.METRICS[name]["own_labels"]
    ttft = t.METRICS["sglang:time_to_first_token_seconds"]
    assert ttft["type"] == "histogram" and ttft["collector"] == "TokenizerMetricsCollector"
    assert t.METRICS["sglang:generation_tokens_total"]["type"] == "counter"
    assert t.COLLECTOR_LABELS["SchedulerMetricsCollector"] == ["model_name", "engine_type", "tp_rank", "pp_rank",
                                                               "moe_ep_rank"]
    assert "dp_rank" in t.OPTIONAL_LABELS["SchedulerMetricsCollector"]


def test_hand_read_differences_between_the_releases():
    """Read in the wheels' sources: 0.5.9 collector.py:1180-1210 (TTFT: labelnames=labels.keys(), buckets 0.1 ..
    400), tokenizer_manager.py:432-436 (labels: model_name); 0.5.23 metrics_collector.py:1804-1819 (labels:
    model_name, engine_type; priority with priority scheduling), 2040-2047 (TTFT: [*labels.keys(),
    "is_streaming"])."""
    old, new = table("0.5.9"), table("0.5.23")
    assert old.COLLECTOR_LABELS["TokenizerMetricsCollector"] == ["model_name"]
    assert new.COLLECTOR_LABELS["TokenizerMetricsCollector"] == ["model_name", "engine_type"]
    assert new.OPTIONAL_LABELS["TokenizerMetricsCollector"] == ["priority"]
    assert old.METRICS["sglang:time_to_first_token_seconds"]["labels"] == []
    assert new.METRICS["sglang:time_to_first_token_seconds"]["labels"] == ["is_streaming"]
    assert old.METRICS["sglang:time_to_first_token_seconds"]["buckets"][:3] == [0.1, 0.2, 0.4]
    assert old.METRICS["sglang:time_to_first_token_seconds"]["buckets"][-1] == 400.0
    assert old.METRICS["sglang:prompt_tokens_histogram"]["when"] == ["collect_tokens_histogram"]


@pytest.mark.parametrize("version", VERSIONS)
def test_source_text_spot_check(version):
    """Independent of ast: the declaration text in the wheel names the metric with the table's type."""
    wheel = zipfile.ZipFile(wheel_of(version))
    module = next(m for m in tool.METRICS_MODULES if m in wheel.namelist())
    text = wheel.read(module).decode()
    for name, entry in table(version).METRICS.items():
        at = text.index('name="%s"' % name)
        call = text.rfind("(", 0, at)
        kind = text[text.rfind("=", 0, call) + 1:call].strip().split(".")[-1]
        assert tool.METRIC_TYPES[kind] == entry["type"], name


def _wheel(tmp_path, files, version="9.9.9"):
    path = tmp_path / ("sglang-%s-py3-none-any.whl" % version)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("sglang-%s.dist-info/METADATA" % version, "Name: sglang\nVersion: %s\n" % version)
        for name, text in files.items():
            zf.writestr(name, text)
    return str(path)


COLLECTOR = '''
class SchedulerMetricsCollector:
    def __init__(self, labels, flag):
        self.a = Gauge(name="sglang:a", documentation="A.", labelnames=labels.keys(), multiprocess_mode="mostrecent")
        if flag:
            self.b = Counter(name="sglang:b_total", documentation="B.", labelnames=list(labels.keys()) + ["x"])
        else:
            self.b = Counter(name="sglang:b_total", documentation="B.", labelnames=list(labels.keys()) + ["x"])
        default = [1, 2, 3]
        self.c = Histogram(name="sglang:c", documentation="C.", labelnames=[*labels.keys(), "y"],
                           buckets=generate_buckets(None, default))
        self.d = Gauge(name="sglang:d", documentation="D.", labelnames=["page_size"])

class TokenizerMetricsCollector:
    def __init__(self, labels, buckets=None):
        if buckets is None:
            buckets = [0.5, 1]
        self.e = Histogram(name="sglang:e", documentation="E.", labelnames=labels.keys(), buckets=buckets)
'''
LABELS = '''
def sched():
    labels = {"model_name": 1, "tp_rank": 2}
    if dp:
        labels["dp_rank"] = 3
    labels.update(extra)
    return SchedulerMetricsCollector(labels=labels)

def tok():
    labels = {"model_name": 1}
    for label in custom:
        labels[label] = ""
    return labels
'''


def test_extractor_rules_on_a_small_wheel(tmp_path, monkeypatch):
    monkeypatch.setitem(tool.LABEL_SOURCES, "9.9.9", {
        "SchedulerMetricsCollector": ("sglang/srt/labels.py", "sched"),
        "TokenizerMetricsCollector": ("sglang/srt/labels.py", "tok")})
    wheel = _wheel(tmp_path, {"sglang/srt/metrics/collector.py": COLLECTOR, "sglang/srt/labels.py": LABELS})
    version, metrics, labels, optional, open_labels, module = tool.extract_metrics(wheel)
    assert (version, module) == ("9.9.9", "sglang/srt/metrics/collector.py")
    assert metrics["sglang:a"] == {"type": "gauge", "collector": "SchedulerMetricsCollector", "labels": [],
                                   "own_labels": True, "buckets": None, "multiprocess_mode": "mostrecent",
                                   "when": []}
    assert metrics["sglang:b_total"]["labels"] == ["x"] and metrics["sglang:b_total"]["when"] == []  # if and else
    assert metrics["sglang:c"]["buckets"] == [1.0, 2.0, 3.0] and metrics["sglang:c"]["labels"] == ["y"]
    assert metrics["sglang:d"]["own_labels"] is False and metrics["sglang:d"]["labels"] == ["page_size"]
    assert metrics["sglang:e"]["buckets"] == [0.5, 1.0] and metrics["sglang:e"]["collector"] == \
        "TokenizerMetricsCollector"
    assert labels == {"SchedulerMetricsCollector": ["model_name", "tp_rank"],
                      "TokenizerMetricsCollector": ["model_name"]}
    assert optional == {"SchedulerMetricsCollector": ["dp_rank"], "TokenizerMetricsCollector": []}
    assert open_labels == {"SchedulerMetricsCollector": ["update: extra"], "TokenizerMetricsCollector": ["custom: label"]}
    out = tmp_path / "table.py"
    assert tool.write_or_check(wheel, str(out), False) == 0
    assert tool.write_or_check(wheel, str(out), True) == 0
    out.write_text(out.read_text().replace("'gauge'", "'counter'", 1))
    assert tool.write_or_check(wheel, str(out), True) == 1


def test_extractor_refuses_what_it_cannot_read(tmp_path, monkeypatch):
    monkeypatch.setitem(tool.LABEL_SOURCES, "9.9.9", {
        "SchedulerMetricsCollector": ("sglang/srt/labels.py", "nowhere"),
        "TokenizerMetricsCollector": ("sglang/srt/labels.py", "tok")})
    wheel = _wheel(tmp_path, {"sglang/srt/metrics/collector.py": COLLECTOR, "sglang/srt/labels.py": LABELS})
    with pytest.raises(ValueError, match="no function nowhere"):
        tool.extract_metrics(wheel)
    bad = COLLECTOR.replace('labelnames=["page_size"]', "labelnames=names()")
    wheel = _wheel(tmp_path, {"sglang/srt/metrics/collector.py": bad, "sglang/srt/labels.py": LABELS})
    with pytest.raises(ValueError, match="not static"):
        tool.extract_metrics(wheel)
    assert tool.main(["--wheel", str(tmp_path / "missing.whl")]) == 1
