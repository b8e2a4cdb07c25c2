"""SGLang versions on lab hosts: the default release (0.5.23) and 0.5.9 end to end, an upgrade 0.5.9 -> 0.5.23 with
`--tags provision,relaunch`, its rollback when the new release's server fails health.

Two hosts (ssh 127.0.0.1:2361 and 2362, server ports 33600 and 33601, repository server 18096, state in
.lab/h13-versions/), booted once from the provisioned layers of their releases (tests/lab/labhosts.py); the first
deploy.yml runs their provision stage again (a no-change run), the upgrade runs it for real. `new` is the demo: `deploy.yml` with the project's defaults (SGLang 0.5.23: CUDA
13.0, the simulated server, the simulator's 0.5.23 client from the server's venv). `old` pins 0.5.9 (the
inventory's topolaunch_sglang_version): the same deploy.yml runs the real 0.5.9 benchmark client from its own venv;
then it is upgraded the way a user does it (`-e topolaunch_sglang_version=0.5.23 --tags provision,relaunch`), once
with a fault that makes only the 0.5.23 server crash while it loads (SGLANG_SIM_FAULT in the unit's environment,
set for plans of 0.5.23 only: the rollback to 0.5.9 starts clean), once without.

    .venv/bin/pytest -m lab tests/lab/test_versions.py
"""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import yaml

import labhosts
from sweeplab import copied_inventory

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAB_PY = ROOT / "lab" / "lab.py"
NAME = "h13-versions"
HOSTS = {"old": {"ssh": 2361, "port": 33600, "version": "0.5.9"}, "new": {"ssh": 2362, "port": 33601}}
REPO_PORT = 18096
SSH_KEY = ROOT / ".lab" / "ssh" / "id_ed25519"
UNIT = "topolaunch-sglang.service"
# The unit's extra environment: an instant load, a capture long enough for health to report it (4 s: 0.5.23
# captures two graphs of 2 s); with FAULT, a 0.5.23 server crashes while it loads.
FAST = {"SGLANG_SIM_LOAD_SECONDS": "0", "SGLANG_SIM_CAPTURE_SECONDS": "4", "SGLANG_SIM_DRAIN_POLL_SECONDS": "0.2"}
FAULT_0_5_23 = ("{{ %s | combine({'SGLANG_SIM_FAULT': 'crash_during_load'} if relaunch_plan.sglang_version is "
                "version('0.5.23', '>=') else {}) }}" % json.dumps(FAST))

LAB_MISSING = os.geteuid() != 0 or not shutil.which("systemd-nspawn") or not shutil.which("debootstrap")
pytestmark = [pytest.mark.lab, pytest.mark.skipif(LAB_MISSING, reason="needs root, systemd-nspawn and debootstrap")]


class Lab:
    def __init__(self, inventory):
        self.inventory = inventory

    def ssh(self, host, command):
        proc = subprocess.run(
            ["ssh", "-F", "/dev/null", "-i", str(SSH_KEY), "-p", str(HOSTS[host]["ssh"]), "-o", "BatchMode=yes",
             "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
             "root@127.0.0.1", command], capture_output=True, text=True, check=False, timeout=120)
        assert proc.returncode == 0, "ssh %s %r: rc %s %s" % (host, command, proc.returncode, proc.stderr)
        return proc.stdout

    def play(self, *args, extra=None):
        """ansible-playbook deploy.yml; returns (rc, output)."""
        cmd = [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(self.inventory), "deploy.yml", *args]
        if extra:
            cmd += ["-e", json.dumps(extra)]
        env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=1200)
        return proc.returncode, proc.stdout + proc.stderr

    def state(self, host):
        """What the host runs and has installed: the current link, the version record, the running plan's
        version, the venvs, /health and the unit's start."""
        out = self.ssh(host, "readlink /opt/sglang/current; cat /etc/topolaunch/sglang_version.json | tr -d '\\n'; "
                             "echo; python3 -c 'import json; print(json.load(open(\"/var/lib/topolaunch/"
                             "current_plan.json\"))[\"sglang_version\"])'; ls /opt/sglang/venvs | tr '\\n' ' '; echo; "
                             "curl -s -o /dev/null -w '%%{http_code}\\n' http://127.0.0.1:%d/health; "
                             "systemctl show -p InvocationID --value %s" % (HOSTS[host]["port"], UNIT)).splitlines()
        return {"current": out[0], "record": json.loads(out[1]), "plan_version": out[2], "venvs": out[3].split(),
                "health": out[4], "invocation": out[5]}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    inv = tmp_path_factory.mktemp("inventories") / NAME
    copied_inventory(inv, "versions", REPO_PORT, launch_extra_env=FAST, launch_drain_timeout=2, launch_stop_margin=2,
                     health_startup_timeout=60, health_chunk_seconds=5, bench_concurrency=[2])
    hosts = {}
    for name, h in HOSTS.items():
        hosts[name] = {"ansible_port": h["ssh"], "lab_gpu_spec": "proxmox-8x-rtx-pro-6000-vnuma",
                       "topolaunch_port": h["port"], **labhosts.provisioned(h.get("version"))}
        if "version" in h:
            hosts[name]["topolaunch_sglang_version"] = h["version"]
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_hosts": {"children": {
        "sglang_servers": {"hosts": hosts}}}}}}))
    up = subprocess.run([sys.executable, str(LAB_PY), "-i", str(inv), "up"], capture_output=True, text=True,
                        check=False, timeout=900)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        yield Lab(inv)
    finally:
        subprocess.run([sys.executable, str(LAB_PY), "-i", str(inv), "down", "--purge"], capture_output=True,
                       text=True, check=False, timeout=300)


@pytest.fixture(scope="module")
def deployed(lab):
    """deploy.yml on both hosts, as `make demo` runs it: provision, topology, plan, relaunch, bench."""
    rc, out = lab.play()
    assert rc == 0, out[-6000:]
    return out


def test_the_default_release_runs_end_to_end(lab, deployed):
    """`new` runs what `make demo` runs: SGLang 0.5.23 on CUDA 13.0, its client measured."""
    state = lab.state("new")
    assert state["current"] == "/opt/sglang/venvs/0.5.23" and state["venvs"] == ["0.5.23"]
    assert state["record"] == {"sglang_version": "0.5.23", "package_version": "0.5.23+sim",
                               "venv": "/opt/sglang/venvs/0.5.23"}
    assert (state["plan_version"], state["health"]) == ("0.5.23", "200")
    assert "CUDA_HOME=/usr/local/cuda-13.0" in lab.ssh("new", "cat /etc/topolaunch/cuda.env")
    assert "with /opt/sglang/venvs/0.5.23/bin/python -m sglang.benchmark.serving" in deployed
    assert "release 12" not in lab.ssh("new", "/usr/local/cuda-13.0/bin/nvcc --version")


def test_0_5_9_still_runs_end_to_end_with_its_real_client(lab, deployed):
    """`old` pins 0.5.9: CUDA 12.8, and the bench runs SGLang's own 0.5.9 client (the real
    package, no +sim) from its own venv; the results carry the points it measured."""
    state = lab.state("old")
    assert state["current"] == "/opt/sglang/venvs/0.5.9" and state["record"]["sglang_version"] == "0.5.9"
    assert (state["plan_version"], state["health"]) == ("0.5.9", "200")
    assert "CUDA_HOME=/usr/local/cuda-12.8" in lab.ssh("old", "cat /etc/topolaunch/cuda.env")
    assert "with /opt/sglang/clients/0.5.9/bin/python -m sglang.bench_serving" in deployed
    assert lab.ssh("old", "/opt/sglang/clients/0.5.9/bin/python -c 'import importlib.metadata as m; "
                          "print(m.version(\"sglang\"))'").strip() == "0.5.9"
    runs = sorted((lab.inventory.parent / "results").glob("*/*/*/*.jsonl"))
    assert len(runs) == 2, runs
    for run in runs:
        lines = [json.loads(line) for line in run.read_text().splitlines()]
        assert [line["max_concurrency"] for line in lines] == [2, 4] and all(line["completed"] for line in lines)


@pytest.fixture(scope="module")
def failed_upgrade(lab, deployed):
    rc, out = lab.play("--tags", "provision,relaunch", "--limit", "old",
                       extra={"topolaunch_sglang_version": "0.5.23", "launch_extra_env": FAULT_0_5_23})
    return rc, out


def test_an_upgrade_whose_server_fails_health_rolls_back_to_the_old_release(lab, failed_upgrade):
    """0.5.23 is installed beside 0.5.9 and made current, its server crashes while loading: the old venv is current
    again, the record says 0.5.9, the 0.5.9 plan serves, and the play fails saying so."""
    rc, out = failed_upgrade
    assert rc != 0
    assert re.search(r"Layout \S+ \(SGLang 0\.5\.23\) failed its health check", out), out[-6000:]
    assert "simulated fault SGLANG_SIM_FAULT=crash_during_load" in out
    assert re.search(r"Rolled back to the last known good layout \S+ \(SGLang 0\.5\.9\)", out), out[-6000:]
    # Health followed the 0.5.9 start in 0.5.9's words (one host: task names carry its labels).
    assert "reached: Capture cuda graph begin" in out
    assert "SGLang 0.5.9 is the installed version again" in out
    state = lab.state("old")
    assert state["venvs"] == ["0.5.23", "0.5.9"]
    assert state["current"] == "/opt/sglang/venvs/0.5.9" and state["record"]["sglang_version"] == "0.5.9"
    assert (state["plan_version"], state["health"]) == ("0.5.9", "200")


def test_the_upgrade_installs_beside_moves_current_and_relaunches(lab, failed_upgrade):
    rc, out = lab.play("--tags", "provision,relaunch", "--limit", "old", extra={"topolaunch_sglang_version": "0.5.23"})
    assert rc == 0, out[-6000:]
    assert "reached: Capture target" in out  # 0.5.23's capture: prefill, then decode graph
    state = lab.state("old")
    assert state["venvs"] == ["0.5.23", "0.5.9"]
    assert state["current"] == "/opt/sglang/venvs/0.5.23" and state["record"]["sglang_version"] == "0.5.23"
    assert (state["plan_version"], state["health"]) == ("0.5.23", "200")
    # A later relaunch plans for the release installed (the inventory still says 0.5.9) and serves it again
    # (--tags relaunch always restarts: launch_force).
    rc, out = lab.play("--tags", "relaunch", "--limit", "old")
    assert rc == 0, out[-6000:]
    relaunched = lab.state("old")
    assert relaunched["invocation"] != state["invocation"]
    assert dict(relaunched, invocation=None) == dict(state, invocation=None)
    # A plan for a release not installed is refused before anything is stopped.
    rc, out = lab.play("--tags", "relaunch", "--limit", "old", extra={"sglang_installed_version": "0.5.9"})
    assert rc != 0
    assert "the plan is for SGLang 0.5.9 but this host has SGLang 0.5.23 installed and current" in out, out[-6000:]
    assert lab.state("old") == relaunched
