"""tools/alert_rules.py (make rules): every alert has a test file that checks it both ways, and a rule that does not
fire where its test says it must fails the run, through the real promtool of the pinned prometheus .deb."""
import shutil

import pytest
import yaml

import paths
from paths import ROOT

alert_rules = paths.load_script(ROOT / "tools" / "alert_rules.py", "alert_rules")


def write(path, doc):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_test_file_must_check_both_ways(tmp_path):
    fire = {"eval_time": "5m", "alertname": "A", "exp_alerts": [{"exp_labels": {"x": "1"}}]}
    quiet = {"eval_time": "1m", "alertname": "A", "exp_alerts": []}
    both = write(tmp_path / "both.yml", {"tests": [{"alert_rule_test": [fire, quiet]}]})
    assert alert_rules.test_file_problems(both, "A") == []
    only_fire = write(tmp_path / "fire.yml", {"tests": [{"alert_rule_test": [fire]}]})
    assert alert_rules.test_file_problems(only_fire, "A") == [
        "%s: no check where A must not fire (exp_alerts: [])" % only_fire]
    other = write(tmp_path / "other.yml", {"rule_files": ["x"], "tests": [{"alert_rule_test": [fire, quiet]}]})
    assert alert_rules.test_file_problems(other, "B") == [
        "%s: no check where B must fire (exp_alerts not empty)" % other,
        "%s: no check where B must not fire (exp_alerts: [])" % other,
        "%s: leave rule_files out (the rendered rules file is put in)" % other]


def test_the_role_defaults_are_the_settings():
    settings = alert_rules.default_settings()
    assert settings["kv_usage"] == 0.95 and settings["gpu_exporter"] == "nvitop"
    assert "ttft_p99_target_ms" not in settings   # a template in the role (the workload's SLO)


@pytest.fixture(scope="module")
def promtool():
    return alert_rules.promtool(ROOT / "build" / "promtool")


def copy_tests(tmp_path):
    tests = tmp_path / "tests"
    shutil.copytree(ROOT / "tests" / "rules", tests)
    return tests


def test_the_repository_rules_pass(tmp_path, promtool, capsys):
    assert alert_rules.main(["--out", str(tmp_path / "out"), "--tests", str(ROOT / "tests" / "rules"),
                             "--promtool", str(promtool)]) == 0
    assert "rule test files passed" in capsys.readouterr().out


def test_a_rule_that_should_fire_and_does_not_fails(tmp_path, promtool, capsys):
    tests = copy_tests(tmp_path)
    settings = yaml.safe_load((tests / "settings.yml").read_text())
    settings["variants"] = {"nvitop": dict(settings["variants"]["nvitop"], kv_usage=0.995)}
    (tests / "settings.yml").write_text(yaml.safe_dump(settings))
    assert alert_rules.main(["--out", str(tmp_path / "out"), "--tests", str(tests), "--promtool", str(promtool)]) == 1
    captured = capsys.readouterr()
    assert "SGLangKVCacheFull" in captured.out and "promtool test rules failed" in captured.err


def test_an_alert_without_a_test_file_fails(tmp_path, promtool, capsys):
    tests = copy_tests(tmp_path)
    (tests / "common" / "ScrapeTargetDown.yml").unlink()
    assert alert_rules.main(["--out", str(tmp_path / "out"), "--tests", str(tests), "--promtool", str(promtool)]) == 1
    assert "alert ScrapeTargetDown (nvitop) has no test file" in capsys.readouterr().err
