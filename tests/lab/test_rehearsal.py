"""The README's rehearsal, as written (issue 29): the box's inventory made from inventory/example with its vault
encrypted (README "Configure", every command but the deploy to the box), then "Rehearse your inventory against a lab
host" line by line: its own lab host, the box's settings and workload (1024/1024 at 128), the encrypted vault, a
whole deploy.yml with the bench.

The commands are the README's own shell blocks, run by bash from the checkout: `$EDITOR` is a script that writes what
a person would (the box's host, the secrets, the lab host with its ports), HOME is a temporary directory (the vault
pass file), and `mybox` is renamed `pytest-rehearsal` so that a developer's own inventory/mybox is never touched.
The lab host: ssh 127.0.0.1:2236, server port 31290, the lab inventory's repository port (18080), booted from the
provisioned layer (tests/lab/labhosts.py; the person's host boots bare and provisions, which the layer already did).

    .venv/bin/pytest -m lab tests/lab/test_rehearsal.py
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
NAME = "pytest-rehearsal"
HOST, SSH_PORT, SERVER_PORT = "rehearsal", 2236, 31290
HF_TOKEN, API_KEY = "hf_rehearsalTOKEN0123456789", "sk-rehearsal-key-0123456789"
SSH_KEY = ROOT / ".lab" / "ssh" / "id_ed25519"

LAB_MISSING = os.geteuid() != 0 or not shutil.which("systemd-nspawn") or not shutil.which("debootstrap")
pytestmark = [pytest.mark.lab, pytest.mark.skipif(LAB_MISSING, reason="needs root, systemd-nspawn and debootstrap")]

EDITOR = '''import json, os, sys
files = json.loads(os.environ["REHEARSAL_FILES"])
for path in sys.argv[1:]:
    if path in files:
        with open(path, "w", encoding="utf-8") as f:
            f.write(files[path])
'''


def readme_block(first_command):
    """The README's ```sh block whose first line starts with `first_command`: its command lines."""
    text = (ROOT / "README.md").read_text()
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        lines = [ln for ln in block.splitlines() if ln.strip()]
        if lines and lines[0].startswith(first_command):
            return lines
    raise AssertionError("README.md has no sh block starting with %r" % first_command)


def renamed(lines):
    return [ln.replace("mybox", NAME) for ln in lines]


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    box, lab = ROOT / "inventory" / NAME, ROOT / "inventory" / (NAME + "-lab")
    for inv in (box, lab):
        assert not inv.exists(), "%s exists: a developer's inventory, or a run that did not clean up" % inv
    configure = readme_block("cp -r inventory/example inventory/mybox")
    assert configure[-1].startswith("ansible-playbook -i inventory/mybox deploy.yml")   # the deploy to the box
    rehearse = readme_block("cp -r inventory/lab inventory/mybox-lab")
    script = renamed(configure[:-1] + rehearse)
    files = {
        "inventory/%s/hosts.yml" % NAME: yaml.safe_dump({"all": {"children": {"gpu_hosts": {"children": {
            "sglang_servers": {"hosts": {"box": {"ansible_host": "192.0.2.10", "ansible_user": "ubuntu"}}}}}}}}),
        "inventory/%s/group_vars/all/vault.yml" % NAME: yaml.safe_dump({
            "model_weights_hf_token": HF_TOKEN, "topolaunch_api_key": API_KEY}),
        "inventory/%s-lab/hosts.yml" % NAME: yaml.safe_dump({"all": {"children": {"gpu_hosts": {"children": {
            "sglang_servers": {"hosts": {HOST: {
                "ansible_port": SSH_PORT, "topolaunch_port": SERVER_PORT,
                "lab_gpu_spec": labhosts.FIELD_SPEC, **labhosts.provisioned()}}}}}}}}),
    }
    editor = home / "editor.py"
    editor.write_text(EDITOR)
    env = dict(os.environ, HOME=str(home), EDITOR="%s %s" % (sys.executable, editor),
               REHEARSAL_FILES=json.dumps(files), PATH="%s:%s" % (ROOT / ".venv" / "bin", os.environ["PATH"]),
               ANSIBLE_NOCOLOR="1")
    env.pop("ANSIBLE_CONFIG", None)
    before = set((ROOT / "results").rglob("*")) if (ROOT / "results").exists() else set()
    logs = []

    def run(line):
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", line], cwd=ROOT, env=env, capture_output=True,
                              text=True, check=False, timeout=1500)
        logs.append((line, proc.returncode, proc.stdout + proc.stderr))
        return proc.returncode

    try:
        assert script[-1].endswith("lab.py -i inventory/%s-lab down" % NAME), script[-1]
        for line in script[:-1]:          # the last line (down) is the last test's
            if run(line) != 0:
                break
        yield logs, lab, lambda: run(script[-1])
    finally:
        subprocess.run([sys.executable, str(ROOT / "lab" / "lab.py"), "-i", str(lab), "down", "--purge"],
                       capture_output=True, check=False, timeout=300)
        shutil.rmtree(box, ignore_errors=True)
        shutil.rmtree(lab, ignore_errors=True)
        shutil.rmtree(ROOT / "artifacts" / HOST, ignore_errors=True)
        for path in sorted(set((ROOT / "results").rglob("*")) - before, reverse=True) \
                if (ROOT / "results").exists() else []:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def curl(path, key=None):
    """An HTTP status code of the rehearsed server, from inside its host."""
    header = "-H 'Authorization: Bearer %s'" % key if key else ""
    proc = subprocess.run(
        ["ssh", "-F", "/dev/null", "-i", str(SSH_KEY), "-p", str(SSH_PORT), "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
         "root@127.0.0.1", "curl -s -o /dev/null -w '%%{http_code}' %s http://127.0.0.1:%d%s" % (header, SERVER_PORT, path)],
        capture_output=True, text=True, check=False, timeout=60)
    return proc.stdout.strip()


def test_the_readme_rehearsal_runs_as_written(rehearsal):
    logs, lab, _ = rehearsal
    for line, rc, out in logs:
        assert rc == 0, "README line failed (rc %d): %s\n%s" % (rc, line, out[-6000:])
    deploy = logs[-1][2]
    assert "ansible-playbook -i inventory/%s-lab deploy.yml --vault-password-file" % NAME in logs[-1][0]
    assert re.search(r"^%s\s+: ok=\d+ .*failed=0" % HOST, deploy, re.M), deploy[-4000:]
    assert "serves" in deploy and "timed out after" not in deploy, deploy[-4000:]
    for _, _, out in logs:
        assert HF_TOKEN not in out and API_KEY not in out
    assert (lab / "group_vars" / "all" / "vault.yml").read_text().startswith("$ANSIBLE_VAULT;1.1;AES256")


def test_the_box_workload_was_benchmarked_in_the_lab(rehearsal):
    """The bench ran the box's workload (1024/1024 at 128) through, within the lab's scaled point timeout, and
    stored it."""
    logs, _, _ = rehearsal
    deploy = logs[-1][2]
    assert "input 1024 / output 1024 tokens" in deploy, deploy[-4000:]
    shown = re.search(r"c=128 ok [0-9.]+ tok/s TTFT p99 [0-9.]+ ms -> (\S+\.jsonl)", deploy)
    assert shown, deploy[-4000:]
    assert pathlib.Path(shown.group(1)).is_file()


def test_the_rehearsed_server_enforces_the_vaults_api_key(rehearsal):
    assert curl("/v1/models") == "401"
    assert curl("/v1/models", API_KEY) == "200"


def test_the_readme_rehearsal_ends_with_the_lab_down(rehearsal):
    _, lab, down = rehearsal
    assert down() == 0
    status = subprocess.run([sys.executable, str(ROOT / "lab" / "lab.py"), "-i", str(lab), "status"],
                            capture_output=True, text=True, check=False, timeout=60)
    assert status.returncode == 0 and "running" not in status.stdout, status.stdout + status.stderr
