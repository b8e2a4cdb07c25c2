"""The monitoring stage on lab hosts (issue 23): Prometheus (Debian's real package) scraping the SGLang server, a node
exporter (Debian's) and nvitop-exporter (PyPI, on the fake NVML), as deploy.yml's `monitoring` stage installs them.

Two hosts booted from the provisioned layer (tests/lab/labhosts.py): `srv` (ssh 2540, server 35400, replicas 35401
and 35402 when it serves tp4dp2, the gateway's metrics 35403, node exporter 9410, GPU exporter 9411) in
sglang_servers, `mon` (ssh 2541, Prometheus 35405) in the group monitoring; lab repository 18204, state in
.lab/h23-monitoring/. One relaunch, then the cases:
- after `--tags monitoring`, the real Prometheus reports every target up (up == 1 for the server, the node exporter
  and the GPU exporter) and holds the GPU exporter's series for the host; the alert rules are loaded;
- a second run changes nothing, and neither does --check;
- playbooks/status.yml shows the plan, the unit, its health and its metrics now;
- bad input (a listen address that is not one, a monitoring host not in the inventory, a port another program
  holds) fails with one line naming the field, before anything changes on a host;
- last (it changes the layout): tp4dp2, two replicas behind the model gateway (the lab's 70B stand-in), then
  `--tags monitoring` alone: every replica and the gateway up == 1, an sglang: series per replica, status.yml per
  replica; the relaunch pointed the watchdog at each replica, and so does `--tags watchdog` alone; a hung replica
  is restarted by it alone.

    nsenter --net=/run/netns/<ns> -- .venv/bin/pytest -q tests/lab/test_monitoring.py
"""
import json
import os
import pathlib
import re
import shutil
import time
import urllib.parse
import urllib.request

import pytest

import labhosts

NAME = "h23-monitoring"
SRV, MON = "srv", "mon"
SERVER_PORT, NODE_PORT, GPU_PORT, PROM_PORT = 35400, 9410, 9411, 35405
REPLICA_PORTS, GATEWAY_METRICS_PORT = (35401, 35402), 35403      # the replicas: the gateway's port + 1 + i
GW_MODEL = "llama-3.1-70b"              # the lab's 70B stand-in: one TP4 replica per socket of the field spec
REPO_PORT = 18204
ROOT = pathlib.Path(__file__).resolve().parents[2]
PROM = "http://127.0.0.1:%d" % PROM_PORT

LAB_MISSING = os.geteuid() != 0 or not shutil.which("systemd-nspawn") or not shutil.which("debootstrap")
pytestmark = [pytest.mark.lab, pytest.mark.skipif(LAB_MISSING, reason="needs root, systemd-nspawn and debootstrap")]


@pytest.fixture(scope="module")
def lab():
    with labhosts.Lab(NAME, repo_port=REPO_PORT, hosts={
            SRV: {"ansible_port": 2540, "topolaunch_port": SERVER_PORT, "monitoring_node_exporter_port": NODE_PORT,
                  "monitoring_gpu_exporter_port": GPU_PORT, "topolaunch_gateway_metrics_port": GATEWAY_METRICS_PORT},
            MON: {"ansible_port": 2541, "monitoring_prometheus_port": PROM_PORT},
    }, groups={"monitoring": [MON]}, settings={"launch_drain_timeout": 2}) as lab:
        rc, out = lab.play("--tags", "relaunch")
        assert rc == 0, out[-6000:]
        yield lab


def query(expr):
    url = PROM + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return body["data"]["result"]


def wait_for(expr, ok, timeout=90):
    """Query until ok(result); returns the last result (the caller asserts)."""
    deadline, result = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            result = query(expr)
            if ok(result):
                return result
        except OSError:
            pass
        time.sleep(2)
    return result


def recap(out):
    return {m.group(1): {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
            for m in re.finditer(r"^(\S+)\s+: (ok=.*)$", out, re.M)}


@pytest.fixture(scope="module")
def monitored(lab):
    rc, out = lab.play("--tags", "monitoring")
    assert rc == 0, out[-6000:]
    return out


def test_prometheus_reports_every_target_up(lab, monitored):
    def all_up(result):
        jobs = {(r["metric"]["job"], r["metric"].get("host")): r["value"][1] for r in result}
        return all(jobs.get(k) == "1" for k in (("sglang", SRV), ("node", SRV), ("gpu", SRV)))
    result = wait_for('up{job=~"sglang|node|gpu"}', all_up)
    assert result is not None and all_up(result), result
    # the targets are where the inventory says: 127.0.0.1 (topolaunch_host), the host's own ports
    # (ours carry the label host; Debian's default configuration, which the package starts Prometheus with before
    # the role writes its own, scrapes localhost:9100 as job node: its samples stay queryable for a few minutes)
    instances = {r["metric"]["job"]: r["metric"]["instance"] for r in result if r["metric"].get("host") == SRV}
    assert instances == {"sglang": "127.0.0.1:%d" % SERVER_PORT, "node": "127.0.0.1:%d" % NODE_PORT,
                         "gpu": "127.0.0.1:%d" % GPU_PORT}
    # nvitop-exporter read the fake NVML: one memory total per GPU of the field spec (8)
    gpus = wait_for('gpu_memory_total_MiB{host="%s"}' % SRV, lambda r: len(r) == 8)
    assert len(gpus) == 8, gpus
    # the served model's SGLang series (the simulator exports SGLang's own metric names)
    served = lab.host_json("/var/lib/topolaunch/current_plan.json", SRV)["served_model_name"]
    series = wait_for('{__name__=~"sglang:.+", model_name="%s", host="%s"}' % (served, SRV), lambda r: len(r) > 0)
    assert series, "no sglang: series for %s" % served
    # the alert rules are loaded, and nothing listens on every address
    with urllib.request.urlopen(PROM + "/api/v1/rules", timeout=5) as resp:
        names = {r["name"] for g in json.load(resp)["data"]["groups"] for r in g["rules"]}
    assert {"SGLangServerNotReady", "SGLangGenerationStalled", "SGLangKVCacheFull", "ScrapeTargetDown",
            "GPUMemoryFull"} <= names, names
    rc, out = lab.ssh("ss -Hltn", host=SRV)
    assert rc == 0
    for port in (NODE_PORT, GPU_PORT):
        assert re.search(r"127\.0\.0\.1:%d\b" % port, out) and not re.search(r"(\*|0\.0\.0\.0|\[::\]):%d\b" % port, out), out


def test_a_second_run_and_check_mode_change_nothing(lab, monitored):
    for args in (("--tags", "monitoring"), ("--tags", "monitoring", "--check")):
        rc, out = lab.play(*args)
        assert rc == 0, out[-6000:]
        changed = {h: r["changed"] for h, r in recap(out).items()}
        assert changed and all(v == 0 for v in changed.values()), (args, changed, out[-4000:])


def test_status_shows_what_runs_its_health_and_metrics_now(lab, monitored):
    served = lab.host_json("/var/lib/topolaunch/current_plan.json", SRV)
    run = lab.playbook("playbooks/status.yml")
    assert run.returncode == 0, run.stdout[-4000:]
    assert "plan: %s on GPUs" % served["layout"]["name"] in run.stdout, run.stdout[-3000:]
    assert "unit: active/running, up " in run.stdout
    assert "health: ok (http://127.0.0.1:%d/health 200)" % SERVER_PORT in run.stdout
    assert re.search(r"now: \d+ running, \d+ queued, token usage [\d.]+, [\d.]+ tokens/s generated", run.stdout)
    assert {h: r["changed"] for h, r in recap(run.stdout).items()} == {SRV: 0}


@pytest.mark.parametrize("extra, words", [
    ({"monitoring_listen_address": "localhost:9"}, ["monitoring_listen_address", "srv", "not an IP address"]),
    ({"monitoring_hosts": ["mon", "ghost"]}, ["monitoring_hosts", "ghost", "not a host of the inventory"]),
    ({"monitoring_prometheus_port": 2541}, ["monitoring_prometheus_port", "mon", "2541", "in use by sshd"]),
])
def test_bad_input_fails_before_anything_changes(lab, monitored, extra, words):
    files = "sha256sum /etc/prometheus/prometheus.yml /etc/default/prometheus; systemctl show -p MainPID prometheus"
    rc, before = lab.ssh(files, host=MON)
    rc, out = lab.play("--tags", "monitoring", extra=extra)
    assert rc != 0, out[-4000:]
    failed = [line for line in out.splitlines() if '"msg":' in line]
    assert failed and all(w in failed[0] for w in words), (words, failed, out[-3000:])
    assert "Traceback" not in out
    changed = {h: r["changed"] for h, r in recap(out).items()}
    assert changed and all(v == 0 for v in changed.values()), (changed, out[-3000:])
    assert lab.ssh(files, host=MON)[1] == before


def test_replicas_behind_the_gateway_are_scraped_each(lab, monitored):
    """tp4dp2 (two replicas behind the gateway), then the monitoring stage alone (--tags monitoring, no plan in the
    run): Prometheus scrapes each replica and the gateway, and holds an sglang: series of each replica."""
    model = ROOT / "tests" / "fixtures" / "models" / GW_MODEL
    for f in sorted(model.iterdir()):
        rc, _ = lab.ssh("mkdir -p /srv/models/%s && cat > /srv/models/%s/%s" % (GW_MODEL, GW_MODEL, f.name), SRV,
                        stdin=f.read_text())
        assert rc == 0, f
    rc, out = lab.play("--tags", "relaunch", extra={"layout": "tp4dp2", "topolaunch_model_path": "/srv/models/" + GW_MODEL})
    assert rc == 0, out[-6000:]
    ports = [lab.host_json("/var/lib/topolaunch/replica-%d/current_plan.json" % i, SRV)["port"] for i in (0, 1)]
    assert ports == list(REPLICA_PORTS), ports
    rc, out = lab.play("--tags", "monitoring")
    assert rc == 0, out[-6000:]
    wanted = {("sglang", "127.0.0.1:%d" % p) for p in REPLICA_PORTS} | {
        ("sglang-gateway", "127.0.0.1:%d" % GATEWAY_METRICS_PORT)}

    def up(result):
        return {(r["metric"]["job"], r["metric"]["instance"]): r["value"][1] for r in result}
    # exactly these, all up (the one server's target 35400 of the earlier configuration goes stale at the reload)
    result = wait_for('up{job=~"sglang|sglang-gateway", host="%s"}' % SRV,
                      lambda r: up(r) == {k: "1" for k in wanted})
    assert result is not None and up(result) == {k: "1" for k in wanted}, result
    # each replica's own series, labelled with its unit
    for port in REPLICA_PORTS:
        series = wait_for('{__name__=~"sglang:.+", instance="127.0.0.1:%d"}' % port, lambda r: len(r) > 0)
        assert series, "no sglang: series of the replica on port %d" % port
    # status.yml shows each replica: its unit, its health and its metrics
    run = lab.playbook("playbooks/status.yml")
    assert run.returncode == 0, run.stdout[-4000:]
    for i, port in enumerate(REPLICA_PORTS):
        assert "server: topolaunch-sglang@%d.service at http://127.0.0.1:%d" % (i, port) in run.stdout, run.stdout[-3000:]
        assert "health: ok (http://127.0.0.1:%d/health 200)" % port in run.stdout, run.stdout[-3000:]
    assert len(re.findall(r"now: \d+ running, \d+ queued", run.stdout)) == 2, run.stdout[-3000:]


WD_INTERVAL, WD_FAILURES, WD_PROBE_TIMEOUT, WD_TERM = 2, 2, 3, 2


def _replica_show(lab, index, prop):
    rc, out = lab.ssh("systemctl show -p %s --value topolaunch-sglang@%d.service" % (prop, index), SRV)
    assert rc == 0
    return out.strip()


def _replica_code(lab, port, path="/generate"):
    data = "-X POST -H 'Content-Type: application/json' -d '{\"text\": \"a b\", \"sampling_params\": " \
           "{\"max_new_tokens\": 2}}' " if path == "/generate" else ""
    rc, out = lab.ssh("curl -s -m 3 -o /dev/null -w '%%{http_code}' %shttp://127.0.0.1:%d%s || true"
                      % (data, port, path), SRV)
    return out.strip()


def test_the_watchdog_restarts_the_hung_replica_alone(lab, monitored):
    """After the case above (tp4dp2 runs): its relaunch, and `--tags watchdog` alone (reading the host), watch each
    replica; replica 1 hangs (the simulator's hang_after_requests fault in its env file): the watchdog restarts it,
    it serves again, and replica 0 keeps its main pid."""
    if _replica_show(lab, 1, "ActiveState") != "active":
        pytest.skip("needs the replicas of test_replicas_behind_the_gateway_are_scraped_each")
    units = ["topolaunch-sglang@0.service", "topolaunch-sglang@1.service"]
    # the `--tags relaunch` to tp4dp2 above already pointed the watchdog at each replica (it watched the one server's
    # unit, gone since, until the relaunch ran the watchdog stage too)
    assert [s["unit"] for s in lab.host_json("/etc/topolaunch/watchdog.json", SRV)["servers"]] == units
    rc, out = lab.play("--tags", "watchdog", extra={
        "topolaunch_watchdog_interval": WD_INTERVAL, "topolaunch_watchdog_failures": WD_FAILURES,
        "topolaunch_watchdog_max_restarts": 2, "topolaunch_load_timeout": 30,
        "watchdog_probe_timeout": WD_PROBE_TIMEOUT, "watchdog_term_timeout": WD_TERM})
    assert rc == 0, out[-6000:]
    assert [s["unit"] for s in lab.host_json("/etc/topolaunch/watchdog.json", SRV)["servers"]] == units
    # replica 1 only: the fault in its env file, a new start
    rc, _ = lab.ssh("echo 'SGLANG_SIM_FAULT=\"hang_after_requests:2\"' >> /etc/topolaunch/sglang@1.env && "
                    "systemctl restart topolaunch-sglang@1.service", SRV)
    assert rc == 0
    deadline = time.monotonic() + 60
    while _replica_code(lab, REPLICA_PORTS[1], "/health_generate") != "200":
        assert time.monotonic() < deadline, "replica 1 did not serve after its restart"
        time.sleep(1)
    pid0, hung = _replica_show(lab, 0, "MainPID"), _replica_show(lab, 1, "InvocationID")
    codes = [_replica_code(lab, REPLICA_PORTS[1]) for _ in range(4)]
    assert codes[:2] == ["200", "200"] and "200" not in codes[2:], codes
    # interval x failures (+ each failed probe's timeout), the stop (SIGTERM, SIGKILL after TERM), the load
    bound = WD_INTERVAL * (WD_FAILURES + 1) + WD_PROBE_TIMEOUT * WD_FAILURES + WD_TERM + 60
    deadline = time.monotonic() + bound
    while not (_replica_show(lab, 1, "InvocationID") not in (hung, "")
               and _replica_code(lab, REPLICA_PORTS[1], "/health_generate") == "200"):
        assert time.monotonic() < deadline, "the watchdog did not restart replica 1 within %d s" % bound
        time.sleep(1)
    rc, journal = lab.ssh("journalctl -o cat -t topolaunch-watchdog --no-pager", SRV)
    assert "topolaunch-sglang@1.service: restart: " in journal, journal[-3000:]
    assert "topolaunch-sglang@0.service: restart: " not in journal, journal[-3000:]
    assert _replica_show(lab, 0, "MainPID") == pid0
    assert _replica_code(lab, REPLICA_PORTS[0]) == "200"
