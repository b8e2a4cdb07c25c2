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
import subprocess
import sys

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
