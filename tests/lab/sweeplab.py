"""A private lab for the sweep: one host `bfield` with the field spec (8 RTX PRO 6000, two NUMA nodes), ssh 2231,
server port 32000, repository server 18083, state in .lab/bench-sweep/. Shared by tests/lab/test_sweep.py and
bench/sweep_overhead.py. The inventory reuses every lab setting of inventory/lab/group_vars/all/ (linked), with its
own connection and repository port.
"""
import json
import os
import pathlib
import subprocess
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
NAME = "bench-sweep"
HOST = "bfield"
SSH_PORT = 2231
SERVER_PORT = 32000
REPO_PORT = 18083
SPEC = "proxmox-8x-rtx-pro-6000-vnuma"
INVENTORY = ROOT / ".lab" / "inventories" / NAME
SSH_KEY = ROOT / ".lab" / "ssh" / "id_ed25519"
BIN = pathlib.Path(sys.executable).parent
OWN = {"connection.yml", "lab.yml"}


def write_inventory():
    """(Re)write the inventory and return its directory."""
    group_all = INVENTORY / "group_vars" / "all"
    group_all.mkdir(parents=True, exist_ok=True)
    for old in group_all.iterdir():
        old.unlink()
    for src in sorted((ROOT / "inventory" / "lab" / "group_vars" / "all").glob("*.yml")):
        if src.name not in OWN:
            (group_all / src.name).symlink_to(src)
    (group_all / "connection.yml").write_text(yaml.safe_dump({
        "ansible_host": "127.0.0.1", "ansible_user": "root", "ansible_connection": "ansible.builtin.ssh",
        "ansible_ssh_private_key_file": str(SSH_KEY), "ansible_python_interpreter": "/usr/bin/python3"}))
    (group_all / "lab.yml").write_text(yaml.safe_dump({
        "lab_repo_port": REPO_PORT, "lab_repo_url": "http://127.0.0.1:{{ lab_repo_port }}"}))
    (INVENTORY / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_hosts": {"children": {
        "sglang_servers": {"hosts": {HOST: {
            "ansible_port": SSH_PORT, "lab_gpu_spec": SPEC, "topolaunch_port": SERVER_PORT}}}}}}}}))
    return INVENTORY


def lab(*args):
    """lab/lab.py on this inventory; raises with its output when it fails."""
    proc = subprocess.run([sys.executable, str(ROOT / "lab" / "lab.py"), "-i", str(INVENTORY), *args],
                          capture_output=True, text=True, check=False, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError("lab.py %s failed:\n%s\n%s" % (" ".join(args), proc.stdout, proc.stderr))
    return proc.stdout


def playbook(path, *args, extra=None, timeout=900):
    """ansible-playbook on this inventory; returns the CompletedProcess (stdout and stderr together)."""
    cmd = [str(BIN / "ansible-playbook"), "-i", str(INVENTORY), str(ROOT / path), *args]
    if extra:
        cmd += ["-e", json.dumps(extra)]
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
    return subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          check=False, timeout=timeout)


def ssh(command):
    """Run a command on the lab host as root; returns (rc, stdout)."""
    proc = subprocess.run(
        ["ssh", "-F", "/dev/null", "-i", str(SSH_KEY), "-p", str(SSH_PORT), "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
         "root@127.0.0.1", command], capture_output=True, text=True, check=False, timeout=120)
    return proc.returncode, proc.stdout


def up_and_provisioned():
    """Boot the host (reused when running) and provision it; returns the inventory directory."""
    write_inventory()
    lab("up")
    run = playbook("deploy.yml", "--tags", "provision,topology")
    if run.returncode != 0:
        raise RuntimeError("provisioning the sweep lab failed:\n" + run.stdout[-6000:])
    return INVENTORY
