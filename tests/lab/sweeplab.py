"""Private labs of one host each: `PrivateLab` boots a host with its own inventory (.lab/inventories/<name>/: every
lab setting of inventory/lab/group_vars/all/ linked, with its own connection and repository port, and host variables
such as the simulator's knobs), provisions it, and runs playbooks and ssh commands on it.

The sweep's lab (this module's names): host `bfield` with the field spec (8 RTX PRO 6000, two NUMA nodes), ssh 2231,
server port 32000, repository server 18083, state in .lab/bench-sweep/. Shared by tests/lab/test_sweep.py and
perf/sweep_overhead.py.
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
SSH_KEY = ROOT / ".lab" / "ssh" / "id_ed25519"
BIN = pathlib.Path(sys.executable).parent
OWN = {"connection.yml", "lab.yml"}
FIELD_SPEC = "proxmox-8x-rtx-pro-6000-vnuma"


def copied_inventory(inv, name, repo_port, **settings):
    """A test's own inventory at `inv`: group_vars/all holds copies of inventory/lab's files, then zz-<name>.yml (read
    last: it wins) with the lab repository's port, the lab's ssh key, the controller's artifacts and results folders
    beside the inventory (Ansible would read files inside it as inventory) and `settings`. Returns `inv`."""
    group_all = inv / "group_vars" / "all"
    group_all.mkdir(parents=True)
    for src in (ROOT / "inventory" / "lab" / "group_vars" / "all").glob("*.yml"):
        shutil.copy(src, group_all / src.name)
    (group_all / ("zz-%s.yml" % name)).write_text(yaml.safe_dump(dict({
        "lab_repo_port": repo_port, "lab_repo_url": "http://127.0.0.1:%d" % repo_port,
        "ansible_ssh_private_key_file": str(SSH_KEY),
        "topolaunch_artifacts_dir": str(inv.parent / "artifacts"),
        "topolaunch_results_dir": str(inv.parent / "results")}, **settings)))
    return inv


class PrivateLab:
    """One lab host: name (the inventory's, .lab/inventories/<name>), host, its ssh, server and repository ports."""

    def __init__(self, name, host, ssh_port, server_port, repo_port, spec=FIELD_SPEC, host_vars=None):
        self.name, self.host, self.spec = name, host, spec
        self.ssh_port, self.server_port, self.repo_port = ssh_port, server_port, repo_port
        self.inventory = ROOT / ".lab" / "inventories" / name
        self.host_vars = dict(host_vars or {})

    def write_inventory(self, **host_vars):
        """(Re)write the inventory, with these host variables (else the ones given before); returns its directory."""
        if host_vars:
            self.host_vars = host_vars
        group_all = self.inventory / "group_vars" / "all"
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
            "lab_repo_port": self.repo_port, "lab_repo_url": "http://127.0.0.1:{{ lab_repo_port }}"}))
        (self.inventory / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_hosts": {"children": {
            "sglang_servers": {"hosts": {self.host: dict(
                {"ansible_port": self.ssh_port, "lab_gpu_spec": self.spec, "topolaunch_port": self.server_port},
                **self.host_vars)}}}}}}}))
        return self.inventory

    def lab(self, *args):
        """lab/lab.py on this inventory; raises with its output when it fails."""
        proc = subprocess.run([sys.executable, str(ROOT / "lab" / "lab.py"), "-i", str(self.inventory), *args],
                              capture_output=True, text=True, check=False, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError("lab.py %s failed:\n%s\n%s" % (" ".join(args), proc.stdout, proc.stderr))
        return proc.stdout

    def popen(self, path, *args, extra=None):
        """ansible-playbook on this inventory, started (stdout and stderr together, text); the caller waits."""
        cmd = [str(BIN / "ansible-playbook"), "-i", str(self.inventory), str(ROOT / path), *args]
        if extra:
            cmd += ["-e", json.dumps(extra)]
        env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0")
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def playbook(self, path, *args, extra=None, timeout=900):
        """ansible-playbook on this inventory; returns the CompletedProcess (stdout and stderr together)."""
        proc = self.popen(path, *args, extra=extra)
        try:
            stdout, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, stdout)

    def ssh(self, command):
        """Run a command on the lab host as root; returns (rc, stdout)."""
        proc = subprocess.run(
            ["ssh", "-F", "/dev/null", "-i", str(SSH_KEY), "-p", str(self.ssh_port), "-o", "BatchMode=yes",
             "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
             "root@127.0.0.1", command], capture_output=True, text=True, check=False, timeout=120)
        return proc.returncode, proc.stdout

    def host_json(self, path):
        """A JSON file of the host (state files: current_plan.json...), parsed; asserts it can be read."""
        rc, out = self.ssh("cat " + path)
        assert rc == 0, path
        return json.loads(out)

    def main_pid(self):
        """The server unit's main pid (0: not running)."""
        rc, out = self.ssh("systemctl show --property=MainPID --value topolaunch-sglang.service")
        assert rc == 0
        return int(out.strip())

    def up_and_provisioned(self):
        """Boot the host (reused when running) and provision it; returns the inventory directory."""
        self.write_inventory()
        self.lab("up")
        run = self.playbook("deploy.yml", "--tags", "provision,topology")
        if run.returncode != 0:
            raise RuntimeError("provisioning the lab %s failed:\n%s" % (self.name, run.stdout[-6000:]))
        return self.inventory


NAME, HOST, SSH_PORT, SERVER_PORT, REPO_PORT, SPEC = "bench-sweep", "bfield", 2231, 32000, 18083, FIELD_SPEC
SWEEP = PrivateLab(NAME, HOST, SSH_PORT, SERVER_PORT, REPO_PORT, SPEC)
INVENTORY = SWEEP.inventory
write_inventory, lab, playbook, ssh, up_and_provisioned, host_json, main_pid = (
    SWEEP.write_inventory, SWEEP.lab, SWEEP.playbook, SWEEP.ssh, SWEEP.up_and_provisioned, SWEEP.host_json,
    SWEEP.main_pid)
