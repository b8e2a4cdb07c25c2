"""Server lifecycle on a lab host: relaunch between layouts, a kept plan, foreign processes, refusals before any stop,
`-e` strings, a converged second run.

One host (ssh 127.0.0.1:2229, server port 31090, repo server 18082, state in .lab/pytest-lifecycle/): tests/lab/lifecyclelab.py.
After each case: no GPU memory is held by anything but the running unit, and a process of another user on a GPU
outside the plan is still alive.

    .venv/bin/pytest -m lab tests/lab/test_lifecycle.py
"""
import json
import os
import signal
import socket
import subprocess

import pytest
import yaml

from lifecyclelab import LAB_MISSING, ROOT, SMALL_MODEL, UNIT, assert_only_the_unit_holds_gpus, booted_host

NAME, SSH_PORT, SERVER_PORT, REPO_PORT = "pytest-lifecycle", 2229, 31090, 18082
pytestmark = [pytest.mark.lab, pytest.mark.skipif(LAB_MISSING, reason="needs root, systemd-nspawn and debootstrap")]


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    yield from booted_host(tmp_path_factory, NAME, SSH_PORT, SERVER_PORT, REPO_PORT)


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
                    value = given.get(name, defaults.get(name))
                    if isinstance(value, str) and "{{" in value:     # the inventory's template: the role's default
                        value = defaults.get(name)
                    values[name] = value
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


# The whole deploy.yml costs a minute of CPU in the lab: the case below reads the run before it (file order), and
# runs its own when run alone.
RUNS = {}


def test_a_second_run_and_check_mode_change_nothing(host, good_tp8):
    """On a converged host (the whole deploy.yml ran, bench included), deploy.yml again and deploy.yml --check report
    changed=0: the same plan's server is kept with its record, health of an untouched server writes nothing, a server
    already measured at this workload is not measured again, provisioning predicts no pip install. The second run is
    the one with ansible.cfg's stdout callback, which the case below reads."""
    rc, out = host.play()
    assert rc == 0, out[-6000:]
    for args, brief in (((), True), (("--check",), False)):
        rc, out = host.play(*args, brief=brief)
        assert rc == 0, out[-6000:]
        changed, recap = changed_tasks(out)
        assert recap == [0] and changed == [], (args, changed, recap)
        assert "Leaving the server running: the same plan already runs" in out
        assert "up for " in out and "s, not restarted" in out
        assert "is already measured at this workload" in out
        if brief:
            RUNS["noop_brief"] = out


NOOP_LINE_BUDGET = 60       # a no-op deploy.yml, default verbosity, one host (the README states it)


def test_the_output_shows_the_lines_that_matter(host, good_tp8):  # after the converging test above (file order)
    """Issue 29 item 7 (and 25 item 18): a no-op deploy.yml printed 780-900 lines; a failed plan printed its reason
    twice in 3.5-4 KB of JSON. With the stdout callback ansible.cfg sets (callback_plugins/brief.py), a converged
    host's whole deploy.yml (the case above's second run) says in a few lines that nothing changed and why, and a
    failed plan says its reason once; -v still prints every result."""
    out = RUNS.get("noop_brief")
    if out is None:
        rc, out = host.play(brief=True)
        assert rc == 0, out[-6000:]
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) <= NOOP_LINE_BUDGET, "%d lines (budget %d):\n%s" % (len(lines), NOOP_LINE_BUDGET, out)
    for words in ("Leaving the server running: the same plan already runs", "s, not restarted",
                  "is already measured at this workload", "lc                         : ok="):
        assert words in out, (words, out)
    assert "skipping: [" not in out and "ok: [" not in out and "included: " not in out
    assert "changed=0" in out, out[-2000:]
    rc, out = host.play("--tags", "plan", "-e", "layout=tp3", brief=True)
    assert rc != 0
    failed = [line for line in out.splitlines() if "FAILED: " in line]      # a rescue failing again: "(the reason above)"
    assert len(failed) == 1 and '"candidates"' not in out and "[ERROR]" not in out, out
    assert max(len(line) for line in out.splitlines()) < 1000, out
    rc, out = host.play("--tags", "plan", "-e", "layout=tp3", "-v", brief=True)
    assert rc != 0 and "fatal: [lc]: FAILED! =>" in out                  # the whole result at -v

LOCK_HELD_FOR_TP4PP2 = """import json, os, sys
try:
    pid = int(open("/run/topolaunch/relaunch.lock").read().split()[0])
    os.kill(pid, 0)
    sys.exit(json.load(open("/var/lib/topolaunch/current_plan.json"))["layout"]["name"] != "tp4pp2")
except (OSError, ValueError, IndexError, KeyError):
    sys.exit(1)"""


def test_every_numeric_and_boolean_variable_works_given_as_an_extra_var_string(host, good_tp8):  # after the above
    """Issue 29: `-e bench_point_timeout=600` crashed the bench. On the host the cases above converged (run alone: a
    plain deploy first), the whole deploy.yml (provision to bench) with every numeric and boolean variable given as
    `-e name=value` at its value passes and changes nothing: each variable means the same from the command line as
    from the inventory or a role's default (the watchdog's stop deadlines were the cleanup role's only in a play that
    had that role, and its own 10 s otherwise: such a run rewrote the watchdog)."""
    if "noop_brief" not in RUNS:
        rc, out = host.play()
        assert rc == 0, out[-6000:]
    extra = typed_extra_vars(host.inventory)
    assert any(a.startswith("bench_point_timeout=") for a in extra) and "launch_hardening=true" in extra
    assert "topolaunch_kill_timeout=15" in extra
    assert len(extra) > 100, extra                     # 2 per variable: more than 50 variables
    rc, out = host.play(*extra)
    assert rc == 0, out[-6000:]
    assert "'>=' not supported" not in out and "Traceback" not in out
    changed, recap = changed_tasks(out)
    assert recap == [0] and changed == [], (changed, recap)


def test_two_relaunches_at_once_the_second_waits_then_fails_naming_the_first(host, good_tp8):
    """Issue 25 item 6: two `--tags relaunch` runs at once interleaved (the second's restart failed the first's
    health, which rolled back on top of it). The first run holds the relaunch lock from validate to the end of
    health; the second waits launch_relaunch_lock_wait seconds, fails naming the holder, and stops nothing: the
    first run's server comes up and stays (the same main pid), serving."""
    slow = json.dumps({"launch_extra_env": {"SGLANG_SIM_LOAD_SECONDS": "20", "SGLANG_SIM_CAPTURE_SECONDS": "0",
                                            "SGLANG_SIM_DRAIN_POLL_SECONDS": "0.2"}})
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    first = subprocess.Popen([str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(host.inventory),
                              "deploy.yml", "--tags", "relaunch", "-e", "layout=tp4pp2", "-e", slow],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
    frozen = False
    try:
        # The first run holds the lock once its launch wrote its plan (the layout's name, parsed: a tp8 plan names
        # tp4pp2 among its candidates) and the lock file names a live holder (the file keeps its last holder's line)
        host.ssh("cat > /run/lock-held.py <<'EOF'\n%s\nEOF" % LOCK_HELD_FOR_TP4PP2)
        host.ssh("timeout 120 sh -c 'until python3 /run/lock-held.py; do sleep 0.2; done'")
        # The first run's controller is frozen while the second runs (the lock's holder lives on the host, and a
        # health call in flight ends within its 5 s chunk, long before the 20 s load): without it the first run
        # could finish before the second reached its validate on a loaded machine (CI), and the second then
        # rightly took the free lock.
        os.killpg(first.pid, signal.SIGSTOP)
        frozen = True
        rc, out = host.relaunch("-e", "layout=tp8", "-e", "launch_relaunch_lock_wait=2")
        os.killpg(first.pid, signal.SIGCONT)
        frozen = False
        first_out, _ = first.communicate(timeout=600)
    finally:
        if frozen:
            os.killpg(first.pid, signal.SIGCONT)
        if first.poll() is None:
            first.kill()
    assert rc != 0 and "relaunch_lock: the relaunch lock /run/topolaunch/relaunch.lock was not had within 2s: another " \
        "run holds it (pid " in out, "second run:\n%s\nfirst run:\n%s" % (out[-3000:], first_out[-3000:])
    assert 'for play "Relaunch' in out and "nothing was stopped" in out and "TASK [topolaunch.sglang.cleanup" not in out
    assert first.returncode == 0, first_out[-4000:]
    assert "serves" in first_out and "(tp4pp2 on GPUs" in first_out
    plan = host.plan()
    assert plan["layout"]["name"] == "tp4pp2" and host.healthy(plan["port"])
    rc, out = host.relaunch("-e", "layout=tp8")
    assert rc == 0, out[-4000:]


def test_a_full_state_directory_is_refused_before_the_running_server_is_stopped(host, good_tp8):
    """Issue 25 item 5: a full disk under the state directory turned a healthy server into an outage (ENOSPC after
    cleanup). Here /var/lib/topolaunch is a small tmpfs holding its own files and filled up: the relaunch is refused
    in validate naming the directory, and the running server is untouched (same unit start, serving)."""
    before = host.ssh("systemctl show -p InvocationID --value %s" % UNIT)
    host.ssh("set -e; d=/var/lib/topolaunch; mkdir -p /run/tl-full; cp -a $d/. /run/tl-full/; "
             "mount -t tmpfs -o size=2m,mode=0755 tmpfs $d; cp -a /run/tl-full/. $d/; "
             "dd if=/dev/zero of=$d/.filler bs=64k 2>/dev/null || true")
    try:
        rc, out = host.relaunch("-e", "layout=tp4pp2")
    finally:
        host.ssh("umount /var/lib/topolaunch && rm -rf /run/tl-full")
    assert rc != 0 and "bytes free, the launch needs" in out and "/var/lib/topolaunch" in out, out[-4000:]
    assert "nothing was stopped" in out and "TASK [topolaunch.sglang.cleanup" not in out
    assert host.ssh("systemctl show -p InvocationID --value %s" % UNIT) == before
    assert host.healthy(SERVER_PORT)
