"""lab/lab.py up next to another lab: a port another process holds is refused before anything changes, saying who
holds it (another checkout's lab repository server with that checkout's path, or the process) and how to pick
other ports; and a lab's state is its checkout's (`status` in one checkout never shows another's hosts).

Opens ports 18203 and 2530 on 127.0.0.1 (this helper's: run it in its network namespace) and needs root, as
`lab.py up` does."""
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
REPO_PORT, SSH_PORT = 18203, 2530
NAME = "unit-ports"
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("systemd-nspawn")
                                or not shutil.which("debootstrap"), reason="lab.py up needs root and its tools")


@pytest.fixture
def inventory(tmp_path):
    inv = tmp_path / NAME
    inv.mkdir()
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"vars": {"lab_repo_port": REPO_PORT}, "hosts": {
        "alpha": {"ansible_port": SSH_PORT, "lab_gpu_spec": "proxmox-8x-rtx-pro-6000-vnuma"}}}}))
    yield inv
    assert not (ROOT / ".lab" / NAME).exists(), "a refused command left lab state behind"


def lab(inventory, *args, lab_py=ROOT / "lab" / "lab.py"):
    return subprocess.run([sys.executable, str(lab_py), "-i", str(inventory), *args],
                          capture_output=True, text=True, check=False, timeout=60)


def listening(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def other_checkout(tmp_path):
    """Another checkout's lab repository server on REPO_PORT, as its lab.py starts it."""
    other = tmp_path / "other-clone"
    (other / "build" / "repo").mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory",
                             str(other / "build" / "repo"), str(REPO_PORT)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not listening(REPO_PORT):
            assert time.monotonic() < deadline and proc.poll() is None, "the stand-in repository server did not listen"
            time.sleep(0.1)
        yield other, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_repo_port_of_another_checkouts_lab_names_it_and_the_way_out(inventory, other_checkout):
    other, pid = other_checkout
    proc = lab(inventory, "up")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert err.startswith(f"lab.py up: error: lab_repo_port {REPO_PORT}: something else already listens on "
                          f"127.0.0.1:{REPO_PORT}: another checkout's ({other}) lab repository server (pid {pid})."), err
    assert f"free ports (lab_repo_port, each host's ansible_port and topolaunch_port) in {inventory}/hosts.yml" in err
    assert "make lab-down" in err and len(err.splitlines()) == 1


def test_an_ssh_port_held_by_a_process_names_the_process(inventory):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", SSH_PORT))
        s.listen()
        proc = lab(inventory, "up")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (f"alpha: ansible_port {SSH_PORT}: something else already listens on 127.0.0.1:{SSH_PORT}: pid {os.getpid()} "
            f"({sys.executable}") in proc.stderr, proc.stderr


def test_a_labs_state_is_its_checkouts(inventory, tmp_path):
    """A host recorded running in another checkout's .lab/ (a live process) is that checkout's: this checkout's
    status shows it stopped, the other's running."""
    other = tmp_path / "other-clone"
    (other / "lab").mkdir(parents=True)
    shutil.copy(ROOT / "lab" / "lab.py", other / "lab" / "lab.py")
    shutil.copytree(ROOT / "lab" / "specs", other / "lab" / "specs")
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        with open(f"/proc/{sleeper.pid}/stat", encoding="ascii") as f:
            stat = f.read()
        starttime = stat[stat.rfind(")") + 2:].split()[19]
        host = other / ".lab" / NAME / "hosts" / "alpha"
        host.mkdir(parents=True)
        (host / "host.json").write_text(json.dumps({"port": SSH_PORT, "spec": "proxmox-8x-rtx-pro-6000-vnuma",
                                                    "nspawn": {"pid": sleeper.pid, "starttime": starttime}}))
        ours, theirs = lab(inventory, "status"), lab(inventory, "status", lab_py=other / "lab" / "lab.py")
    finally:
        sleeper.kill()
        sleeper.wait()
    assert ours.returncode == 0 and theirs.returncode == 0, ours.stderr + theirs.stderr
    assert f"state {ROOT}/.lab/{NAME}" in ours.stdout and f"state {other}/.lab/{NAME}" in theirs.stdout
    row = [line.split() for line in ours.stdout.splitlines() if line.split()[:1] == ["alpha"]]
    assert row and row[0][2] == "stopped", ours.stdout
    row = [line.split() for line in theirs.stdout.splitlines() if line.split()[:1] == ["alpha"]]
    assert row and row[0][2] == "running", theirs.stdout
