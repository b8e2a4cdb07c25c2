"""Filters of playbooks/status.yml (the readable state of each server): the values of named metrics in a
Prometheus text exposition (the server's /metrics, the watchdog's textfile), and the lines the playbook prints.

    metrics_text | topolaunch.sglang.metric_values(['sglang:num_running_reqs', ...])   -> {name: value}
    facts | topolaunch.sglang.status_lines                                               -> ["plan ...", ...]

A metric with several series (one per TP rank, per unit) is summed for counts and throughput, and its maximum is
taken for ratios (a name in MAX_OF: token usage); a metric that is absent is left out.
"""
import math

MAX_OF = ("sglang:token_usage", "topolaunch_watchdog_gave_up", "topolaunch_watchdog_last_run_timestamp_seconds")


def _series(line):
    """(name, value) of one sample line, or None (comments, blank lines, lines that do not parse)."""
    line = line.strip()
    if not line or line.startswith("#"):
        return None
    if "{" in line:
        name, _brace, rest = line.partition("{")
        rest = rest.rsplit("}", 1)[-1]
    else:
        name, _space, rest = line.partition(" ")
    fields = rest.split()
    if not fields:
        return None
    try:
        value = float(fields[0])
    except ValueError:
        return None
    return name.strip(), value


def metric_values(text, names):
    """{name: value} of the names found in `text`: summed over series, or their maximum for MAX_OF."""
    out = {}
    wanted = set(names or [])
    for line in (text or "").splitlines():
        parsed = _series(line)
        if parsed is None or parsed[0] not in wanted or math.isnan(parsed[1]):
            continue
        name, value = parsed
        if name in out:
            out[name] = max(out[name], value) if name in MAX_OF else out[name] + value
        else:
            out[name] = value
    return {k: round(v, 4) for k, v in out.items()}


def _uptime(seconds):
    if seconds is None:
        return "-"
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    return ("%dd " % days if days else "") + "%02d:%02d:%02d" % (hours, minutes, secs)


def status_lines(facts):
    """The lines status.yml prints for one server, from what it read: {plan, unit: {ActiveState, SubState,
    NRestarts}, uptime_s, health: {status, url}, metrics, watchdog, watchdog_journal}."""
    f = dict(facts or {})
    plan = f.get("plan") or {}
    unit = f.get("unit") or {}
    health = f.get("health") or {}
    metrics = f.get("metrics") or {}
    watchdog = f.get("watchdog") or {}
    lines = []
    if plan:
        layout = (plan.get("layout") or {}).get("name", "?")
        lines.append("plan: %s on GPUs %s, model %s, SGLang %s (%s)" % (
            layout, ",".join(str(g) for g in plan.get("gpu_indices") or []) or "-",
            plan.get("served_model_name") or plan.get("model_path") or "?", plan.get("sglang_version") or "?",
            plan.get("source") or "?"))
    else:
        lines.append("plan: none (no current_plan.json: nothing launched here)")
    lines.append("unit: %s/%s, up %s, %s restart(s) by systemd" % (
        unit.get("ActiveState", "?"), unit.get("SubState", "?"), _uptime(f.get("uptime_s")), unit.get("NRestarts", "?")))
    status = health.get("status")
    answered = status not in (None, -1)
    lines.append("health: %s (%s %s)" % ("ok" if status == 200 else "FAILING" if answered else "no answer",
                                         health.get("url", "?"), status if answered else health.get("msg", "")))
    if metrics:
        lines.append("now: %s running, %s queued, token usage %s, %s tokens/s generated" % (
            _num(metrics.get("sglang:num_running_reqs")), _num(metrics.get("sglang:num_queue_reqs")),
            _num(metrics.get("sglang:token_usage")), _num(metrics.get("sglang:gen_throughput"))))
    else:
        lines.append("now: no metrics (the server's /metrics did not answer, or topolaunch_metrics is off)")
    if watchdog:
        lines.append("watchdog: %s, %s failure(s) in a row, %s restart(s) in the last hour (%s in all)%s" % (
            "healthy" if watchdog.get("topolaunch_watchdog_healthy") else "not healthy",
            _num(watchdog.get("topolaunch_watchdog_consecutive_failures")),
            _num(watchdog.get("topolaunch_watchdog_restarts_last_hour")),
            _num(watchdog.get("topolaunch_watchdog_restarts_total")),
            ", GAVE UP: the server is left down" if watchdog.get("topolaunch_watchdog_gave_up") else ""))
    else:
        lines.append("watchdog: no metrics file (not installed here)")
    for line in f.get("watchdog_journal") or []:
        lines.append("watchdog log: " + line)
    return lines


def _num(value):
    if value is None:
        return "-"
    return str(int(value)) if float(value).is_integer() else str(value)


class FilterModule:
    def filters(self):
        return {"metric_values": metric_values, "status_lines": status_lines}
