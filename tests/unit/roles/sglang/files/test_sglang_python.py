"""roles/sglang/files/sglang_python.py: which interpreter an SGLang venv is made from, or why none can be.

The CPython versions per release are the sglang role's own table (defaults/main.yml, sglang_python_versions);
the hosts are Debian 12 (python3 3.11), Ubuntu 22.04 (3.10; apt offers python3.11 in jammy-updates) and Ubuntu
24.04 (3.12). The script is a role file run on the host with its python3, loaded here from its path.
"""
import json
import subprocess
import sys

import pytest
import yaml
import paths

ROOT = paths.ROOT
SCRIPT = ROOT / "roles" / "sglang" / "files" / "sglang_python.py"
sglang_python = paths.load_script(SCRIPT, "sglang_python")

TABLE = yaml.safe_load((ROOT / "roles" / "sglang" / "defaults" / "main.yml").read_text())["sglang_python_versions"]
PY3 = "/usr/bin/python3"


def choose(version, default_version, installed=None, offered=(), explicit=None):
    return sglang_python.decide(version, TABLE.get(version, []), (PY3, default_version), installed or {},
                                list(offered), explicit)


def test_the_table_says_what_the_wheels_say():
    """docs/sglang-versions.md: 0.5.9 is py3-none-any with Requires-Python >=3.10 (its torch has 3.10-3.13 wheels);
    0.5.23 has cp311, cp312, cp313 wheels only."""
    assert TABLE == {"0.5.9": ["3.10", "3.11", "3.12", "3.13"], "0.5.23": ["3.11", "3.12", "3.13"]}


@pytest.mark.parametrize("version, host_python", [("0.5.23", "3.11"), ("0.5.23", "3.12"), ("0.5.9", "3.10"),
                                                  ("0.5.9", "3.11"), ("0.6.0", "3.10")])
def test_the_hosts_python3_when_it_has_wheels(version, host_python):
    """Debian 12 and Ubuntu 24.04 with 0.5.23, Ubuntu 22.04 with 0.5.9; a release without a table: no constraint."""
    got = choose(version, host_python, offered=["3.11"])
    assert (got["python"], got["python_version"], got["packages"]) == (PY3, host_python, [])


def test_ubuntu_22_04_gets_the_distributions_python_3_11_for_0_5_23():
    got = choose("0.5.23", "3.10", offered=["3.11"])
    assert (got["python"], got["python_version"], got["packages"]) == ("/usr/bin/python3.11", "3.11",
                                                                      ["python3.11", "python3.11-venv"])
    assert got["reason"] == ("SGLang 0.5.23 has wheels for CPython 3.11, 3.12, 3.13 only and the host's python3 is "
                             "3.10: Python 3.11 from the distribution")


def test_an_installed_matching_python_is_preferred_to_installing_one():
    got = choose("0.5.23", "3.10", installed={"3.12": "/usr/local/bin/python3.12"}, offered=["3.11"])
    assert (got["python"], got["packages"]) == ("/usr/local/bin/python3.12", [])
    assert got["reason"].endswith("Python 3.12 found on the host")


def test_refused_with_the_reason_when_nothing_matches():
    got = choose("0.5.23", "3.10")
    assert got == {"error": "SGLang 0.5.23 has wheels for CPython 3.11, 3.12, 3.13 only; this host's python3 "
                            "(/usr/bin/python3) is 3.10 and its distribution offers none of python3.11, python3.12, "
                            "python3.13 (with its -venv package). Use a distribution that has one (Debian 12, "
                            "Ubuntu 24.04), or set sglang_base_python to a CPython 3.11, 3.12, 3.13 interpreter"}
    assert "python3 (/usr/bin/python3) is missing" in choose("0.5.23", None)["error"]


def test_the_users_interpreter_is_taken_or_refused_naming_its_version():
    assert choose("0.5.23", "3.10", explicit=("/opt/py/bin/python3.12", "3.12"))["python"] == "/opt/py/bin/python3.12"
    assert choose("0.5.23", "3.11", explicit=("/usr/bin/python3.10", "3.10")) == {
        "error": "sglang_base_python /usr/bin/python3.10 is Python 3.10, but SGLang 0.5.23 has wheels for CPython "
                 "3.11, 3.12, 3.13 only"}
    assert choose("0.5.23", "3.11", explicit=("/nowhere/python", None)) == {
        "error": "sglang_base_python /nowhere/python does not run"}


def test_apt_cache_policy_output_is_read():
    policy = ("python3.11:\n  Installed: (none)\n  Candidate: 3.11.0~rc1-1~22.04\n  Version table:\n"
              "     3.11.0~rc1-1~22.04 500\n        500 http://archive.ubuntu.com/ubuntu jammy-updates/universe amd64"
              " Packages\npython3.11-venv:\n  Installed: (none)\n  Candidate: 3.11.0~rc1-1~22.04\n"
              "python3.12:\n  Installed: (none)\n  Candidate: (none)\n  Version table:\n")
    assert sglang_python.apt_offered(policy) == {"python3.11", "python3.11-venv"}


def test_the_script_prints_its_choice_as_json():
    """Run as the role runs it, with this machine's python3: a choice or a refusal, one JSON object."""
    arg = json.dumps({"sglang_version": "0.5.23", "supported": TABLE["0.5.23"], "base_python": sys.executable})
    out = json.loads(subprocess.run([sys.executable, str(SCRIPT), arg], capture_output=True, text=True,
                                    check=True).stdout)
    mine = "%d.%d" % sys.version_info[:2]
    assert out == ({"python": sys.executable, "python_version": mine, "packages": [],
                    "reason": "sglang_base_python, Python %s" % mine} if mine in TABLE["0.5.23"] else
                   {"error": "sglang_base_python %s is Python %s, but SGLang 0.5.23 has wheels for CPython 3.11, "
                             "3.12, 3.13 only" % (sys.executable, mine)})


def test_an_installed_older_match_beats_installing_a_newer_one():
    """Python 3.11 already there, the distribution offering 3.12 too: 3.11, with its -venv package where offered."""
    got = choose("0.5.23", "3.10", installed={"3.11": "/usr/bin/python3.11"}, offered=["3.11", "3.12"])
    assert (got["python"], got["packages"]) == ("/usr/bin/python3.11", ["python3.11", "python3.11-venv"])
    assert choose("0.5.23", "3.10", installed={"3.11": "/usr/local/bin/python3.11"},
                  offered=["3.12"])["python"] == "/usr/local/bin/python3.11"


def test_a_host_python3_with_wheels_is_taken_without_asking_apt(monkeypatch, capsys):
    """The common case costs no apt-cache run (seconds on a host): the host's python3 has the release's wheels."""
    ran = []
    monkeypatch.setattr(sglang_python, "python_version", lambda path: "3.11" if path == PY3 else None)
    monkeypatch.setattr(sglang_python.subprocess, "run", lambda argv, **kw: ran.append(argv))
    monkeypatch.setattr(sys, "argv", ["sglang_python.py", json.dumps({"sglang_version": "0.5.23",
                                                                      "supported": TABLE["0.5.23"]})])
    sglang_python.main()
    assert json.loads(capsys.readouterr().out)["python"] == PY3 and ran == []
    monkeypatch.setattr(sglang_python, "python_version", lambda path: "3.10" if path == PY3 else None)
    monkeypatch.setattr(sglang_python.subprocess, "run", lambda argv, **kw: ran.append(argv) or
                        subprocess.CompletedProcess(argv, 0, b"", b""))
    sglang_python.main()
    assert ran and ran[0][:2] == ["apt-cache", "policy"]            # python3 3.10: apt is asked for 3.11-3.13
    assert "error" in json.loads(capsys.readouterr().out)
