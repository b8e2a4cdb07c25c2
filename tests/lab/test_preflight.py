"""The preflight stage on lab hosts, through deploy.yml as a user runs it, with the worker's lab stand-in.

Two SGLang servers (state in .lab/h17-preflight/, inventory .lab/inventories/h17-preflight/, lab repository 18098):
`hang` (ssh 2381, server port 33800) is the field box whose cross-socket pair 3-7 hangs with P2P
(proxmox-8x-rtx-pro-6000-p2p-hang); `naive` (ssh 2382, port 33801) is the same box without vNUMA or the P2P
clique (proxmox-8x-rtx-pro-6000-naive), whose flat PCI tree hides the sockets. Booted from the provisioned layer
(tests/lab/labhosts.py) and taken through a first deploy (provision, topology, preflight, plan, relaunch; bench skipped) once; the cases follow in file order.

    flock /tmp/tl-fixed-ports.lock .venv/bin/pytest -m lab tests/lab/test_preflight.py
"""
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import time

import pytest
import yaml

import labhosts

ROOT = pathlib.Path(__file__).resolve().parents[2]
NAME = "h17-preflight"
INVENTORY = ROOT / ".lab" / "inventories" / NAME
OUTSIDE = ROOT / ".lab" / "inventories" / (NAME + "-files")    # artifacts and results, outside the inventory
HOSTS = {"hang": (2381, 33800, "proxmox-8x-rtx-pro-6000-p2p-hang"),
         "naive": (2382, 33801, "proxmox-8x-rtx-pro-6000-naive"),
         "nolinks": (2383, 33802, "hgx-8x-h100-nvswitch")}
DEPLOYED = ("hang", "naive")        # nolinks is only booted: its spec has no links, the stage says so
REPO_PORT = 18098
STEP_TIMEOUT = 3
SSH_KEY = ROOT / ".lab" / "ssh" / "id_ed25519"
UNIT = "topolaunch-sglang.service"

LAB_MISSING = os.geteuid() != 0 or not shutil.which("systemd-nspawn") or not shutil.which("debootstrap")
pytestmark = [pytest.mark.lab, pytest.mark.skipif(LAB_MISSING, reason="needs root, systemd-nspawn and debootstrap")]


def write_inventory():
    group_all = INVENTORY / "group_vars" / "all"
    if INVENTORY.exists():
        shutil.rmtree(INVENTORY)
    group_all.mkdir(parents=True)
    for src in sorted((ROOT / "inventory" / "lab" / "group_vars" / "all").glob("*.yml")):
        shutil.copy(src, group_all / src.name)
    (group_all / "zz-h17-preflight.yml").write_text(yaml.safe_dump({
        "lab_repo_port": REPO_PORT, "lab_repo_url": "http://127.0.0.1:%d" % REPO_PORT,
        "ansible_ssh_private_key_file": str(SSH_KEY),
        "topolaunch_artifacts_dir": str(OUTSIDE / "artifacts"), "topolaunch_results_dir": str(OUTSIDE / "results"),
        "preflight_step_timeout": STEP_TIMEOUT,
        "launch_extra_env": {"SGLANG_SIM_LOAD_SECONDS": "0", "SGLANG_SIM_CAPTURE_SECONDS": "0",
                             "SGLANG_SIM_DRAIN_POLL_SECONDS": "0.2"},
        "launch_drain_timeout": 2, "launch_stop_margin": 2, "health_startup_timeout": 60, "health_chunk_seconds": 5}))
    (INVENTORY / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"gpu_hosts": {"children": {
        "sglang_servers": {"hosts": {name: {"ansible_port": ssh, "topolaunch_port": port, "lab_gpu_spec": spec,
                                            **labhosts.provisioned()}
                                     for name, (ssh, port, spec) in HOSTS.items()}}}}}}}))


def lab(*args):
    proc = subprocess.run([sys.executable, str(ROOT / "lab" / "lab.py"), "-i", str(INVENTORY), *args],
                          capture_output=True, text=True, check=False, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def play(*args):
    """deploy.yml on this inventory: (rc, output)."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(INVENTORY), "deploy.yml",
                           *args], cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=900)
    return proc.returncode, proc.stdout + proc.stderr


def ssh(host, command):
    proc = subprocess.run(
        ["ssh", "-F", "/dev/null", "-i", str(SSH_KEY), "-p", str(HOSTS[host][0]), "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
         "root@127.0.0.1", command], capture_output=True, text=True, check=False, timeout=120)
    assert proc.returncode == 0, "ssh %s %r: %s" % (host, command, proc.stderr)
    return proc.stdout


def host_json(host, path):
    return json.loads(ssh(host, "cat " + path))


def artifact(host, name):
    return json.loads((OUTSIDE / "artifacts" / host / name).read_text())


def unit_start(host):
    """The unit's invocation id: changes with every start."""
    return ssh(host, "systemctl show -P InvocationID " + UNIT).strip()


def task_results(out, name):
    """The host result lines (ok:, changed:, skipping:...) of every task whose title contains name."""
    lines = []
    for block in re.split(r"^TASK \[", out, flags=re.M)[1:]:
        title, _, body = block.partition("\n")
        if name in title.split("]")[0]:
            lines += [line for line in body.splitlines() if re.match(r"(ok|changed|skipping|failed|fatal): \[", line)]
    return lines


def recap(out):
    """{host: changed count} of the PLAY RECAP."""
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+: ok=\d+\s+changed=(\d+)", out, re.M)}


@pytest.fixture(scope="module")
def deployed():
    """Both hosts up and through a first deploy (the preflight before the first plan); output of that deploy."""
    write_inventory()
    lab("down", "--purge")              # fresh disks: a first deploy measures (no record left from an earlier run)
    shutil.rmtree(OUTSIDE, ignore_errors=True)
    lab("up")
    try:
        rc, out = play("--skip-tags", "bench", "--limit", ",".join(DEPLOYED))
        assert rc == 0, out[-8000:]
        yield out
    finally:
        lab("down", "--purge")


def test_first_deploy_measures_and_the_plan_applies_the_fix(deployed):
    out = deployed
    fingerprint = artifact("hang", "topology.json")["fingerprint"]
    records = artifact("hang", "preflight.json")
    assert list(records) == [fingerprint]
    record = records[fingerprint]
    assert record == host_json("hang", "/var/lib/topolaunch/preflight.json")
    assert [f["id"] for f in record["findings"]] == ["preflight-p2p-hang", "preflight-p2p-disabled-by-plan"]
    assert "ERROR preflight-p2p-hang (GPU 3,7): a P2P copy did not finish within 3s (GPUs 3->7)" in out
    assert "Unidirectional P2P=Enabled Bandwidth Matrix (GB/s)" in out
    # the hang cost one step timeout: the pair was killed at its deadline, nothing else waited for it
    hung = [s for s in record["steps"] if s["status"] == "hang"]
    assert len(hung) == 1 and hung[0]["hung_on"] == [3, 7]
    assert STEP_TIMEOUT <= hung[0]["seconds"] < STEP_TIMEOUT + 2
    assert record["timing"]["total_seconds"] < STEP_TIMEOUT + 10
    png = OUTSIDE / "artifacts" / "hang" / "preflight.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the plan made after it runs with P2P off, as the record's fixes say, and says its figures are measured
    plan = host_json("hang", "/var/lib/topolaunch/current_plan.json")
    assert plan["env"]["NCCL_P2P_DISABLE"] == "1" and "--disable-custom-all-reduce" in plan["argv"]
    assert plan["link_figures"]["source"] == "preflight"
    assert "Link figures measured on this machine by the preflight of %s" % record["created"] in plan["reason"]
    assert ssh("hang", "systemctl is-active " + UNIT).strip() == "active"


def test_the_naive_vm_gets_the_nccl_topology_file(deployed):
    fingerprint = artifact("naive", "topology.json")["fingerprint"]
    mode = ssh("naive", "stat -c '%a %U %G' /etc/topolaunch/nccl_topo.xml").split()
    assert mode == ["644", "root", "root"]
    text = ssh("naive", "cat /etc/topolaunch/nccl_topo.xml")
    assert text.startswith('<system version="1" name="topolaunch-%s">' % fingerprint)
    assert text.count("<cpu ") == 2                      # the two sockets the measured host paths show
    plan = host_json("naive", "/var/lib/topolaunch/current_plan.json")
    assert plan["env"]["NCCL_TOPO_FILE"] == "/etc/topolaunch/nccl_topo.xml"
    assert plan["env"]["NCCL_P2P_DISABLE"] == "1"       # CNS: no P2P at all (NVML), as before
    assert "NCCL topology file /etc/topolaunch/nccl_topo.xml: written" in deployed


def test_a_second_deploy_of_the_same_topology_does_not_measure_again(deployed):
    created = {h: artifact(h, "preflight.json")[artifact(h, "topology.json")["fingerprint"]]["created"]
               for h in DEPLOYED}
    started = {h: unit_start(h) for h in DEPLOYED}
    rc, out = play("--skip-tags", "bench", "--limit", ",".join(DEPLOYED))
    assert rc == 0, out[-8000:]
    assert out.count("not measured: record for ") == 2
    installs = task_results(out, "Install the worker")      # GPUs in use: nothing installed, nothing measured
    assert installs and all(line.startswith("skipping:") for line in installs), installs
    assert {h: artifact(h, "preflight.json")[artifact(h, "topology.json")["fingerprint"]]["created"]
            for h in DEPLOYED} == created
    assert {h: unit_start(h) for h in DEPLOYED} == started
    assert recap(out) == {"hang": 0, "naive": 0}


def test_a_relaunch_never_measures():
    rc, out = play("--tags", "relaunch", "--list-tasks")
    assert rc == 0, out
    tasks = [line for line in out.splitlines() if "TAGS:" in line and not line.lstrip().startswith("play #")]
    assert any("Plan the launch" in line for line in tasks), out
    assert not [line for line in tasks if "preflight" in line.lower()], out


def test_asked_against_a_running_server_it_refuses(deployed):
    started = unit_start("hang")
    rc, out = play("--tags", "preflight", "--limit", "hang")
    assert rc != 0
    assert "The preflight measures only free GPUs, and GPUs 0,1,2,3,4,5,6,7 on hang are in use" in out
    assert "-e preflight_stop_server=true" in out
    assert unit_start("hang") == started and ssh("hang", "systemctl is-active " + UNIT).strip() == "active"


@pytest.mark.full
def test_stop_server_stops_measures_and_relaunches_the_same_plan(deployed):
    fingerprint = artifact("hang", "topology.json")["fingerprint"]
    before = artifact("hang", "preflight.json")[fingerprint]
    plan = host_json("hang", "/var/lib/topolaunch/current_plan.json")
    started = unit_start("hang")
    rc, out = play("--tags", "preflight", "--limit", "hang", "-e", "preflight_stop_server=true")
    assert rc == 0, out[-8000:]
    after = artifact("hang", "preflight.json")[fingerprint]
    assert after["created"] != before["created"]                   # measured again
    assert "measured in " in out and "Replacing the server" in out
    again = host_json("hang", "/var/lib/topolaunch/current_plan.json")
    keys = ("layout", "gpu_indices", "cuda_visible_devices", "env", "argv", "host", "port", "model_path",
            "served_model_name", "sglang_version")
    assert {k: again[k] for k in keys} == {k: plan[k] for k in keys}
    assert unit_start("hang") != started and ssh("hang", "systemctl is-active " + UNIT).strip() == "active"


def test_a_spec_without_links_is_skipped_with_its_reason(deployed):
    rc, out = play("--tags", "preflight", "--limit", "nolinks")
    assert rc == 0, out[-8000:]
    assert ("Preflight skipped on nolinks: the lab GPU spec hgx-8x-h100-nvswitch has no links section "
            "(lab/specs/README.md), so the worker stand-in has nothing to answer from.") in out
    assert recap(out) == {"nolinks": 0}
    assert ssh("nolinks", "test -e /var/lib/topolaunch/preflight.json || echo absent").strip() == "absent"


PVE_PORT = 35501                    # the Proxmox API stand-in (lab/proxmox_standin), on the controller
PVE_TOKEN = ("topolaunch@pve", "tl", "token-secret-lab")
PVE_ROOT_PASSWORD = "root-password-lab"
HOOK = '''#!/usr/bin/env python3
"""The stand-in's power hook: a reboot of VM 101 powers the lab host `naive` off and on (lab.py stop, start),
recording first whether our server still ran on it."""
import subprocess, sys
action, vmid = sys.argv[1:3]
if action != "reboot":
    sys.exit(0)
unit = subprocess.run(%(ssh)r + ["systemctl is-active %(unit)s || true"], capture_output=True, text=True).stdout
with open(%(log)r, "a") as f:
    f.write("reboot %%s unit %%s\\n" %% (vmid, unit.strip()))
for verb in ("stop", "start"):
    subprocess.run([%(python)r, %(lab)r, "-i", %(inventory)r, verb, "naive"], check=True, timeout=600)
'''


def test_a_proxmox_restart_stops_our_server_first_and_the_deploy_goes_on(deployed, tmp_path):
    """Issue 26 item 4: with proxmox_restart_allowed, the config the findings call for is written, our server on the
    VM is stopped through the cleanup, the VM restarted through the API (the stand-in's reboot powers the lab host
    off and on), ssh and the driver waited for, the topology read again, and the deploy goes on to a serving server.
    Booted through community.proxmox's proxmox_kvm against the stand-in, as in tests/sim/test_proxmox_standin.py."""
    from proxmox_cases import naive_config, write_host_sysfs   # pylint: disable=import-outside-toplevel
    state = tmp_path / "state.json"
    state.write_text(json.dumps({
        "nodes": {"pve1": {"vms": {"101": {"config": naive_config(), "status": "running"}}}},
        "users": {"root@pam": PVE_ROOT_PASSWORD}, "tokens": {"%s!%s" % PVE_TOKEN[:2]: PVE_TOKEN[2]}}))
    ssh_argv = ["ssh", "-F", "/dev/null", "-i", str(SSH_KEY), "-p", str(HOSTS["naive"][0]), "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                "root@127.0.0.1"]
    hook, hook_log = tmp_path / "hook.py", tmp_path / "hook.log"
    hook.write_text(HOOK % {"ssh": ssh_argv, "unit": UNIT, "log": str(hook_log), "python": sys.executable,
                            "lab": str(ROOT / "lab" / "lab.py"), "inventory": str(INVENTORY)})
    hook.chmod(0o755)
    pve_inventory = tmp_path / "pve.yml"
    pve_inventory.write_text(yaml.safe_dump({"all": {"children": {"proxmox_hosts": {"hosts": {"pve1": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable, "proxmox_node": "pve1",
        "proxmox_api_host": "127.0.0.1", "proxmox_api_port": PVE_PORT, "proxmox_api_user": PVE_TOKEN[0],
        "proxmox_api_token_id": PVE_TOKEN[1], "proxmox_ca_path": str(tmp_path / "tls" / "ca.pem"),
        "proxmox_sysfs_root": write_host_sysfs(str(tmp_path / "sys"))}}}},
        "hosts": {"naive": {"proxmox_vmid": 101, "proxmox_node": "pve1"}}}}))
    secrets = tmp_path / "secrets.json"          # as ansible-vault would give them: never on the command line
    secrets.write_text(json.dumps({"proxmox_api_token_secret": PVE_TOKEN[2], "proxmox_root_password": PVE_ROOT_PASSWORD}))
    secrets.chmod(0o600)
    booted = ssh("naive", "systemctl show -P UserspaceTimestampMonotonic").strip()
    started = unit_start("naive")
    log = open(tmp_path / "standin.log", "w", encoding="utf-8")
    standin = subprocess.Popen([sys.executable, str(ROOT / "lab" / "proxmox_standin" / "standin.py"), "--state",
                                str(state), "--port", str(PVE_PORT), "--tls-dir", str(tmp_path / "tls"),
                                "--power-hook", str(hook)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:                     # the stand-in listens (a condition with a deadline)
            try:
                socket.create_connection(("127.0.0.1", PVE_PORT), timeout=1).close()
                break
            except OSError:
                assert standin.poll() is None and time.monotonic() < deadline, (tmp_path / "standin.log").read_text()
                time.sleep(0.2)
        rc, out = play("-i", str(pve_inventory), "--skip-tags", "bench,provision", "--limit", "naive,pve1",
                       "-e", "@%s" % secrets, "-e", "topolaunch_proxmox_manage=true", "-e", "proxmox_apply=true",
                       "-e", "proxmox_restart_allowed=true")
    finally:
        standin.terminate()
        standin.wait(timeout=10)
        log.close()
    assert rc == 0, out[-8000:] + (tmp_path / "standin.log").read_text()[-2000:]
    assert PVE_TOKEN[2] not in out and PVE_ROOT_PASSWORD not in out
    assert hook_log.read_text() == "reboot 101 unit inactive\n"            # our server was stopped before the reboot
    vm = json.loads(state.read_text())["nodes"]["pve1"]["vms"]["101"]
    assert vm["pending"] == {} and vm["status"] == "running"
    assert vm["config"]["numa"] in (1, "1") and vm["config"]["numa1"].startswith("cpus=32-63,hostnodes=1")
    assert "restarted naive with the new config" in out
    assert "naive: back after its restart, NVML sees 8 GPU(s)" in out
    assert out.count("PLAY [Stage topology]") == 2                          # read again after the restart
    assert ssh("naive", "systemctl show -P UserspaceTimestampMonotonic").strip() != booted
    assert unit_start("naive") != started and ssh("naive", "systemctl is-active " + UNIT).strip() == "active"
