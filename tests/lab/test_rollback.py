"""Faults on a lab host: every simulator fault during load or serving, health failures and the rollback to the last
good layout, a server that ignores SIGTERM, orphan schedulers, systemd's restarts and start limit.

One host (ssh 127.0.0.1:2234, server port 31190, repo server 18084, state in .lab/pytest-rollback/): tests/lab/lifecyclelab.py.
Also the NUMA binding of --numa-node: checked by health, and a failed bind (numactl removed) rolled back.
After each case: no GPU memory is held by anything but the running unit, and a process of another user on a GPU
outside the plan is still alive.

    .venv/bin/pytest -m lab tests/lab/test_rollback.py
"""
import re

import pytest

from lifecyclelab import LAB_MISSING, SMALL_MODEL, UNIT, assert_only_the_unit_holds_gpus, booted_host, shlex_quote

NAME, SSH_PORT, SERVER_PORT, REPO_PORT = "pytest-rollback", 2234, 31190, 18084
pytestmark = [pytest.mark.lab, pytest.mark.skipif(LAB_MISSING, reason="needs root, systemd-nspawn and debootstrap")]


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    yield from booted_host(tmp_path_factory, NAME, SSH_PORT, SERVER_PORT, REPO_PORT)


@pytest.mark.parametrize("fault, expected", [
    ("crash_during_load", ["died while starting", "simulated fault SGLANG_SIM_FAULT=crash_during_load"]),
    ("hang_during_load", ["is not ready", "after its start (timeout 8"]),
])
def test_fault_during_load_rolls_back_to_the_last_good_layout(host, good_tp8, tp4pp2, tmp_path, fault, expected):
    rc, out = host.relaunch("-e", host.fault_plan_file(tp4pp2, fault, tmp_path), "-e", "health_startup_timeout=8")
    assert rc != 0
    assert "Layout tp4pp2 failed its health check" in out
    for words in expected:
        assert words in out, out[-4000:]
    assert "Rolled back to the last known good layout tp8" in out and "healthy and serving" in out
    plan = host.plan()
    assert plan["layout"]["name"] == "tp8" and host.healthy(plan["port"])
    assert_only_the_unit_holds_gpus(host, plan)
    assert lock_free(host)            # the rollback's validate took the lock again, its health ended it


def lock_free(host):
    """No holder keeps the relaunch lock (its flock) once a relaunch ended, whichever way: the watchdog may act."""
    return host.ssh("flock -n /run/topolaunch/relaunch.lock echo free || echo held").strip() == "free"


def test_a_server_answering_garbage_fails_health_and_rolls_back(host, good_tp8, tp4pp2, tmp_path):
    """The answer probe: a server that answers without the number it was asked to repeat (the simulator's fault
    garbage_output) fails health like any unhealthy server, and the last good layout is back, passing the probe. A
    probe without a check is refused before anything is stopped."""
    before = host.ssh("systemctl show -p InvocationID --value %s" % UNIT)
    rc, out = host.relaunch("-e", '{"health_answer_probe": {"prompt": "The capital of France is"}}')
    assert rc != 0 and "health_answer_probe.expect: missing: a probe with a prompt needs the text" in out, out[-4000:]
    assert "Nothing was stopped." in out and "TASK [topolaunch.sglang.launch : Validate" not in out
    assert host.ssh("systemctl show -p InvocationID --value %s" % UNIT) == before
    rc, out = host.relaunch("-e", host.fault_plan_file(tp4pp2, "garbage_output", tmp_path))
    assert rc != 0
    q = r'\\?"'                     # the message comes JSON-quoted in Ansible's output
    failed = re.search(r"Layout tp4pp2 failed its health check: The answer probe failed: asked to repeat (\d{8}) "
                       r"\(POST http://127\.0\.0\.1:%d/v1/chat/completions, temperature 0, at most 64 tokens\), the "
                       r"server answered %s[a-z ]+\.\.\.%s \(64 tokens, finish reason length\), without %s\1%s\."
                       % (tp4pp2["port"], q, q, q, q), out)
    assert failed, out[-4000:]
    assert "Rolled back to the last known good layout tp8" in out and "healthy and serving" in out
    assert "the answer probe passed (asked to repeat " in out                # the layout put back passed it
    plan = host.plan()
    assert plan["layout"]["name"] == "tp8" and host.healthy(plan["port"])
    assert_only_the_unit_holds_gpus(host, plan)


def test_rollback_can_be_turned_off(host, good_tp8, tp4pp2, tmp_path):
    rc, out = host.relaunch("-e", host.fault_plan_file(tp4pp2, "crash_during_load", tmp_path),
                            "-e", "health_rollback=false")
    assert rc != 0 and "No rollback: rollback is off (health_rollback=false)" in out
    assert lock_free(host)
    rc, out = host.relaunch("-e", "layout=tp8")
    assert rc == 0, out[-4000:]
    assert lock_free(host)            # health ended it: the relaunch needed no release call of its own


def test_a_failing_last_good_plan_is_not_rolled_back_to_itself(host, good_tp8):
    """The last known good plan's own server is gone (stopped behind our back): health fails, and there is nothing
    to roll back to. The failure is short: the plan it names leaves out the planner's candidates table."""
    rc, out = host.relaunch("-e", "layout=tp8")
    assert rc == 0, out[-4000:]
    host.ssh("systemctl stop %s" % UNIT)
    rc, out = host.play("--tags", "health")
    assert rc != 0 and "No rollback: the last known good plan is the one that failed" in out, out[-4000:]
    assert "died while starting: it is " in out and '"candidates"' not in out, out[-4000:]
    rc, out = host.relaunch("-e", "layout=tp8")
    assert rc == 0, out[-4000:]


def test_server_ignoring_sigterm_is_killed_by_systemd(host, good_tp8, tp4pp2, tmp_path):
    rc, out = host.relaunch("-e", host.fault_plan_file(tp4pp2, "ignore_sigterm", tmp_path))
    assert rc == 0, out[-4000:]
    rc, out = host.relaunch("-e", "layout=tp8")
    assert rc == 0, out[-4000:]
    assert "did not stop on SIGTERM within its TimeoutStopSec: systemd SIGKILLed its processes" in out
    assert_only_the_unit_holds_gpus(host, host.plan())


def test_orphan_schedulers_of_a_hand_started_server_are_found_and_stopped(host, good_tp8, tp4pp2):
    """A server started by hand as the service user (outside the unit) whose launcher died: its schedulers stay
    on the GPUs (sgl-project/sglang#23627); the next relaunch finds them through NVML and stops them."""
    rc, out = host.play("--tags", "cleanup", "-e", "layout=tp8")
    assert rc == 0, out[-4000:]
    env = " ".join("%s=%s" % kv for kv in tp4pp2["env"].items())
    argv = " ".join(shlex_quote(a) for a in tp4pp2["argv"])
    # The shell that runuser starts writes its pid, then becomes the launcher (exec): the pid file holds the
    # launcher's pid. Every fd of the background job points away from ssh's pipes, so ssh returns at once.
    host.ssh("rm -f /tmp/by-hand.pid /tmp/by-hand.log; cd /tmp; runuser -u sglang -- sh -c "
             "'echo $$ >/tmp/by-hand.pid; exec env \"$@\"' by-hand %s SGLANG_SIM_LOAD_SECONDS=0 "
             "SGLANG_SIM_FAULT=orphan_schedulers /opt/sglang/venvs/%s/bin/python -m sglang.launch_server %s "
             "</dev/null >/tmp/by-hand.log 2>&1 &" % (env, tp4pp2["sglang_version"], argv))
    up = host.ssh("timeout 60 sh -c 'until [ -s /tmp/by-hand.pid ] && curl -sf -o /dev/null "
                  "http://127.0.0.1:%d/health; do sleep 0.5; done' && echo up || tail -20 /tmp/by-hand.log"
                  % tp4pp2["port"])
    assert up.strip() == "up", "the hand-started server did not answer /health within 60 s:\n" + up
    launcher = int(host.ssh("cat /tmp/by-hand.pid"))
    assert "sglang.launch_server" in host.ssh("tr '\\0' ' ' </proc/%d/cmdline" % launcher)
    host.ssh("kill -KILL %d" % launcher)
    held = [p for g in host.gpus() for p in g["pids"]]
    assert held and not any(host.in_unit(p) for p in held), "orphans should hold the GPUs outside the unit"
    assert launcher not in held and not host.alive(launcher)
    rc, out = host.relaunch("-e", "layout=tp8")
    assert rc == 0, out[-4000:]
    assert "sglang::scheduler_PP" in out and "by SIGTERM" in out, out[-4000:]
    assert not any(host.alive(p) for p in held)
    assert_only_the_unit_holds_gpus(host, host.plan())


def test_server_dying_after_requests_is_restarted_by_systemd(host, good_tp8, tp4pp2, tmp_path):
    """The server dies after serving N generation requests (its launcher SIGKILLs itself, as SGLang does when a
    scheduler fails): systemd restarts it, and a later health check follows the new start and passes."""
    rc, out = host.relaunch("-e", host.fault_plan_file(tp4pp2, "die_after_requests:4", tmp_path),
                            "-e", "launch_restart_sec=1")          # RestartSec: how long systemd waits, not whether
    assert rc == 0, out[-4000:]
    first = host.ssh("systemctl show -p InvocationID --value %s" % UNIT).strip()
    port = tp4pp2["port"]
    # health's own /generate and its answer probe were the first two requests; the watchdog's timer may ask its own
    # answer probe of this new start at any moment (a user request too): the server answers one or two of ours, then
    # dies, and no later request is answered.
    codes = host.ssh("for i in 1 2 3 4; do curl -s -m 5 -o /dev/null -w '%%{http_code} ' http://127.0.0.1:%d/generate "
                     "-d '{\"text\": \"hi\", \"sampling_params\": {\"max_new_tokens\": 2}}'; done; true" % port).split()
    # the only two outcomes: the watchdog's probe came first (one of ours answered) or did not (two answered)
    assert codes in (["200", "000", "000", "000"], ["200", "200", "000", "000"]), codes
    restarted = host.ssh(
        "timeout 60 sh -c 'until [ \"$(systemctl show -p InvocationID --value %s)\" != %s ] && "
        "[ \"$(systemctl is-active %s)\" = active ]; do sleep 0.2; done' && systemctl show -p NRestarts --value %s"
        " || systemctl status --no-pager %s" % (UNIT, first, UNIT, UNIT, UNIT))
    assert restarted.strip() == "1", "systemd did not restart the server within 60 s:\n" + restarted
    died = host.ssh("journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID=%s + INVOCATION_ID=%s" % (first, first))
    assert "die_after_requests:4: 4 generation requests answered" in died, died[-3000:]
    assert "Main process exited, code=killed, status=9/KILL" in died, died[-3000:]
    rc, out = host.play("--tags", "health")
    assert rc == 0, out[-4000:]
    assert "serves" in out and "(tp4pp2 on GPUs" in out, out[-4000:]
    assert host.ssh("systemctl show -p NRestarts --value %s" % UNIT).strip() == "1"   # not restarted by health
    assert_only_the_unit_holds_gpus(host, host.plan())
    rc, out = host.relaunch("-e", "layout=tp8")
    assert rc == 0, out[-4000:]


def test_relaunch_after_crashes_spent_systemds_start_limit(host, good_tp8, tp4pp2, tmp_path):
    """A server that crashed until systemd stopped restarting it (start limit spent): our relaunch still starts."""
    rc, out = host.relaunch("-e", host.fault_plan_file(tp4pp2, "crash_during_load", tmp_path),
                            "-e", "health_rollback=false", "-e", "launch_restart_sec=1")
    assert rc != 0 and "No rollback" in out, out[-4000:]
    # systemd restarts the crashing server until its start limit is spent and leaves the unit failed
    # (a condition poll with a deadline); from then on a plain start is refused.
    host.ssh("timeout 90 bash -c 'until [ \"$(systemctl show -p ActiveState --value %s)\" = failed ] && "
             "[ \"$(systemctl show -p NRestarts --value %s)\" -ge 2 ]; do sleep 0.3; done'" % (UNIT, UNIT))
    assert host.ssh("systemctl start %s >/dev/null 2>&1; echo $?" % UNIT).strip() != "0"
    rc, out = host.relaunch("-e", "layout=tp8")
    assert rc == 0, out[-4000:]
    plan = host.plan()
    assert plan["layout"]["name"] == "tp8" and host.healthy(plan["port"])
    assert_only_the_unit_holds_gpus(host, plan)


def test_numa_node_binds_every_scheduler_and_a_failed_bind_rolls_back(host, good_tp8):
    """Issue 25 item 8. tp8 on the vnuma spec plans --numa-node 0 0 0 0 1 1 1 1 and, on 0.5.23, makes a failed bind
    fatal (SGLANG_CRASH_ON_NUMA_BIND_FAILURE=1); provisioning installed numactl, through which each scheduler
    starts. Health checks every scheduler's CPUs and memory policy in /proc against the plan and says so, also on
    the running server (--tags health: not restarted, same main pid). The spec's CPUs are folded onto the host's
    two (node 0 on CPU 0, node 1 on CPU 1: lab/lab.py fold_cpus) and the host has memory on node 0 only. Then,
    the previous server running (the small model on GPUs 0-3, one node: no --numa-node): with numactl gone a plan
    that binds is refused in validate and that server is untouched (same main pid, serving); with a numactl that
    cannot bind (a stub exiting 1) the plan fails at its start (0.5.23's dry run, fatal here), health fails, and the
    rollback puts the previous server back, serving."""
    def main_pid():
        return host.ssh("systemctl show -p MainPID --value %s" % UNIT).strip()

    rc, out = host.relaunch("-e", "layout=tp8")                            # started bound (--tags relaunch forces)
    assert rc == 0, out[-4000:]
    assert "NUMA binding checked: " in out, out[-4000:]
    before = main_pid()
    rc, out = host.play("--tags", "health")                                # the running server, checked in place
    assert rc == 0, out[-4000:]
    assert main_pid() == before and "not restarted" in out
    plan = host.plan()
    assert plan["numa_bind"]["nodes"] == [0, 0, 0, 0, 1, 1, 1, 1] and plan["numa_bind"]["node_cpus"] == {
        "0": "0", "1": "1"}
    assert plan["env"]["SGLANG_CRASH_ON_NUMA_BIND_FAILURE"] == "1"
    assert host.ssh("dpkg-query -W -f '${Version}' numactl") == "2.0.16-1"
    assert "NUMA binding checked: " in out, out[-4000:]
    assert re.search(r"sglang::scheduler_TP0 \(pid \d+, CUDA device 0\) runs on CPUs 0 with memory policy bind:0: "
                     r"bound to NUMA node 0 as planned", out), out[-4000:]
    assert re.search(r"sglang::scheduler_TP7 \(pid \d+, CUDA device 7\) runs on CPUs 1 with memory policy default: "
                     r"bound to NUMA node 1 as planned; memory not checked: this host has no memory on node 1", out)
    # the kernel's own view of one scheduler per node, read here rather than through the module
    bound = host.ssh("for p in $(pgrep -u sglang -f 'sglang::scheduler_TP[07]'); do "
                     "grep -h Cpus_allowed_list /proc/$p/status; done")
    assert sorted(bound.split()) == ["0", "1", "Cpus_allowed_list:", "Cpus_allowed_list:"], bound

    small = ["-e", "topolaunch_model_path=/srv/models/%s" % SMALL_MODEL,
             "-e", "topolaunch_served_model_name=%s" % SMALL_MODEL, "-e", '{"topolaunch_gpus": [0, 1, 2, 3]}',
             "-e", "layout=tp4"]
    rc, out = host.relaunch(*small)
    assert rc == 0, out[-4000:]
    previous = host.plan()
    assert "numa_bind" not in previous and "--numa-node" not in previous["argv"]
    running = main_pid()
    host.ssh("mv /usr/bin/numactl /usr/bin/numactl.h25n")
    try:
        rc, out = host.relaunch("-e", "layout=tp8")
        assert rc != 0 and "numactl is not on the service's PATH" in out and "nothing was stopped" in out, out[-4000:]
        assert main_pid() == running and host.healthy(previous["port"])
        host.ssh("printf '#!/bin/sh\\necho \"numactl: stub that cannot bind\" >&2\\nexit 1\\n' > /usr/bin/numactl && "
                 "chmod 755 /usr/bin/numactl")
        rc, out = host.relaunch("-e", "layout=tp8")
        assert rc != 0
        assert "numactl could not apply NUMA binding for node 0" in out, out[-6000:]
        assert "Layout tp8 failed its health check" in out, out[-4000:]
        assert "Rolled back to the last known good layout tp4" in out and "healthy and serving" in out
        plan = host.plan()
        assert plan["layout"]["name"] == "tp4" and plan["model_path"] == previous["model_path"]
        assert host.healthy(plan["port"])
        assert_only_the_unit_holds_gpus(host, plan)
    finally:
        host.ssh("mv /usr/bin/numactl.h25n /usr/bin/numactl")
    rc, out = host.relaunch("-e", "layout=tp8")
    assert rc == 0, out[-4000:]
