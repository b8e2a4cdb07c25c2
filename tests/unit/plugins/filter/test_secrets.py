"""filter_plugins/secrets.py: the inventory files that give a secret variable in plaintext (the play warns)."""
import json
import os
import pathlib
import subprocess
import sys

import yaml

from ansible_collections.topolaunch.sglang.plugins.filter.secrets import SECRET_VARS, FilterModule, plaintext_secrets

ROOT = pathlib.Path(__file__).resolve().parents[4]
VAULTED = "$ANSIBLE_VAULT;1.1;AES256\n6162636465\n"


def inventory(tmp_path, files):
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return str(tmp_path)


def test_a_plaintext_vault_file_is_named_with_its_secrets_and_never_their_values(tmp_path):
    inv = inventory(tmp_path, {
        "hosts.yml": "all:\n  hosts:\n    box: {ansible_host: 10.0.0.5}\n",
        "group_vars/all/main.yml": "topolaunch_port: 30000\ntopolaunch_api_key: \"\"\n",
        "group_vars/all/vault.yml": "model_weights_hf_token: hf_secretvalue\ntopolaunch_api_key: sk-secret\n"})
    found = plaintext_secrets([inv])
    assert found == ["%s/group_vars/all/vault.yml: model_weights_hf_token, topolaunch_api_key" % inv]
    assert "secretvalue" not in str(found) and "sk-secret" not in str(found)


def test_encrypted_files_vault_values_and_empty_secrets_pass(tmp_path):
    inv = inventory(tmp_path, {
        "hosts.yml": "all:\n  hosts:\n    box: {}\n",
        "group_vars/all/vault.yml": VAULTED,
        "group_vars/all/inline.yml": "topolaunch_api_key: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n  6162\n",
        "group_vars/all/main.yml": "model_weights_hf_token: ''\nnot_a_secret: x\n",
        "group_vars/all/vault.yml.example": "model_weights_hf_token: hf_example\n",    # Ansible does not read it
        "host_vars/box/.hidden.yml": "topolaunch_api_key: x\n"})
    assert plaintext_secrets([inv]) == []


def test_secrets_in_the_hosts_file_and_host_vars_of_a_file_source(tmp_path):
    inventory(tmp_path, {
        "hosts.yml": "all:\n  vars: {launch_api_key: abc}\n  hosts:\n    box: {bench_api_key: def}\n",
        "host_vars/box.yml": "model_weights_hf_token: !unsafe 'hf_x'\n",
        "broken.yml": "a: [\n"})
    found = plaintext_secrets(str(tmp_path / "hosts.yml"))
    assert found == ["%s/hosts.yml: bench_api_key, launch_api_key" % tmp_path,
                     "%s/host_vars/box.yml: model_weights_hf_token" % tmp_path]


def test_every_secret_option_of_the_argument_specs_is_a_secret_variable():
    secret = {"topolaunch_api_key"}     # the shared role's (it has no argument spec)
    for path in (ROOT / "roles").glob("*/meta/argument_specs.yml"):
        for spec in yaml.safe_load(path.read_text())["argument_specs"].values():
            secret |= {n for n, o in (spec.get("options") or {}).items() if o.get("no_log")}
    assert secret <= set(SECRET_VARS)
    assert {"model_weights_hf_token", "bench_api_key"} <= secret


def test_the_filter_is_registered():
    assert FilterModule().filters() == {"plaintext_secrets": plaintext_secrets}


def test_the_provision_and_plan_plays_warn_once_naming_the_file(tmp_path):
    """The playbooks' own warning tasks, run by Ansible on a local inventory with a plaintext vault.yml."""
    inv = inventory(tmp_path / "inv", {
        "hosts.yml": "all:\n  hosts:\n    box: {ansible_connection: local, ansible_python_interpreter: %s}\n"
                     % sys.executable,
        "group_vars/all/vault.yml": "model_weights_hf_token: hf_secretvalue\n"})
    plays = []
    for name in ("provision", "plan"):
        play = yaml.safe_load((ROOT / "playbooks" / ("%s.yml" % name)).read_text())[0]
        warn = [t for t in play["tasks"] if t["name"] == "Warn about secrets in unencrypted inventory files"]
        assert len(warn) == 1, name
        plays.append({"name": name, "hosts": "all", "gather_facts": False, "tasks": warn})
    (tmp_path / "play.yml").write_text(json.dumps(plays))
    proc = subprocess.run([str(pathlib.Path(sys.executable).parent / "ansible-playbook"), "-i", inv,
                           str(tmp_path / "play.yml")], cwd=ROOT, capture_output=True, text=True, check=False,
                          env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg")), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = "secrets in plaintext: %s/group_vars/all/vault.yml: model_weights_hf_token" % inv
    assert proc.stdout.count(line) == 1 and "hf_secretvalue" not in proc.stdout, proc.stdout
