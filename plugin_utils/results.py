"""Benchmark results: parse sglang.bench_serving JSON lines, store runs, summarize, feed the planner.

Plain Python 3.9+ stdlib, controller side only. Used by the sglang_bench and sglang_plan action plugins and by
tools/report.py.

On-disk layout (one directory per model x topology fingerprint x layout, one run per id):

    results/<model>/<topology fingerprint>/<layout>/<run id>.jsonl          bench_serving's own lines, untouched
                                                     <run id>.meta.json      what was asked: points, lengths, seed
                                                     <run id>.plan.json      the plan the server ran
                                                     <run id>.topology.json  the topology facts
                                                     <run id>.versions.json  sglang, driver, CUDA, topolaunch commit
                                                     <run id>.error.json     only when something failed
    results/<model>/<topology fingerprint>/fit.json                   the model fitted to this machine (plan_fit.py)
    results/<model>/<topology fingerprint>/tune-<run id>.json         one tune: predicted and measured per layout

The run id is the UTC start time with seconds (20261130T101502Z), with -2, -3... appended when that id is
taken. Every file is created exclusively: a result is never overwritten. The meta file is written last: a run
whose output has no meta file beside it was cut short while it was being stored and counts for nothing.

bench_serving writes one JSON line per run (see docs/DESIGN.md, "Benchmark results"). It does not write how many
prompts were asked for, so the meta file keeps it; a line with completed < num_prompts is a partial failure.
"""

import datetime
import json
import math
import os
import re

from ansible_collections.topolaunch.sglang.plugins.module_utils.constants import server_view
from ansible_collections.topolaunch.sglang.plugins.module_utils.tune_backends import split_variant

SCHEMA_VERSION = 1

# bench_serving field -> our name. Percentiles: SGLang writes median_* (p50) and p99_* (p90/p95 for some).
METRICS = {
    "output_throughput": "output_throughput",
    "total_throughput": "total_throughput",
    "input_throughput": "input_throughput",
    "request_throughput": "request_throughput",
    "median_ttft_ms": "ttft_p50_ms",
    "p99_ttft_ms": "ttft_p99_ms",
    "mean_ttft_ms": "ttft_mean_ms",
    "median_itl_ms": "itl_p50_ms",
    "p99_itl_ms": "itl_p99_ms",
    "median_tpot_ms": "tpot_p50_ms",
    "p99_tpot_ms": "tpot_p99_ms",
    "median_e2e_latency_ms": "e2e_p50_ms",
    "p99_e2e_latency_ms": "e2e_p99_ms",
    "duration": "duration_s",
    "total_input_tokens": "total_input_tokens",
    "total_output_tokens": "total_output_tokens",
    "max_output_tokens_per_s": "max_output_tokens_per_s",
    "concurrency": "mean_concurrency",
}
# A line without these is not a bench_serving result.
REQUIRED = ("completed", "max_concurrency", "output_throughput", "duration")

STATUS_OK = "ok"
STATUS_PARTIAL = "partial"  # completed < num_prompts
STATUS_FAILED = "failed"  # no line, or nothing completed

_RUN_ID_RE = re.compile(r"^\d{8}T\d{6}Z(-\d+)?$")
_SAFE_RE = re.compile(r"[^A-Za-z0-9._+-]")


class ResultsError(ValueError):
    """Bad result data; the message names the file, line and value."""


# ---------------------------------------------------------------------------------------------------- parsing


def _number(value, field, where, allow_none=True):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ResultsError("%s: field %r must be a number, got %r" % (where, field, value))
    if isinstance(value, float) and math.isnan(value):
        return None  # bench_serving writes NaN for statistics over no requests
    return value


def is_simulated(server_info, sglang_version=None):
    """The lab's simulator says so in server_info (simulated: true) and in its version (0.5.9+sim)."""
    info = server_info if isinstance(server_info, dict) else {}
    if info.get("simulated") is True:
        return True
    for version in (info.get("version"), sglang_version):
        if isinstance(version, str) and "+sim" in version:
            return True
    return False


def parse_line(text, num_prompts=None, where="line"):
    """One bench_serving JSON line -> a point dict (metrics under our names, status ok/partial/failed).

    num_prompts is what was asked for (bench_serving does not write it); None when unknown.
    """
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise ResultsError("%s: not JSON (%s): %.80r" % (where, exc, text)) from None
    if not isinstance(raw, dict):
        raise ResultsError("%s: expected a JSON object, got %s" % (where, type(raw).__name__))
    missing = [f for f in REQUIRED if f not in raw]
    if missing:
        raise ResultsError("%s: not a bench_serving result, missing %s" % (where, ", ".join(missing)))
    concurrency = raw["max_concurrency"]
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ResultsError("%s: max_concurrency must be a positive integer, got %r" % (where, concurrency))
    completed = raw["completed"]
    if isinstance(completed, bool) or not isinstance(completed, int) or completed < 0:
        raise ResultsError("%s: completed must be a non-negative integer, got %r" % (where, completed))
    point = {name: _number(raw.get(field), field, where) for field, name in METRICS.items()}
    point["max_concurrency"] = concurrency
    point["completed"] = completed
    point["num_prompts"] = num_prompts
    point["input_len"] = raw.get("random_input_len")
    point["output_len"] = raw.get("random_output_len")
    point["dataset_name"] = raw.get("dataset_name")
    server_info = raw.get("server_info") if isinstance(raw.get("server_info"), dict) else {}
    point["server_version"] = server_info.get("version")
    point["simulated"] = is_simulated(server_info)
    point["status"] = point_status(completed, num_prompts)
    return point


def point_status(completed, num_prompts):
    if completed == 0:
        return STATUS_FAILED
    if num_prompts is not None and completed < num_prompts:
        return STATUS_PARTIAL
    return STATUS_OK


def parse_jsonl(text, prompts_by_concurrency=None, where="results"):
    """All lines of a bench_serving output file (blank lines ignored)."""
    prompts = prompts_by_concurrency or {}
    points = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        point = parse_line(line, None, "%s line %d" % (where, number))
        point["num_prompts"] = prompts.get(point["max_concurrency"])
        point["status"] = point_status(point["completed"], point["num_prompts"])
        point["line"] = number
        points.append(point)
    return points


def check_points(requested, points, client_error=None):
    """Compare what was asked with what came back. Returns a list of failures (empty when all is well).

    requested: [{max_concurrency, num_prompts}]; client_error: {max_concurrency, rc, msg, stderr} of a client that
    failed (non-zero exit or killed), if any.
    """
    by_concurrency = {}
    for point in points:
        by_concurrency.setdefault(point["max_concurrency"], []).append(point)
    failures = []
    for ask in requested:
        c = ask["max_concurrency"]
        got = by_concurrency.get(c, [])
        if client_error and client_error.get("max_concurrency") == c:
            failures.append({
                "max_concurrency": c, "num_prompts": ask["num_prompts"], "completed": got[-1]["completed"] if got else 0,
                "reason": "client failed (exit code %s): %s" % (client_error.get("rc"), _one_line(client_error)),
            })
        elif not got:
            if client_error:
                reason = "not run: the client failed at concurrency %s" % client_error.get("max_concurrency")
            else:
                reason = "no result line from bench_serving"
            failures.append({"max_concurrency": c, "num_prompts": ask["num_prompts"], "completed": 0, "reason": reason})
        elif got[-1]["status"] != STATUS_OK:
            failures.append({
                "max_concurrency": c, "num_prompts": ask["num_prompts"], "completed": got[-1]["completed"],
                "reason": "completed %d of %d prompts" % (got[-1]["completed"], ask["num_prompts"]),
            })
    return failures


def _one_line(client_error):
    """What the failed client said: Ansible's message unless it is the generic one, and the last line of stderr
    (else stdout: bench_serving prints some errors there)."""
    parts = []
    msg = (client_error.get("msg") or "").strip()
    if msg and msg != "non-zero return code":
        parts.append(msg)
    output = ((client_error.get("stderr") or "").strip() or (client_error.get("stdout") or "").strip()).splitlines()
    if output:
        parts.append(output[-1][:300])
    return "; ".join(parts) or "no output"


# ---------------------------------------------------------------------------------------------------- storage


def safe_name(name):
    """A model/layout/fingerprint as a single path component (a served name may hold '/')."""
    if not isinstance(name, str) or not name.strip():
        raise ResultsError("a results path component must be a non-empty string, got %r" % (name,))
    safe = _SAFE_RE.sub("_", name.strip()).replace("/", "_")
    if safe in (".", ".."):
        raise ResultsError("a results path component cannot be %r" % name)
    return safe


def artifacts_host_dir(artifacts_dir, host):
    """The controller's folder of one inventory host's artifacts, <artifacts_dir>/<host> with the host name made one
    path component as safe_name makes it: a host name holding '../' or '/' stays inside artifacts_dir."""
    return os.path.join(artifacts_dir, safe_name(str(host)))


def run_id_for(when):
    """UTC timestamp with seconds: 20261130T101502Z. `when` is a datetime or an ISO 8601 string."""
    if isinstance(when, str):
        try:
            when = datetime.datetime.fromisoformat(when.replace("Z", "+00:00"))
        except ValueError:
            raise ResultsError("not an ISO 8601 time: %r" % when) from None
    if when.tzinfo is None:
        raise ResultsError("time %s has no time zone; give UTC" % when.isoformat())
    return when.astimezone(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def filed_under(plan):
    """(model, fingerprint) whose folder keeps the results of a plan's server: the plan's model and, for a server
    across nodes, its cluster fingerprint (every node's topology), else its topology fingerprint. The one place this
    is decided: the sglang_bench action plugin and the filter topolaunch.sglang.results_fingerprint call it."""
    plan = plan or {}
    return plan.get("model_name"), plan.get("cluster_fingerprint") or plan.get("topology_fingerprint")


def plan_hosts(plan, nodes, host):
    """The inventory hosts whose topology a plan's results are recorded with: every node (`nodes`, node-rank order)
    for a server across nodes (per_node) or replicas on several nodes (replica_nodes), else `host` alone."""
    plan = plan or {}
    return list(nodes) if plan.get("per_node") or plan.get("replica_nodes") else [host]


def planned_topology(plan, hosts, facts_of, artifacts_dir):
    """The topology facts a plan's results are recorded with (their .topology.json), checked against the plan.

    hosts: the inventory hosts of the plan's server in node-rank order (one for a single node); facts_of(host): this
    run's gpu_topology facts of that host, or None (the topology stage did not run): then the facts the topology
    stage saved on the controller, <artifacts_dir>/<host>/topology.json. A server across nodes gets every node's
    facts under its cluster fingerprint. Raises ResultsError, naming the host, when the facts are missing or their
    fingerprint is not the one the plan was made for: results filed under a fingerprint must have been measured on
    it."""
    plan = plan or {}
    found = []
    for host in hosts:
        facts = facts_of(host)
        if not facts:
            path = os.path.join(artifacts_host_dir(artifacts_dir, host), "topology.json")
            facts = _read_json(path) if os.path.isfile(path) else None
        found.append((host, facts or {}))
    # a server across nodes (per_node), or replicas on several nodes (replica_nodes): every node's topology
    per_node = plan.get("per_node") or plan.get("replica_nodes")
    planned = [n.get("topology_fingerprint") for n in per_node] if per_node else [plan.get("topology_fingerprint")]
    have = [facts.get("fingerprint") for _host, facts in found]
    if have != planned:
        host, facts = next(((h, f) for (h, f), want in zip(found, planned) if f.get("fingerprint") != want),
                           found[0] if found else ("?", {}))
        raise ResultsError(
            "bench refuses to run on %s: the plan was made for topology %s but %s. Run deploy.yml --tags "
            "topology,relaunch first." % (host, filed_under(plan)[1], (
                "the topology now has fingerprint %s" % facts["fingerprint"] if facts.get("fingerprint")
                else "%s is missing" % os.path.join(artifacts_dir, host, "topology.json"))))
    if not per_node:
        return found[0][1]
    nodes = [facts for _host, facts in found]
    return {"fingerprint": filed_under(plan)[1], "nnodes": len(nodes), "nodes": nodes, "node_fingerprints": have,
            "gpu_count": sum(n.get("gpu_count", 0) for n in nodes),
            "gpus": [g for n in nodes for g in n.get("gpus", [])],
            "driver_version": nodes[0].get("driver_version"), "cuda_driver_version": nodes[0].get("cuda_driver_version")}


def layout_dir(results_dir, model, fingerprint, layout):
    return os.path.join(results_dir, safe_name(model), safe_name(fingerprint), safe_name(layout))


def _write_new(path, data):
    """Create path exclusively (never overwrite); raises FileExistsError when it is there."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "w") as handle:
        handle.write(data)


def _dump(obj):
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def reserve_run(directory, run_id, first_suffix, first_data, create=True):
    """Claim a run id in directory by creating its first file exclusively; -2, -3... when taken.

    Returns the id claimed. With create=False only says which id would be claimed.
    """
    if not _RUN_ID_RE.match(run_id):
        raise ResultsError("bad run id %r (want YYYYmmddTHHMMSSZ)" % run_id)
    if create:
        os.makedirs(directory, exist_ok=True)
    taken = set()
    if os.path.isdir(directory):
        taken = {name.split(".", 1)[0] for name in os.listdir(directory)}
    for n in range(1, 1000):
        candidate = run_id if n == 1 else "%s-%d" % (run_id, n)
        if candidate in taken:
            continue
        if not create:
            return candidate
        try:
            _write_new(os.path.join(directory, candidate + first_suffix), first_data)
        except FileExistsError:
            continue  # someone claimed it between listdir and open
        return candidate
    raise ResultsError("more than 999 runs with id %s in %s" % (run_id, directory))


SECRET_SERVER_ARGS = ("api_key", "admin_api_key", "ssl_keyfile_password")
SECRET_FLAGS = {"--" + name.replace("_", "-") for name in SECRET_SERVER_ARGS}
REDACTED = "<redacted>"


def _redact_command(command, values):
    """0.5.23's launch_command (the launch argv after the --config merge, joined by spaces): the word after a secret
    flag, the value of `--flag=value`, and any secret value found elsewhere."""
    if isinstance(command, list):
        return _redact_command(" ".join(str(w) for w in command), values).split(" ")
    words = []
    hide_next = False
    for word in command.split(" "):
        flag, eq, _value = word.partition("=")
        if hide_next:
            word, hide_next = REDACTED, False
        elif flag.replace("_", "-") in SECRET_FLAGS:
            if eq:
                word = flag + "=" + REDACTED
            else:
                hide_next = True
        words.append(word)
    return _redact_values(" ".join(words), values)


def _redact_values(obj, values):
    """obj with every secret value replaced wherever it occurs in a string (keys and numbers stay)."""
    if isinstance(obj, str):
        for value in values:
            obj = obj.replace(value, REDACTED)
        return obj
    if isinstance(obj, list):
        return [_redact_values(item, values) for item in obj]
    if isinstance(obj, dict):
        return {k: _redact_values(v, values) for k, v in obj.items()}
    return obj


def _holders(info):
    """The dicts of a server info that carry server args: itself and each internal_states entry."""
    states = info.get("internal_states")
    return [info] + [s for s in states if isinstance(s, dict)] if isinstance(states, list) else [info]


def _redact_server_info(info):
    """The server info a client line copies, its secrets replaced: the secret server args at the top and in each
    internal_states entry (both releases), 0.5.23's launch_command, and any other string holding a secret value.
    Returns (info, changed)."""
    values = sorted({str(h[k]) for h in _holders(info) for k in SECRET_SERVER_ARGS if h.get(k)}, key=len,
                    reverse=True)
    redacted = _redact_values(info, values)
    for holder in _holders(redacted):
        holder.update({k: REDACTED for k in SECRET_SERVER_ARGS if holder.get(k)})
    if isinstance(redacted.get("launch_command"), (str, list)):
        redacted["launch_command"] = _redact_command(redacted["launch_command"], values)
    return redacted, redacted != info


def scrub_secrets(lines):
    """The benchmark client copies the server's /server_info into each line: both SGLang releases return every
    server arg there, --api-key in clear, at the top and in each internal_states entry, and 0.5.23 adds
    launch_command, the launch command line (after the --config merge) with the key in it. Replace the secrets
    before anything is stored; other lines stay as they are."""
    out = []
    for line in lines.splitlines(keepends=True):
        try:
            obj = json.loads(line)
        except ValueError:
            out.append(line)
            continue
        info = obj.get("server_info") if isinstance(obj, dict) else None
        if isinstance(info, dict):
            obj["server_info"], changed = _redact_server_info(info)
            if changed:
                line = json.dumps(obj) + ("\n" if line.endswith("\n") else "")
        out.append(line)
    return "".join(out)


def record_run(results_dir, model, fingerprint, layout, started, requested, lines="", meta=None, plan=None,
               topology=None, versions=None, client_error=None, error=None, write=True):
    """Store one bench run (or one failed sweep layout) and say what failed.

    requested: [{max_concurrency, num_prompts}] (empty for a layout that failed before benchmarking);
    lines: bench_serving's output file as text; error: {stage, message} for a failure outside the client.
    Returns {run_id, dir, files, points, failures}. With write=False nothing is written (check mode).
    """
    requested = [_requested_point(p) for p in requested or []]
    prompts = {p["max_concurrency"]: p["num_prompts"] for p in requested}
    lines = scrub_secrets(lines or "")
    try:
        points = parse_jsonl(lines or "", prompts, where="bench_serving output")
    except ResultsError as exc:
        # A client killed mid-write leaves a broken line: keep the output as it is and say so.
        points = []
        error = error or {"stage": "bench", "message": "unreadable bench_serving output: %s" % exc}
    failures = check_points(requested, points, client_error)
    directory = layout_dir(results_dir, model, fingerprint, layout)
    run_meta = dict(meta or {})
    run_meta.update({
        "schema": SCHEMA_VERSION, "model": model, "topology_fingerprint": fingerprint, "layout": layout,
        "started": started, "points": requested,
    })
    files = []
    if requested:
        files.append((".jsonl", lines or ""))
    for suffix, obj in ((".plan.json", plan), (".topology.json", topology), (".versions.json", versions)):
        if obj:
            files.append((suffix, _dump(obj)))
    if failures or error or client_error:
        files.append((".error.json", _dump({
            "schema": SCHEMA_VERSION, "model": model, "topology_fingerprint": fingerprint, "layout": layout,
            "started": started, "stage": (error or {}).get("stage", "bench"),
            "message": (error or {}).get("message") or failure_message(layout, failures),
            "failures": failures,
        })))
    if requested:
        files.append((".meta.json", _dump(run_meta)))   # last: what makes the run complete
    if not files:
        raise ResultsError("nothing to record for layout %s: no points asked and no error given" % layout)
    run_id = reserve_run(directory, run_id_for(started), files[0][0], files[0][1], create=write)
    paths = [os.path.join(directory, run_id + suffix) for suffix, _data in files]
    if write:
        for (suffix, data), path in zip(files[1:], paths[1:]):
            _write_new(path, data)
    return {"run_id": run_id, "dir": directory, "files": paths, "points": points, "failures": failures}


def _requested_point(point):
    try:
        c, n = point["max_concurrency"], point["num_prompts"]
    except (KeyError, TypeError):
        raise ResultsError("a requested point needs max_concurrency and num_prompts, got %r" % (point,)) from None
    for field, value in (("max_concurrency", c), ("num_prompts", n)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ResultsError("requested point %s must be a positive integer, got %r" % (field, value))
    return {"max_concurrency": c, "num_prompts": n}


def failure_message(layout, failures):
    if not failures:
        return ""
    parts = ["concurrency %s: %s" % (f["max_concurrency"], f["reason"]) for f in failures]
    return "bench of %s failed at %s" % (layout, "; ".join(parts))


# ---------------------------------------------------------------------------------------------------- loading


def _read_json(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except ValueError as exc:
        raise ResultsError("%s: not JSON (%s)" % (path, exc)) from None


def load_runs(results_dir, model=None, fingerprint=None):
    """Every run under results_dir (optionally one model and/or fingerprint), oldest first.

    A run: {run_id, model, topology_fingerprint, layout, dir, meta, points, error, plan, topology, versions}.
    """
    runs = []
    if not os.path.isdir(results_dir):
        return runs
    for model_name in sorted(os.listdir(results_dir)):
        model_path = os.path.join(results_dir, model_name)
        if not os.path.isdir(model_path) or model_name.startswith("."):
            continue
        for fp in sorted(os.listdir(model_path)):
            fp_path = os.path.join(model_path, fp)
            if not os.path.isdir(fp_path) or (fingerprint is not None and fp != safe_name(fingerprint)):
                continue
            for layout in sorted(os.listdir(fp_path)):
                layout_path = os.path.join(fp_path, layout)
                if os.path.isdir(layout_path):
                    runs.extend(_load_layout_dir(layout_path, model_name, fp, layout))
    if model is not None:
        runs = [r for r in runs if r["model"] == model or safe_name(r["model"]) == safe_name(model)]
    runs.sort(key=lambda r: (r["run_id"], r["layout"]))
    return runs


def _load_layout_dir(path, model, fingerprint, layout):
    ids = sorted({name.split(".", 1)[0] for name in os.listdir(path) if _RUN_ID_RE.match(name.split(".", 1)[0])})
    runs = []
    for run_id in ids:
        base = os.path.join(path, run_id)
        extra = {}
        for key in ("meta", "plan", "topology", "versions", "error"):
            file = "%s.%s.json" % (base, key)
            extra[key] = _read_json(file) if os.path.exists(file) else None
        meta = extra["meta"] or {}
        # output without its meta file: storing it was cut short (the meta file is written last)
        incomplete = os.path.exists(base + ".jsonl") and extra["meta"] is None
        prompts = {}
        for p in meta.get("points", []):
            prompts[p.get("max_concurrency")] = p.get("num_prompts")
        points = []
        if os.path.exists(base + ".jsonl") and not incomplete:
            with open(base + ".jsonl") as handle:
                try:
                    points = parse_jsonl(handle.read(), prompts, where=base + ".jsonl")
                except ResultsError:
                    if not extra["error"]:
                        raise
                    points = []  # the error file already says the output could not be read
        version = (extra["versions"] or {}).get("sglang")
        run = {
            "run_id": run_id,
            "model": meta.get("model") or (extra["error"] or {}).get("model") or model,
            "topology_fingerprint": meta.get("topology_fingerprint") or fingerprint,
            "layout": meta.get("layout") or (extra["error"] or {}).get("layout") or layout,
            "dir": path,
            "points": points,
            "simulated": any(p["simulated"] for p in points) or is_simulated({}, version),
            "incomplete": incomplete,
        }
        run.update(extra)
        for point in points:
            point.update({"run_id": run_id, "layout": run["layout"], "model": run["model"],
                          "topology_fingerprint": run["topology_fingerprint"], "simulated": run["simulated"]})
        runs.append(run)
    return runs


# ---------------------------------------------------------------------------------------------------- summary


def measured_run(runs, plan, points, bench):
    """The newest complete run of this very server (the plan's SERVER_KEYS) at this very workload (the same points
    and bench settings), or None: what the bench stage skips re-measuring unless forced."""
    wanted_points = [_requested_point(p) for p in points]
    for run in reversed(runs):
        meta = run.get("meta") or {}
        if run.get("error") or not run.get("plan") or meta.get("points") != wanted_points:
            continue
        if meta.get("bench") != bench or server_view(run["plan"]) != server_view(plan):
            continue
        if len(run["points"]) == len(wanted_points) and all(p.get("status") == STATUS_OK for p in run["points"]):
            return run
    return None


def workload_of(point):
    return (point.get("input_len"), point.get("output_len"))


def latest_points(runs):
    """{(model, fingerprint, (input_len, output_len)): {layout: {concurrency: point}}}, the newest complete point
    per layout x concurrency (runs are oldest first, so later ones win). Partial and failed points never count."""
    table = {}
    for run in runs:
        for point in run["points"]:
            if point["status"] != STATUS_OK:
                continue
            key = (run["model"], run["topology_fingerprint"], workload_of(point))
            table.setdefault(key, {}).setdefault(run["layout"], {})[point["max_concurrency"]] = point
    return table


def best_per_concurrency(layouts):
    """layouts: {layout: {concurrency: point}} -> [{max_concurrency, best, output_throughput, runner_up,
    runner_up_throughput, margin_pct}] (margin over the runner-up; None when only one layout has the point)."""
    rows = []
    for c in sorted({c for points in layouts.values() for c in points}):
        ranked = sorted(((points[c]["output_throughput"] or 0.0, name) for name, points in layouts.items() if c in points),
                        key=lambda t: (-t[0], t[1]))
        best_tp, best = ranked[0]
        row = {"max_concurrency": c, "best": best, "output_throughput": best_tp, "runner_up": None,
               "runner_up_throughput": None, "margin_pct": None, "layouts_measured": len(ranked)}
        if len(ranked) > 1:
            second_tp, second = ranked[1]
            row.update({"runner_up": second, "runner_up_throughput": second_tp,
                        "margin_pct": (best_tp - second_tp) / second_tp * 100.0 if second_tp > 0 else None})
        rows.append(row)
    return rows


def winner(layouts):
    """The layout with the highest output throughput at any measured concurrency (peak tok/s), with the
    runner-up layout's peak and the margin. None when nothing was measured."""
    peaks = []
    for name, points in layouts.items():
        best = max(points.values(), key=lambda p: (p["output_throughput"] or 0.0, -p["max_concurrency"]))
        peaks.append((best["output_throughput"] or 0.0, name, best["max_concurrency"]))
    if not peaks:
        return None
    peaks.sort(key=lambda t: (-t[0], t[1]))
    top_tp, top, top_c = peaks[0]
    result = {"layout": top, "output_throughput": top_tp, "max_concurrency": top_c,
              "runner_up": None, "runner_up_throughput": None, "margin_pct": None}
    if len(peaks) > 1:
        second_tp, second, _unused = peaks[1]
        result.update({"runner_up": second, "runner_up_throughput": second_tp,
                       "margin_pct": (top_tp - second_tp) / second_tp * 100.0 if second_tp > 0 else None})
    return result


def summarize(runs):
    """Groups by model x fingerprint x workload, each with its table, best per concurrency, winner, failures,
    provenance. Failures (error files, partial points) are listed per group's model x fingerprint."""
    table = latest_points(runs)
    groups = []
    for (model, fp, workload), layouts in sorted(table.items(), key=lambda kv: _sort_key(kv[0])):
        group_runs = [r for r in runs if r["model"] == model and r["topology_fingerprint"] == fp]
        used = {p["run_id"] for points in layouts.values() for p in points.values()}
        groups.append({
            "model": model, "topology_fingerprint": fp, "input_len": workload[0], "output_len": workload[1],
            "layouts": layouts, "best": best_per_concurrency(layouts), "winner": winner(layouts),
            "simulated": any(r["simulated"] for r in group_runs if r["run_id"] in used),
            "runs": [r for r in group_runs if r["run_id"] in used],
        })
    return groups


def failures(runs):
    """Every recorded failure: error files and partial/failed points, newest first."""
    found = []
    for run in runs:
        if run["error"]:
            found.append({"model": run["model"], "topology_fingerprint": run["topology_fingerprint"],
                          "layout": run["layout"], "run_id": run["run_id"],
                          "stage": run["error"].get("stage", "?"), "message": run["error"].get("message", "")})
        elif run.get("incomplete"):
            found.append({"model": run["model"], "topology_fingerprint": run["topology_fingerprint"],
                          "layout": run["layout"], "run_id": run["run_id"], "stage": "bench",
                          "message": "incomplete: storing the run was cut short (no meta file); it counts for nothing"})
        elif any(p["status"] != STATUS_OK for p in run["points"]):
            bad = [p for p in run["points"] if p["status"] != STATUS_OK]
            found.append({"model": run["model"], "topology_fingerprint": run["topology_fingerprint"],
                          "layout": run["layout"], "run_id": run["run_id"], "stage": "bench",
                          "message": "; ".join("concurrency %d: completed %d of %s prompts"
                                               % (p["max_concurrency"], p["completed"], p["num_prompts"]) for p in bad)})
    found.sort(key=lambda f: f["run_id"], reverse=True)
    return found


def _sort_key(key):
    model, fp, (i, o) = key
    return (model, fp, i or 0, o or 0)


def measured_records(runs, model=None, fingerprint=None):
    """What the planner's auto mode consumes: one record per model x fingerprint x layout x concurrency x workload,
    from the newest complete point. Partial and failed points are left out (they are not a fair number)."""
    records = []
    for (m, fp, workload), layouts in sorted(latest_points(runs).items(), key=lambda kv: _sort_key(kv[0])):
        if (model is not None and m != model) or (fingerprint is not None and fp != fingerprint):
            continue
        for layout, points in sorted(layouts.items()):
            for c, p in sorted(points.items()):
                records.append({
                    "model": m, "topology_fingerprint": fp, "layout": layout, "max_concurrency": c,
                    "output_throughput": p["output_throughput"], "total_throughput": p["total_throughput"],
                    "ttft_p99_ms": p["ttft_p99_ms"], "itl_p99_ms": p["itl_p99_ms"],
                    "ttft_p50_ms": p.get("ttft_p50_ms"), "tpot_p50_ms": p.get("tpot_p50_ms"),
                    "tpot_p99_ms": p.get("tpot_p99_ms"),
                    "input_len": workload[0], "output_len": workload[1], "num_prompts": p["num_prompts"],
                    "run_id": p["run_id"], "simulated": p["simulated"], "source": "measured",
                })
    return records


def latest_failures(runs):
    """Per model x fingerprint x layout whose newest run failed (an error file): that failure, as failures() words
    it. A tune does not measure again a layout whose newest run failed to start."""
    newest = {}
    for run in runs:
        newest[(run["model"], run["topology_fingerprint"], run["layout"])] = run
    return list(failures([r for r in newest.values() if r["error"]]))


# ---------------------------------------------------------------------------------------------------- fits, tunes


FIT_FILE = "fit.json"
_TUNE_RE = re.compile(r"^tune-(\d{8}T\d{6}Z(?:-\d+)?)\.json$")


def fit_path(results_dir, model, fingerprint):
    return os.path.join(results_dir, safe_name(model), safe_name(fingerprint), FIT_FILE)


def _machine_dirs(results_dir, model=None, fingerprint=None):
    """(model dir name, fingerprint dir name, path) of every model x fingerprint directory."""
    if not os.path.isdir(results_dir):
        return
    for model_name in sorted(os.listdir(results_dir)):
        model_path = os.path.join(results_dir, model_name)
        if not os.path.isdir(model_path) or model_name.startswith(".") or \
                (model is not None and model_name != safe_name(model)):
            continue
        for fp in sorted(os.listdir(model_path)):
            fp_path = os.path.join(model_path, fp)
            if os.path.isdir(fp_path) and (fingerprint is None or fp == safe_name(fingerprint)):
                yield model_name, fp, fp_path


def load_fits(results_dir):
    """Every machine's fit under results_dir (fit.json per model x fingerprint), for the planner."""
    fits = []
    for _model, _fp, path in _machine_dirs(results_dir):
        file = os.path.join(path, FIT_FILE)
        if os.path.isfile(file):
            fit = _read_json(file)
            if not isinstance(fit, dict):
                raise ResultsError("%s: a fit must be a JSON object" % file)
            fits.append(fit)
    return fits


def _gpus(candidate):
    c = candidate or {}
    return c["tp"] * c["pp"] * c["dp"] if all(isinstance(c.get(k), int) for k in ("tp", "pp", "dp")) else None


def tune_record(selection, outcomes, candidates, plan, workload):
    """What a tune record keeps: per layout that could win or was measured at the workload, what the model predicted
    when the tune chose (selection, sglang_plan's `tune`), what was measured (the final plan's candidates), and what
    happened in this tune (outcomes: {layout, status ok/failed, run_id, stage, message, and the timings seconds,
    stage_started, finished, server_ready_s}); the winner, the model's
    pick, this machine's fit (the final plan's)."""
    predicted = {r["name"]: r for r in (selection or {}).get("rows", [])}
    final = {c["name"]: c for c in candidates or [] if c.get("valid")}
    done = {o["layout"]: o for o in outcomes or []}
    names = list((selection or {}).get("chosen", []))
    names += [n for n in done if n not in names]
    names += sorted(n for n, c in final.items() if c.get("measured") and n not in names)
    rows = []
    for name in names:
        out = done.get(name, {})
        # a backend variant (tp8+moe_runner_backend.cutlass) is its layout's candidate, with its own figure
        base, backends = split_variant(name)
        cand = final.get(base) or {}
        measured = dict(cand.get("measured") or {})
        figures = measured.get("variants") or {}
        figure = figures.get(name) if figures else measured.get("output_throughput")
        if figures and name not in figures:
            measured = {}
        status = {"ok": "measured", "failed": "failed"}.get(
            out.get("status"), "measured before" if measured else "not measured")
        estimate = cand.get("estimate") or {}
        rows.append({"layout": name, "predicted": (predicted.get(name) or {}).get("estimate"),
                     "measured": figure, "status": status, "backends": backends or None,
                     "gpus": _gpus(cand or None), "curve": estimate.get("curve"),
                     "slo_met": measured.get("slo_met"),
                     "run_id": out.get("run_id"), "stage": out.get("stage"), "message": out.get("message"),
                     "seconds": out.get("seconds"), "stage_started": out.get("stage_started"),
                     "finished": out.get("finished"), "server_ready_s": out.get("server_ready_s")})
    return {"workload": workload, "layouts": rows, "predicted_winner": (selection or {}).get("model_pick"),
            "winner": ((plan or {}).get("layout") or {}).get("variant")
            or ((plan or {}).get("layout") or {}).get("name"),
            "winner_source": (plan or {}).get("source"),
            "error": (selection or {}).get("error"), "scale": (selection or {}).get("scale"),
            "fit": (plan or {}).get("fit"),
            "simulated": any(((c.get("measured") or {}).get("simulated")) for c in final.values())}


def record_tune(results_dir, model, fingerprint, started, tune, write=True):
    """Store one tune's record (what was predicted, what was measured) as tune-<run id>.json beside the layouts;
    never overwritten. Returns {run_id, file}."""
    if not isinstance(tune, dict):
        raise ResultsError("a tune record must be a mapping, got %r" % (tune,))
    directory = os.path.join(results_dir, safe_name(model), safe_name(fingerprint))
    data = _dump(dict(tune, schema=SCHEMA_VERSION, model=model, topology_fingerprint=fingerprint, started=started))
    run_id = run_id_for(started)
    if write:
        os.makedirs(directory, exist_ok=True)
    taken = set(os.listdir(directory)) if os.path.isdir(directory) else set()
    for n in range(1, 1000):
        candidate = run_id if n == 1 else "%s-%d" % (run_id, n)
        path = os.path.join(directory, "tune-%s.json" % candidate)
        if os.path.basename(path) in taken:
            continue
        if write:
            try:
                _write_new(path, data)
            except FileExistsError:
                continue
        return {"run_id": candidate, "file": path}
    raise ResultsError("more than 999 tunes with id %s in %s" % (run_id, directory))


def load_tunes(results_dir, model=None, fingerprint=None):
    """Every tune record under results_dir (optionally one model and/or fingerprint), oldest first."""
    tunes = []
    for _model, _fp, path in _machine_dirs(results_dir, model, fingerprint):
        for name in sorted(os.listdir(path)):
            match = _TUNE_RE.match(name)
            if match:
                tune = _read_json(os.path.join(path, name))
                if not isinstance(tune, dict):
                    raise ResultsError("%s: a tune record must be a JSON object" % os.path.join(path, name))
                tunes.append(dict(tune, run_id=match.group(1), file=os.path.join(path, name)))
    tunes.sort(key=lambda t: t["run_id"])
    return tunes
