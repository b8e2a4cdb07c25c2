"""watchdog_install.py: the files it writes (package from the running module_utils, config, service, timer),
idempotence, check mode, bad settings before anything is written, removal; systemctl faked."""
import json
import os
import subprocess
import sys

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import watchdog_install
from ansible_collections.topolaunch.sglang.plugins.module_utils.watchdog_install import InstallError, install


class Systemctl:
    def __init__(self):
        self.calls, self.enabled = [], False

    def __call__(self, argv):
        self.calls.append(argv)
        if argv[1] in ("is-enabled", "is-active"):
            return (0, "enabled\n" if argv[1] == "is-enabled" else "active\n", "") if self.enabled else (1, "", "")
        if argv[1] == "enable":
            self.enabled = True
        return 0, "", ""


def opts(tmp_path):
    return {"package_dir": str(tmp_path / "opt"), "config_file": str(tmp_path / "etc/watchdog.json"),
            "unit_dir": str(tmp_path / "units"), "python": sys.executable}


def owner():
    return os.getuid(), os.getgid()


def test_install_writes_everything_once_and_starts_the_timer(tmp_path):
    systemctl = Systemctl()
    o = opts(tmp_path)
    first = install(o, {"interval": 2, "failures": 2}, run=systemctl, owner=owner())
    assert first["changed"] and len(first["files"]) == 11      # 8 modules, the config, the service, the timer
    assert ["systemctl", "daemon-reload"] in systemctl.calls
    assert ["systemctl", "enable", "--now", "topolaunch-watchdog.timer"] in systemctl.calls
    timer = (tmp_path / "units/topolaunch-watchdog.timer").read_text()
    assert "OnUnitActiveSec=2s" in timer and "OnActiveSec=2s" in timer
    service = (tmp_path / "units/topolaunch-watchdog.service").read_text()
    assert "Type=oneshot" in service and "-m topolaunch_watchdog.watchdog %s" % o["config_file"] in service
    config = json.loads((tmp_path / "etc/watchdog.json").read_text())
    assert config["interval"] == 2 and config["failures"] == 2 and config["max_restarts"] == 3
    systemctl.calls.clear()
    again = install(o, {"interval": 2, "failures": 2}, run=systemctl, owner=owner())
    assert again["changed"] is False and again["files"] == []
    assert not [c for c in systemctl.calls if c[1] not in ("is-enabled", "is-active")]


def test_the_installed_package_runs(tmp_path):
    """The copied modules import as one package: its main refuses bad settings in one line."""
    o = opts(tmp_path)
    install(o, {}, run=Systemctl(), owner=owner())
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"failures": 0}))
    res = subprocess.run([sys.executable, "-m", "topolaunch_watchdog.watchdog", str(bad)], capture_output=True,
                         text=True, env=dict(os.environ, PYTHONPATH=o["package_dir"]), check=False)
    assert res.returncode == 2 and "failures must be an integer > 0, got 0" in res.stdout, res.stderr


def test_check_mode_writes_nothing(tmp_path):
    systemctl = Systemctl()
    result = install(opts(tmp_path), {}, check_mode=True, run=systemctl, owner=owner())
    assert result["changed"] and result["files"] and not (tmp_path / "units").exists()
    assert all(c[1] in ("is-enabled", "is-active") for c in systemctl.calls)


@pytest.mark.parametrize("settings, words", [
    ({"interval": 0}, "interval must be a number > 0, got 0"),
    ({"failures": -1}, "failures must be an integer > 0, got -1"),
])
def test_bad_settings_fail_before_anything_is_written(tmp_path, settings, words):
    with pytest.raises(InstallError, match=words):
        install(opts(tmp_path), settings, run=Systemctl(), owner=owner())
    assert not (tmp_path / "units").exists() and not (tmp_path / "opt").exists()


def test_absent_removes_it(tmp_path):
    systemctl = Systemctl()
    o = opts(tmp_path)
    install(o, {}, run=systemctl, owner=owner())
    gone = install(dict(o, state="absent"), {}, run=systemctl, owner=owner())
    assert gone["changed"] and ["systemctl", "disable", "--now", "topolaunch-watchdog.timer"] in systemctl.calls
    assert not os.listdir(tmp_path / "units") and not (tmp_path / "opt/topolaunch_watchdog").exists()
    assert install(dict(o, state="absent"), {}, run=systemctl, owner=owner())["changed"] is False


def test_paths_with_spaces_are_refused(tmp_path):
    with pytest.raises(InstallError, match="python must be an absolute path"):
        install(dict(opts(tmp_path), python="/usr/bin/python3 -c evil"), {}, run=Systemctl(), owner=owner())


def test_package_sources_are_the_running_modules():
    sources = watchdog_install.package_sources()
    assert set(sources) == {"__init__.py", "watchdog.py", "cleanup.py", "constants.py", "system.py",
                            "health.py", "health_nodes.py", "text.py"}     # the last three: the answer probe
    assert "def decide(" in sources["watchdog.py"] and "def cleanup(" in sources["cleanup.py"]
