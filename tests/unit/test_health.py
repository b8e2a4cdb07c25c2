"""sglang_wait logic: milestones from SGLang's log lines, a dead unit fails at once with its error lines, timeouts.

systemctl and journalctl are replaced by a scripted `run` (a list of states the unit goes through); the port is a
real socket on loopback.
"""
import socket

import pytest

from topolaunch.health import HealthError, error_lines, milestone, parse_show, port_open, wait_chunk

LOG = [
    "[2026-11-30 01:00:00] server_args=ServerArgs(model_path='/srv/models/glm-5-nvfp4', tp_size=8)",
    "[2026-11-30 01:00:02 TP0] Load weight begin. avail mem=93.10 GB",
    "[2026-11-30 01:03:40 TP0] Load weight end. type=GlmMoeDsaForCausalLM, dtype=torch.bfloat16, elapsed=218.0 s",
    "[2026-11-30 01:03:41 TP0] Capture cuda graph begin. This can take up to several minutes.",
    "[2026-11-30 01:07:10 TP0] Capture cuda graph end. Time elapsed: 209.0 s.",
    "[2026-11-30 01:07:12] The server is fired up and ready to roll!",
]
CRASH = LOG[:2] + [
    "[2026-11-30 01:00:05 TP3] Scheduler hit an exception: Traceback (most recent call last):",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    "[2026-11-30 01:00:05] Received sigquit from a child process. It usually means the child failed.",
    "topolaunch-sglang.service: Main process exited, code=killed, status=9/KILL",
]


class Unit:
    """Scripted systemctl/journalctl: each poll advances one step of (properties, journal lines)."""

    def __init__(self, steps):
        self.steps = steps
        self.i = 0
        self.calls = []

    def run(self, argv):
        self.calls.append(argv)
        props, lines = self.steps[min(self.i, len(self.steps) - 1)]
        if argv[0] == "systemctl":
            return 0, "".join("%s=%s\n" % kv for kv in props.items()), ""
        self.i += 1                        # journalctl is read after systemctl: one step per poll
        return 0, "".join(line + "\n" for line in lines), ""


def active(**kw):
    base = {"LoadState": "loaded", "ActiveState": "active", "SubState": "running", "Result": "success",
            "NRestarts": "0", "InvocationID": "abc123", "ExecMainStatus": "0", "ExecMainCode": "0",
            "ExecMainStartTimestampMonotonic": "0"}
    base.update(kw)
    return base


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


@pytest.fixture
def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]                 # closed again when the block ends


@pytest.fixture
def open_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def _wait(unit, port, clock, **kw):
    return wait_chunk("topolaunch-sglang.service", "127.0.0.1", port, run=unit.run, clock=clock, sleep=clock.sleep, **kw)


def test_milestones_in_order_and_errors_filtered():
    assert milestone([]) == "started"
    assert milestone(LOG[:2]) == "load_weight_begin"
    assert milestone(LOG[:4]) == "capture_cuda_graph_begin"
    assert milestone(LOG) == "ready"
    assert error_lines(CRASH) == CRASH[2:4] + CRASH[5:]
    assert parse_show("ActiveState=active\nInvocationID=x=y\n") == {"ActiveState": "active", "InvocationID": "x=y"}


def test_port_open_sees_a_listener(open_port, closed_port):
    assert port_open("127.0.0.1", open_port)
    assert port_open("0.0.0.0", open_port)                    # a wildcard listen address is reached via loopback
    assert not port_open("127.0.0.1", closed_port)


def test_returns_at_each_new_milestone_then_ready(open_port):
    clock = Clock()
    unit = Unit([(active(), []), (active(), LOG[:2]), (active(), LOG[:3]), (active(), LOG)])
    first = _wait(unit, open_port, clock, chunk_s=20)
    assert first["state"] == "progress" and first["milestone"] == "load_weight_begin"
    assert first["invocation_id"] == "abc123"
    second = _wait(unit, open_port, clock, known=first["milestone"], invocation_id="abc123")
    assert second["milestone"] == "load_weight_end" and second["label"] == "Load weight end"
    third = _wait(unit, open_port, clock, known=second["milestone"], invocation_id="abc123")
    assert third["state"] == "ready" and third["port_open"] is True
    # The journal is read for this start only.
    journal_call = [c for c in unit.calls if c[0] == "journalctl"][-1]
    assert "_SYSTEMD_INVOCATION_ID=abc123" in journal_call and "INVOCATION_ID=abc123" in journal_call


def test_ready_needs_the_port_too(closed_port):
    clock = Clock()
    unit = Unit([(active(), LOG)])
    res = _wait(unit, closed_port, clock, known="ready", chunk_s=3)
    assert res["state"] == "waiting" and res["port_open"] is False
    assert clock.t >= 1003.0


def test_dead_unit_fails_at_once_with_the_error_lines(closed_port):
    clock = Clock()
    unit = Unit([(active(), LOG[:2]),
                 (active(ActiveState="failed", SubState="failed", Result="signal", ExecMainCode="2", ExecMainStatus="9"),
                  CRASH)])
    with pytest.raises(HealthError) as err:
        _wait(unit, closed_port, clock, known="load_weight_begin", chunk_s=20)
    msg = str(err.value)
    assert "died while starting" in msg and "killed by signal status 9" in msg
    assert "Last milestone: Load weight begin" in msg
    assert "torch.OutOfMemoryError: CUDA out of memory" in msg
    assert err.value.result["error_lines"] == error_lines(CRASH)
    assert clock.t < 1001.0                                   # at once, not at the end of the chunk


def test_systemd_restart_counts_as_death(closed_port):
    clock = Clock()
    unit = Unit([(active(SubState="auto-restart", ActiveState="activating", NRestarts="1"), CRASH)])
    with pytest.raises(HealthError, match="systemd is restarting it"):
        _wait(unit, closed_port, clock, invocation_id="abc123")
    unit = Unit([(active(InvocationID="def456"), [])])
    with pytest.raises(HealthError, match="a new start replaced the one we waited for"):
        _wait(unit, closed_port, clock, invocation_id="abc123")


def test_not_ready_after_the_startup_timeout_names_the_milestone(closed_port):
    clock = Clock()
    clock.t = 2000.0                  # the unit started at monotonic 1000 s: 1000 s ago
    unit = Unit([(active(ExecMainStartTimestampMonotonic="1000000000"), LOG[:4])])
    with pytest.raises(HealthError) as err:
        _wait(unit, closed_port, clock, known="capture_cuda_graph_begin", startup_timeout=900)
    msg = str(err.value)
    assert "not ready 1000.0 s after its start (timeout 900 s)" in msg
    assert "last milestone: Capture cuda graph begin" in msg and "still closed" in msg


def test_a_start_after_an_earlier_systemd_restart_is_followed_not_dead(open_port):
    # systemd restarted the server once (NRestarts=1) before this wait began and the new start runs: followed.
    clock = Clock()
    unit = Unit([(active(NRestarts="1", InvocationID="def456"), LOG)])
    res = _wait(unit, open_port, clock)
    assert res["state"] == "ready" and res["invocation_id"] == "def456"


def test_a_main_process_that_exited_is_named_with_its_status(closed_port):
    clock = Clock()
    unit = Unit([(active(SubState="auto-restart", ActiveState="activating", Result="exit-code", ExecMainCode="1",
                         ExecMainStatus="0"), CRASH)])
    with pytest.raises(HealthError, match=r"its main process exited with status 0 and systemd is restarting it"):
        _wait(unit, closed_port, clock, invocation_id="abc123")
