"""Server lifecycle on a lab host: relaunch between layouts, every simulator fault, rollback, foreign processes.

One host (ssh 127.0.0.1:2229, server port 31090, repo server 18082, state in .lab/pytest-lifecycle/) is booted once
from the provisioned layer (tests/lab/labhosts.py), its topology read (deploy.yml --tags topology), and reused by every
case. Each case drives the real user
command, `ansible-playbook deploy.yml --tags relaunch ...`; a fault is injected by taking a plan the planner made
(current_plan.json after a normal relaunch), adding SGLANG_SIM_FAULT to its env and passing it as the extra var
topolaunch_plan (extra vars win over the plan stage's fact). After each case: no GPU memory is held by anything but
the running unit, and a process of another user on a GPU outside the plan is still alive.

    .venv/bin/pytest -m lab tests/lab/test_lifecycle.py
"""
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys

import pytest
import yaml

import labhosts
from sweeplab import copied_inventory

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAB_PY = ROOT / "lab" / "lab.py"
NAME = "pytest-lifecycle"
SSH_PORT = 2229
SERVER_PORT = 31090
REPO_PORT = 18082
SSH_KEY = ROOT / ".lab" / "ssh" / "id_ed25519"
UNIT = "topolaunch-sglang.service"
IDLE_MIB = 560                          # memory_reserved_mib of the vnuma spec: a GPU with no process
SMALL_MODEL = "llama-2-7b"              # fits 4 GPUs, so that a plan can leave GPUs 4-7 to someone else

LAB_MISSING = os.geteuid() != 0 or not shutil.which("systemd-nspawn") or not shutil.which("debootstrap")
pytestmark = [pytest.mark.lab, pytest.mark.skipif(LAB_MISSING, reason="needs root, systemd-nspawn and debootstrap")]


class Host:
    def __init__(self, inventory):
        self.inventory = inventory

    def ssh(self, command, check=True):
        proc = subprocess.run(
            ["ssh", "-F", "/dev/null", "-i", str(SSH_KEY), "-p", str(SSH_PORT), "-o", "BatchMode=yes",
             "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
             "root@127.0.0.1", command], capture_output=True, text=True, check=False, timeout=120)
        if check:
            assert proc.returncode == 0, "ssh %r: rc %s %s" % (command, proc.returncode, proc.stderr)
        return proc.stdout

    def play(self, *args):
        """ansible-playbook deploy.yml against this host; returns (rc, output)."""
        env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        proc = subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(self.inventory),
                               "deploy.yml", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                              check=False, timeout=900)
        return proc.returncode, proc.stdout + proc.stderr

    def relaunch(self, *args):
        rc, out = self.play("--tags", "relaunch", *args)
        return rc, out

    def plan(self, name="current_plan.json"):
        return json.loads(self.ssh("cat /var/lib/topolaunch/" + name))

    def fault_plan_file(self, plan, fault, tmp_path):
        """An extra-vars file whose topolaunch_plan is `plan` with SGLANG_SIM_FAULT set."""
        plan = json.loads(json.dumps(plan))
        plan["env"]["SGLANG_SIM_FAULT"] = fault
        path = tmp_path / ("plan-%s.json" % fault.replace(":", "-"))
        path.write_text(json.dumps({"topolaunch_plan": plan}))
        return "@%s" % path

    def gpus(self):
        """Per GPU: used MiB and holder pids, read through NVML with the tools python."""
        code = ("import json, pynvml as n; n.nvmlInit(); out = []\n"
                "for i in range(n.nvmlDeviceGetCount()):\n"
                "    h = n.nvmlDeviceGetHandleByIndex(i)\n"
                "    out.append({'used_mib': n.nvmlDeviceGetMemoryInfo(h).used >> 20,"
                " 'pids': [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)]})\n"
                "print(json.dumps(out))")
        return json.loads(self.ssh("/opt/topolaunch/tools/bin/python -c %s" % shlex_quote(code)))

    def in_unit(self, pid):
        return ("/%s" % UNIT) in self.ssh("cat /proc/%d/cgroup 2>/dev/null || true" % pid)

    def healthy(self, port):
        return self.ssh("curl -s -o /dev/null -w '%%{http_code}' http://127.0.0.1:%d/health || true" % port) == "200"

    def start_foreign(self, gpu, title="foreign-trainer"):
        """A process of user nobody holding 10 GiB on `gpu` (registered with the fake NVML); returns its pid."""
        pid = int(self.ssh("runuser -u nobody -- bash -c 'exec -a %s sleep 100000 >/dev/null 2>&1 & echo $!'" % title))
        self.ssh("st=$(awk '{print $22}' /proc/%d/stat); d=${FAKE_NVML_STATE_DIR:-/run/fake-nvml}; "
                 "echo \"%d $st\" > $d/.%d.tmp && mv $d/.%d.tmp $d/%d.%d" % (pid, 10 << 30, pid, pid, pid, gpu))
        return pid

    def alive(self, pid):
        return self.ssh("test -d /proc/%d && awk '{print $3}' /proc/%d/stat || echo gone" % (pid, pid)).strip() not in ("gone", "Z")


def shlex_quote(s):
    return "'" + s.replace("'", "'\"'\"'") + "'"


def assert_only_the_unit_holds_gpus(host, plan):
    """Every NVML holder is in our unit; GPUs outside the plan are idle (or held by the foreign process only)."""
    for index, gpu in enumerate(host.gpus()):
        ours = [p for p in gpu["pids"] if host.in_unit(p)]
        others = [p for p in gpu["pids"] if p not in ours]
        if index in plan["gpu_indices"]:
            assert ours and not others, "GPU %d: holders %s, ours %s" % (index, gpu["pids"], ours)
        else:
            assert not ours, "GPU %d is not in the plan but our unit holds it: %s" % (index, ours)


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    inv = tmp_path_factory.mktemp("inventories") / NAME
    copied_inventory(
        inv, "pytest-lifecycle", REPO_PORT, topolaunch_port=SERVER_PORT,
        # Time no case measures: an instant load, a drain that notices SIGTERM at once (SGLang polls every 5 s),
        # a short TimeoutStopSec (a server that ignores SIGTERM is SIGKILLed after 4 s instead of 10 s).
        launch_extra_env={"SGLANG_SIM_LOAD_SECONDS": "0", "SGLANG_SIM_CAPTURE_SECONDS": "0",
                          "SGLANG_SIM_DRAIN_POLL_SECONDS": "0.2"},
        launch_drain_timeout=2, launch_stop_margin=2, health_startup_timeout=60, health_chunk_seconds=5)
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_hosts": {"children": {"sglang_servers": {
        "hosts": {"lc": {"ansible_port": SSH_PORT, "lab_gpu_spec": "proxmox-8x-rtx-pro-6000-vnuma",
                         **labhosts.provisioned()}}}}}}}}))
    up = subprocess.run([sys.executable, str(LAB_PY), "-i", str(inv), "up"], capture_output=True, text=True,
                        check=False, timeout=900)
    assert up.returncode == 0, up.stdout + up.stderr
    h = Host(inv)
    try:
        rc, out = h.play("--tags", "topology")
        assert rc == 0, out[-4000:]
        model = ROOT / "tests" / "fixtures" / "models" / SMALL_MODEL
        tar = subprocess.run(["tar", "-C", str(model), "-cf", "-", "."], capture_output=True, check=True).stdout
        subprocess.run(["ssh", "-F", "/dev/null", "-i", str(SSH_KEY), "-p", str(SSH_PORT), "-o", "BatchMode=yes",
                        "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                        "root@127.0.0.1", "mkdir -p /srv/models/%s && tar -C /srv/models/%s -xf -" % (SMALL_MODEL, SMALL_MODEL)],
                       input=tar, check=True, timeout=60)
        yield h
    finally:
        subprocess.run([sys.executable, str(LAB_PY), "-i", str(inv), "down", "--purge"], capture_output=True,
                       text=True, check=False, timeout=300)


@pytest.fixture(scope="module")
def good_tp8(host):
    """tp8 healthy and recorded as last known good; returns its plan."""
    rc, out = host.relaunch("-e", "layout=tp8")
    assert rc == 0, out[-4000:]
    return host.plan("last_good_plan.json")


@pytest.fixture(scope="module")
def tp4pp2(host, good_tp8):
    """The planner's tp4pp2 plan (launched once), then tp8 back in place."""
    rc, out = host.relaunch("-e", "layout=tp4pp2")
    assert rc == 0, out[-4000:]
    plan = host.plan()
    rc, out = host.relaunch("-e", "layout=tp8")
    assert rc == 0, out[-4000:]
    return plan


def test_switching_tp8_and_tp4pp2_repeatedly(host, good_tp8):
    for layout in ("tp4pp2", "tp8", "tp4pp2", "tp8"):
        rc, out = host.relaunch("-e", "layout=%s" % layout)
        assert rc == 0, out[-4000:]
        plan = host.plan()
        assert plan["layout"]["name"] == layout
        assert host.healthy(plan["port"])
        assert "serves" in out and "(%s on GPUs" % layout in out
        assert_only_the_unit_holds_gpus(host, plan)


def test_same_plan_without_tags_is_left_running(host, good_tp8):
    before = host.ssh("systemctl show -p InvocationID --value %s" % UNIT)
    rc, out = host.play("--tags", "plan,cleanup,launch,health", "-e", "layout=tp8", "-e", "launch_force=false")
    assert rc == 0, out[-4000:]
    assert "Leaving the server running: the same plan already runs" in out, out[-6000:]
    assert host.ssh("systemctl show -p InvocationID --value %s" % UNIT) == before


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
    rc, out = host.relaunch("-e", "layout=tp8")
    assert rc == 0, out[-4000:]


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
    # health's own /generate and its answer probe were the first two requests: the server answers two more, then dies.
    codes = host.ssh("for i in 1 2 3 4; do curl -s -m 5 -o /dev/null -w '%%{http_code} ' http://127.0.0.1:%d/generate "
                     "-d '{\"text\": \"hi\", \"sampling_params\": {\"max_new_tokens\": 2}}'; done; true" % port)
    assert codes.split() == ["200", "200", "000", "000"], codes
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


def test_foreign_process_on_another_gpu_survives_and_one_on_ours_stops_the_play(host, good_tp8):
    small = ["-e", "topolaunch_model_path=/srv/models/%s" % SMALL_MODEL, "-e", "topolaunch_served_model_name=%s" % SMALL_MODEL,
             "-e", '{"topolaunch_gpus": [0, 1, 2, 3]}', "-e", "layout=tp4"]
    rc, out = host.relaunch(*small)
    assert rc == 0, out[-4000:]
    foreign = host.start_foreign(6)
    try:
        for layout in ("tp2pp2", "tp4"):
            rc, out = host.relaunch(*small[:-1], "layout=%s" % layout)
            assert rc == 0, out[-4000:]
            assert host.alive(foreign)
            assert foreign in host.gpus()[6]["pids"]
        intruder = host.start_foreign(2, title="foreign-on-our-gpu")
        rc, out = host.relaunch(*small)
        assert rc != 0
        assert "pid %d user nobody cmdline 'foreign-on-our-gpu 100000' on GPU 2" % intruder in out
        assert host.alive(intruder) and host.alive(foreign)
        assert host.ssh("systemctl is-active %s || true" % UNIT).strip() == "active"   # nothing was stopped
        host.ssh("kill %d" % intruder)
    finally:
        host.ssh("kill %d || true" % foreign)
    rc, out = host.relaunch("-e", "layout=tp8")
    assert rc == 0, out[-4000:]


def test_a_plan_for_other_gpus_is_refused_before_anything_is_stopped(host, good_tp8, tmp_path):
    """Validate is one call on the host before cleanup: a plan made for another topology fails there, naming both
    fingerprints, and the running server is untouched."""
    before = host.ssh("systemctl show -p InvocationID --value %s" % UNIT)
    other = dict(good_tp8, topology_fingerprint="0123456789ab")
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"topolaunch_plan": other}))
    rc, out = host.relaunch("-e", "@%s" % path)
    assert rc != 0
    assert "the plan was made for topology 0123456789ab but this host reads %s" % good_tp8["topology_fingerprint"] in out
    assert "nothing was stopped" in out and "TASK [topolaunch.sglang.cleanup" not in out
    assert host.ssh("systemctl show -p InvocationID --value %s" % UNIT) == before


def test_a_port_held_out_of_the_hosts_view_is_refused_before_anything_is_stopped(host, good_tp8):
    """Issue 29: something outside the host's view (here this controller, whose network the lab host shares, as a
    container shares a VM's) listens on the server's port on another address: the host's /proc shows the socket and
    no process holding it. Validate refuses naming the port; nothing is stopped and the old server still serves."""
    rc, out = host.relaunch("-e", "layout=tp8")
    assert rc == 0, out[-4000:]
    before = host.ssh("systemctl show -p InvocationID --value %s" % UNIT)
    with socket.socket() as outside:
        outside.bind(("127.0.0.2", SERVER_PORT))
        outside.listen()
        rc, out = host.relaunch("-e", "layout=tp4pp2")
    assert rc != 0
    assert "port %d: something listens on it that no process this host's /proc shows holds" % SERVER_PORT in out, \
        out[-4000:]
    assert "nothing was stopped" in out and "TASK [topolaunch.sglang.launch : Replace" not in out
    assert host.ssh("systemctl show -p InvocationID --value %s" % UNIT) == before
    assert host.healthy(SERVER_PORT)
    rc, out = host.relaunch("-e", "layout=tp8")        # the port free again: relaunches as before
    assert rc == 0, out[-4000:]


def typed_extra_vars(inventory, name="lc"):
    """`-e name=value` for every numeric and boolean variable of the roles' argument specs (and the shared role's
    defaults), at the value this inventory gives it (else the role's default): as strings, as a command line gives
    them. Left out: variables the roles set themselves (set_fact: an extra var would override the role's own) and
    those whose default is a template (their source variable is passed)."""
    out = subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-inventory"), "-i", str(inventory), "--host", name],
                         capture_output=True, text=True, check=True, timeout=120,
                         env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg")))
    given = json.loads(out.stdout)
    set_by_roles = set()
    for path in ROOT.glob("roles/*/tasks/*.yml"):
        for task in yaml.safe_load(path.read_text()) or []:
            for t in [task] + list(task.get("block") or []) + list(task.get("rescue") or []):
                set_by_roles |= set((t.get("ansible.builtin.set_fact") or {}).keys())
    values = {}
    for spec_path in sorted(ROOT.glob("roles/*/meta/argument_specs.yml")):
        defaults = yaml.safe_load((spec_path.parents[1] / "defaults" / "main.yml").read_text()) or {}
        for spec in yaml.safe_load(spec_path.read_text())["argument_specs"].values():
            for name, option in (spec.get("options") or {}).items():
                if option.get("type") in ("int", "float", "bool") and name not in set_by_roles:
                    values[name] = given.get(name, defaults.get(name))
    for name, value in yaml.safe_load((ROOT / "roles" / "topolaunch" / "defaults" / "main.yml").read_text()).items():
        if isinstance(value, (bool, int)):
            values[name] = given.get(name, value)
    args = []
    for name, value in sorted(values.items()):
        if isinstance(value, bool):
            args += ["-e", "%s=%s" % (name, str(value).lower())]
        elif isinstance(value, (int, float)) or (isinstance(value, str) and "{{" not in value and value):
            args += ["-e", "%s=%s" % (name, value)]
    return args


def test_every_numeric_and_boolean_variable_works_given_as_an_extra_var_string(host, good_tp8):
    """Issue 29: `-e bench_point_timeout=600` crashed the bench. The whole deploy.yml (provision to bench), every
    numeric and boolean variable given as `-e name=value` at its value: it passes and changes nothing."""
    extra = typed_extra_vars(host.inventory)
    assert any(a.startswith("bench_point_timeout=") for a in extra) and "launch_hardening=true" in extra
    assert len(extra) > 100, extra                     # 2 per variable: more than 50 variables
    rc, out = host.play(*extra)
    assert rc == 0, out[-6000:]
    assert "'>=' not supported" not in out and "Traceback" not in out


def changed_tasks(out):
    """The tasks an ansible-playbook run reported changed, and the recap's changed count."""
    changed, task = [], None
    for line in out.splitlines():
        if line.startswith("TASK ["):
            task = line
        elif line.startswith("changed: "):
            changed.append(task)
    recap = [int(word.split("=")[1]) for line in out.splitlines() if line.startswith("lc ") and "changed=" in line
             for word in line.split() if word.startswith("changed=")]
    return changed, recap


def test_a_second_run_and_check_mode_change_nothing(host, good_tp8):
    """On a converged host (the whole deploy.yml ran, bench included), deploy.yml again and deploy.yml --check report
    changed=0: the same plan's server is kept with its record, health of an untouched server writes nothing, a server
    already measured at this workload is not measured again, provisioning predicts no pip install."""
    rc, out = host.play()
    assert rc == 0, out[-6000:]
    for args in ((), ("--check",)):
        rc, out = host.play(*args)
        assert rc == 0, out[-6000:]
        changed, recap = changed_tasks(out)
        assert recap == [0] and changed == [], (args, changed, recap)
        assert "Leaving the server running: the same plan already runs" in out
        assert "up for " in out and "s, not restarted" in out
        assert "is already measured at this workload" in out


GW_MODEL = "llama-3.1-70b"              # the 70B stand-in: one TP4 replica per socket of the field spec


def _replica_requests(host, port):
    """Replica's own request counter (sglang:num_requests_total summed; no sample before its first request: 0)."""
    out = host.ssh("curl -s http://127.0.0.1:%d/metrics" % port)
    return sum(float(l.rsplit(" ", 1)[1]) for l in out.splitlines() if l.startswith("sglang:num_requests_total{"))


def _ask_gateway(host, i):
    body = json.dumps({"text": "%08x q%d" % (i * 2654435761 % 2 ** 32, i), "sampling_params": {"max_new_tokens": 4}})
    return host.ssh("curl -s -o /dev/null -w '%%{http_code}' -m 20 -H 'Content-Type: application/json' "
                    "-d '%s' http://127.0.0.1:%d/generate" % (body, SERVER_PORT))


def test_tp4dp2_replicas_behind_the_gateway_survive_a_killed_replica(host):
    model = ROOT / "tests" / "fixtures" / "models" / GW_MODEL
    tar = subprocess.run(["tar", "-C", str(model), "-cf", "-", "."], capture_output=True, check=True).stdout
    host.ssh("mkdir -p /srv/models/%s" % GW_MODEL)
    subprocess.run(["ssh", "-F", "/dev/null", "-i", str(SSH_KEY), "-p", str(SSH_PORT), "-o", "BatchMode=yes",
                    "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                    "root@127.0.0.1", "tar -C /srv/models/%s -xf -" % GW_MODEL], input=tar, check=True, timeout=60)
    try:
        rc, out = host.relaunch("-e", "layout=tp4dp2", "-e", "topolaunch_model_path=/srv/models/" + GW_MODEL)
        assert rc == 0, out[-6000:]
        assert "topolaunch-sglang@1.service on GPUs 4,5,6,7 port %d NUMA 1" % (SERVER_PORT + 2) in out
        units = {}
        for i in (0, 1):
            unit = "topolaunch-sglang@%d.service" % i
            assert host.ssh("systemctl is-active %s" % unit).strip() == "active"
            cmd = host.ssh("systemctl show -p ExecStart --value %s" % unit)
            numa = re.search(r"--numa-node ([0-9 ]+)", cmd.replace(" ; ", " ")).group(1).split()
            assert set(numa) == {str(i)}, cmd
            units[i] = json.loads(host.ssh("cat /var/lib/topolaunch/replica-%d/current_plan.json" % i))
        assert [units[i]["gpu_indices"] for i in (0, 1)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
        assert host.ssh("systemctl is-active topolaunch-gateway.service").strip() == "active"
        assert host.ssh("systemctl is-active %s || true" % UNIT).strip() != "active"
        ports = [units[i]["port"] for i in (0, 1)]
        before = [_replica_requests(host, p) for p in ports]
        assert [_ask_gateway(host, i) for i in range(16)] == ["200"] * 16
        grown = [_replica_requests(host, p) - b for p, b in zip(ports, before)]
        assert all(g > 0 for g in grown), grown
        # bad input: one line naming the field, before anything stops
        ids = "systemctl show -p InvocationID --value topolaunch-sglang@0.service topolaunch-gateway.service"
        before_ids = host.ssh(ids)
        for extra, field in ((["-e", '{"topolaunch_replica_ports": [%d, %d]}' % (SERVER_PORT, SERVER_PORT + 5)],
                              "topolaunch_replica_ports[0]: port %d is the gateway's port" % SERVER_PORT),
                             (["-e", "topolaunch_gateway=always", "-e", "topolaunch_gateway_version=9.9"],
                              "topolaunch_gateway_version: '9.9' is not in topolaunch_gateway_releases")):
            rc, out = host.relaunch("-e", "layout=tp4dp2", "-e", "topolaunch_model_path=/srv/models/" + GW_MODEL,
                                    *extra)
            assert rc != 0 and field in out, out[-4000:]
            assert "Traceback" not in out
        assert host.ssh(ids) == before_ids
        # one replica SIGKILLed: the gateway routes around it, systemd brings it back, the gateway uses it again
        host.ssh("systemctl kill -s SIGKILL topolaunch-sglang@1.service")
        assert [_ask_gateway(host, 100 + i) for i in range(8)] == ["200"] * 8
        deadline = 90
        for k in range(deadline):
            before1 = _replica_requests(host, ports[1]) if host.healthy(ports[1]) else None
            if before1 is not None:
                assert [_ask_gateway(host, 200 + 8 * k + j) for j in range(8)] == ["200"] * 8
                if _replica_requests(host, ports[1]) > before1:
                    break
            host.ssh("sleep 1")          # one poll a second, bounded by the deadline
        else:
            pytest.fail("the restarted replica was not used again within %d s" % deadline)
    finally:
        rc, out = host.relaunch("-e", "layout=tp8")
        assert rc == 0, out[-6000:]
        left = host.ssh("ls /etc/systemd/system | grep -c 'topolaunch-sglang@\\|topolaunch-gateway' || true")
        assert left.strip() == "0", left
