"""Safe by default, on a lab host reached as the lab's non-root user (issue 14's acceptance).

One host (ssh 127.0.0.1:2372 as `ops` with sudo, server port 33710, repo server 18097, state in .lab/h14-security/)
is booted once from the provisioned layer (tests/lab/labhosts.py, which provisions as `ops`: provisioning becomes
root), its topology read as `ops` (deploy.yml --tags topology), and reused by every case:
- a relaunch and a bench with topolaunch_api_key and an HF token from an extra-vars file, at -vvv: neither value in
  the playbook output, in the command line of any process (sampled every 50 ms by an unprivileged user during the
  run), in a file other users can read, or in the results on the controller; the server reads the key from its own
  config file (0600, the service user's); SGLang's own start-up line in the journal (root's) is the one place it is;
- the tasks that need root become root, topology, plan and the benchmark client do not;
- the hardened unit serves and `systemd-analyze security` rates it <= 4.5; numactl binds under the unit's own
  properties (systemd-run -p ...);
- hostile input (a flag smuggled in a list, a CR in the served name or the env) and a unit systemd-analyze verify
  refuses are refused before anything changes: the running server is untouched;
- a GPU holder that NVML reports by a pid of another PID namespace (the lab host is a container: the host's pid of
  a process inside it) is named by cleanup and never acted on;
- topolaunch_proc_hidepid hides the server's processes from other users.

    flock /tmp/tl-fixed-ports.lock .venv/bin/pytest -m lab tests/lab/test_security.py
"""
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest
import yaml

import labhosts
from sweeplab import copied_inventory

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAB_PY = ROOT / "lab" / "lab.py"
NAME = "h14-security"
HOST = "sec"
SSH_PORT = 2372
SERVER_PORT = 33710
REPO_PORT = 18097
SSH_KEY = ROOT / ".lab" / "ssh" / "id_ed25519"
UNIT = "topolaunch-sglang.service"
USER = "ops"                                   # lab.py's non-root ssh user (LAB_USER)
API_KEY = "sk-l4b-Secret-7d1e9a"
HF_TOKEN = "hf_l4bT0kenQz81"
SECRETS = (API_KEY, HF_TOKEN)

LAB_MISSING = os.geteuid() != 0 or not shutil.which("systemd-nspawn") or not shutil.which("debootstrap")
pytestmark = [pytest.mark.lab, pytest.mark.skipif(LAB_MISSING, reason="needs root, systemd-nspawn and debootstrap")]

SAMPLER = r"""
import os, time
out = open("/tmp/samples.txt", "a")
deadline = time.time() + 900
while time.time() < deadline and not os.path.exists("/tmp/sampler.stop"):
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open("/proc/%s/cmdline" % p, "rb") as f:
                    out.write(f.read().replace(b"\0", b" ").decode("utf-8", "replace") + "\n")
            except OSError:
                pass
    out.flush()
    time.sleep(0.05)
out.close()
open("/tmp/sampler.done", "w").close()
"""


class Host:
    def __init__(self, inventory):
        self.inventory = inventory

    def ssh(self, command, check=True, user="root", stdin=None):
        proc = subprocess.run(
            ["ssh", "-F", "/dev/null", "-i", str(SSH_KEY), "-p", str(SSH_PORT), "-o", "BatchMode=yes",
             "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
             "%s@127.0.0.1" % user, command], input=stdin, capture_output=True, text=True, check=False, timeout=300)
        if check:
            assert proc.returncode == 0, "ssh %r: rc %s %s" % (command, proc.returncode, proc.stderr)
        return proc.stdout

    def play(self, *args, playbook="deploy.yml"):
        env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        proc = subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(self.inventory), playbook,
                               *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, check=False, timeout=900)
        return proc.returncode, proc.stdout

    def extra(self, tmp_path, name, data):
        """An extra-vars file (never -e key=value: that would put the value on our own command line)."""
        path = tmp_path / name
        path.write_text(json.dumps(data))
        path.chmod(0o600)
        return "@%s" % path

    def unit(self):
        """(InvocationID, MainPID) of the running server."""
        out = self.ssh("systemctl show -p InvocationID -p MainPID -p ActiveState %s" % UNIT)
        props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        assert props["ActiveState"] == "active", props
        return props["InvocationID"], props["MainPID"]

    def healthy(self):
        return self.ssh("curl -s -o /dev/null -w '%%{http_code}' http://127.0.0.1:%d/health || true"
                        % SERVER_PORT) == "200"

    def plan(self):
        return json.loads(self.ssh("cat /var/lib/topolaunch/current_plan.json"))


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    inv = tmp_path_factory.mktemp("inventories") / NAME
    copied_inventory(
        inv, "security", REPO_PORT, ansible_user=USER, topolaunch_port=SERVER_PORT,
        launch_extra_env={"SGLANG_SIM_LOAD_SECONDS": "0", "SGLANG_SIM_CAPTURE_SECONDS": "0",
                          "SGLANG_SIM_DRAIN_POLL_SECONDS": "0.2"},
        launch_drain_timeout=2, launch_stop_margin=2, health_startup_timeout=60, health_chunk_seconds=5)
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_hosts": {"children": {"sglang_servers": {
        "hosts": {HOST: {"ansible_port": SSH_PORT, "lab_gpu_spec": "proxmox-8x-rtx-pro-6000-vnuma",
                         **labhosts.provisioned()}}}}}}}}))
    up = subprocess.run([sys.executable, str(LAB_PY), "-i", str(inv), "up"], capture_output=True, text=True,
                        check=False, timeout=900)
    assert up.returncode == 0, up.stdout + up.stderr
    h = Host(inv)
    try:
        assert h.ssh("id -un", user=USER).strip() == USER
        rc, out = h.play("--tags", "topology")
        assert rc == 0, out[-4000:]
        yield h
    finally:
        subprocess.run([sys.executable, str(LAB_PY), "-i", str(inv), "down", "--purge"], capture_output=True,
                       text=True, check=False, timeout=300)


@pytest.fixture(scope="module")
def secret_run(host, tmp_path_factory):
    """A relaunch and a bench with the API key and the HF token set (extra-vars file), at -vvv, while an
    unprivileged user samples every process's command line. Returns the playbook output."""
    tmp = tmp_path_factory.mktemp("secrets")
    secrets = host.extra(tmp, "vault.json", {"topolaunch_api_key": API_KEY, "model_weights_hf_token": HF_TOKEN})
    host.ssh("rm -f /tmp/samples.txt /tmp/sampler.stop /tmp/sampler.done")
    host.ssh("runuser -u nobody -- setsid python3 -c %s >/dev/null 2>&1 < /dev/null &" % shlex.quote(SAMPLER))
    rc, out = host.play("--tags", "relaunch,bench", "-e", "bench_force=true", "-e", secrets, "-vvv")
    host.ssh("touch /tmp/sampler.stop")
    assert rc == 0, out[-6000:]
    # The sampler's last pass ends with /tmp/sampler.done (at most 10 s).
    done = host.ssh("for i in $(seq 100); do [ -e /tmp/sampler.done ] && echo done && break; sleep 0.1; done")
    assert done.strip() == "done", "the sampler never stopped"
    samples = host.ssh("cat /tmp/samples.txt")
    return {"output": out, "samples": samples}


def sections(output):
    """{task name: its -vvv text} of a playbook's output."""
    found = {}
    for part in re.split(r"\nTASK \[", output)[1:]:
        name, _, body = part.partition("]")
        found.setdefault(name.split(" : ", 1)[-1], []).append(body)
    return {k: "\n".join(v) for k, v in found.items()}


def test_secrets_reach_nothing_but_the_server(host, secret_run):
    out, samples = secret_run["output"], secret_run["samples"]
    for secret in SECRETS:
        assert secret not in out, "a secret is in the -vvv playbook output"
        assert secret not in samples, "a secret was on a process's command line"
    # The sampler saw the run: the server, the benchmark client of the release (unprivileged: 0.5.9's
    # sglang.bench_serving, 0.5.23's sglang.benchmark.serving) and the bench wrapper.
    assert "sglang.launch_server" in samples and "bench_client.py" in samples
    assert re.search(r"sglang\.(bench_serving|benchmark\.serving)", samples)
    assert "--config /var/lib/topolaunch/sglang-config.yaml" in samples and "--api-key" not in samples
    # No file another user can read holds either secret (the patterns come on stdin: on no command line).
    found = host.ssh("runuser -u nobody -- grep -rlsF -f /dev/stdin / --exclude-dir=proc --exclude-dir=sys "
                     "--exclude-dir=dev || true", stdin="\n".join(SECRETS) + "\n")
    assert found.strip() == "", "readable by other users: %s" % found
    # The server's config (the key) is the service user's alone; the env file (the token) root's alone.
    assert host.ssh("stat -c '%a %U' /var/lib/topolaunch/sglang-config.yaml").strip() == "600 sglang"
    assert host.ssh("stat -c '%a %U' /etc/topolaunch/sglang.env").strip() == "600 root"
    assert "TOPOLAUNCH_API_KEY" not in host.ssh("cat /etc/topolaunch/sglang.env")
    # issue 25 item 15: the model loads from a local directory: the HF token is not in the server's environment
    assert "HF_TOKEN" not in host.ssh("cat /etc/topolaunch/sglang.env")
    assert "HF_TOKEN=" not in host.ssh("tr '\\0' '\\n' < /proc/%s/environ" % host.unit()[1])
    # SGLang itself logs its server args (api_key included) at start: in the journal, which only root and the
    # systemd-journal group read (README says so, and topolaunch_proc_hidepid).
    assert host.ssh("journalctl -u %s --no-pager -o cat | grep -cF %s || true" % (UNIT, "server_args")).strip() != "0"
    # Nothing kept on the controller holds them either.
    for tree in ("artifacts", "results"):
        for path in (host.inventory.parent / tree).rglob("*"):
            if path.is_file():
                text = path.read_text(errors="replace")
                assert not [s for s in SECRETS if s in text], path
    assert [p for p in (host.inventory.parent / "results").rglob("*.jsonl")], "the bench stored no run"


def test_root_only_where_needed(secret_run):
    """At -vvv each task's EXEC line shows whether it went through sudo."""
    tasks = sections(secret_run["output"])

    def becomes(prefix):
        hits = [body for name, body in tasks.items() if name.startswith(prefix)]
        assert hits, "no task %r in the output" % prefix
        return all("sudo -H -S -n" in body for body in hits)

    # the launch's call stops the old server and starts the new one; the bench's one call runs the client sweep
    for privileged in ("Validate the plan on the host", "Replace topolaunch-sglang",
                       "Check that the server serves", "Make the client's output directory"):
        assert becomes(privileged), privileged
    for plain in ("Plan the launch", "Run the client at concurrency"):
        assert not becomes(plain), plain
    assert "ESTABLISH SSH CONNECTION FOR USER: %s" % USER in secret_run["output"]


def test_the_hardened_unit_serves_and_rates_ok(host, secret_run):
    assert host.healthy()
    score = re.search(r"Overall exposure level for \S+: (\d+\.\d+)",
                      host.ssh("systemd-analyze security --no-pager %s" % UNIT))
    assert score and float(score.group(1)) <= 4.5, score
    main_pid = host.unit()[1]
    status = host.ssh("grep -E '^(NoNewPrivs|CapBnd|CapEff)' /proc/%s/status" % main_pid)
    assert "NoNewPrivs:\t1" in status and "CapBnd:\t0000000000000000" in status
    # numactl binds (mbind, set_mempolicy, sched_setaffinity) under the unit's own properties.
    host.ssh("command -v numactl || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq numactl >/dev/null")
    service = host.ssh("cat /etc/systemd/system/%s" % UNIT).split("[Service]", 1)[1].split("[Install]", 1)[0]
    keys = {"User", "Group", "NoNewPrivileges", "CapabilityBoundingSet", "AmbientCapabilities", "ProtectSystem",
            "ReadWritePaths", "PrivateTmp", "ProtectHome", "ProtectKernelTunables", "ProtectKernelModules",
            "ProtectKernelLogs", "ProtectControlGroups", "ProtectHostname", "ProtectProc", "RestrictSUIDSGID",
            "RestrictNamespaces", "RestrictRealtime", "RestrictAddressFamilies", "LockPersonality",
            "SystemCallArchitectures", "RemoveIPC", "UMask", "LimitMEMLOCK", "LimitNOFILE"}
    props = [line for line in service.splitlines() if line.partition("=")[0] in keys]
    assert len(props) >= 20, props
    argv = ["systemd-run", "--quiet", "--wait", "--pipe", "--collect"]
    for prop in props:
        argv += ["-p", prop]
    argv += ["--", "numactl", "--cpunodebind=0", "--membind=0", "--", "sh", "-c",
             "numactl --show; grep NoNewPrivs /proc/self/status; touch /usr/x 2>/dev/null || echo usr-read-only"]
    shown = host.ssh(" ".join(shlex.quote(a) for a in argv))
    assert "policy: bind" in shown and "membind: 0" in shown and "cpubind: 0" in shown, shown
    assert "NoNewPrivs:\t1" in shown and "usr-read-only" in shown


@pytest.mark.parametrize("case, words", [
    ({"topolaunch_server_args": {"log_requests_target": ["stdout", "--tp-size", "1"]}}, ["looks like a flag"]),
    ({"topolaunch_served_model_name": "glm\r"}, ["control character"]),
    ({"launch_extra_env": {"SGLANG_SIM_LOAD_SECONDS": "0", "SGLANG_SIM_X": "a\rb"}},
     ["(SGLANG_SIM_X) contains a control character", "nothing was stopped"]),
    ({"launch_read_write_paths": ["relative/cache"]},
     ["systemd-analyze verify refuses the rendered unit", "not absolute", "nothing was stopped"]),
    ("plan", ["served_model_name 'glm", "contains a control character", "nothing was stopped"]),
    # issue 25 items 3 and 4: a key SGLang would read as a flag, and a second --config, refused before any stop
    ({"topolaunch_api_key": "--host=0.0.0.0"}, ["(api-key, from topolaunch_api_key): the value begins with '-'",
                                                "nothing was stopped"]),
    ({"topolaunch_server_args": {"config": "/etc/sglang/extra.yaml"}}, ["server_args.config is set by the planner"]),
    # issue 25 item 2: every address without an API key (and no topolaunch_listen_without_api_key)
    ({"topolaunch_host": "0.0.0.0", "topolaunch_api_key": ""},
     ["host 0.0.0.0 (topolaunch_host) listens on every address without an API key"]),
    # issue 25 items 9, 10, 13, 17: a port true (was port 1), a list host, the watermark keys in the plan, root as
    # the service user, topolaunch_nodes no list
    ({"topolaunch_port": True}, ["port (topolaunch_port) must be an integer, got True"]),
    ({"topolaunch_host": ["127.0.0.1"]}, ["host (topolaunch_host) must be one address"]),
    ({"topolaunch_server_args": {"watermark_config": '{"key": "wm"}'}},
     ["server_args.watermark_config is a secret", "topolaunch_watermark_config"]),
    ({"topolaunch_service_user": "root"}, ["the service user 'root' (topolaunch_service_user) has uid 0 (root)",
                                           "nothing was stopped"]),
    ({"topolaunch_nodes": "box"}, ['topolaunch_nodes must be a list of inventory hostnames', 'got "box"']),
])
def test_hostile_input_never_costs_the_running_server(host, secret_run, tmp_path, case, words):
    before = host.unit()
    if case == "plan":                       # past the planner: a plan with a CR, as extra vars (wins over the fact)
        plan = dict(host.plan(), served_model_name="glm\rX")
        case = {"topolaunch_plan": plan}
    rc, out = host.play("--tags", "relaunch", "-e", host.extra(tmp_path, "hostile.json", case))
    assert rc != 0 and all(w in out for w in words), out[-3000:]
    assert host.unit() == before and host.healthy(), "the running server was touched"


def _host_pid(host, pid_in_container):
    """The pid this machine gives a process of the lab host (what the real driver, outside the container, reports)."""
    sys.path.insert(0, str(ROOT / "lab"))
    import lab  # pylint: disable=import-outside-toplevel
    state = lab.HostRuntime(lab.Lab(str(host.inventory)), HOST).state()
    for pid in lab.processes_rooted_in([state["root_id"]]):
        try:
            with open("/proc/%d/status" % pid, encoding="utf-8") as f:
                nspid = [line.split()[1:] for line in f if line.startswith("NSpid:")][0]
        except OSError:
            continue
        if nspid[-1] == str(pid_in_container):
            return pid
    raise AssertionError("no process of the lab host has pid %s inside it" % pid_in_container)


def test_a_pid_of_another_pid_namespace_is_refused_and_never_acted_on(host, secret_run):
    """The lab host is a container: the real driver would name a process in it by this machine's pid. Such a
    holder of our GPU, running as the service user, is named by cleanup and never signalled; the server stays."""
    before = host.unit()
    inner = int(host.ssh("runuser -u sglang -- setsid sleep 600 >/dev/null 2>&1 < /dev/null & echo $!").strip())
    outer = _host_pid(host, inner)
    assert outer != inner and host.ssh("test -e /proc/%d && echo here || true" % outer).strip() == ""
    gpu = host.plan()["gpu_indices"][0]
    host.ssh("st=$(awk '{print $22}' /proc/%d/stat); echo \"%d $st %d\" > /run/fake-nvml/.%d.tmp && "
             "mv /run/fake-nvml/.%d.tmp /run/fake-nvml/%d.%d" % (inner, 3 << 30, outer, inner, inner, inner, gpu))
    try:
        rc, out = host.play("--tags", "relaunch")
        assert rc != 0 and ("pid %d on GPU %d (3072 MiB)" % (outer, gpu)) in out, out[-3000:]
        assert "another PID namespace" in out and "our server was left running" in out
        assert host.unit() == before and host.healthy()
        assert host.ssh("test -d /proc/%d && echo alive" % inner).strip() == "alive"
    finally:
        host.ssh("kill %d" % inner, check=False)
    rc, out = host.play("--tags", "relaunch")
    assert rc == 0, out[-3000:]


def test_hidepid_hides_the_servers_processes_from_other_users(host, secret_run):
    seen = host.ssh("runuser -u nobody -- ps -eo user= | sort -u")
    assert "sglang" in seen                                  # without hidepid, anyone sees the server
    try:
        rc, out = host.play("--tags", "provision", "-e", "topolaunch_proc_hidepid=true")
        assert rc == 0, out[-3000:]
        assert "hidepid=invisible" in host.ssh("findmnt --noheadings --output OPTIONS /proc")
        assert "proc /proc proc defaults,hidepid=invisible 0 0" in host.ssh("cat /etc/fstab")
        seen = host.ssh("runuser -u nobody -- ps -eo user= | sort -u")
        assert "sglang" not in seen and "root" not in seen, seen
        assert host.healthy()
        rc, out = host.play("--tags", "provision", "-e", "topolaunch_proc_hidepid=true")
        assert rc == 0 and re.search(r"%s\s+: ok=\d+\s+changed=0 " % HOST, out), out[-2000:]
    finally:
        host.ssh("sed -i '/^proc \\/proc proc/d' /etc/fstab; mount -o remount,hidepid=off /proc")


# A stand-in huggingface_hub for the download task: it records who ran it, a digest of the token it got and how the
# token's file was kept (never the token itself), and takes a moment, so that the sampler sees it running.
FAKE_HUB = r'''
import hashlib, json, os, sys, time
__version__ = "0.0+lab"
def snapshot_download(repo_id, revision, local_dir, token=None):
    st = os.stat(sys.argv[4])
    time.sleep(1)
    with open(os.path.join(local_dir, "download.json"), "w") as f:
        json.dump({"repo_id": repo_id, "revision": revision, "uid": os.getuid(), "token_file": sys.argv[4],
                   "token_file_mode": oct(st.st_mode & 0o777), "token_file_uid": st.st_uid,
                   "token_sha256": hashlib.sha256((token or "").encode()).hexdigest()}, f)
    return local_dir
'''
DOWNLOAD_PLAY = """
- name: Download a snapshot the way provisioning does (root by sudo, the download as the service user)
  hosts: all
  become: true
  gather_facts: false
  tasks:
    - name: Look up the users (the role's main.yml does before it includes download.yml)
      ansible.builtin.getent:
        database: passwd
        fail_key: false

    - name: Run the model_weights download tasks
      ansible.builtin.include_role:
        name: topolaunch.sglang.model_weights
        tasks_from: download
      vars:
        model_weights_source: hf
        model_weights_hf_python: /usr/local/bin/fakehub-python
        model_weights_hf_repo_id: topolaunch-lab/gated-model
        model_weights_hf_revision: 0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e
        model_weights_hf_poll_seconds: 1
        topolaunch_model_path: /srv/models/hf-download
        _model_weights_download_bytes: 1000
"""


def test_the_hf_download_gets_the_token_in_a_private_file(host, tmp_path):
    """model_weights' download: the token reaches huggingface_hub through a 0600 file of the download user (the
    service user, not root), never a command line, the connection's environment or the -vvv output; the file is
    gone afterwards. (The lab's SGLang venv has no huggingface_hub: a stand-in takes its place.)"""
    import hashlib  # pylint: disable=import-outside-toplevel
    host.ssh("mkdir -p /opt/fakehub/huggingface_hub && cat > /opt/fakehub/huggingface_hub/__init__.py",
             stdin=FAKE_HUB)
    host.ssh("printf '#!/bin/sh\\nPYTHONPATH=/opt/fakehub exec python3 \"$@\"\\n' > /usr/local/bin/fakehub-python"
             " && chmod 755 /usr/local/bin/fakehub-python && rm -rf /srv/models/hf-download"
             " && install -d -o sglang -m 0755 /srv/models/hf-download")
    playbook = tmp_path / "download.yml"
    playbook.write_text(DOWNLOAD_PLAY)
    secrets = host.extra(tmp_path, "vault.json", {"model_weights_hf_token": HF_TOKEN})
    host.ssh("rm -f /tmp/samples.txt /tmp/sampler.stop")
    host.ssh("runuser -u nobody -- setsid python3 -c %s >/dev/null 2>&1 < /dev/null &" % shlex.quote(SAMPLER))
    try:
        rc, out = host.play("-e", secrets, "-vvv", playbook=str(playbook))
    finally:
        host.ssh("touch /tmp/sampler.stop")
    assert rc == 0, out[-6000:]
    samples = host.ssh("sleep 0.3; cat /tmp/samples.txt")
    assert HF_TOKEN not in out and HF_TOKEN not in samples
    assert "from huggingface_hub import snapshot_download" in samples   # the sampler saw the download run
    got = json.loads(host.ssh("cat /srv/models/hf-download/download.json"))
    sglang_uid = int(host.ssh("id -u sglang"))
    assert got["token_sha256"] == hashlib.sha256(HF_TOKEN.encode()).hexdigest()
    assert got["uid"] == sglang_uid and got["token_file_uid"] == sglang_uid and got["token_file_mode"] == "0o600"
    assert got["token_file"] in out                                   # named on the command line: its path only
    assert host.ssh("test -e %s && echo left || true" % shlex.quote(got["token_file"])).strip() == ""
    assert "topolaunch-lab/gated-model@" in host.ssh("cat /srv/models/hf-download/.topolaunch-snapshot")
