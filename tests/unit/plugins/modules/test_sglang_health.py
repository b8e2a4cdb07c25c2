"""Module sglang_health: main() against a scripted unit and server - verified and recorded, check mode, failures that
carry the plan, the API key never in its output, its documentation."""
import functools

import pytest
import yaml

from ansible_collections.topolaunch.sglang.plugins.module_utils import health as module_health
from ansible_collections.topolaunch.sglang.plugins.module_utils.health import error_lines
from ansible_collections.topolaunch.sglang.plugins.modules import sglang_health
from health_cases import CRASH, KEY, LOG, ME, PLAN, active, Clock, ready_on_30000, Server, state, Unit  # noqa: F401  pylint: disable=unused-import  (fixtures)


@pytest.fixture
def health_module(run_module, monkeypatch):
    """sglang_health's main() against a scripted unit and server: health_module(args, unit, server, check_mode)."""

    def run(args, unit, server, check_mode=False):
        clock = Clock()
        monkeypatch.setattr(sglang_health, "check", functools.partial(module_health.check, run=unit.run, http=server,
                                                                    owner=ME, clock=clock, sleep=clock.sleep))
        return run_module(sglang_health, args, check_mode)

    return run


def module_args(state_dir, **kw):
    return dict({"plan_path": str(state_dir / "current_plan.json"),
                 "last_good_path": str(state_dir / "last_good_plan.json"), "verify": True}, **kw)


def test_module_verifies_records_and_keeps_the_key_out_of_its_output(state, ready_on_30000, health_module):
    state_dir, text = state
    server = Server()
    rc, res, out = health_module(module_args(state_dir, api_key=KEY), Unit([(active(), LOG)]), server)
    assert rc == 0 and res["changed"] is True and res["state"] == "ready" and res["generated_tokens"] == 8
    assert res["plan"] == PLAN and (state_dir / "last_good_plan.json").read_text() == text
    assert server.calls[1]["headers"]["Authorization"] == "Bearer " + KEY          # sent...
    assert KEY not in out                                                             # ...but never shown
    rc, res, _ = health_module(module_args(state_dir, api_key=KEY), Unit([(active(), LOG)]),
                            Server())
    assert rc == 0 and res["changed"] is False


def test_module_check_mode_reports_the_change_without_writing(state, ready_on_30000, health_module):
    state_dir, _ = state
    rc, res, _ = health_module(module_args(state_dir), Unit([(active(), LOG)]), Server(),
                            check_mode=True)
    assert rc == 0 and res["changed"] is True and res["verified"] is True
    assert not (state_dir / "last_good_plan.json").exists()


def test_module_failures_carry_the_plan(state, ready_on_30000, health_module):
    state_dir, _ = state
    rc, res, out = health_module(module_args(state_dir, api_key=KEY), Unit([(active(), LOG)]),
                              Server(generate=[(200, {"text": "", "meta_info": {"completion_tokens": 0}})]))
    assert rc == 1 and res["failed"] is True and res["msg"].startswith("/generate returned no tokens")
    assert res["plan"] == PLAN and KEY not in out
    assert not (state_dir / "last_good_plan.json").exists()
    dead = Unit([(active(ActiveState="failed", SubState="failed", Result="exit-code", ExecMainCode="1",
                         ExecMainStatus="1"), CRASH)])
    rc, res, _ = health_module(module_args(state_dir), dead, Server())
    assert rc == 1 and "died while starting" in res["msg"] and res["plan"] == PLAN
    assert res["error_lines"] == error_lines(CRASH)


def test_module_without_a_plan_fails_before_watching(tmp_path, health_module):
    unit = Unit([(active(), LOG)])
    rc, res, _ = health_module(module_args(tmp_path), unit, Server())
    assert rc == 1 and "The launch stage writes it" in res["msg"] and "plan" not in res
    assert unit.calls == []


def test_module_keeps_the_key_secret_and_documents_both_modes():
    assert sglang_health.ARGUMENT_SPEC["api_key"]["no_log"] is True
    examples = yaml.safe_load(sglang_health.EXAMPLES)
    assert examples[0]["topolaunch.sglang.sglang_health"]["verify"] is True
    assert examples[1]["topolaunch.sglang.sglang_health"]["mode"] == "serving"
    assert {"plan", "generated_tokens", "state", "already_serving", "last_good_plan"} <= set(
        yaml.safe_load(sglang_health.RETURN))


def test_module_refuses_a_zero_timeout(state, health_module):
    state_dir, _ = state
    rc, res, _ = health_module(module_args(state_dir, ready_timeout=0), Unit([]), Server())
    assert rc == 1 and res["msg"] == "ready_timeout 0.0: must be greater than 0" and res["stage"] == "health"


def test_module_refuses_a_probe_without_a_check_before_watching(state, health_module):
    state_dir, _ = state
    unit = Unit([(active(), LOG)])
    rc, res, _ = health_module(module_args(state_dir, answer_probe={"prompt": "The capital of France is"}), unit,
                               Server())
    assert rc == 1 and res["msg"].startswith("answer_probe.expect: missing: a probe with a prompt needs the text")
    assert "\n" not in res["msg"] and unit.calls == []


def test_module_runs_the_answer_probe_after_the_generation(state, ready_on_30000, health_module):
    state_dir, _ = state     # PLAN's model directory is not on this machine: no chat template, a base model
    server = Server()
    rc, res, _ = health_module(module_args(state_dir), Unit([(active(), LOG)]), server)
    assert rc == 0 and res["answer_probe"]["state"] == "skipped" and "a base model" in res["answer_probe"]["why"]
    rc, res, _ = health_module(module_args(state_dir, answer_probe="on"), Unit([(active(), LOG)]), server)
    assert rc == 1 and res["state"] == "answer" and res["msg"].startswith("The answer probe failed: asked to repeat ")
    assert server.paths()[-1] == "/generate" and res["plan"] == PLAN
    assert yaml.safe_load(sglang_health.EXAMPLES)[-1]["topolaunch.sglang.sglang_health"]["answer_probe"] == {
        "prompt": "The capital of France is", "expect": "Paris"}


def test_module_says_which_relaunch_lock_holder_it_ended(state, ready_on_30000, health_module, tmp_path):
    """The relaunch skips its own release call when health ended the very holder its validate took: health says
    which (pid and start time), nothing for another run's lock, a failed check ends it too, and check mode none."""
    from ansible_collections.topolaunch.sglang.plugins.module_utils import relaunch_lock
    state_dir, _ = state
    lock = str(tmp_path / "run" / "relaunch.lock")
    ours = "play Relaunch by ops@ctl (run 1)"
    try:
        relaunch_lock.acquire(lock, 60, owner="play Relaunch by ops@ctl (run 2)")
        rc, res, _ = health_module(module_args(state_dir, release_lock=lock, release_lock_owner=ours),
                                   Unit([(active(), LOG)]), Server())
        assert rc == 0 and res["lock_released"] == "" and relaunch_lock.holder(lock) is not None  # not ours
        relaunch_lock.acquire(lock, 60, owner=ours)
        taken = relaunch_lock.holder_id(relaunch_lock.holder(lock))
        rc, res, _ = health_module(module_args(state_dir, release_lock=lock, release_lock_owner=ours),
                                   Unit([(active(), LOG)]), Server(), check_mode=True)
        assert rc == 0 and res["lock_released"] == "" and relaunch_lock.holder(lock) is not None
        rc, res, _ = health_module(module_args(state_dir, release_lock=lock, release_lock_owner=ours),
                                   Unit([(active(), LOG)]), Server())
        assert rc == 0 and res["state"] == "ready" and res["lock_released"] == taken and taken
        assert relaunch_lock.holder(lock) is None
        relaunch_lock.acquire(lock, 60, owner=ours)
        taken = relaunch_lock.holder_id(relaunch_lock.holder(lock))
        rc, res, _ = health_module(module_args(state_dir, release_lock=lock, release_lock_owner=ours),
                                   Unit([(active(), LOG)]),
                                   Server(generate=[(200, {"text": "", "meta_info": {"completion_tokens": 0}})]))
        assert rc == 1 and res["lock_released"] == taken and relaunch_lock.holder(lock) is None
    finally:
        relaunch_lock.release(lock)
