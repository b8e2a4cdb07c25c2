"""The watchdog on a lab host (role watchdog, module_utils/topolaunch/watchdog.py), with short intervals.

One host (ssh 127.0.0.1:2510, server port 35100, repo server 18201, .lab/inventories/h23w-watchdog/) booted from the
provisioned layer; the server runs with SGLANG_SIM_FAULT=hang_after_requests:N in its env file (the simulator's
scheduler stops producing output after N answered requests: process alive, port open, /health_generate 503).

    nsenter --net=/run/netns/tl-<name> -- .venv/bin/pytest -m lab tests/lab/test_watchdog.py
"""
import json
import os
import shutil
import time

import pytest

import labhosts

UNIT = "topolaunch-sglang.service"
PORT = 35100
INTERVAL, FAILURES, MAX_RESTARTS, LOAD_TIMEOUT, PROBE_TIMEOUT, TERM = 2, 2, 2, 15, 3, 2
METRICS = "/var/lib/topolaunch/metrics/topolaunch_watchdog.prom"
LAB_MISSING = os.geteuid() != 0 or not shutil.which("systemd-nspawn") or not shutil.which("debootstrap")
pytestmark = [pytest.mark.lab, pytest.mark.skipif(LAB_MISSING, reason="needs root, systemd-nspawn and debootstrap")]


@pytest.fixture(scope="module")
def lab():
    settings = {
        "launch_extra_env": {"SGLANG_SIM_LOAD_SECONDS": "0", "SGLANG_SIM_CAPTURE_SECONDS": "0",
                             "SGLANG_SIM_DRAIN_POLL_SECONDS": "0.2", "SGLANG_HEALTH_CHECK_TIMEOUT": "2",
                             "SGLANG_SIM_FAULT": "hang_after_requests:4"},
        "launch_drain_timeout": 2, "launch_stop_margin": 2, "health_chunk_seconds": 5,
        "topolaunch_watchdog_interval": INTERVAL, "topolaunch_watchdog_failures": FAILURES,
        "topolaunch_watchdog_max_restarts": MAX_RESTARTS, "topolaunch_load_timeout": LOAD_TIMEOUT,
        "health_startup_timeout": 60, "watchdog_probe_timeout": PROBE_TIMEOUT, "watchdog_term_timeout": TERM}
    with labhosts.Lab("h23w-watchdog", {"wd": {"ansible_port": 2510, "topolaunch_port": PORT}}, repo_port=18201,
                      settings=settings) as the_lab:
        yield the_lab


def sh(lab, command):
    rc, out = lab.ssh(command)
    assert rc == 0, "%s: rc %s %s" % (command, rc, out)
    return out.strip()


def invocation(lab):
    return sh(lab, "systemctl show -p InvocationID --value %s" % UNIT)


def metrics(lab):
    out = {}
    for line in sh(lab, "cat %s" % METRICS).splitlines():
        if not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key.split("{")[0]] = float(value)
    return out


def generate_until_hung(lab, most=10):
    """Answered generation requests until one times out (the fault's N-th); returns how many were answered."""
    for i in range(most):
        code = sh(lab, "curl -s -m 3 -o /dev/null -w '%%{http_code}' -X POST -H 'Content-Type: application/json' "
                       "-d '{\"text\": \"a b\", \"sampling_params\": {\"max_new_tokens\": 2}}' "
                       "http://127.0.0.1:%d/generate || true" % PORT)
        if code != "200":
            return i
    raise AssertionError("the server never hung")


def healthy(lab):
    return sh(lab, "curl -s -m 3 -o /dev/null -w '%%{http_code}' http://127.0.0.1:%d/health_generate || true"
              % PORT) == "200"


def wait_for(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return time.monotonic()
        time.sleep(0.5)
    raise AssertionError("timed out after %ss waiting for %s" % (timeout, what))


def wait_for_watchdog_runs(lab, runs, what):
    """Wait until the watchdog has run `runs` more times (its last-run timestamp took that many new values): the
    evidence that it saw what a negative check says it did not act on."""
    seen = {metrics(lab).get("topolaunch_watchdog_last_run_timestamp_seconds")}
    wait_for(lambda: seen.add(metrics(lab).get("topolaunch_watchdog_last_run_timestamp_seconds")) or len(seen) > runs,
             INTERVAL * (runs + 2) + PROBE_TIMEOUT, "%d watchdog runs %s" % (runs, what))


def test_bad_interval_or_failures_fail_naming_the_field_before_anything_changes(lab):
    rc, out = lab.play("--tags", "relaunch,watchdog")
    assert rc == 0, out[-6000:]
    before = sh(lab, "cat /etc/topolaunch/watchdog.json")
    assert json.loads(before)["interval"] == INTERVAL
    for field, value, words in (("topolaunch_watchdog_interval", 0, "interval must be a number > 0, got 0 "
                                                                     "(set by topolaunch_watchdog_interval)"),
                                ("topolaunch_watchdog_failures", -1, "failures must be an integer > 0, got -1 "
                                                                     "(set by topolaunch_watchdog_failures)")):
        rc, out = lab.play("--tags", "watchdog", extra={field: value})
        assert rc != 0 and words in out, out[-3000:]
    assert sh(lab, "cat /etc/topolaunch/watchdog.json") == before
    assert sh(lab, "systemctl is-active topolaunch-watchdog.timer") == "active"


def test_a_hang_is_restarted_but_not_while_the_relaunch_lock_is_held(lab):
    first = invocation(lab)
    wait_for(lambda: healthy(lab), 30, "the server to serve")
    # a relaunch holds the lock: the hang is seen but nothing is done
    holder = sh(lab, "setsid flock -o /run/topolaunch/relaunch.lock sleep 300 </dev/null >/dev/null 2>&1 & echo $!")
    try:
        assert generate_until_hung(lab) >= 1
        wait_for_watchdog_runs(lab, FAILURES + 1, "while the relaunch lock is held")
        assert invocation(lab) == first, "restarted while the relaunch lock was held"
        assert metrics(lab)["topolaunch_watchdog_relaunch_lock_held"] == 1
    finally:
        sh(lab, "kill %d" % int(holder))
    released = time.monotonic()
    # interval x failures (+ each failed probe's timeout), the stop (SIGTERM, SIGKILL after TERM), the load
    bound = INTERVAL * FAILURES + PROBE_TIMEOUT * FAILURES + TERM + 30
    wait_for(lambda: invocation(lab) != first and healthy(lab), bound, "the watchdog's restart to serve")
    assert time.monotonic() - released < bound
    journal = sh(lab, "journalctl -o cat -t topolaunch-watchdog --no-pager")
    assert "%s: restart: /health_generate" % UNIT in journal and "started" in journal, journal[-3000:]
    assert metrics(lab)["topolaunch_watchdog_restarts_total"] == 1
    # its next run finds the new start serving
    wait_for(lambda: metrics(lab)["topolaunch_watchdog_healthy"] == 1, INTERVAL * 3 + PROBE_TIMEOUT,
             "the watchdog to see the new start serve")


def test_a_hang_at_every_start_stops_at_the_limit_and_leaves_the_server_down(lab):
    # every start from now on hangs in its warmup: the port opens, the ready line never comes (503, "starting")
    sh(lab, "sed -i 's/^SGLANG_SIM_FAULT=.*/SGLANG_SIM_FAULT=hang_after_requests:0/' /etc/topolaunch/sglang.env")
    before = invocation(lab)
    generate_until_hung(lab)
    restarted = wait_for(lambda: invocation(lab) not in (before, ""), 60, "the restart")
    # the new start is loading: not restarted before the load timeout, then counted and, at the limit, stopped
    down = wait_for(lambda: sh(lab, "systemctl show -p ActiveState --value %s" % UNIT) in ("inactive", "failed"),
                    LOAD_TIMEOUT + INTERVAL * FAILURES + PROBE_TIMEOUT * FAILURES + 60, "the server to be left down")
    assert down - restarted >= LOAD_TIMEOUT - INTERVAL, "stopped while it was still loading"
    journal = sh(lab, "journalctl -o cat -t topolaunch-watchdog --no-pager")
    assert "; loading (" in journal and "reach the limit %d: stopping the server and leaving it down" % MAX_RESTARTS \
        in journal, journal[-3000:]
    m = metrics(lab)
    assert m["topolaunch_watchdog_gave_up"] == 1 and m["topolaunch_watchdog_restarts_last_hour"] == MAX_RESTARTS
    wait_for_watchdog_runs(lab, 2, "after it gave up")
    assert sh(lab, "systemctl show -p ActiveState --value %s" % UNIT) in ("inactive", "failed")
    assert "%s: down: left down" % UNIT in sh(lab, "journalctl -o cat -t topolaunch-watchdog --no-pager -n 3")
