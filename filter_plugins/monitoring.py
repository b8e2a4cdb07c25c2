"""Filters of the monitoring stage (role monitoring): what Prometheus scrapes, taken from the inventory; what keeps
the stage from running (checked on the controller before anything changes on a host); the alert rules.

    monitoring_hosts | topolaunch.sglang.monitoring_problems(hostvars, groups)       -> ["one line", ...]
    monitoring_hosts | topolaunch.sglang.monitoring_scrape_configs(hostvars, groups)  -> Prometheus scrape_configs
    inventory_hostname | topolaunch.sglang.monitoring_listeners(hostvars, groups)     -> what this host listens on
    listening | topolaunch.sglang.monitoring_port_conflicts(listeners)               -> ["one line", ...]
    settings | topolaunch.sglang.monitoring_rules                                    -> the rules file (a mapping)

The targets (one rule, here): every SGLang server of `sglang_servers` (node 0 of a server across nodes: the only
node that serves the API and /metrics; one target per replica when this run's plan (topolaunch_plan), or else what
the host runs (relaunch_host_plan, read from it when the stage runs alone), serves replicas, else per port of
`topolaunch_replica_ports`), the gateway of a host whose plan serves replicas or that
sets `topolaunch_gateway_metrics_port`, and on every host of `gpu_hosts` a node exporter and a GPU exporter. Each
listens at its host's `monitoring_listen_address` (the server at `topolaunch_host`); Prometheus scrapes that address,
or the host's `ansible_host` when it is a wildcard.
"""
import ipaddress
import re

from ansible_collections.topolaunch.sglang.plugins.module_utils import gateway

SERVER_GROUP = "sglang_servers"
GPU_GROUP = "gpu_hosts"
# The GPU exporters the role can run, by `monitoring_gpu_exporter`.
GPU_EXPORTERS = ("nvitop", "dcgm")
# The role's defaults the targets depend on (roles/monitoring/defaults/main.yml and roles/topolaunch's; a unit test
# keeps them equal): another host's role defaults are not in hostvars, only what the inventory or -e sets.
DEFAULTS = {
    "monitoring_node_exporter_port": 9100, "monitoring_gpu_exporter_port": 9400, "monitoring_gpu_exporter": "nvitop",
    "monitoring_node_exporter_unit": "prometheus-node-exporter.service",
    "monitoring_gpu_exporter_unit": "topolaunch-gpu-exporter.service",
    "monitoring_prometheus_address": "127.0.0.1", "monitoring_prometheus_port": 9090,
    "topolaunch_host": "127.0.0.1", "topolaunch_port": 30000, "topolaunch_unit_name": "topolaunch-sglang.service",
}
HOSTNAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]*$")


def _var(hostvars, host, name, default=None):
    """A variable of `host` as the inventory (or -e) sets it, else the role's default (DEFAULTS; the listen address:
    the host's topolaunch_host), else `default`."""
    if default is None:
        default = DEFAULTS.get(name)
        if name == "monitoring_listen_address":
            default = _var(hostvars, host, "topolaunch_host")
    try:
        value = hostvars[host].get(name)
    except (KeyError, AttributeError):
        return default
    return default if value is None else value


def _port(value):
    try:
        port = int(value)
    except (TypeError, ValueError):
        return None
    if isinstance(value, bool) or str(value).strip() != str(port) or not 1 <= port <= 65535:
        return None
    return port


def _address(value):
    try:
        return ipaddress.ip_address(str(value))
    except ValueError:
        return None


def _endpoints(hostvars, groups):
    """Every listener the stage scrapes: dicts {job, host, address, port, field, unit}, and the problems found."""
    out, problems = [], []
    servers = list((groups or {}).get(SERVER_GROUP) or [])
    gpu_hosts = list((groups or {}).get(GPU_GROUP) or [])

    def add(job, host, address_field, port_field, unit, port_value=None, address_value=None):
        address = _address(address_value if address_value is not None else _var(hostvars, host, address_field))
        port = _port(port_value if port_value is not None else _var(hostvars, host, port_field))
        if address is None:
            line = ("%s of host %s is %r: not an IP address"
                    % (address_field, host, _var(hostvars, host, address_field, address_value)))
            if line not in problems:
                problems.append(line)
            return
        if port is None:
            problems.append("%s of host %s is %r: not a port (1-65535)"
                            % (port_field, host, port_value if port_value is not None else _var(hostvars, host, port_field)))
            return
        out.append({"job": job, "host": host, "address": str(address), "port": port, "field": port_field,
                    "unit": unit})

    for host in servers:
        nodes = _var(hostvars, host, "topolaunch_nodes", []) or []
        # this run's plan, else what the host runs (relaunch_host_plan: the stage run alone, playbooks/monitoring.yml)
        plan = _var(hostvars, host, "topolaunch_plan", {}) or _var(hostvars, host, "relaunch_host_plan", {}) or {}
        plan = plan if isinstance(plan, dict) else {}
        if len(nodes) >= 2 and host != nodes[0] and not plan.get("replicas"):
            continue  # a worker node serves only SGLang's dummy health check, no /metrics
        # the plan serves replicas (topolaunch_gateway): each replica of this host where the plan put it (on several
        # hosts, at its host's replica address)
        served = [r for r in gateway.local_replicas(plan) if isinstance(r, dict)]
        across = bool(plan.get("replica_nodes"))
        replicas = _var(hostvars, host, "topolaunch_replica_ports", []) or []
        if served:
            for r in served:
                add("sglang", host, "topolaunch_host", "topolaunch_replica_ports", r.get("unit"),
                    port_value=r.get("port"), address_value=r.get("host") if across else
                    _var(hostvars, host, "topolaunch_host", "127.0.0.1"))
        for port in [] if served else replicas or [_var(hostvars, host, "topolaunch_port", 30000)]:
            add("sglang", host, "topolaunch_host", "topolaunch_replica_ports" if replicas else "topolaunch_port",
                _var(hostvars, host, "topolaunch_unit_name", "topolaunch-sglang.service"), port_value=port,
                address_value=_var(hostvars, host, "topolaunch_host", "127.0.0.1"))
        if plan.get("gateway") and not gateway.runs_here(plan):
            continue  # replicas on several hosts: the gateway runs on one of them
        if _var(hostvars, host, "topolaunch_gateway_metrics_port") is not None or (served and plan.get("gateway")):
            add("sglang-gateway", host, "topolaunch_host", "topolaunch_gateway_metrics_port",
                (plan.get("gateway") or {}).get("unit") if served else None,
                port_value=_var(hostvars, host, "topolaunch_gateway_metrics_port", 29000),
                address_value=_var(hostvars, host, "topolaunch_host", "127.0.0.1"))
    for host in gpu_hosts:
        if not HOSTNAME.match(str(host)):
            problems.append("inventory host %r: a GPU exporter labels its metrics with the host name, which may hold "
                            "only letters, digits, '.', '_' and '-'" % host)
            continue
        add("node", host, "monitoring_listen_address", "monitoring_node_exporter_port",
            _var(hostvars, host, "monitoring_node_exporter_unit", "prometheus-node-exporter.service"))
        kind = _var(hostvars, host, "monitoring_gpu_exporter", "nvitop")
        if kind not in GPU_EXPORTERS:
            problems.append("monitoring_gpu_exporter of host %s is %r: one of %s" % (host, kind, ", ".join(GPU_EXPORTERS)))
            continue
        add("gpu", host, "monitoring_listen_address", "monitoring_gpu_exporter_port",
            _var(hostvars, host, "monitoring_gpu_exporter_unit", "topolaunch-gpu-exporter.service"))
    return out, problems


def _scrape_address(hostvars, ep):
    address = ipaddress.ip_address(ep["address"])
    if address.is_unspecified:
        return str(_var(hostvars, ep["host"], "ansible_host", ep["host"]))
    return "[%s]" % address if address.version == 6 else str(address)


def _prometheus_listener(hostvars, host):
    address = _address(_var(hostvars, host, "monitoring_prometheus_address", "127.0.0.1"))
    port = _port(_var(hostvars, host, "monitoring_prometheus_port", 9090))
    return address, port


def monitoring_problems(monitoring_hosts, hostvars, groups):
    """Why the monitoring stage cannot run as the inventory says ([] when it can): one line each, naming the
    variable and the host. A monitoring host that is not in the inventory, a listen address that is not an IP
    address, a port that is not one, two listeners on one address and port of one machine, a target on a loopback
    address of another machine than its Prometheus."""
    problems = []
    known = set((groups or {}).get("all") or []) | set(hostvars or {})
    monitoring_hosts = list(monitoring_hosts or [])
    for host in monitoring_hosts:
        if host not in known:
            problems.append("monitoring_hosts names %r, which is not a host of the inventory" % host)
    endpoints, found = _endpoints(hostvars, groups)
    problems += found
    listeners = [dict(ep) for ep in endpoints]
    for host in monitoring_hosts:
        if host not in known:
            continue
        address, port = _prometheus_listener(hostvars, host)
        if address is None:
            problems.append("monitoring_prometheus_address of host %s is %r: not an IP address"
                            % (host, _var(hostvars, host, "monitoring_prometheus_address")))
        elif port is None:
            problems.append("monitoring_prometheus_port of host %s is %r: not a port (1-65535)"
                            % (host, _var(hostvars, host, "monitoring_prometheus_port")))
        else:
            listeners.append({"job": "prometheus", "host": host, "address": str(address), "port": port,
                              "field": "monitoring_prometheus_port"})
    seen = {}
    for ep in listeners:
        machine = str(_var(hostvars, ep["host"], "ansible_host", ep["host"]))
        wild = ipaddress.ip_address(ep["address"]).is_unspecified
        for (m, addr, port, wild2), other in seen.items():
            if m == machine and port == ep["port"] and (addr == ep["address"] or wild or wild2):
                problems.append("%s of host %s is %d, which %s of host %s already listens on (%s)"
                                % (ep["field"], ep["host"], ep["port"], other["field"], other["host"], addr))
                break
        else:
            seen[(machine, ep["address"], ep["port"], wild)] = ep
    for host in monitoring_hosts:
        if host not in known:
            continue
        here = str(_var(hostvars, host, "ansible_host", host))
        for ep in endpoints:
            there = str(_var(hostvars, ep["host"], "ansible_host", ep["host"]))
            if ipaddress.ip_address(ep["address"]).is_loopback and there != here:
                field = "topolaunch_host" if ep["job"].startswith("sglang") else "monitoring_listen_address"
                problems.append("%s of host %s listens on %s (%s), which Prometheus on %s cannot reach: give the host "
                                "an address Prometheus reaches" % (ep["job"], ep["host"], ep["address"], field, host))
    return problems


def monitoring_scrape_configs(monitoring_hosts, hostvars, groups, scrape_interval="15s"):
    """Prometheus `scrape_configs` for the inventory: one job per kind (sglang, sglang-gateway, node, gpu), each
    target labelled with its inventory host (`host`). Jobs without targets are left out."""
    endpoints, _problems = _endpoints(hostvars, groups)
    jobs = {}
    for ep in endpoints:
        target = {"targets": ["%s:%d" % (_scrape_address(hostvars, ep), ep["port"])], "labels": {"host": ep["host"]}}
        jobs.setdefault(ep["job"], []).append(target)
    out = []
    for job in ("sglang", "sglang-gateway", "node", "gpu"):
        if job in jobs:
            out.append({"job_name": job, "scrape_interval": scrape_interval, "static_configs": jobs[job]})
    return out


def monitoring_listeners(host, hostvars, groups, monitoring_hosts=()):
    """What the monitoring stage makes this host listen on, or expects there (the server): [{job, address, port,
    field, unit}], the Prometheus of a monitoring host included (unit prometheus.service)."""
    endpoints, _problems = _endpoints(hostvars, groups)
    out = [{k: ep[k] for k in ("job", "address", "port", "field", "unit")} for ep in endpoints if ep["host"] == host]
    if host in (monitoring_hosts or ()):
        address, port = _prometheus_listener(hostvars, host)
        if address is not None and port is not None:
            out.append({"job": "prometheus", "address": str(address), "port": port,
                        "field": "monitoring_prometheus_port", "unit": "prometheus.service"})
    return out


def monitoring_port_conflicts(listening, listeners, host="this host"):
    """The ports a listener of this host needs that another program holds: one line each. `listening` is what the
    host listens on now ([{address, port, pid, comm, unit}], roles/monitoring/files/listeners.py); a port held by the
    listener's own unit is no conflict (a second run), nor the SGLang server's port (the stage does not start it)."""
    problems = []
    for want in listeners or []:
        if want["job"].startswith("sglang"):
            continue
        for have in listening or []:
            if int(have.get("port", -1)) != int(want["port"]):
                continue
            a, b = _address(have.get("address")), _address(want["address"])
            if not (a is None or b is None or a == b or a.is_unspecified or b.is_unspecified):
                continue
            if want.get("unit") and have.get("unit") == want["unit"]:
                continue
            problems.append("%s of host %s is %d, which is in use by %s (pid %s, %s) on %s"
                            % (want["field"], host, want["port"], have.get("comm") or "?", have.get("pid") or "?",
                               have.get("unit") or "no unit", have.get("address")))
            break
    return problems


def _duration(value, name):
    text = str(value).strip()
    units = ("ms", "s", "m", "h", "d")
    for unit in units:
        if text.endswith(unit) and text[:-len(unit)].isdigit() and int(text[:-len(unit)]) > 0:
            if unit == "s" and text.endswith("ms"):
                continue
            return text
    raise ValueError("%s is %r: a Prometheus duration such as 30s, 5m" % (name, value))


def _number(value, name, low=0.0, high=None):
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = None
    if number is None or isinstance(value, bool) or number < low or (high is not None and number > high):
        raise ValueError("%s is %r: a number%s" % (name, value, " from %s to %s" % (low, high) if high else " >= %s" % low))
    return number


def _fmt(number):
    return ("%f" % number).rstrip("0").rstrip(".")


def monitoring_rules(settings):
    """The alert rules file (a mapping, written as YAML) from the thresholds in `settings` (the role's
    monitoring_alert_* variables without the prefix, and gpu_exporter). SGLang's metric names are the release's
    own (sglang:..., the same in 0.5.9 and 0.5.23); the GPU exporter's are nvitop-exporter's (prometheus_client
    adds the unit: gpu_memory_percent_Percentage) or DCGM's (DCGM_FI_DEV_*)."""
    s = dict(settings or {})
    for_ = _duration(s.get("for", "2m"), "monitoring_alert_for")
    stall = _duration(s.get("stall_for", "5m"), "monitoring_alert_stall_for")
    window = _duration(s.get("rate_window", "5m"), "monitoring_alert_rate_window")
    kv = _number(s.get("kv_usage", 0.95), "monitoring_alert_kv_usage", 0.0, 1.0)
    ttft = _number(s.get("ttft_p99_target_ms", 0), "monitoring_alert_ttft_p99_target_ms")
    gpu_mem = _number(s.get("gpu_memory_percent", 98), "monitoring_alert_gpu_memory_percent", 0.0, 100.0)
    gpu_temp = _number(s.get("gpu_temperature_c", 85), "monitoring_alert_gpu_temperature_c")
    kind = s.get("gpu_exporter", "nvitop")
    if kind not in GPU_EXPORTERS:
        raise ValueError("monitoring_gpu_exporter is %r: one of %s" % (kind, ", ".join(GPU_EXPORTERS)))

    def alert(name, expr, summary, for_value=for_, severity="critical"):
        return {"alert": name, "expr": expr, "for": for_value, "labels": {"severity": severity},
                "annotations": {"summary": summary}}

    server = [
        alert("SGLangServerNotReady", 'up{job="sglang"} == 0',
              "SGLang server {{ $labels.host }} ({{ $labels.instance }}) does not answer /metrics"),
        # A hung scheduler updates no gauge: the running/queued counts keep their last value, and the counter of
        # generated tokens (added to as requests finish) stops. Absent counter (nothing finished yet) counts as 0.
        alert("SGLangGenerationStalled",
              '(sum by (job, instance, host, model_name) (sglang:num_running_reqs) '
              '+ sum by (job, instance, host, model_name) (sglang:num_queue_reqs)) > 0 '
              'unless on (job, instance) sum by (job, instance) (increase(sglang:generation_tokens_total[%s])) > 0'
              % stall,
              "SGLang server {{ $labels.host }} has requests in flight and has finished none for %s" % stall,
              for_value=stall),
        alert("SGLangKVCacheFull",
              'max by (job, instance, host, model_name) (sglang:token_usage) > %s' % _fmt(kv),
              "SGLang server {{ $labels.host }}: KV cache usage above %s" % _fmt(kv), severity="warning"),
    ]
    if ttft > 0:
        server.append(alert(
            "SGLangTTFTAboveTarget",
            'histogram_quantile(0.99, sum by (job, instance, host, model_name, le) '
            '(rate(sglang:time_to_first_token_seconds_bucket[%s]))) > %s' % (window, _fmt(ttft / 1000.0)),
            "SGLang server {{ $labels.host }}: p99 TTFT above the target %s ms" % _fmt(ttft),
            severity="warning"))
    # The watchdog's own metrics (module_utils/topolaunch/watchdog.py, through node exporter's textfile collector).
    server += [
        alert("SGLangWatchdogGaveUp", "topolaunch_watchdog_gave_up == 1",
              "The watchdog of host {{ $labels.host }} reached its restart limit and left {{ $labels.unit }} down",
              for_value="0s"),
        alert("SGLangWatchdogRestarted", "increase(topolaunch_watchdog_restarts_total[1h]) > 0",
              "The watchdog of host {{ $labels.host }} restarted {{ $labels.unit }} in the last hour (a hang)",
              for_value="0s", severity="warning"),
    ]
    # host!="": our scrape jobs label every target with its host; Debian's package starts Prometheus with its own
    # config (a job "node" on localhost:9100) before the role writes ours, and that target is not one of ours
    targets = [alert("ScrapeTargetDown", 'up{job=~"node|gpu|sglang-gateway", host!=""} == 0',
                     "{{ $labels.job }} target {{ $labels.instance }} of host {{ $labels.host }} is down")]
    if kind == "nvitop":
        gpu = [
            alert("GPUMemoryFull", "gpu_memory_percent_Percentage > %s" % _fmt(gpu_mem),
                  "GPU {{ $labels.index }} of host {{ $labels.host }}: memory above %s%%" % _fmt(gpu_mem), severity="warning"),
            alert("GPUTemperatureHigh", "gpu_temperature_C > %s" % _fmt(gpu_temp),
                  "GPU {{ $labels.index }} of host {{ $labels.host }}: above %s C" % _fmt(gpu_temp), severity="warning"),
        ]
    else:
        gpu = [
            alert("GPUMemoryFull",
                  "100 * DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE) > %s" % _fmt(gpu_mem),
                  "GPU {{ $labels.gpu }} of host {{ $labels.host }}: memory above %s%%" % _fmt(gpu_mem), severity="warning"),
            alert("GPUTemperatureHigh", "DCGM_FI_DEV_GPU_TEMP > %s" % _fmt(gpu_temp),
                  "GPU {{ $labels.gpu }} of host {{ $labels.host }}: above %s C" % _fmt(gpu_temp), severity="warning"),
            alert("GPUXidError", "DCGM_FI_DEV_XID_ERRORS > 0",
                  "GPU {{ $labels.gpu }} of host {{ $labels.host }} reported an XID error", for_value="0s"),
        ]
    return {"groups": [{"name": "topolaunch-sglang", "rules": server}, {"name": "topolaunch-targets", "rules": targets},
                       {"name": "topolaunch-gpu", "rules": gpu}]}


def monitoring_settings_problems(settings):
    """Why the alert thresholds cannot be rendered ([] when they can): the one line monitoring_rules would raise."""
    try:
        monitoring_rules(settings)
    except ValueError as exc:
        return [str(exc)]
    return []


class FilterModule:
    def filters(self):
        return {"monitoring_problems": monitoring_problems, "monitoring_scrape_configs": monitoring_scrape_configs,
                "monitoring_listeners": monitoring_listeners, "monitoring_port_conflicts": monitoring_port_conflicts,
                "monitoring_rules": monitoring_rules, "monitoring_settings_problems": monitoring_settings_problems}
