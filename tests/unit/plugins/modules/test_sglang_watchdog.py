"""Module sglang_watchdog: main() installs in check mode without writing, and refuses a bad interval or failure
count in one line naming the field before anything changes."""
import pytest

from ansible_collections.topolaunch.sglang.plugins.modules import sglang_watchdog


def args(tmp_path, **extra):
    return dict({"package_dir": str(tmp_path / "opt"), "config_file": str(tmp_path / "watchdog.json"),
                 "unit_dir": str(tmp_path / "units")}, **extra)


@pytest.mark.parametrize("field, value, words", [
    ("interval", 0, "interval must be a number > 0, got 0 (set by topolaunch_watchdog_interval)"),
    ("interval", -1, "interval must be a number > 0, got -1 (set by topolaunch_watchdog_interval)"),
    ("failures", 0, "failures must be an integer > 0, got 0 (set by topolaunch_watchdog_failures)"),
    ("answer_every", -2, "answer_every must be an integer >= 0, got -2 (set by topolaunch_watchdog_answer_every)"),
    ("answer_probe", {"prompt": "hi"}, "answer_probe.expect: missing: a probe with a prompt needs the text its"),
    ("answer_probe", {"prompt": "hi"}, "(set by health_answer_probe)"),
])
def test_bad_input_is_one_line_naming_the_field(tmp_path, run_module, field, value, words):
    code, result, _ = run_module(sglang_watchdog, args(tmp_path, **{field: value}))
    assert code == 1 and result["failed"] and words in result["msg"] and "\n" not in result["msg"]
    assert result["msg"].startswith("sglang_watchdog: ") and not (tmp_path / "units").exists()


def test_check_mode_reports_the_files_and_writes_none(tmp_path, run_module, monkeypatch):
    from ansible_collections.topolaunch.sglang.plugins.module_utils import watchdog_install
    monkeypatch.setattr(watchdog_install, "_run", lambda argv: (1, "", ""))
    monkeypatch.setattr(watchdog_install.install, "__defaults__", (False, lambda argv: (1, "", ""), (0, 0)))
    code, result, _ = run_module(sglang_watchdog, args(tmp_path, interval=5, failures=2), check_mode=True)
    assert code == 0 and result["changed"] and result["settings"]["interval"] == 5
    assert result["timer"] == "topolaunch-watchdog.timer" and not (tmp_path / "units").exists()
