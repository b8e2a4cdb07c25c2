#!/usr/bin/env python3
"""Extract SGLang's Prometheus metrics (name, type, labels, buckets) from a wheel, without importing sglang.

SGLang declares its server metrics with prometheus_client in one module: 0.5.9 ``sglang/srt/metrics/collector.py``,
0.5.23 ``sglang/srt/observability/metrics_collector.py`` (METRICS_MODULES: the first the wheel holds). Every
``Gauge(...)``, ``Counter(...)``, ``Histogram(...)`` or ``Summary(...)`` call in a class of COLLECTORS gives one
entry, keyed by its ``name=`` (``sglang:num_running_reqs``):

    type            gauge, counter, histogram, summary (prometheus_client exposes a counter declared as
                    ``x_total`` under ``# TYPE x counter`` with the sample ``x_total``)
    collector       the class that declares it (SchedulerMetricsCollector: one set per scheduler rank that
                    reports; TokenizerMetricsCollector: one per server)
    labels          labelnames after the collector's own labels (``labels.keys()``): ``["stage"]`` for
                    ``list(labels.keys()) + ["stage"]``; the full list when the call names no collector labels
    own_labels      False when labelnames does not start with the collector's labels (a literal list)
    buckets         a histogram's default buckets when written in the source (a list in the function, the
                    default of generate_buckets(...)); None when they come from elsewhere
    multiprocess_mode   as declared (gauges: "mostrecent", ...), None when not given
    when            the conditions (source text) of the ``if`` blocks around the declaration, outermost first

(The documentation strings are left out: SGLang's /metrics shows every HELP as "Multiprocess metric".)

The collectors' own labels are built where they are constructed (LABEL_SOURCES: the module and function per
version): ``labels = {"model_name": ..., ...}`` gives the keys always present (COLLECTOR_LABELS), and
``labels["k"] = ...`` in that function the ones added under a condition (OPTIONAL_LABELS: dp_rank, priority);
``labels.update(...)`` (extra_metric_labels) and custom labels from a loop are listed in OPEN_LABELS.

Usage (the wheels and their pins are tools/sglang_flags.py's WHEELS, cached in build/wheels):
    tools/sglang_metrics.py --all [--check]      # write (or compare) module_utils/topolaunch/sglang_metrics_<v>.py
    tools/sglang_metrics.py --wheel path/to/sglang.whl [--out FILE]
"""
import argparse
import ast
import importlib.util
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("sglang_flags_tool", ROOT / "tools" / "sglang_flags.py")
flags_tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(flags_tool)
WHEELS = flags_tool.WHEELS

METRICS_MODULES = ("sglang/srt/observability/metrics_collector.py", "sglang/srt/metrics/collector.py")
COLLECTORS = ("SchedulerMetricsCollector", "TokenizerMetricsCollector")
METRIC_TYPES = {"Gauge": "gauge", "Counter": "counter", "Histogram": "histogram", "Summary": "summary"}
# version -> collector -> (module path, function) where its labels dict is built (read by hand from each wheel:
# 59:sglang/srt/managers/scheduler_metrics_mixin.py:113-125, tokenizer_manager.py:432-446;
# 523:sglang/srt/observability/metrics_collector.py:1382-1394 (init_new), 1804-1819 (tokenizer_metric_labels))
LABEL_SOURCES = {
    "0.5.9": {
        "SchedulerMetricsCollector": ("sglang/srt/managers/scheduler_metrics_mixin.py", "init_metrics"),
        "TokenizerMetricsCollector": ("sglang/srt/managers/tokenizer_manager.py", "init_metric_collector_watchdog"),
    },
    "0.5.23": {
        "SchedulerMetricsCollector": ("sglang/srt/observability/metrics_collector.py", "init_new"),
        "TokenizerMetricsCollector": ("sglang/srt/observability/metrics_collector.py", "tokenizer_metric_labels"),
    },
}
ENTRY_KEYS = ("type", "collector", "labels", "own_labels", "buckets", "multiprocess_mode", "when")


def _source(wheel, path):
    if path not in wheel.names:
        return None
    return ast.parse(wheel.zip.read(path).decode("utf-8"), filename=path)


def _functions(tree, name):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]


def _is_labels_keys(node):
    """labels.keys() (self.labels.keys() too)."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "keys"
            and ((isinstance(node.func.value, ast.Name) and node.func.value.id == "labels")
                 or (isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "labels")))


def _labelnames(node):
    """(own_labels, [extra names]) of a labelnames= expression; ValueError when it is not static."""
    if _is_labels_keys(node):
        return True, []
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "list" and node.args:
        return _labelnames(node.args[0])
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        own, left = _labelnames(node.left)
        right_own, right = _labelnames(node.right)
        if right_own:
            raise ValueError("collector labels after others: %s" % ast.unparse(node))
        return own, left + right
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        own, names = False, []
        for i, elt in enumerate(node.elts):
            if isinstance(elt, ast.Starred) and _is_labels_keys(elt.value) and i == 0:
                own = True
            elif isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                names.append(elt.value)
            else:
                raise ValueError("labelnames item %s is not static" % ast.unparse(elt))
        return own, names
    raise ValueError("labelnames %s is not static" % ast.unparse(node))


def _list_literal(node):
    value = ast.literal_eval(node)
    if not isinstance(value, (list, tuple)):
        raise ValueError("not a list")
    return [float(v) for v in value]


def _buckets(node, function):
    """A histogram's default buckets: a literal, a local name assigned a literal in the function (the last such
    assignment), or the second argument of generate_buckets(configured, default)."""
    if node is None:
        return None
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "generate_buckets":
        return _buckets(node.args[1], function) if len(node.args) > 1 else None
    if isinstance(node, ast.Name):
        found = None
        for sub in ast.walk(function):
            if isinstance(sub, ast.Assign) and any(isinstance(t, ast.Name) and t.id == node.id for t in sub.targets):
                try:
                    found = _list_literal(sub.value)
                except ValueError:
                    pass
        return found
    try:
        return _list_literal(node)
    except ValueError:
        return None


def _walk_with_conditions(node, conditions=()):
    """(node, [if conditions around it]) for every node under `node`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If):
            test = ast.unparse(child.test)
            yield child.test, conditions
            for stmt in child.body:
                yield stmt, conditions + (test,)
                yield from _walk_with_conditions(stmt, conditions + (test,))
            for stmt in child.orelse:
                yield stmt, conditions + ("not (%s)" % test,)
                yield from _walk_with_conditions(stmt, conditions + ("not (%s)" % test,))
        else:
            yield child, conditions
            yield from _walk_with_conditions(child, conditions)


def collector_metrics(tree, collector):
    """{name: entry} of the metrics one collector class declares."""
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == collector]
    if not classes:
        raise ValueError("the metrics module has no class %s" % collector)
    out = {}
    for function in (n for n in classes[0].body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        seen = set()
        for node, conditions in _walk_with_conditions(function):
            if id(node) in seen or not isinstance(node, ast.Call):
                continue
            seen.add(id(node))
            func = node.func
            kind = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if kind not in METRIC_TYPES:
                continue
            kw = {k.arg: k.value for k in node.keywords if k.arg}
            name = kw.get("name", node.args[0] if node.args else None)
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                continue
            own, labels = _labelnames(kw["labelnames"]) if "labelnames" in kw else (False, [])
            mode = kw.get("multiprocess_mode")
            entry = {
                "type": METRIC_TYPES[kind], "collector": collector, "labels": labels, "own_labels": own,
                "buckets": _buckets(kw.get("buckets"), function) if kind == "Histogram" else None,
                "multiprocess_mode": mode.value if isinstance(mode, ast.Constant) else None,
                "when": list(conditions),
            }
            if name.value in out and out[name.value] != entry:
                # declared twice (an if and its else): the same metric under the conditions both share
                prev = out[name.value]
                if {k: v for k, v in prev.items() if k != "when"} != {k: v for k, v in entry.items() if k != "when"}:
                    raise ValueError("%s is declared twice with different shapes" % name.value)
                shared = 0
                while shared < min(len(prev["when"]), len(entry["when"])) and \
                        prev["when"][shared] == entry["when"][shared]:
                    shared += 1
                prev["when"] = prev["when"][:shared]
                continue
            out[name.value] = entry
    return out


def collector_labels(tree, function_name):
    """(always, optional, open) label names of the labels dict built in a function."""
    functions = _functions(tree, function_name) if tree is not None else []
    if not functions:
        raise ValueError("no function %s where the collector's labels are built" % function_name)
    always, optional, open_labels = None, [], []
    for node in ast.walk(functions[0]):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and always is None and any(
                isinstance(t, ast.Name) and t.id == "labels" for t in node.targets):
            always = [k.value for k in node.value.keys if isinstance(k, ast.Constant)]
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)
                                                  and t.value.id == "labels" for t in node.targets):
            key = node.targets[0].slice
            if isinstance(key, ast.Constant):
                optional.append(key.value)
            else:
                open_labels.append("custom: " + ast.unparse(key))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update"
              and isinstance(node.func.value, ast.Name) and node.func.value.id == "labels"):
            open_labels.append("update: " + ast.unparse(node.args[0]))
    if always is None:
        raise ValueError("%s builds no labels = {...} dict" % function_name)
    return always, optional, open_labels


def extract_metrics(wheel_path):
    """(version, metrics, collector_labels, optional_labels, open_labels, module path) of one wheel."""
    wheel = flags_tool.WheelSource(wheel_path)
    version = wheel.version()
    module = next((m for m in METRICS_MODULES if m in wheel.names), None)
    if module is None:
        raise ValueError("the wheel holds none of %s" % ", ".join(METRICS_MODULES))
    tree = _source(wheel, module)
    metrics, labels, optional, open_labels = {}, {}, {}, {}
    sources = LABEL_SOURCES.get(version)
    if sources is None:
        raise ValueError("version %s has no LABEL_SOURCES entry (where its collectors' labels are built)" % version)
    for collector in COLLECTORS:
        for name, entry in collector_metrics(tree, collector).items():
            if name in metrics:
                raise ValueError("%s is declared by %s and %s" % (name, metrics[name]["collector"], collector))
            metrics[name] = entry
        path, function = sources[collector]
        labels[collector], optional[collector], open_labels[collector] = collector_labels(
            _source(wheel, path), function)
    return version, dict(sorted(metrics.items())), labels, optional, open_labels, module


def render_module(version, wheel_name, metrics, labels, optional, open_labels, module):
    literal = flags_tool.literal
    lines = [
        '"""SGLang %s Prometheus metrics, extracted by tools/sglang_metrics.py. Do not edit.' % version,
        "",
        "From %s (%s)." % (wheel_name, module),
        "",
        "Regenerate: tools/sglang_metrics.py --all. METRICS: name -> {type, collector, labels (after the collector's",
        "own, COLLECTOR_LABELS), own_labels, buckets, multiprocess_mode, when}; tools/sglang_metrics.py",
        "describes every key.",
        '"""',
        "",
        "VERSION = %r" % version,
        "COLLECTOR_LABELS = " + literal(labels),
        "OPTIONAL_LABELS = " + literal(optional),
        "OPEN_LABELS = " + literal(open_labels),
        "",
        "METRICS = {",
    ]
    for name, entry in metrics.items():
        entry = {k: entry[k] for k in ENTRY_KEYS}
        lines.append("    %r: %s," % (name, literal(entry, 4, 150 - len(repr(name)))))
    lines += ["}", ""]
    return "\n".join(lines)


def module_path(version):
    return ROOT / "module_utils" / "topolaunch" / ("sglang_metrics_%s.py" % version.replace(".", "_"))


def write_or_check(wheel, out, check, expect_version=None):
    version, metrics, labels, optional, open_labels, module = extract_metrics(wheel)
    if expect_version and version != expect_version:
        raise ValueError("wheel %s is version %s, not %s" % (wheel, version, expect_version))
    out = pathlib.Path(out) if out else module_path(version)
    text = render_module(version, os.path.basename(wheel), metrics, labels, optional, open_labels, module)
    if check:
        if (out.read_text() if out.exists() else "") != text:
            print("%s differs from what %s gives: regenerate with tools/sglang_metrics.py --all" % (out, wheel),
                  file=sys.stderr)
            return 1
        print("%s matches %s (%d metrics)" % (out, wheel, len(metrics)))
        return 0
    out.write_text(text)
    print("wrote %s: %d metrics from %s" % (out, len(metrics), wheel))
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true", help="every supported version (tools/sglang_flags.py WHEELS)")
    parser.add_argument("--wheel", help="path of an sglang wheel")
    parser.add_argument("--wheel-dir", default=str(flags_tool.WHEEL_DIR))
    parser.add_argument("--out", help="output module (default module_utils/topolaunch/sglang_metrics_<ver>.py)")
    parser.add_argument("--check", action="store_true", help="compare with the output file, write nothing")
    args = parser.parse_args(argv)
    if bool(args.all) == bool(args.wheel):
        parser.error("give one of --all, --wheel")
    if args.out and args.all:
        parser.error("--out goes with --wheel")
    try:
        if args.wheel:
            return write_or_check(args.wheel, args.out, args.check)
        rc = 0
        for version in sorted(WHEELS):
            rc |= write_or_check(flags_tool.download_wheel(version, args.wheel_dir), None, args.check, version)
        return rc
    except (ValueError, FileNotFoundError, subprocess.CalledProcessError) as exc:
        print("sglang_metrics: %s" % exc, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
