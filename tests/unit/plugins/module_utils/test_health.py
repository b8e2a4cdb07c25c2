"""health.py: milestones from SGLang's log lines, a dead unit fails at once with its error lines, timeouts; once
ready the server is verified (/health, /model_info, /generate) and its plan recorded as the last known good one.

systemctl and journalctl are replaced by a scripted `run` (a list of states the unit goes through), the server's
HTTP answers by a scripted `http`; the port is a real socket on loopback. One test asks the real simulator.
"""
import json
import os
import socket
import stat

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import health as module_health
from simlab import Lab, free_port, sim_site, sim_wheels  # noqa: F401  pylint: disable=unused-import
from ansible_collections.topolaunch.sglang.plugins.module_utils.system import parse_show
from ansible_collections.topolaunch.sglang.plugins.module_utils.health import (HealthError, base_url, check, error_lines, milestone, port_open,
                               read_plan, record_last_good, verify, wait_chunk)
from health_cases import CRASH, LOG, ME, Clock, Unit, active
from health_cases import GENERATED, KEY, PLAN, ready_on_30000, Server, state  # noqa: F401  pylint: disable=unused-import  (fixtures)

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


# A TP8 start of each release, every line as that release's source writes it (the f-strings at the places health.py
# names, filled in with a GLM-5-NVFP4 load); the server_args= line shortened.
LOG_0_5_9 = [
    "[2026-11-30 01:00:00] server_args=ServerArgs(model_path='/srv/models/glm-5-nvfp4', tp_size=8, ...)",
    "[2026-11-30 01:00:01 TP0] Init torch distributed begin.",
    "[2026-11-30 01:00:03 TP0] Init torch distributed ends. elapsed=2.10 s, mem usage=0.62 GB",
    "[2026-11-30 01:00:03 TP0] Load weight begin. avail mem=93.10 GB",
    "[2026-11-30 01:03:40 TP0] Load weight end. elapsed=217.31 s, type=GlmMoeDsaForCausalLM, dtype=torch.bfloat16, "
    "avail mem=41.55 GB, mem usage=51.55 GB.",
    "[2026-11-30 01:03:52 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=12.20 GB",
    "[2026-11-30 01:07:10 TP0] Capture cuda graph end. Time elapsed: 198.04 s. mem usage=1.71 GB. avail mem=10.49 GB.",
    "[2026-11-30 01:07:14] The server is fired up and ready to roll!",
]
LOG_0_5_23 = [
    "[2026-11-30 01:00:00] server_args=ServerArgs(model_path='/srv/models/glm-5-nvfp4', tp_size=8, ...)",
    "[2026-11-30 01:00:01 TP0] Init parallel begin.",
    "[2026-11-30 01:00:03 TP0] Init parallel ends. elapsed=2.31 s",
    "[2026-11-30 01:00:03 TP0] Memory baseline taken. mem usage=0.62 GB",
    "[2026-11-30 01:00:03 TP0] Load weight begin. avail mem=93.10 GB",
    "[2026-11-30 01:03:40 TP0] Load weight end. elapsed=217.31 s, type=GlmMoeDsaForCausalLM, quant=modelopt_fp4, "
    "quant_algo=NVFP4, avail mem=41.55 GB, mem usage=51.55 GB.",
    "[2026-11-30 01:03:52 TP0] Capture target prefill CUDA graph begin. backend=breakable, "
    "num_tokens=[8, 16, 32, 64, 128, 256, 512], avail mem=12.20 GB",
    "[2026-11-30 01:04:31 TP0] Capture target prefill CUDA graph end. elapsed=39.12 s, mem usage=0.92 GB, "
    "avail mem=11.28 GB.",
    "[2026-11-30 01:04:31 TP0] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
    "avail mem=11.28 GB",
    "[2026-11-30 01:07:10 TP0] Capture target decode CUDA graph end. bs=[1, 2, 4, 8, 16, 24, 32], elapsed=158.92 s, "
    "mem usage=1.71 GB, avail mem=9.57 GB.",
    "[2026-11-30 01:07:14] The server is fired up and ready to roll!",
]


@pytest.mark.parametrize("version, log, expected", [
    ("0.5.9", LOG_0_5_9, [None, "init_distributed_begin", None, "load_weight_begin", "load_weight_end",
                          "capture_cuda_graph_begin", "capture_cuda_graph_end", "ready"]),
    ("0.5.23+sim", LOG_0_5_23, [None, "init_parallel_begin", None, None, "load_weight_begin", "load_weight_end",
                                "capture_prefill_graph_begin", "capture_prefill_graph_end",
                                "capture_decode_graph_begin", "capture_decode_graph_end", "ready"]),
])
def test_each_versions_milestones_from_its_real_log_lines(version, log, expected):
    """Line by line, the milestone reached is the version's own; its label is the words of that line."""
    reached = "started"
    for n, line in enumerate(log):
        now = milestone(log[:n + 1], version)
        reached = expected[n] or reached
        assert now == reached, line
        if expected[n]:
            assert module_health.label(now, version) in line
    assert [k for k, _ in module_health.milestones(version)] == [k for k in expected if k]


def test_a_version_reads_only_its_own_lines_and_an_unknown_one_reads_all():
    """0.5.9's capture line is not a 0.5.23 milestone (nor the reverse); a release without a table (a newer one, a
    git build) is followed with every known release's lines."""
    assert milestone(LOG_0_5_9[:6], "0.5.23") == "load_weight_end"
    assert milestone(LOG_0_5_23[:7], "0.5.9") == "load_weight_end"
    assert milestone(LOG_0_5_23[:9], "0.5.24") == "capture_decode_graph_begin"
    assert milestone(LOG_0_5_9[:6], None) == "capture_cuda_graph_begin"
    assert module_health.label("started", "0.5.23") == "started (no milestone yet)"


def test_a_0_5_23_start_is_followed_through_both_graphs(open_port):
    """The health call follows the plan's version: a chunk returns at each 0.5.23 milestone, in its words."""
    clock = Clock()
    unit = Unit([(active(), LOG_0_5_23[:7]), (active(), LOG_0_5_23[:8]), (active(), LOG_0_5_23[:9]),
                 (active(), LOG_0_5_23)])
    seen = []
    known = "load_weight_end"
    while True:
        res = _wait(unit, open_port, clock, known=known, invocation_id="abc123", version="0.5.23")
        seen.append(res["label"])
        if res["state"] == "ready":
            break
        known = res["milestone"]
    assert seen == ["Capture target prefill CUDA graph begin", "Capture target prefill CUDA graph end",
                    "Capture target decode CUDA graph begin", "The server is fired up and ready to roll!"]


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


def test_a_server_busy_for_hours_is_still_ready(open_port):
    """The start's milestones are read by pattern, not from the last lines: a server that logged thousands of
    request lines since its ready line (a deploy or a bench hours later) read 'started (no milestone yet)'."""
    busy = LOG + ["[2026-11-30 0%d:%02d:00 TP0] Decode batch. #running-req: 4, #token: 1%03d, gen throughput "
                  "(token/s): 310.2" % (2 + i // 600, i // 10 % 60, i % 1000) for i in range(3000)]
    unit = Unit([(active(), busy)])
    res = _wait(unit, open_port, Clock(), known="ready", invocation_id="abc123")
    assert res["state"] == "ready" and res["milestone"] == "ready", res
    assert any("--grep" in call for call in unit.calls if call[0] == "journalctl")


def test_ready_needs_the_port_too(closed_port):
    clock = Clock()
    unit = Unit([(active(), LOG)])
    res = _wait(unit, closed_port, clock, known="ready", chunk_s=3)
    assert res["state"] == "waiting" and res["port_open"] is False
    assert clock.t >= 1003.0


@pytest.mark.parametrize("started_at, gaps", [
    (1000.0, [0.1] * 30),          # the first seconds of a start: a server that comes up fast is seen at once
    (900.0, [0.5] * 6),            # a long load: twice a second is enough
])
def test_polls_quickly_right_after_the_start_and_slowly_during_a_long_load(closed_port, started_at, gaps):
    clock = Clock()
    clock.t = 1000.0
    start = active(ExecMainStartTimestampMonotonic=str(int(started_at * 1e6)))
    unit = Unit([(start, LOG[:2])])
    slept = []

    def sleep(s):
        slept.append(round(s, 3))
        clock.sleep(s)

    res = wait_chunk("topolaunch-sglang.service", "127.0.0.1", closed_port, known="load_weight_begin", chunk_s=3,
                     run=unit.run, clock=clock, sleep=sleep)
    assert res["state"] == "waiting" and slept == gaps


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


# ------------------------------------------------------------------------------------------ verify and record


def _check(state_dir, unit, server, clock, **kw):
    kw.setdefault("verify_server", True)
    kw.setdefault("owner", ME)
    return check("topolaunch-sglang.service", str(state_dir / "current_plan.json"),
                 str(state_dir / "last_good_plan.json"), run=unit.run, http=server, clock=clock, sleep=clock.sleep,
                 **kw)


def test_ready_then_verified_and_recorded_once(state, ready_on_30000):
    state_dir, text = state
    clock, server = Clock(), Server()
    res = _check(state_dir, Unit([(active(), LOG)]), server, clock, max_new_tokens=8, prompt="Hi there")
    assert res["state"] == "ready" and res["verified"] is True and res["plan"] == PLAN
    assert res["generated_tokens"] == 8 and res["generated_text"] == GENERATED["text"]
    assert res["url"] == "http://127.0.0.1:30000" and res["last_good_changed"] is True
    assert server.paths() == ["/health", "/model_info", "/generate"]
    gen = server.calls[2]
    assert gen["method"] == "POST"
    assert gen["body"] == {"text": "Hi there", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    assert all("Authorization" not in c["headers"] for c in server.calls)          # no key set: none sent
    last_good = state_dir / "last_good_plan.json"
    assert last_good.read_text() == text and stat.S_IMODE(last_good.stat().st_mode) == 0o644
    mtime = last_good.stat().st_mtime_ns
    again = _check(state_dir, Unit([(active(), LOG)]), Server(), clock)
    assert again["verified"] is True and again["last_good_changed"] is False
    assert last_good.stat().st_mtime_ns == mtime
    assert [n for n in os.listdir(state_dir) if n.startswith(".")] == []            # no temp file left


def test_a_different_plan_or_mode_is_written_again(state, ready_on_30000):
    state_dir, text = state
    last_good = state_dir / "last_good_plan.json"
    last_good.write_text("{}")
    last_good.chmod(0o600)
    assert record_last_good(text, str(last_good), owner=ME) is True
    assert last_good.read_text() == text and stat.S_IMODE(last_good.stat().st_mode) == 0o644
    last_good.chmod(0o600)
    assert record_last_good(text, str(last_good), owner=ME) is True and stat.S_IMODE(last_good.stat().st_mode) == 0o644
    assert record_last_good(text, str(last_good), owner=ME) is False


def test_a_full_disk_under_the_state_dir_leaves_the_healthy_server_up_with_a_warning(state, ready_on_30000,
                                                                                     monkeypatch):
    """Issue 25 item 5: writing the last-good record failed with ENOSPC and raised, so health failed and the
    rollback stopped the healthy new server. Now the check passes and warns; nothing half-written is left."""
    state_dir, _ = state

    def full(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(module_health, "write_atomic", full)
    res = _check(state_dir, Unit([(active(), LOG)]), Server(), Clock())
    assert res["state"] == "ready" and res["verified"] is True and res["last_good_changed"] is False
    assert len(res["warnings"]) == 1 and res["warnings"][0].startswith(
        "The server is healthy, but recording it as the last known good plan failed: %s: No space left on device. "
        "It keeps running" % (state_dir / "last_good_plan.json")), res["warnings"]
    assert not (state_dir / "last_good_plan.json").exists()
    with pytest.raises(HealthError, match="recording it as the last known good plan failed"):
        record_last_good("{}", str(state_dir / "last_good_plan.json"), owner=ME)   # without a warnings list: refused


def test_check_mode_verifies_but_writes_nothing(state, ready_on_30000):
    state_dir, _ = state
    clock, server = Clock(), Server()
    res = _check(state_dir, Unit([(active(), LOG)]), server, clock, check_mode=True)
    assert res["verified"] is True and res["last_good_changed"] is True
    assert server.paths() == ["/health", "/model_info", "/generate"]
    assert not (state_dir / "last_good_plan.json").exists()


def test_without_verify_a_ready_server_is_only_reported(state, ready_on_30000):
    state_dir, _ = state
    server = Server()
    res = _check(state_dir, Unit([(active(), LOG)]), server, Clock(), verify_server=False)
    assert res["state"] == "ready" and "verified" not in res and res["plan"] == PLAN
    assert server.calls == [] and not (state_dir / "last_good_plan.json").exists()


def test_health_503_then_200_is_waited_for():
    clock = Clock()
    server = Server(health=[(503, ""), (503, ""), (200, "")])
    res = verify(PLAN, http=server, ready_timeout=30, clock=clock, sleep=clock.sleep)
    assert server.paths() == ["/health"] * 3 + ["/model_info", "/generate"]
    assert res["health_s"] == 1.0 and res["generated_tokens"] == 8


def test_health_never_200_times_out_saying_what_it_waited_for(state, ready_on_30000):
    state_dir, _ = state
    clock = Clock()
    server = Server(health=[(0, "[Errno 111] Connection refused"), (503, "")])
    with pytest.raises(HealthError) as err:
        _check(state_dir, Unit([(active(), LOG)]), server, clock, ready_timeout=5)
    msg = str(err.value)
    assert msg.startswith("GET http://127.0.0.1:30000/health did not answer 200 within 5 s after the server's ready "
                          "line (11 tries; the last one answered 503 with an empty body)"), msg
    assert 1005.0 <= clock.t < 1006.0
    assert "/model_info" not in server.paths()
    assert err.value.result["plan"] == PLAN                          # the failure says which plan failed
    assert not (state_dir / "last_good_plan.json").exists()


def test_wrong_model_is_another_server():
    clock = Clock()
    server = Server(model_info=[(200, {"model_path": "/srv/models/llama-2-7b"})])
    with pytest.raises(HealthError) as err:
        verify(PLAN, http=server, clock=clock, sleep=clock.sleep)
    assert str(err.value) == ("The server on port 30000 serves /srv/models/llama-2-7b, not /srv/models/glm-5-nvfp4: "
                              "is another server on this port?")
    assert "/generate" not in server.paths()
    # The served model name counts as ours too; a server that names no model does not.
    assert verify(PLAN, http=Server(model_info=[(200, {"model_path": "glm-5-nvfp4"})]), clock=clock,
                  sleep=clock.sleep)["generated_tokens"] == 8
    with pytest.raises(HealthError, match="serves \\?, not /srv/models/glm-5-nvfp4"):
        verify(PLAN, http=Server(model_info=[(200, "not json")]), clock=clock, sleep=clock.sleep)


@pytest.mark.parametrize("answer", [
    {"text": "", "meta_info": {"completion_tokens": 0}},
    {"meta_info": {"completion_tokens": 3}},
    {"text": "x", "meta_info": {}},
    {"text": "x", "meta_info": {"completion_tokens": True}},
    "[]",
])
def test_no_tokens_fails(answer):
    clock = Clock()
    with pytest.raises(HealthError) as err:
        verify(PLAN, http=Server(generate=[(200, answer)]), clock=clock, sleep=clock.sleep)
    body = answer if isinstance(answer, str) else json.dumps(answer)
    assert str(err.value) == "/generate returned no tokens: " + body


def test_http_errors_are_named_with_the_answer():
    clock = Clock()
    with pytest.raises(HealthError) as err:
        verify(PLAN, http=Server(generate=[(500, {"error": "boom"})]), clock=clock, sleep=clock.sleep)
    assert str(err.value) == 'POST http://127.0.0.1:30000/generate answered 500: {"error": "boom"}'
    with pytest.raises(HealthError) as err:
        verify(PLAN, http=Server(model_info=[(401, {"error": "Unauthorized"})]), clock=clock, sleep=clock.sleep)
    assert "answered 401" in str(err.value) and "the server wants an API key: set topolaunch_api_key" in str(err.value)


def test_api_key_goes_to_model_info_and_generate_only():
    clock, server = Clock(), Server()
    verify(PLAN, http=server, api_key=KEY, http_timeout=7, clock=clock, sleep=clock.sleep)
    sent = {c["path"]: c["headers"].get("Authorization") for c in server.calls}
    assert sent == {"/health": None, "/model_info": "Bearer " + KEY, "/generate": "Bearer " + KEY}
    assert {c["timeout"] for c in server.calls} == {7}
    with pytest.raises(HealthError) as err:
        verify(PLAN, http=Server(model_info=[(401, {"error": "Unauthorized"})]), api_key=KEY, clock=clock,
               sleep=clock.sleep)
    assert "refused our API key" in str(err.value) and KEY not in str(err.value)


def test_wildcard_and_ipv6_listen_addresses_are_reached_via_loopback():
    assert base_url("0.0.0.0", 30000) == "http://127.0.0.1:30000"
    assert base_url("::", 30000) == "http://[::1]:30000"
    assert base_url("fd00::5", 30000) == "http://[fd00::5]:30000"
    assert base_url(None, 30000) == "http://127.0.0.1:30000"


def test_death_while_starting_carries_the_plan(state, closed_port):
    state_dir, _ = state
    clock = Clock()
    unit = Unit([(active(ActiveState="failed", SubState="failed", Result="signal", ExecMainCode="2",
                         ExecMainStatus="9"), CRASH)])
    server = Server()
    with pytest.raises(HealthError) as err:
        _check(state_dir, unit, server, clock)
    assert "died while starting" in str(err.value) and "torch.OutOfMemoryError" in str(err.value)
    assert err.value.result["plan"] == PLAN and err.value.result["state"] == "dead"
    assert server.calls == []


@pytest.mark.parametrize("content, why", [
    (None, "No such file or directory"),
    ("{not json", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    ('{"port": "30000"}', "its port '30000' is not a port number"),
])
def test_a_missing_or_bad_plan_says_the_launch_stage_writes_it(tmp_path, content, why):
    path = tmp_path / "current_plan.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(HealthError) as err:
        read_plan(str(path))
    msg = str(err.value)
    assert msg.startswith("Cannot read the plan the unit runs, %s: " % path) and why in msg
    assert "The launch stage writes it" in msg and err.value.result == {}


# ------------------------------------------------------------------------------------------ the real simulator
def test_verify_against_the_simulator(tmp_path, sim_site):  # noqa: F811  pylint: disable=redefined-outer-name
    """The default HTTP function against a real simulated server: /health (503 while it starts), the key."""
    lab = Lab(tmp_path, sim_site)
    try:
        server = lab.launch("--model-path", lab.model("llama-2-7b"), "--served-model-name", "llama",
                            "--api-key", KEY)
        plan = {"host": "127.0.0.1", "port": server.port, "model_path": lab.model("llama-2-7b"),
                "served_model_name": "llama"}
        # Asked before the port opens: no answer (connection refused), maybe 503 while it starts, then 200.
        statuses = []

        def recorded(method, url, **kw):
            status, text = module_health.http_request(method, url, **kw)
            statuses.append((url.rsplit("/", 1)[1], status))
            return status, text

        res = verify(plan, http=recorded, api_key=KEY, ready_timeout=30, max_new_tokens=4, poll_s=0.05)
        assert statuses[0] == ("health", 0) and statuses[-3:] == [("health", 200), ("model_info", 200),
                                                                    ("generate", 200)]
        assert res["generated_tokens"] == 4 and len(res["generated_text"].split()) == 4
        assert res["url"] == "http://127.0.0.1:%d" % server.port
        with pytest.raises(HealthError) as err:
            verify(plan, api_key="wrong-key", ready_timeout=5)
        assert "/model_info answered 401" in str(err.value) and "refused our API key" in str(err.value)
        other = dict(plan, model_path="/srv/models/glm-5-nvfp4", served_model_name="glm-5-nvfp4")
        with pytest.raises(HealthError, match="serves .*llama-2-7b, not /srv/models/glm-5-nvfp4"):
            verify(other, api_key=KEY, ready_timeout=5)
    finally:
        lab.cleanup()
    with pytest.raises(HealthError, match=r"did not answer 200 within 0.3 s .*got no answer"):
        verify({"port": free_port()}, ready_timeout=0.3, poll_s=0.05)


# ------------------------------------------------------------------------------------------ what callers decide on
def test_a_server_found_serving_at_the_first_look_is_already_serving(state, ready_on_30000):
    state_dir, _ = state
    clock = Clock()
    res = _check(state_dir, Unit([(active(ExecMainStartTimestampMonotonic="400000000"), LOG)]), Server(), clock)
    assert res["already_serving"] is True and res["since_start_s"] == 600.0
    starting = Unit([(active(), ["Load weight begin"]), (active(), LOG)])
    res = _check(state_dir, starting, Server(), Clock(), known="load_weight_begin")
    assert res["state"] == "ready" and res["already_serving"] is False      # followed, not found


def test_a_failure_carries_the_last_good_plan_and_whether_it_is_another_server(state, closed_port):
    state_dir, _ = state
    dead = Unit([(active(ActiveState="failed", SubState="failed", Result="exit-code", ExecMainCode="1",
                         ExecMainStatus="1"), CRASH)])
    with pytest.raises(HealthError) as err:
        _check(state_dir, dead, Server(), Clock())
    assert err.value.result["last_good_plan"] == {} and err.value.result["last_good_differs"] is False
    tp4pp2 = dict(PLAN, layout={"name": "tp4pp2", "tp": 4, "pp": 2}, reason="whatever")
    (state_dir / "last_good_plan.json").write_text(json.dumps(tp4pp2))
    with pytest.raises(HealthError) as err:
        _check(state_dir, dead, Server(), Clock())
    assert err.value.result["last_good_plan"] == tp4pp2 and err.value.result["last_good_differs"] is True
    # The same server with other words (reason, estimate) is the plan that failed: nothing to go back to.
    (state_dir / "last_good_plan.json").write_text(json.dumps(dict(PLAN, reason="other words")))
    with pytest.raises(HealthError) as err:
        _check(state_dir, dead, Server(), Clock())
    assert err.value.result["last_good_differs"] is False


def _serving(state_dir, unit, server):
    return _check(state_dir, unit, server, Clock(), mode="serving", verify_server=False)


def test_serving_mode_passes_for_the_verified_plan_and_writes_nothing(state, ready_on_30000):
    state_dir, text = state
    (state_dir / "last_good_plan.json").write_text(text)
    server = Server()
    res = _serving(state_dir, Unit([(active(), LOG)]), server)
    assert res["state"] == "ready" and res["plan"] == PLAN and server.paths() == ["/health"]
    assert sorted(p.name for p in state_dir.iterdir()) == ["current_plan.json", "last_good_plan.json"]


@pytest.mark.parametrize("case, words", [
    ("no_last_good", "Health has not passed for the plan this server runs: it runs layout tp8 (current_plan.json) "
                     "but health last passed for no plan"),
    ("other_last_good", "but health last passed for layout tp4pp2 (last_good_plan.json)"),
    ("health_503", "/health answered 503: starting, not 200"),
    ("loading", "The server is not serving yet: topolaunch-sglang.service is at 'Load weight begin'"),
    ("dead", "The server is not serving: topolaunch-sglang.service died while starting"),
])
def test_serving_mode_refuses(state, ready_on_30000, case, words):
    state_dir, text = state
    if case != "no_last_good":
        other = dict(PLAN, layout={"name": "tp4pp2"}) if case == "other_last_good" else PLAN
        (state_dir / "last_good_plan.json").write_text(json.dumps(other))
    unit = Unit([(active(), LOG)])
    if case == "loading":
        unit = Unit([(active(), ["Load weight begin"])])
    elif case == "dead":
        unit = Unit([(active(ActiveState="failed", SubState="failed"), CRASH)])
    server = Server(health=[(503, "starting")]) if case == "health_503" else Server()
    with pytest.raises(HealthError) as err:
        _serving(state_dir, unit, server)
    assert words in str(err.value), str(err.value)
