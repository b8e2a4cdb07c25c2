"""The lifecycle lab's host, shared by tests/lab/test_lifecycle.py and tests/lab/test_rollback.py: each file boots its
own host (its own ports, state in .lab/<name>/) from the provisioned layer (tests/lab/labhosts.py), reads its topology
(deploy.yml --tags topology), and reuses it for every case, so that the two files run in parallel lanes. Each case
drives the real user command, `ansible-playbook deploy.yml --tags relaunch ...`; a fault is injected by taking a plan
the planner made (current_plan.json after a normal relaunch), adding SGLANG_SIM_FAULT to its env and passing it as the
extra var topolaunch_plan (extra vars win over the plan stage's fact).
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import yaml

import labhosts
from sweeplab import copied_inventory

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAB_PY = ROOT / "lab" / "lab.py"
SSH_KEY = ROOT / ".lab" / "ssh" / "id_ed25519"
UNIT = "topolaunch-sglang.service"
IDLE_MIB = 560                          # memory_reserved_mib of the vnuma spec: a GPU with no process
SMALL_MODEL = "llama-2-7b"              # fits 4 GPUs, so that a plan can leave GPUs 4-7 to someone else

LAB_MISSING = os.geteuid() != 0 or not shutil.which("systemd-nspawn") or not shutil.which("debootstrap")


class Host:
    """One booted lab host: its inventory and ssh port."""

    def __init__(self, inventory, ssh_port):
        self.inventory, self.ssh_port = inventory, ssh_port

    def ssh(self, command, check=True):
        proc = subprocess.run(
            ["ssh", "-F", "/dev/null", "-i", str(SSH_KEY), "-p", str(self.ssh_port), "-o", "BatchMode=yes",
             "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
             "root@127.0.0.1", command], capture_output=True, text=True, check=False, timeout=120)
        if check:
            assert proc.returncode == 0, "ssh %r: rc %s %s" % (command, proc.returncode, proc.stderr)
        return proc.stdout

    def play(self, *args, brief=False):
        """ansible-playbook deploy.yml against this host; returns (rc, output). brief: with the stdout callback
        ansible.cfg sets for people (callback_plugins/brief.py), not the default one the tests read (tests/conftest.py)."""
        env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        if brief:
            env.pop("ANSIBLE_STDOUT_CALLBACK", None)
        proc = subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(self.inventory),
                               "deploy.yml", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                              check=False, timeout=900)
        return proc.returncode, proc.stdout + proc.stderr

    def relaunch(self, *args):
        rc, out = self.play("--tags", "relaunch", *args)
        return rc, out

    def plan(self, name="current_plan.json"):
        return json.loads(self.ssh("cat /var/lib/topolaunch/" + name))

    def fault_plan_file(self, plan, fault, tmp_path):
        """An extra-vars file whose topolaunch_plan is `plan` with SGLANG_SIM_FAULT set."""
        plan = json.loads(json.dumps(plan))
        plan["env"]["SGLANG_SIM_FAULT"] = fault
        path = tmp_path / ("plan-%s.json" % fault.replace(":", "-"))
        path.write_text(json.dumps({"topolaunch_plan": plan}))
        return "@%s" % path

    def gpus(self):
        """Per GPU: used MiB and holder pids, read through NVML with the tools python."""
        code = ("import json, pynvml as n; n.nvmlInit(); out = []\n"
                "for i in range(n.nvmlDeviceGetCount()):\n"
                "    h = n.nvmlDeviceGetHandleByIndex(i)\n"
                "    out.append({'used_mib': n.nvmlDeviceGetMemoryInfo(h).used >> 20,"
                " 'pids': [p.pid for p in n.nvmlDeviceGetComputeRunningProcesses(h)]})\n"
                "print(json.dumps(out))")
        return json.loads(self.ssh("/opt/topolaunch/tools/bin/python -c %s" % shlex_quote(code)))

    def in_unit(self, pid):
        return ("/%s" % UNIT) in self.ssh("cat /proc/%d/cgroup 2>/dev/null || true" % pid)

    def healthy(self, port):
        return self.ssh("curl -s -o /dev/null -w '%%{http_code}' http://127.0.0.1:%d/health || true" % port) == "200"

    def start_foreign(self, gpu, title="foreign-trainer"):
        """A process of user nobody holding 10 GiB on `gpu` (registered with the fake NVML); returns its pid."""
        pid = int(self.ssh("runuser -u nobody -- bash -c 'exec -a %s sleep 100000 >/dev/null 2>&1 & echo $!'" % title))
        self.ssh("st=$(awk '{print $22}' /proc/%d/stat); d=${FAKE_NVML_STATE_DIR:-/run/fake-nvml}; "
                 "echo \"%d $st\" > $d/.%d.tmp && mv $d/.%d.tmp $d/%d.%d" % (pid, 10 << 30, pid, pid, pid, gpu))
        return pid

    def alive(self, pid):
        return self.ssh("test -d /proc/%d && awk '{print $3}' /proc/%d/stat || echo gone" % (pid, pid)).strip() not in ("gone", "Z")


def shlex_quote(s):
    return "'" + s.replace("'", "'\"'\"'") + "'"


def assert_only_the_unit_holds_gpus(host, plan):
    """Every NVML holder is in our unit; GPUs outside the plan are idle (or held by the foreign process only)."""
    for index, gpu in enumerate(host.gpus()):
        ours = [p for p in gpu["pids"] if host.in_unit(p)]
        others = [p for p in gpu["pids"] if p not in ours]
        if index in plan["gpu_indices"]:
            assert ours and not others, "GPU %d: holders %s, ours %s" % (index, gpu["pids"], ours)
        else:
            assert not ours, "GPU %d is not in the plan but our unit holds it: %s" % (index, ours)


def booted_host(tmp_path_factory, name, ssh_port, server_port, repo_port, **settings):
    """Boot the host `lc` (field spec) of inventory `name` from the provisioned layer, read its topology, copy the
    small model in; yields its Host and takes it down (purged) afterwards. `settings`: more inventory variables."""
    inv = tmp_path_factory.mktemp("inventories") / name
    copied_inventory(
        inv, name, repo_port, topolaunch_port=server_port,
        # Time no case measures: an instant load, a drain that notices SIGTERM at once (SGLang polls every 5 s),
        # a short TimeoutStopSec (a server that ignores SIGTERM is SIGKILLed after 4 s instead of 10 s).
        launch_extra_env={"SGLANG_SIM_LOAD_SECONDS": "0", "SGLANG_SIM_CAPTURE_SECONDS": "0",
                          "SGLANG_SIM_DRAIN_POLL_SECONDS": "0.2"},
        launch_drain_timeout=2, launch_stop_margin=2, health_startup_timeout=60, health_chunk_seconds=5, **settings)
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_hosts": {"children": {"sglang_servers": {
        "hosts": {"lc": {"ansible_port": ssh_port, "lab_gpu_spec": "proxmox-8x-rtx-pro-6000-vnuma",
                         **labhosts.provisioned()}}}}}}}}))
    up = subprocess.run([sys.executable, str(LAB_PY), "-i", str(inv), "up"], capture_output=True, text=True,
                        check=False, timeout=900)
    assert up.returncode == 0, up.stdout + up.stderr
    h = Host(inv, ssh_port)
    try:
        rc, out = h.play("--tags", "topology")
        assert rc == 0, out[-4000:]
        model = ROOT / "tests" / "fixtures" / "models" / SMALL_MODEL
        tar = subprocess.run(["tar", "-C", str(model), "-cf", "-", "."], capture_output=True, check=True).stdout
        subprocess.run(["ssh", "-F", "/dev/null", "-i", str(SSH_KEY), "-p", str(ssh_port), "-o", "BatchMode=yes",
                        "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                        "root@127.0.0.1", "mkdir -p /srv/models/%s && tar -C /srv/models/%s -xf -" % (SMALL_MODEL, SMALL_MODEL)],
                       input=tar, check=True, timeout=60)
        yield h
    finally:
        subprocess.run([sys.executable, str(LAB_PY), "-i", str(inv), "down", "--purge"], capture_output=True,
                       text=True, check=False, timeout=300)
