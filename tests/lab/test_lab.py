"""lab/lab.py: bad input is refused before anything changes; `up` is idempotent and applies spec changes to
running hosts; `down` leaves no process, mount or veth behind.

The tests marked `lab` boot two hosts of a private inventory (ports 2251-2252, repo server 18088, state in
.lab/pytest-lab/) and need root, systemd-nspawn and debootstrap (the cached rootfs is built when missing):

    .venv/bin/pytest -m lab tests/lab/test_lab.py
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAB_PY = ROOT / "lab" / "lab.py"
SPECS = ROOT / "lab" / "specs"
NAME = "pytest-lab"
STATE = ROOT / ".lab" / NAME
PORTS = {"alpha": 2251, "beta": 2252}
REPO_PORT = 18088
SSH_KEY = ROOT / ".lab" / "ssh" / "id_ed25519"

LAB_MISSING = os.geteuid() != 0 or not shutil.which("systemd-nspawn") or not shutil.which("debootstrap")


def write_inventory(directory, hosts, repo_port=REPO_PORT):
    """hosts: {name: (port, spec)} -> <directory>/hosts.yml."""
    directory.mkdir(parents=True, exist_ok=True)
    inv = {"all": {"vars": {"lab_repo_port": repo_port},
                   "hosts": {h: {"ansible_port": p, "lab_gpu_spec": s} for h, (p, s) in hosts.items()}}}
    (directory / "hosts.yml").write_text(yaml.safe_dump(inv), encoding="utf-8")
    return directory


def lab(inventory, *args):
    return subprocess.run([sys.executable, str(LAB_PY), "-i", str(inventory), *args],
                          capture_output=True, text=True, check=False, timeout=600)


def ssh(port, command):
    proc = subprocess.run(
        ["ssh", "-F", "/dev/null", "-i", str(SSH_KEY), "-p", str(port), "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
         "root@127.0.0.1", command], capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 0, f"ssh -p {port} {command!r}: {proc.stderr}"
    return proc.stdout


def nspawn_pids():
    """{host: pid} of the nspawn processes lab.py recorded and that are still alive."""
    pids = {}
    for f in STATE.glob("hosts/*/host.json"):
        rec = json.loads(f.read_text()).get("nspawn")
        if rec and starttime(rec["pid"]) == rec["starttime"]:
            pids[f.parent.name] = rec["pid"]
    return pids


def mounts_under(path):
    path = str(path.resolve())
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        return [ln.split()[4] for ln in f if ln.split()[4] == path or ln.split()[4].startswith(path + "/")]


def container_pids():
    """pids running inside our hosts: their root directory is one of the hosts' (mounted) roots."""
    roots = {(st.st_dev, st.st_ino) for st in (r.stat() for r in STATE.glob("hosts/*/root"))}
    found = []
    for p in pathlib.Path("/proc").iterdir():
        try:
            st = (p / "root").stat()
        except OSError:
            continue
        if p.name.isdigit() and (st.st_dev, st.st_ino) in roots:
            found.append(int(p.name))
    return found


def starttime(pid):
    """Field 22 of /proc/<pid>/stat (tells a pid from a later process that reuses it); None when gone or a zombie."""
    try:
        stat = (pathlib.Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    return None if fields[0] == "Z" else fields[19]


def listening(port):
    with open("/proc/net/tcp", encoding="ascii") as f:
        return any(ln.split()[1].endswith(f":{port:04X}") and ln.split()[3] == "0A" for ln in f.readlines()[1:])


def expected_sysfs(spec_name):
    spec = json.loads((SPECS / f"{spec_name}.json").read_text())
    out = {}
    for gpu in spec["gpus"]:
        domain, rest = gpu["pci_bus_id"].split(":", 1)
        out[f"{int(domain, 16):04x}:{rest.lower()}"] = str(gpu.get("sysfs_numa_node", gpu["numa_node"]))
    return out


def host_sysfs(port):
    out = ssh(port, "cd /etc/fake-nvml/sysfs/bus/pci/devices && for d in *; do echo $d $(cat $d/numa_node); done")
    return dict(line.split() for line in out.splitlines())


# ----------------------------------------------------------------------------------------------------------
# Bad input: refused with the bad value named, before anything changes (no root needed).


@pytest.mark.parametrize("hosts, message", [
    ({"alpha": (2251, "no-such-spec")}, "no-such-spec.json does not exist"),
    ({"alpha": (2251, "proxmox-8x-rtx-pro-6000-naive"), "beta": (2251, "proxmox-8x-rtx-pro-6000-naive")},
     "both use ansible_port 2251"),
    ({"Bad_Host": (2251, "proxmox-8x-rtx-pro-6000-naive")}, "'Bad_Host'"),
    ({"alpha": (22, "proxmox-8x-rtx-pro-6000-naive")}, "ansible_port 22 "),
    # a spec given as a path (with a '/') is relative to the inventory directory
    ({"alpha": (2251, "./bad-spec.json")}, "pci_bus_id '01:00.0'"),
])
def test_bad_inventory_is_refused_before_anything_changes(tmp_path, hosts, message):
    inventory = write_inventory(tmp_path / "pytest-bad", hosts)
    bad = json.loads((SPECS / "h200x2-vm-real.json").read_text())
    bad["gpus"][1]["pci_bus_id"] = "01:00.0"
    (inventory / "bad-spec.json").write_text(json.dumps(bad))
    proc = lab(inventory, "up")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert not (ROOT / ".lab" / "pytest-bad").exists()


def test_bad_repo_port_is_refused(tmp_path):
    inventory = write_inventory(tmp_path / "pytest-bad", {"alpha": (2251, "h200x2-vm-real")}, repo_port="x")
    proc = lab(inventory, "status")
    assert proc.returncode == 1
    assert "lab_repo_port 'x'" in proc.stderr


# ----------------------------------------------------------------------------------------------------------
# A running lab (module scope: booted once, always taken down and purged at the end).


@pytest.fixture(scope="module")
def inventory(tmp_path_factory):
    if LAB_MISSING:
        pytest.skip("needs root, systemd-nspawn (systemd-container) and debootstrap")
    inv = write_inventory(tmp_path_factory.mktemp("inv") / NAME,
                          {"alpha": (PORTS["alpha"], "proxmox-8x-rtx-pro-6000-naive"),
                           "beta": (PORTS["beta"], "proxmox-8x-rtx-pro-6000-vnuma")})
    yield inv
    proc = lab(inv, "down", "--purge")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.lab
def test_up_boots_systemd_hosts(inventory):
    proc = lab(inventory, "up")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for host, port in PORTS.items():
        assert ssh(port, "hostname").strip() == host
        assert ssh(port, "cat /proc/1/comm").strip() == "systemd"
    assert sorted(nspawn_pids()) == ["alpha", "beta"]
    assert host_sysfs(PORTS["alpha"]) == expected_sysfs("proxmox-8x-rtx-pro-6000-naive")
    assert listening(REPO_PORT)
    status = lab(inventory, "status").stdout
    assert "alpha" in status and "running" in status and str(PORTS["beta"]) in status


@pytest.mark.lab
def test_second_up_reuses_running_hosts(inventory):
    before = nspawn_pids()
    t0 = time.monotonic()
    proc = lab(inventory, "up")
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "booting" not in proc.stdout
    assert nspawn_pids() == before
    assert elapsed < 60


@pytest.mark.lab
def test_up_applies_a_spec_change_to_a_running_host(inventory):
    before = nspawn_pids()
    write_inventory(inventory, {"alpha": (PORTS["alpha"], "proxmox-8x-rtx-pro-6000-naive"),
                                "beta": (PORTS["beta"], "h200x2-vm-real")})
    proc = lab(inventory, "up")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert nspawn_pids() == before
    assert "beta: running" in proc.stdout and "updated /etc/fake-nvml/spec.json" in proc.stdout
    assert json.loads(ssh(PORTS["beta"], "cat /etc/fake-nvml/spec.json")) == \
        json.loads((SPECS / "h200x2-vm-real.json").read_text())
    assert host_sysfs(PORTS["beta"]) == expected_sysfs("h200x2-vm-real")


@pytest.mark.lab
def test_stop_and_start_one_host(inventory):
    """`stop beta` powers beta off (the lab's unreachable node) and leaves alpha and the repo alone; `start beta`
    boots it again."""
    before = nspawn_pids()
    proc = lab(inventory, "stop", "beta")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert nspawn_pids() == {"alpha": before["alpha"]}
    assert not listening(PORTS["beta"]) and listening(REPO_PORT)
    assert ssh(PORTS["alpha"], "hostname").strip() == "alpha"
    assert [ln.split()[2] for ln in lab(inventory, "status").stdout.splitlines()[3:]] == ["running", "stopped"]
    proc = lab(inventory, "start", "beta")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "alpha" not in proc.stdout
    pids = nspawn_pids()
    assert pids["alpha"] == before["alpha"] and pids["beta"] != before["beta"]
    assert ssh(PORTS["beta"], "hostname").strip() == "beta"


@pytest.mark.lab
def test_down_leaves_nothing_behind(inventory):
    processes = {p: starttime(p) for p in [*nspawn_pids().values(), *container_pids()]}
    assert len(processes) > 4, f"expected nspawn, systemd, sshd, ... of both hosts, found pids {list(processes)}"
    proc = lab(inventory, "down")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert nspawn_pids() == {}
    assert [p for p, t in processes.items() if starttime(p) == t] == []
    assert mounts_under(STATE) == []
    assert [i for i in os.listdir("/sys/class/net") if i.startswith(("ve-tl-pytest", "vb-tl-pytest"))] == []
    assert not any(listening(p) for p in [*PORTS.values(), REPO_PORT])
    again = lab(inventory, "down")
    assert again.returncode == 0, again.stdout + again.stderr
