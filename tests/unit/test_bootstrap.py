"""The first run, as a new user makes it: `./bootstrap` (the README's first command: OS packages, then what `make
demo` does, without needing make beforehand), user inventories ignored by git but not the project's own, and the
example inventory that the README's "Using it on your box" points at."""
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
BOOTSTRAP = ROOT / "bootstrap"


def fake_bin(tmp_path, uid, missing=()):
    """PATH stand-ins: dpkg-query (installed unless in `missing`), id -u, and apt-get and make that log their
    arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "log"
    scripts = {
        "dpkg-query": 'for a; do last=$a; done; case " %s " in *" $last "*) exit 1 ;; esac; printf installed'
                      % " ".join(missing),
        "id": "echo %d" % uid,
        "apt-get": 'echo "apt-get $*" >> %s' % log,
        "make": 'echo "make $*" >> %s' % log,
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body + "\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir, log


def bootstrap(tmp_path, *args, uid=0, missing=(), python=sys.executable):
    bin_dir, log = fake_bin(tmp_path, uid, missing)
    env = dict(os.environ, PATH="%s:/usr/bin:/bin" % bin_dir, PYTHON=python)
    proc = subprocess.run([shutil.which("dash") or "sh", str(BOOTSTRAP), *args], env=env, capture_output=True,
                          text=True, check=False, timeout=60)
    return proc, (log.read_text().splitlines() if log.exists() else [])


pytestmark = pytest.mark.skipif(not pathlib.Path("/etc/os-release").exists() or "debian" not in
                                pathlib.Path("/etc/os-release").read_text(), reason="needs a Debian-like host")


def test_bootstrap_is_posix_sh():
    assert BOOTSTRAP.stat().st_mode & 0o111
    assert subprocess.run([shutil.which("dash") or "sh", "-n", str(BOOTSTRAP)], check=False).returncode == 0


def test_bootstrap_as_a_user_prints_the_exact_command(tmp_path):
    proc, log = bootstrap(tmp_path, uid=1000, missing=("gcc", "debootstrap"))
    assert proc.returncode == 1 and log == []
    assert "  sudo apt-get update && sudo apt-get install -y --no-install-recommends gcc debootstrap\n" in proc.stderr
    assert "then run: sudo ./bootstrap" in proc.stderr


def test_bootstrap_as_root_installs_then_runs_the_demo(tmp_path):
    proc, log = bootstrap(tmp_path, uid=0, missing=("make", "systemd-container"))
    assert proc.returncode == 0, proc.stderr
    assert log == ["apt-get update -qq", "apt-get install -y -qq --no-install-recommends make systemd-container",
                   "make demo PYTHON=%s" % sys.executable]


def test_bootstrap_test_and_packages(tmp_path):
    proc, log = bootstrap(tmp_path, "test", uid=0)
    assert proc.returncode == 0 and log == ["make test PYTHON=%s" % sys.executable]
    (tmp_path / "p").mkdir()
    proc, log = bootstrap(tmp_path / "p", "packages", uid=1000)
    assert proc.returncode == 0 and log == [] and "the OS packages are there" in proc.stdout


def test_bootstrap_refuses_what_it_cannot_do(tmp_path):
    proc, log = bootstrap(tmp_path, uid=1000)
    assert proc.returncode == 1 and log == [] and "needs root: run sudo ./bootstrap" in proc.stderr
    old = tmp_path / "python3.10"
    old.write_text("#!/bin/sh\ncase \"$2\" in *exit*) exit 1 ;; esac; echo 3.10\n")
    old.chmod(0o755)
    (tmp_path / "q").mkdir()
    proc, log = bootstrap(tmp_path / "q", uid=0, python=str(old))
    assert proc.returncode == 1 and log == [] and "is Python 3.10; topolaunch needs 3.11 or 3.12" in proc.stderr
    (tmp_path / "r").mkdir()
    proc, _ = bootstrap(tmp_path / "r", "bogus")
    assert proc.returncode == 2 and "usage:" in proc.stderr


def _git(*args):
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)


@pytest.mark.skipif(_git("rev-parse").returncode != 0, reason="not a git checkout")
def test_user_inventories_are_ignored_and_the_projects_are_not():
    assert _git("check-ignore", "-q", "inventory/mybox/hosts.yml").returncode == 0
    assert _git("check-ignore", "-q", "inventory/mybox/group_vars/all/vault.yml").returncode == 0
    for own in ("lab", "example", "lab-multinode"):
        assert _git("check-ignore", "-q", "inventory/%s/hosts.yml" % own).returncode == 1, own


def test_the_example_inventory_has_every_variable_the_readme_lists():
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## Using it on your box", 1)[1].split("```", 1)[0]
    first_cells = re.findall(r"^\| ([^|]*) \|", table, re.M)
    listed = {name for cell in first_cells for name in re.findall(r"`(\w+)`", cell)}
    example = ROOT / "inventory" / "example"
    defined = {}
    for path in list(example.glob("*.yml")) + list(example.glob("group_vars/all/*")):
        data = yaml.safe_load(path.read_text()) or {}
        defined.update(data)
    defined.update((yaml.safe_load((example / "hosts.yml").read_text())["all"]["children"]["gpu_hosts"]["children"]
                    ["sglang_servers"]["hosts"]["gpu-box-01"]))
    assert "topolaunch_gpus" in listed
    missing = sorted(n for n in listed if n not in defined and n != "model_weights_dir")
    assert not missing, "inventory/example lacks %s" % missing
    assert "ansible_become" not in defined           # root only where needed: the roles say where


def test_the_vault_is_documented_without_a_terminal():
    text = (ROOT / "inventory" / "example" / "group_vars" / "all" / "vault.yml.example").read_text()
    assert "ansible-vault encrypt --vault-password-file" in text
    assert "ansible-vault encrypt --vault-password-file" in (ROOT / "README.md").read_text()
