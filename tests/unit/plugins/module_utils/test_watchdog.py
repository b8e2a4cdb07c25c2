"""watchdog.py: the decisions (counting, the restart limit, the loading grace, the relaunch lock), the probe, the
settings' errors, the metrics file, and one run end to end with systemctl, the probe and the cleanup faked."""
import fcntl
import json
import os
import urllib.error

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import watchdog
from ansible_collections.topolaunch.sglang.plugins.module_utils.watchdog import (SettingsError, check_settings,
                                                                                   decide, new_state)

S = check_settings({"failures": 3, "max_restarts": 2, "load_timeout": 100})
FAIL = (False, "/health_generate answered 503")
OK = (True, "/health_generate answered 200")


def unit(invocation="inv1", started=1000.0, active="active"):
    return {"ActiveState": active, "InvocationID": invocation,
            "ExecMainStartTimestampMonotonic": str(int(started * 1e6))}


def run(state, probes, mono=2000.0, now=50000.0, u=None, lock=False, s=S):
    """Actions of consecutive runs 1 s apart."""
    out = []
    for i, result in enumerate(probes):
        out.append(decide(state, u or unit(), result, now + i, mono + i, s, lock)[0])
    return out


# ------------------------------------------------------------------------------------------- counting
def test_consecutive_failures_restart_and_a_pass_resets_the_count():
    state = new_state()
    assert run(state, [OK, FAIL, FAIL, OK, FAIL, FAIL, FAIL]) == ["ok", "fail", "fail", "ok", "fail", "fail",
                                                                  "restart"]
    assert state["failures"] == 0 and state["restarts_total"] == 1 and len(state["restarts"]) == 1


def test_failures_one_restarts_at_the_first_failure():
    state = new_state()
    assert run(state, [OK, FAIL], s=check_settings({"failures": 1})) == ["ok", "restart"]


# ------------------------------------------------------------------------------------------- the limit
def test_at_the_limit_the_server_is_left_down_and_stays_down():
    state = new_state()
    actions = []
    for i in range(3):  # three starts, each serves once then hangs
        actions += run(state, [OK, FAIL, FAIL, FAIL], u=unit("inv%d" % i), now=50000.0 + 10 * i)
    assert actions[-4:] == ["ok", "fail", "fail", "give_up"] and actions.count("restart") == 2
    assert state["gave_up"] is True
    # the cleanup stopped the unit: it is inactive now, the watchdog says it is down and does nothing
    assert run(state, [None], u=unit("inv2", active="inactive"), now=50030.0) == ["down"]
    # an hour after the restarts the limit has room again; a new start clears gave_up
    assert run(state, [OK], u=unit("inv3"), now=50000.0 + 3700) == ["ok"]
    assert state["gave_up"] is False and state["restarts"] == []


def test_max_restarts_zero_never_restarts():
    state = new_state()
    assert run(state, [OK, FAIL], s=check_settings({"failures": 1, "max_restarts": 0})) == ["ok", "give_up"]


# ------------------------------------------------------------------------------------------- loading grace
def test_a_server_still_loading_is_not_failing_until_the_load_timeout():
    state = new_state()
    # started at mono 1000, load timeout 100: failures before 1100 are loading
    assert run(state, [FAIL] * 5, mono=1050.0) == ["loading"] * 5
    assert state["failures"] == 0
    assert run(state, [FAIL, FAIL, FAIL], mono=1101.0) == ["fail", "fail", "restart"]


def test_once_served_a_failure_counts_even_within_the_load_time():
    state = new_state()
    assert run(state, [OK, FAIL], mono=1010.0) == ["ok", "fail"]


def test_a_new_start_gets_the_grace_again_and_a_fresh_count():
    state = new_state()
    assert run(state, [OK, FAIL, FAIL], mono=1010.0) == ["ok", "fail", "fail"]
    assert run(state, [FAIL, FAIL], u=unit("inv2", started=1012.0), mono=1020.0) == ["loading", "loading"]
    assert state["failures"] == 0


# ------------------------------------------------------------------------------------------- lock, inactive
def test_nothing_happens_while_the_relaunch_holds_the_lock():
    state = new_state()
    assert run(state, [OK, FAIL, FAIL]) == ["ok", "fail", "fail"]
    assert run(state, [FAIL, FAIL, FAIL], lock=True) == ["skip_lock"] * 3
    assert state["failures"] == 2 and state["restarts_total"] == 0


def test_a_stopped_unit_is_not_watched():
    state = new_state()
    assert run(state, [None], u=unit(active="inactive")) == ["skip_inactive"]
    assert run(state, [None], u=unit(active="failed")) == ["skip_inactive"]


# ------------------------------------------------------------------------------------------- settings
@pytest.mark.parametrize("field, value, words", [
    ("interval", 0, "interval must be a number > 0, got 0"),
    ("interval", -5, "interval must be a number > 0, got -5"),
    ("failures", 0, "failures must be an integer > 0, got 0"),
    ("failures", 1.5, "failures must be an integer > 0, got 1.5"),
    ("failures", True, "failures must be an integer > 0, got True"),
    ("max_restarts", -1, "max_restarts must be an integer >= 0, got -1"),
    ("load_timeout", 0, "load_timeout must be a number > 0"),
    ("lock_file", "relative", "lock_file must be an absolute path"),
    ("servers", [], "servers must be a non-empty list"),
    ("servers", [{"unit": "x; rm", "current_plan": "/p"}], "servers[0].unit must be a systemd service name"),
    ("servers", [{"unit": "a.service", "current_plan": "/p\n"}], "servers[0].current_plan must be an absolute"),
    ("bogus", 1, "unknown watchdog setting(s) bogus"),
    ("answer_every", -1, "answer_every must be an integer >= 0, got -1"),
    ("answer_probe", {"prompt": "say hi"}, "answer_probe.expect: missing"),
    ("answer_probe", "sometimes", "answer_probe: 'sometimes' is not auto, on, off"),
])
def test_bad_settings_are_named(field, value, words):
    with pytest.raises(SettingsError) as err:
        check_settings({field: value})
    assert words in str(err.value) and "\n" not in str(err.value)


def test_replica_units_are_accepted():
    s = check_settings({"servers": [{"unit": "topolaunch-sglang@0.service", "current_plan": "/a.json"},
                                    {"unit": "topolaunch-sglang@1.service", "current_plan": "/b.json"}]})
    assert [x["unit"] for x in s["servers"]] == ["topolaunch-sglang@0.service", "topolaunch-sglang@1.service"]
    with pytest.raises(SettingsError, match="named twice"):
        check_settings({"servers": [{"unit": "a.service", "current_plan": "/a"}] * 2})


# ------------------------------------------------------------------------------------------- probe
class Resp:
    def __init__(self, status):
        self.status = status

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_probe_asks_health_generate_and_reads_the_status():
    asked = []

    def opener(url, timeout):
        asked.append((url, timeout))
        return Resp(200)
    assert watchdog.probe("127.0.0.1", 30000, 7, opener) == (True, "/health_generate answered 200")
    assert asked == [("http://127.0.0.1:30000/health_generate", 7)]
    assert watchdog.probe("::1", 1, 7, opener)[0] and asked[-1][0] == "http://[::1]:1/health_generate"

    def busy(url, timeout):
        raise urllib.error.HTTPError(url, 503, "Service Unavailable", {}, None)
    assert watchdog.probe("h", 1, 7, busy) == (False, "/health_generate answered 503")

    def hung(url, timeout):
        raise urllib.error.URLError(TimeoutError("timed out"))
    assert watchdog.probe("h", 1, 7, hung) == (False, "/health_generate timed out after 7s")

    def closed(url, timeout):
        raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
    assert "Connection refused" in watchdog.probe("h", 1, 7, closed)[1]
    assert watchdog.probe_address({"host": "0.0.0.0", "port": 1234}) == ("127.0.0.1", 1234)


# ------------------------------------------------------------------------------------------- one run
class Systemd:
    """systemctl faked: show answers from `units`, every other call recorded."""

    def __init__(self, units):
        self.units, self.calls = units, []

    def __call__(self, argv):
        if argv[:2] == ["systemctl", "show"]:
            name = argv[-1]
            props = argv[2].split("=", 1)[1].split(",")
            return 0, "".join("%s=%s\n" % (p, self.units[name].get(p, "")) for p in props), ""
        self.calls.append(argv)
        if argv[:2] == ["systemctl", "kill"] and "--kill-who=all" in argv:
            self.units[argv[-1]]["ActiveState"] = "inactive"
        return 0, "", ""


@pytest.fixture
def settings(tmp_path):
    plan = tmp_path / "current_plan.json"
    plan.write_text(json.dumps({"host": "127.0.0.1", "port": 30000, "gpu_indices": [0, 1],
                                "layout": {"nnodes": 1}}))
    return {"servers": [{"unit": "topolaunch-sglang.service", "current_plan": str(plan)}], "failures": 2,
            "max_restarts": 1, "load_timeout": 5, "probe_timeout": 1, "term_timeout": 1,
            "lock_file": str(tmp_path / "run/relaunch.lock"), "state_dir": str(tmp_path / "state"),
            "metrics_file": str(tmp_path / "metrics/watchdog.prom")}


def metrics(settings):
    out = {}
    for line in open(settings["metrics_file"], encoding="utf-8"):
        if not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key.split("{")[0]] = float(value)
    return out


def test_a_run_restarts_through_the_cleanup_then_gives_up(settings, monkeypatch):
    systemd = Systemd({"topolaunch-sglang.service": dict(unit(started=1.0))})
    cleaned = []
    monkeypatch.setattr(watchdog, "cleanup", lambda opts, nvml: cleaned.append(opts) or {"summary": "released"})

    def hung(url, timeout):
        raise urllib.error.URLError(TimeoutError("timed out"))
    lines, t = [], [100.0]
    kw = dict(nvml=object(), run=systemd, opener=hung, log=lines.append, clock=lambda: t[0], wall=lambda: 5000.0,
              sleep=lambda seconds: t.__setitem__(0, t[0] + seconds))
    assert [a for _, a, _ in watchdog.run_once(settings, **kw)] == ["fail"]
    assert metrics(settings)["topolaunch_watchdog_consecutive_failures"] == 1
    assert [a for _, a, _ in watchdog.run_once(settings, **kw)] == ["restart"]
    # SIGTERM to the launcher, SIGKILL to the cgroup after term_timeout, cleanup of the unit's GPUs and port, start
    assert ["systemctl", "kill", "--kill-who=main", "--signal=SIGTERM", "topolaunch-sglang.service"] in systemd.calls
    assert ["systemctl", "start", "--no-block", "topolaunch-sglang.service"] in systemd.calls
    assert cleaned[0]["unit_name"] == "topolaunch-sglang.service" and cleaned[0]["stop_unit"] is True
    assert cleaned[0]["gpu_indices"] == [0, 1] and cleaned[0]["ports"] == [30000]
    assert lines[-1].startswith("<3>topolaunch-watchdog: topolaunch-sglang.service: restart: ")
    assert metrics(settings)["topolaunch_watchdog_restarts_total"] == 1
    # the new start (new invocation) is loading until load_timeout, then fails twice: the limit (1) is reached
    systemd.units["topolaunch-sglang.service"] = dict(unit("inv2", started=t[0] - 1))
    assert [a for _, a, _ in watchdog.run_once(settings, **kw)] == ["loading"]
    assert metrics(settings)["topolaunch_watchdog_loading"] == 1
    t[0] += 10
    systemd.calls.clear()
    actions = [watchdog.run_once(settings, **kw)[0][1] for _ in range(2)]
    assert actions == ["fail", "give_up"] and len(cleaned) == 2
    assert not any(c[:2] == ["systemctl", "start"] for c in systemd.calls)
    assert "leaving it down" in lines[-1] and lines[-1].startswith("<3>")
    m = metrics(settings)
    assert m["topolaunch_watchdog_gave_up"] == 1 and m["topolaunch_watchdog_max_restarts"] == 1
    assert [a for _, a, _ in watchdog.run_once(settings, **kw)] == ["down"]


def test_a_run_skips_while_the_lock_is_held(settings):
    systemd = Systemd({"topolaunch-sglang.service": dict(unit(started=0.0))})
    os.makedirs(os.path.dirname(settings["lock_file"]))
    fd = os.open(settings["lock_file"], os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        def never(url, timeout):
            raise AssertionError("probed while the relaunch holds the lock")
        out = watchdog.run_once(settings, nvml=object(), run=systemd, opener=never, log=lambda line: None)
        assert [a for _, a, _ in out] == ["skip_lock"] and systemd.calls == []
        assert metrics(settings)["topolaunch_watchdog_relaunch_lock_held"] == 1
    finally:
        os.close(fd)


def test_no_plan_and_multi_node_plans_are_not_watched(settings, tmp_path):
    systemd = Systemd({"topolaunch-sglang.service": dict(unit(started=0.0))})
    os.remove(settings["servers"][0]["current_plan"])
    out = watchdog.run_once(settings, run=systemd, log=lambda line: None)
    assert out[0][1] == "skip_inactive" and "nothing launched here yet" in out[0][2]
    with open(settings["servers"][0]["current_plan"], "w", encoding="utf-8") as f:
        json.dump({"layout": {"nnodes": 2}}, f)
    assert "across nodes is not watched" in watchdog.run_once(settings, run=systemd, log=lambda line: None)[0][2]


def test_main_refuses_bad_settings_in_one_line(tmp_path, capsys):
    path = tmp_path / "watchdog.json"
    path.write_text(json.dumps({"interval": 0}))
    assert watchdog.main([str(path)]) == 2
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "interval must be a number > 0, got 0" in out


# ------------------------------------------------------------------------------------------- the answer probe
class Answers:
    """The server's chat completions faked: repeats the probe's number (right) or answers filler (wrong)."""

    def __init__(self):
        self.right, self.calls = True, []

    def __call__(self, method, url, body=None, headers=None, timeout=60.0):
        self.calls.append((method, url, dict(headers or {}), timeout))
        number = body["messages"][0]["content"].rsplit(" ", 1)[1]
        text = number if self.right else "the of and the of and"
        return 200, json.dumps({"choices": [{"message": {"content": text}, "finish_reason": "stop"}],
                                "usage": {"completion_tokens": 4}})


@pytest.fixture
def instruct(settings, tmp_path):
    """The settings' server serves an instruct model (a chat template in its directory) with an API key."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    plan_path = settings["servers"][0]["current_plan"]
    with open(plan_path, encoding="utf-8") as f:
        plan = json.load(f)
    plan.update(model_path=str(model), served_model_name="m")
    with open(plan_path, "w", encoding="utf-8") as f:
        json.dump(plan, f)
    (tmp_path / "sglang-config.yaml").write_text('# managed\napi-key: "s3cret"\n')
    return dict(settings, answer_every=3)


def test_the_answer_probe_runs_after_each_start_every_nth_pass_and_a_wrong_answer_restarts(instruct, monkeypatch):
    systemd = Systemd({"topolaunch-sglang.service": dict(unit(started=1.0))})
    monkeypatch.setattr(watchdog, "cleanup", lambda opts, nvml: {"summary": "released"})
    answers, lines, t = Answers(), [], [100.0]
    kw = dict(nvml=object(), run=systemd, opener=lambda url, timeout: Resp(200), log=lines.append,
              clock=lambda: t[0], wall=lambda: 5000.0, sleep=lambda seconds: t.__setitem__(0, t[0] + seconds),
              http=answers)
    # the first pass of the start asks it (with the server's key, the probe's timeout), then every 3rd pass
    actions = [watchdog.run_once(instruct, **kw)[0][1] for _ in range(7)]
    assert actions == ["ok"] * 7
    assert len(answers.calls) == 3, answers.calls          # passes 1, 4 and 7
    method, url, headers, timeout = answers.calls[0]
    assert (method, url, headers, timeout) == ("POST", "http://127.0.0.1:30000/v1/chat/completions",
                                               {"Authorization": "Bearer s3cret"}, 1)
    assert "the answer probe passed" in lines[0] and "the answer probe" not in lines[1]
    assert "s3cret" not in "".join(lines)
    # a wrong answer is a failure at once (the server served: no loading grace); the next run asks again
    answers.right = False
    out = [watchdog.run_once(instruct, **kw)[0] for _ in range(3)]
    assert [a for _, a, _ in out] == ["ok", "ok", "fail"]
    assert "/health_generate answered 200, but the answer probe failed" in out[2][2] and "s3cret" not in out[2][2]
    assert watchdog.run_once(instruct, **kw)[0][1] == "restart" and len(answers.calls) == 5
    # the new start: its first pass asks again
    systemd.units["topolaunch-sglang.service"] = dict(unit("inv2", started=1.0))
    answers.right = True
    assert watchdog.run_once(instruct, **kw)[0][1] == "ok" and len(answers.calls) == 6
    # answer_every 0: only after a start
    zero = dict(instruct, answer_every=0)
    assert [watchdog.run_once(zero, **kw)[0][1] for _ in range(5)] == ["ok"] * 5 and len(answers.calls) == 6
    systemd.units["topolaunch-sglang.service"] = dict(unit("inv3", started=1.0))
    assert watchdog.run_once(zero, **kw)[0][1] == "ok" and len(answers.calls) == 7


def test_the_answer_probe_off_or_a_base_model_asks_nothing(instruct, settings, monkeypatch):
    systemd = Systemd({"topolaunch-sglang.service": dict(unit(started=1.0))})
    answers = Answers()
    kw = dict(nvml=object(), run=systemd, opener=lambda url, timeout: Resp(200), log=lambda line: None,
              clock=lambda: 100.0, wall=lambda: 5000.0, http=answers)
    assert [watchdog.run_once(dict(instruct, answer_probe="off"), **kw)[0][1] for _ in range(4)] == ["ok"] * 4
    with open(instruct["servers"][0]["current_plan"], encoding="utf-8") as f:
        plan = json.load(f)
    os.remove(os.path.join(plan["model_path"], "tokenizer_config.json"))     # a base model: auto skips it
    out = [watchdog.run_once(dict(instruct, state_dir=instruct["state_dir"] + "2"), **kw)[0] for _ in range(4)]
    assert [a for _, a, _ in out] == ["ok"] * 4 and answers.calls == []
    assert "the answer probe was skipped: a base model" in out[0][2]
