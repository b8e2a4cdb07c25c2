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


def written_spec(spec_name):
    """The spec as lab.py writes it on this machine (lab/specs, its CPUs folded onto the host's: fold_cpus)."""
    sys.path.insert(0, str(ROOT / "lab"))
    import lab as lab_py  # pylint: disable=import-outside-toplevel
    return json.loads(lab_py.spec_files(str(SPECS / f"{spec_name}.json"))[0])


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
    assert json.loads(ssh(PORTS["beta"], "cat /etc/fake-nvml/spec.json")) == written_spec("h200x2-vm-real")
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


def outside_cgroup(pid):
    """The cgroup v2 line of a process as this machine sees it (outside every lab host)."""
    lines = pathlib.Path(f"/proc/{pid}/cgroup").read_text(encoding="utf-8").splitlines()
    return [ln for ln in lines if ln.startswith("0::")][0]


def host_cgroup_dirs():
    """The cgroups lab.py made for this lab's hosts, as recorded in their state."""
    return [d for f in STATE.glob("hosts/*/host.json") for d in json.loads(f.read_text()).get("cgroups", [])]


@pytest.mark.lab
def test_hosts_have_cgroup_trees_of_their_own(inventory):
    """The same unit on two hosts lives in two cgroups: before, every host rooted its tree in lab.py's own cgroup, so
    a unit one host stopped removed the cgroup another host was starting the same-named unit in (219/CGROUP)."""
    for port in PORTS.values():
        ssh(port, "systemd-run --unit=tl-cgroup-probe --property=Type=exec /usr/bin/tail -f /dev/null")
    probe = b"/usr/bin/tail\x00-f\x00/dev/null\x00"         # idles until stopped (Type=exec: it runs when systemd-run returns)
    probes = [q for q in container_pids() if pathlib.Path(f"/proc/{q}/cmdline").read_bytes() == probe]
    assert len(probes) == 2, probes
    cgroups = [outside_cgroup(q) for q in probes]
    assert all(c.endswith("/system.slice/tl-cgroup-probe.service") for c in cgroups), cgroups
    assert cgroups[0] != cgroups[1], cgroups
    ssh(PORTS["alpha"], "systemctl stop tl-cgroup-probe")
    assert ssh(PORTS["beta"], "systemctl is-active tl-cgroup-probe").strip() == "active"
    ssh(PORTS["beta"], "systemctl kill --signal=SIGTERM tl-cgroup-probe")
    assert host_cgroup_dirs() and all(os.path.isdir(d) for d in host_cgroup_dirs())


@pytest.mark.lab
def test_down_leaves_nothing_behind(inventory):
    cgroups = host_cgroup_dirs()
    processes = {p: starttime(p) for p in [*nspawn_pids().values(), *container_pids()]}
    assert len(processes) > 4, f"expected nspawn, systemd, sshd, ... of both hosts, found pids {list(processes)}"
    proc = lab(inventory, "down")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert nspawn_pids() == {}
    assert [p for p, t in processes.items() if starttime(p) == t] == []
    assert mounts_under(STATE) == []
    assert cgroups and [d for d in cgroups if os.path.exists(d)] == []
    assert [i for i in os.listdir("/sys/class/net") if i.startswith(("ve-tl-pytest", "vb-tl-pytest"))] == []
    assert not any(listening(p) for p in [*PORTS.values(), REPO_PORT])
    again = lab(inventory, "down")
    assert again.returncode == 0, again.stdout + again.stderr


# ----------------------------------------------------------------------------------------------------------
# Layers: a stopped host's disk saved (save-layer), other hosts booted from it (lab_layer). A bare host of
# .lab/pytest-layer-src/ (ssh 2253, repo 18086) gets a marker file and its lab port's cuda-keyring (what
# provisioning installs first); two hosts of .lab/pytest-layer/ (ssh 2254-2255, repo 18087) boot from its layer.

LAYER = ROOT / ".lab" / "layers-test" / "marked"
SRC_PORT, SRC_REPO, COPY_PORTS, COPY_REPO = 2253, 18086, {"one": 2254, "two": 2255}, 18087
IDENTITY = "hostname; cat /etc/machine-id; ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub | cut -d' ' -f2"


def test_a_host_on_something_that_is_no_layer_is_refused(tmp_path):
    inventory = write_inventory(tmp_path / "pytest-bad", {"alpha": (2251, "h200x2-vm-real")})
    (inventory / "empty").mkdir()
    data = yaml.safe_load((inventory / "hosts.yml").read_text())
    data["all"]["hosts"]["alpha"]["lab_layer"] = "empty"  # relative to the inventory directory
    (inventory / "hosts.yml").write_text(yaml.safe_dump(data))
    proc = lab(inventory, "up")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"lab_layer {inventory / 'empty'} is not a layer" in proc.stderr
    assert not (ROOT / ".lab" / "pytest-bad").exists()


@pytest.fixture(scope="module")
def layered(tmp_path_factory):
    """The source host booted and marked, its disk saved as LAYER, then two hosts booted from it."""
    if LAB_MISSING:
        pytest.skip("needs root, systemd-nspawn (systemd-container) and debootstrap")
    src = write_inventory(tmp_path_factory.mktemp("src") / "pytest-layer-src",
                          {"src": (SRC_PORT, "proxmox-8x-rtx-pro-6000-vnuma")}, repo_port=SRC_REPO)
    copies = write_inventory(tmp_path_factory.mktemp("copies") / "pytest-layer",
                             {h: (p, "h200x2-vm-real") for h, p in COPY_PORTS.items()}, repo_port=COPY_REPO)
    data = yaml.safe_load((copies / "hosts.yml").read_text())
    for host in data["all"]["hosts"].values():
        host["lab_layer"] = str(LAYER)
    (copies / "hosts.yml").write_text(yaml.safe_dump(data))
    shutil.rmtree(LAYER.parent, ignore_errors=True)
    try:
        assert lab(src, "up").returncode == 0
        ssh(SRC_PORT, "echo from-the-layer > /opt/marker && curl -fsS -o /tmp/k.deb "
                      f"http://127.0.0.1:{SRC_REPO}/keyring/{SRC_REPO}/cuda-keyring_1.1-1_all.deb && dpkg -i /tmp/k.deb"
                      " >/dev/null && apt-get update -qq -o Dir::Etc::SourceParts=/nonexistent "
                      "-o Dir::Etc::SourceList=/etc/apt/sources.list.d/cuda-debian12-x86_64.list")
        source = ssh(SRC_PORT, IDENTITY).split()
        refused = lab(src, "save-layer", "src", str(LAYER))   # still running
        assert lab(src, "down").returncode == 0
        saved = lab(src, "save-layer", "src", str(LAYER))
        again = lab(src, "save-layer", "src", str(LAYER))
        up = lab(copies, "up")
        assert up.returncode == 0, up.stdout + up.stderr
        yield {"source": source, "refused": refused, "saved": saved, "again": again, "up": up}
    finally:
        for inv in (copies, src):
            lab(inv, "down", "--purge")
        shutil.rmtree(LAYER.parent, ignore_errors=True)


@pytest.mark.lab
def test_save_layer_takes_a_stopped_host_only_once(layered):
    assert layered["refused"].returncode == 1 and "src is running" in layered["refused"].stderr
    assert layered["saved"].returncode == 0, layered["saved"].stdout + layered["saved"].stderr
    assert layered["again"].returncode == 1   # the host's disk became the layer: nothing left to save
    manifest = json.loads((LAYER / "layer.json").read_text())
    assert manifest["repo_port"] == SRC_REPO and manifest["rootfs"].startswith("/")
    assert (LAYER / "root" / "opt" / "marker").read_text() == "from-the-layer\n"
    # What is each host's own is not in the layer.
    for own in ("etc/machine-id", "etc/hostname", "etc/fake-nvml", "etc/ssh/sshd_config.d/10-lab-listen.conf",
                "root/.ssh", "var/log/journal/" + layered["source"][1]):
        assert not os.path.lexists(LAYER / "root" / own), own
    assert not list((LAYER / "root" / "etc" / "ssh").glob("ssh_host_*"))


@pytest.mark.lab
def test_hosts_on_a_layer_have_its_files_and_their_own_identity(layered):
    assert "layer marked" in layered["up"].stdout
    seen = {}
    for host, port in COPY_PORTS.items():
        assert ssh(port, "cat /opt/marker") == "from-the-layer\n"
        name, machine_id, host_key = ssh(port, IDENTITY).split()
        assert name == host
        seen[host] = (machine_id, host_key)
        assert host_sysfs(port) == expected_sysfs("h200x2-vm-real")
    (one_id, one_key), (two_id, two_key) = seen["one"], seen["two"]
    source_id, source_key = layered["source"][1:]
    assert len({one_id, two_id, source_id}) == 3 and len({one_key, two_key, source_key}) == 3


@pytest.mark.lab
def test_a_host_writes_its_own_disk_not_the_layer(layered):
    ssh(COPY_PORTS["one"], "echo changed > /opt/marker && touch /opt/only-one")
    assert ssh(COPY_PORTS["two"], "cat /opt/marker; ls /opt") == "from-the-layer\nmarker\n"
    assert (LAYER / "root" / "opt" / "marker").read_text() == "from-the-layer\n"
    assert not (LAYER / "root" / "opt" / "only-one").exists()


@pytest.mark.lab
def test_a_layer_from_another_lab_reaches_this_labs_repository(layered):
    """The layer was saved with the keyring of port 18086; these hosts' lab serves on 18087: apt reaches it there,
    with the keyring package of 18087 installed and no list of the old port left."""
    for port in COPY_PORTS.values():
        assert f"http://127.0.0.1:{COPY_REPO}/apt/" in ssh(port, "cat /etc/apt/sources.list.d/cuda-debian12-x86_64.list")
        assert f":{SRC_REPO}" not in ssh(port, "ls /var/lib/apt/lists")
        assert ssh(port, "dpkg --verify cuda-keyring && echo clean").strip() == "clean"
        got = ssh(port, "cd /tmp && apt-get download -q nvidia-smi 2>&1 | grep ^Get")
        assert f"http://127.0.0.1:{COPY_REPO}/apt/" in got
