"""gpu_cleanup logic against the fake NVML and real processes spawned here.

Processes are real children (some renamed with `exec -a` the way setproctitle names SGLang's schedulers), their GPU
memory registered with the fake NVML. "Our service user" is `nobody`, a "foreign user" is `daemon` or root; tests
that switch users need root (CI runs as root).
"""
import json
import os
import socket
import subprocess
import time

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils.cleanup import (DEFAULTS, CleanupError, _summary, classify, cleanup, in_unit_cgroup, port_problem,
                                stop_unit)
import paths
from cleanup_cases import GIB, OTHER, OURS, _alive, _opts, _wait_for, needs_root, nvml, procs, subreaper  # noqa: F401  pylint: disable=unused-import  (fixtures)

ROOT = paths.ROOT


# ------------------------------------------------------------------------------------------- pure logic

def test_in_unit_cgroup_matches_whole_path_segments():
    assert in_unit_cgroup("0::/system.slice/topolaunch-sglang.service\n", "topolaunch-sglang.service")
    assert in_unit_cgroup("12:pids:/\n1:name=systemd:/system.slice/topolaunch-sglang.service\n",
                          "topolaunch-sglang.service")
    assert in_unit_cgroup("0::/system.slice/topolaunch-sglang.service/worker\n", "topolaunch-sglang.service")
    assert not in_unit_cgroup("0::/system.slice/topolaunch-sglang.service-old\n", "topolaunch-sglang.service")
    assert not in_unit_cgroup("0::/user.slice/user-0.slice/session-1.scope\n", "topolaunch-sglang.service")


@pytest.mark.parametrize("cgroup", [
    # A user's own unit of the same name: not the system's.
    "0::/user.slice/user-1000.slice/user@1000.service/app.slice/topolaunch-sglang.service\n",
    # A container's nested copy (its systemd's unit, seen from the host).
    "0::/machine.slice/machine-tl.scope/payload/system.slice/topolaunch-sglang.service\n",
    "0::/system.slice/docker-1a2b.scope/system.slice/topolaunch-sglang.service\n",
    "1:name=systemd:/user.slice/user-1000.slice/user@1000.service/topolaunch-sglang.service\n0::/\n",
    "0::/topolaunch-sglang.service\n",
])
def test_only_the_system_units_own_cgroup_is_ours(cgroup):
    assert not in_unit_cgroup(cgroup, "topolaunch-sglang.service")
    info = {"cgroup": cgroup, "uid": 1000, "user": "alice", "title": "sglang::scheduler_TP0", "cmdline": ""}
    assert classify(info, "topolaunch-sglang.service", "sglang", ["sglang::"], []) == (False, ["sglang title"])


def test_classify_needs_cgroup_or_service_user():
    base = {"cgroup": "0::/user.slice\n", "uid": 1000, "user": "alice", "title": "python", "cmdline": "python x.py"}
    assert classify(base, "u.service", "sglang", ["sglang::"], ["sglang.launch_server"]) == (False, [])
    other_sglang = dict(base, title="sglang::scheduler_PP0_TP0")
    assert classify(other_sglang, "u.service", "sglang", ["sglang::"], []) == (False, ["sglang title"])
    own = dict(other_sglang, uid=999, user="sglang")
    assert classify(own, "u.service", "sglang", ["sglang::"], []) == (True, ["service user", "sglang title"])
    in_unit = dict(base, cgroup="0::/system.slice/u.service\n")
    assert classify(in_unit, "u.service", "", [], []) == (True, ["unit cgroup"])
    launcher = dict(base, uid=999, user="sglang",
                    cmdline="/opt/sglang/venvs/0.5.9/bin/python -m sglang.launch_server --tp-size 8")
    assert classify(launcher, "u.service", "sglang", ["sglang::"], ["sglang.launch_server"]) == \
        (True, ["service user", "sglang title"])


def test_users_are_compared_by_name():
    """Another name on the service user's uid (or a uid this host cannot name) is not the service user."""
    info = {"cgroup": "0::/\n", "uid": 999, "user": "sglang-old", "title": "x", "cmdline": ""}
    assert classify(info, "u.service", "sglang", [], []) == (False, [])
    assert classify(dict(info, user="999"), "u.service", "sglang", [], []) == (False, [])
    assert classify(dict(info, user="sglang"), "u.service", "sglang", [], []) == (True, ["service user"])


# ------------------------------------------------------------------------------------------- real processes

@needs_root
def test_ours_are_stopped_with_sigterm_and_memory_released(nvml, procs, tmp_path):
    a = procs.spawn("sglang::scheduler_PP0_TP0", OURS, gpus=[0])
    b = procs.spawn("sglang::scheduler_PP0_TP1", OURS, gpus=[1])
    assert nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(0)).used > 40 * GIB
    res = cleanup(_opts(tmp_path), nvml)
    assert not _alive(a) and not _alive(b)
    stopped = {p["pid"]: p for p in res["stopped"]}
    assert set(stopped) == {a, b}
    assert stopped[a]["signal"] == "SIGTERM" and stopped[a]["user"] == OURS
    assert stopped[a]["title"] == "sglang::scheduler_PP0_TP0" and stopped[a]["gpus"] == {0: 40 * GIB}
    assert res["changed"] is True
    for g in res["gpus"]:
        assert g["used_bytes"] == 560 << 20, g
    assert "stopped 2 process(es)" in res["summary"] and "by SIGTERM" in res["summary"]


@needs_root
def test_sigterm_ignoring_process_is_killed_after_the_deadline(nvml, procs, tmp_path):
    stubborn = procs.spawn("sglang::scheduler_PP1_TP0", OURS, ignore_term=True, gpus=[2])
    polite = procs.spawn("sglang::detokenizer", OURS, gpus=[3])
    t0 = time.monotonic()
    res = cleanup(_opts(tmp_path, term_timeout=0.6), nvml)
    took = time.monotonic() - t0
    stopped = {p["pid"]: p for p in res["stopped"]}
    assert stopped[stubborn]["signal"] == "SIGKILL"
    assert stopped[polite]["signal"] == "SIGTERM"
    assert stopped[stubborn]["ended_after_s"] >= 0.6
    assert took >= 0.6 and not _alive(stubborn)


@needs_root
def test_foreign_process_on_our_gpu_fails_and_nothing_is_touched(nvml, procs, tmp_path):
    ours = procs.spawn("sglang::scheduler_PP0_TP0", OURS, gpus=[0])
    foreign = procs.spawn(None, OTHER, gpus=[1], body="sleep 601")
    with pytest.raises(CleanupError) as err:
        cleanup(_opts(tmp_path), nvml)
    msg = str(err.value)
    assert "pid %d" % foreign in msg and "user %s" % OTHER in msg and "sleep 601" in msg and "GPU 1" in msg
    assert "cleanup_stop_foreign=true" in msg
    assert _alive(ours) and _alive(foreign)
    assert err.value.result["stopped"] == []


@needs_root
def test_another_users_sglang_is_foreign_and_stop_foreign_stops_it(nvml, procs, tmp_path):
    theirs = procs.spawn("sglang::scheduler_PP0_TP0", "root", gpus=[0])
    with pytest.raises(CleanupError, match=r"pid %d user root cmdline 'sglang::scheduler_PP0_TP0 600' on GPU 0" % theirs):
        cleanup(_opts(tmp_path), nvml)
    assert _alive(theirs)
    res = cleanup(_opts(tmp_path, stop_foreign=True), nvml)
    assert [p["pid"] for p in res["stopped"]] == [theirs] and res["stopped"][0]["ours"] is False
    assert not _alive(theirs)


@needs_root
def test_foreign_process_on_another_gpu_survives(nvml, procs, tmp_path):
    ours = procs.spawn("sglang::scheduler_PP0_TP0", OURS, gpus=[0])
    foreign = procs.spawn(None, OTHER, gpus=[5], body="sleep 602")
    # Our service user's process on a GPU outside the plan is not touched either.
    ours_elsewhere = procs.spawn("sglang::scheduler_PP0_TP0", OURS, gpus=[6])
    res = cleanup(_opts(tmp_path), nvml)
    assert not _alive(ours)
    assert _alive(foreign) and _alive(ours_elsewhere)
    assert {p["pid"] for p in res["left_alone"]} == {foreign, ours_elsewhere}
    assert [p["pid"] for p in res["stopped"]] == [ours]


@needs_root
def test_orphan_reparented_after_its_launcher_died_is_found_through_nvml(nvml, procs, tmp_path, subreaper):
    orphan = procs.spawn_orphan("sglang::scheduler_PP0_TP3", OURS, gpus=[3])
    with open("/proc/%d/stat" % orphan) as f:
        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    assert ppid == os.getpid()          # its launcher is gone; it was adopted by the (sub)reaper
    res = cleanup(_opts(tmp_path), nvml)
    assert [p["pid"] for p in res["stopped"]] == [orphan]
    assert not _alive(orphan)


@needs_root
def test_check_mode_reports_and_stops_nothing(nvml, procs, tmp_path):
    ours = procs.spawn("sglang::scheduler_PP0_TP0", OURS, gpus=[0])
    res = cleanup(_opts(tmp_path), nvml, check_mode=True)
    assert _alive(ours)
    assert [p["pid"] for p in res["would_stop"]] == [ours] and res["stopped"] == []
    assert res["changed"] is True and "would stop 1 process" in res["summary"]


@needs_root
def test_running_plan_gpus_and_port_are_added(nvml, procs, tmp_path):
    old = procs.spawn("sglang::scheduler_PP1_TP3", OURS, gpus=[7])
    (tmp_path / "current_plan.json").write_text(json.dumps({"gpu_indices": [4, 5, 6, 7], "port": 31999}))
    res = cleanup(_opts(tmp_path, gpu_indices=[0, 1]), nvml)
    assert res["gpu_indices"] == [0, 1, 4, 5, 6, 7] and res["ports"] == [31999]
    assert [p["pid"] for p in res["stopped"]] == [old]
    assert res["plan"] == {"gpu_indices": [4, 5, 6, 7], "port": 31999}      # the plan it stopped


@needs_root
def test_the_running_plan_is_found_in_the_state_dir(nvml, procs, tmp_path):
    (tmp_path / "current_plan.json").write_text(json.dumps({"gpu_indices": [6], "port": 31998}))
    opts = dict(_opts(tmp_path, gpu_indices=[0]), current_plan_path=None, state_dir=str(tmp_path))
    res = cleanup(opts, nvml)
    assert res["gpu_indices"] == [0, 6] and res["ports"] == [31998] and res["plan"]["port"] == 31998


def _listener(user):
    code = ("import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
            "s.bind(('127.0.0.1', 0)); s.listen(); print(s.getsockname()[1], flush=True); sys.stdin.read()")
    p = subprocess.Popen(["python3", "-c", code], user=user, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return p, int(p.stdout.readline())


@needs_root
def test_our_launcher_on_the_port_is_stopped_and_the_port_closes(nvml, tmp_path):
    p, port = _listener(OURS)
    try:
        res = cleanup(_opts(tmp_path, ports=[port]), nvml)
        assert [s["pid"] for s in res["stopped"]] == [p.pid] and res["stopped"][0]["ports"] == [port]
        assert p.wait(timeout=5) == -15
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0
    finally:
        p.kill()
        p.wait()


@needs_root
def test_foreign_listener_on_our_port_fails(nvml, tmp_path):
    p, port = _listener("root")
    try:
        with pytest.raises(CleanupError, match=r"pid %d user root .* listening on port %d" % (p.pid, port)):
            cleanup(_opts(tmp_path, ports=[port]), nvml)
        assert p.poll() is None
    finally:
        p.kill()
        p.wait()


def test_release_timeout_says_what_it_waited_for(nvml, tmp_path):
    with pytest.raises(CleanupError) as err:
        cleanup(_opts(tmp_path, memory_threshold_mib=100, release_timeout=0.3), nvml)
    msg = str(err.value)
    assert "timed out after 0.3s waiting for GPUs [0, 1, 2, 3] to be released" in msg
    assert "GPU 0 used memory 560 MiB > threshold 100 MiB" in msg


def test_bad_gpu_index_fails_before_anything_happens(nvml, tmp_path):
    with pytest.raises(CleanupError, match=r"gpu_indices \[9\]: this host has 8 GPUs"):
        cleanup(_opts(tmp_path, gpu_indices=[0, 9]), nvml)


def test_unreadable_running_plan_is_named(nvml, tmp_path):
    (tmp_path / "current_plan.json").write_text("{not json")
    with pytest.raises(CleanupError, match="cannot read the running plan .*current_plan.json"):
        cleanup(_opts(tmp_path), nvml)


NOWHERE_PID = 4194301           # a pid this /proc does not have (the kernel's pid_max is 4194304)


@needs_root
@pytest.mark.parametrize("stop_foreign", [False, True])
def test_a_pid_of_another_pid_namespace_is_named_and_never_acted_on(nvml, procs, tmp_path, stop_foreign):
    """NVML names a process by the driver's pid; one this /proc does not have belongs to another PID namespace.
    Even running as our service user, even with stop_foreign, it is refused before the unit is stopped."""
    assert not os.path.exists("/proc/%d" % NOWHERE_PID)
    holder = procs.spawn("sglang::scheduler_TP0", OURS)
    procs.fake.register(2, 3 * GIB, holder, reported_pid=NOWHERE_PID)
    fake = FakeSystemctl(ACTIVE)
    with pytest.raises(CleanupError) as err:
        cleanup(_opts(tmp_path, stop_unit=True, stop_foreign=stop_foreign), nvml, run=fake)
    msg = str(err.value)
    assert msg.startswith("NVML reports a pid on our GPUs that this host's /proc does not have: pid %d on GPU 2 "
                          "(3072 MiB)" % NOWHERE_PID), msg
    assert "another PID namespace" in msg and "our server was left running" in msg
    assert fake.stops() == [] and _alive(holder)
    with pytest.raises(CleanupError, match="pid %d on GPU 2" % NOWHERE_PID):
        cleanup(_opts(tmp_path, stop_foreign=stop_foreign), nvml)
    assert _alive(holder)


# ------------------------------------------------------------------------------------------- stopping the unit

class FakeSystemctl:
    """systemctl show/stop of one unit: records the calls; a stop moves the unit to `after`, running `on_stop`."""

    def __init__(self, before, after=None, stop_rc=0, on_stop=None):
        self.state, self.after, self.stop_rc, self.on_stop = dict(before), after, stop_rc, on_stop
        self.calls = []

    def __call__(self, argv):
        self.calls.append(argv[:2])
        if argv[1] == "show":
            return 0, "".join("%s=%s\n" % kv for kv in self.state.items()), ""
        assert argv[1] == "stop", argv
        if self.stop_rc:
            return self.stop_rc, "", "Job for x failed."
        if self.on_stop:
            self.on_stop()
        self.state.update(self.after or {"ActiveState": "inactive", "SubState": "dead", "Result": "success"})
        return 0, "", ""

    def stops(self):
        return [c for c in self.calls if c[1] == "stop"]


ACTIVE = {"LoadState": "loaded", "ActiveState": "active", "SubState": "running", "Result": "success"}


@pytest.mark.parametrize("before", [
    {"LoadState": "not-found", "ActiveState": "inactive", "SubState": "dead", "Result": "success"},
    {"LoadState": "loaded", "ActiveState": "inactive", "SubState": "dead", "Result": "success"},
    {"LoadState": "loaded", "ActiveState": "failed", "SubState": "failed", "Result": "exit-code"},
])
def test_stop_unit_leaves_a_unit_that_is_not_running_alone(before):
    fake = FakeSystemctl(before)
    out = stop_unit("u.service", fake)
    assert fake.stops() == [] and out["stopped"] is False and out["would_stop"] is False


@pytest.mark.parametrize("before", [ACTIVE, dict(ACTIVE, ActiveState="activating", SubState="auto-restart")])
def test_stop_unit_stops_a_running_or_restarting_unit(before):
    fake = FakeSystemctl(before)
    out = stop_unit("u.service", fake)
    assert fake.stops() == [["systemctl", "stop"]]
    assert out["stopped"] is True and out["sigkilled"] is False and out["result"] == "success"


def test_stop_unit_says_when_systemd_had_to_sigkill():
    fake = FakeSystemctl(ACTIVE, after={"ActiveState": "inactive", "SubState": "dead", "Result": "timeout"})
    out = stop_unit("u.service", fake)
    assert out["sigkilled"] is True
    summary = _summary({"unit": out, "gpu_indices": [0], "stopped": [], "elapsed_s": 1.0}, False)
    assert summary.startswith("u.service did not stop on SIGTERM within its TimeoutStopSec: systemd SIGKILLed "
                              "its processes (Result=timeout); nothing left on GPUs 0")


def test_stop_unit_check_mode_stops_nothing():
    fake = FakeSystemctl(ACTIVE)
    out = stop_unit("u.service", fake, check_mode=True)
    assert fake.stops() == [] and out["would_stop"] is True and out["stopped"] is False


def test_stop_unit_failure_is_named():
    with pytest.raises(CleanupError, match=r"systemctl stop u.service failed \(rc 1\): Job for x failed.; it is active"):
        stop_unit("u.service", FakeSystemctl(ACTIVE, stop_rc=1))


@needs_root
def test_foreign_process_on_our_gpu_fails_before_the_unit_is_stopped(nvml, procs, tmp_path):
    foreign = procs.spawn(None, OTHER, gpus=[1], body="sleep 604")
    fake = FakeSystemctl(ACTIVE)
    with pytest.raises(CleanupError) as err:
        cleanup(_opts(tmp_path, stop_unit=True), nvml, run=fake)
    assert "pid %d user %s" % (foreign, OTHER) in str(err.value) and "our server was left running" in str(err.value)
    assert fake.stops() == [] and _alive(foreign)


@needs_root
def test_stop_unit_then_leftovers_of_our_server(nvml, procs, tmp_path):
    in_unit = procs.spawn("sglang::scheduler_PP0_TP0", OURS, gpus=[0])
    orphan = procs.spawn("sglang::scheduler_PP0_TP1", OURS, gpus=[1])
    # systemd's stop ends what is in the cgroup; the second one escaped it (re-parented) and is left for cleanup.
    fake = FakeSystemctl(ACTIVE, on_stop=lambda: (os.kill(in_unit, 9),
                                                  _wait_for(lambda: not _alive(in_unit), "pid %d to die" % in_unit)))

    res = cleanup(_opts(tmp_path, stop_unit=True), nvml, run=fake)
    assert fake.stops() == [["systemctl", "stop"]] and res["unit"]["stopped"] is True
    assert [p["pid"] for p in res["stopped"]] == [orphan] and not _alive(orphan)
    assert res["summary"].startswith("stopped topolaunch-sglang.service in ") and "stopped 1 process(es)" in res["summary"]


# ------------------------------------------------------------------------------------------- module main()


# ------------------------------------------------------------------------------------------- real GPU record

def test_the_real_gpu_check_passed_and_the_idle_threshold_fits_the_real_driver():
    """tools/gpu_cleanup_check.py on 2x H200 (real driver, real PyTorch processes): NVML listed the pids we started,
    the foreign holder was refused, ours stopped by SIGTERM, the other GPU's holder left alone. The default
    memory_threshold_mib must sit above what that driver reports for an idle GPU and below one process's share."""
    record = json.loads((ROOT / "tests/fixtures/nvml/h200x2-vm.gpu_cleanup_check.json").read_text())
    assert record["checks"] and all(record["checks"].values()), record["checks"]
    idle = max(g["used_bytes"] for g in record["idle"].values())
    smallest = min(p["used_gpu_memory"] for g in record["busy"].values() for p in g["processes"])
    assert idle < DEFAULTS["memory_threshold_mib"] << 20 < smallest


# ------------------------------------------------------------------ validate's port check (issue 29)
def _tcp_table(proc, port, inode):
    """A /proc/net/tcp of one socket listening on 127.0.0.1:`port` with `inode`, and no process holding it."""
    (proc / "net").mkdir(parents=True)
    (proc / "net" / "tcp").write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:%04X 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 %d 1\n"
        % (port, inode))


def test_a_port_listened_on_by_no_process_of_this_proc_is_a_problem(tmp_path):
    _tcp_table(tmp_path / "proc", 30033, 424242)
    why = port_problem(30033, "127.0.0.1", str(tmp_path / "proc"))
    assert why.startswith("port 30033: something listens on it that no process this host's /proc shows holds"), why


def test_a_port_held_by_a_process_here_is_left_to_the_cleanup():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert port_problem(s.getsockname()[1]) == ""        # ours or foreign: the cleanup decides, before stopping


def test_a_port_that_answers_but_that_nothing_here_listens_on_is_a_problem(tmp_path):
    (tmp_path / "proc").mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        why = port_problem(port, "127.0.0.1", str(tmp_path / "proc"))        # this "host" sees no listener
        assert why == ("port %d on 127.0.0.1 answers, but nothing on this host listens on it (a forward, or a "
                       "process in another network namespace): it is not our server" % port)
        assert port_problem(port, "127.0.0.1", str(tmp_path / "proc"), probe=False) == ""


def test_a_port_that_cannot_be_bound_is_a_problem(tmp_path):
    (tmp_path / "proc").mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))                          # bound, not listening: nothing answers
        port = s.getsockname()[1]
        assert port_problem(port, "127.0.0.1", str(tmp_path / "proc")).startswith(
            "port %d on 127.0.0.1 cannot be bound: " % port)
    assert port_problem(port, "127.0.0.1", str(tmp_path / "proc")) == ""    # free again


def test_root_as_the_service_user_is_refused_before_anything_is_signalled(nvml, tmp_path):
    """Issue 25 item 13: with service_user root every root process on our GPUs was "ours" and got signalled."""
    with pytest.raises(CleanupError, match=r"the service user 'root' \(topolaunch_service_user\) has uid 0 \(root\).*"
                                           r"topolaunch_force_service_user: true; nothing was stopped"):
        cleanup(_opts(tmp_path, service_user="root"), nvml)
