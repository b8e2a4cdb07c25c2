"""lab/lab.py reads an inventory that carries secrets (issue 29): a vault.yml encrypted whole with ansible-vault and a
`!vault` value in a plain file, as the README's rehearsal copies them from the box's inventory. The lab needs none
of them and has no password: status, and the checks `up` makes before it changes anything, read the rest."""
import pathlib
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent


def encrypted(tmp_path, text):
    """`text` encrypted whole by the real ansible-vault (a pass file of its own)."""
    password = tmp_path / "pass"
    password.write_text("rehearsal-pass\n")
    plain = tmp_path / "plain.yml"
    plain.write_text(text)
    subprocess.run([str(BIN / "ansible-vault"), "encrypt", "--vault-password-file", str(password), str(plain)],
                   check=True, capture_output=True, timeout=60)
    out = plain.read_text()
    assert out.startswith("$ANSIBLE_VAULT;1.1;AES256")
    return out, password


@pytest.fixture
def inventory(tmp_path):
    inv = tmp_path / "unit-vault"
    (inv / "group_vars" / "all").mkdir(parents=True)
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {
        "alpha": {"ansible_port": 2303, "lab_gpu_spec": "proxmox-8x-rtx-pro-6000-vnuma"}}}}))
    whole, password = encrypted(tmp_path, "model_weights_hf_token: hf_secret\ntopolaunch_api_key: sk-secret\n")
    (inv / "group_vars" / "all" / "vault.yml").write_text(whole)
    value = subprocess.run([str(BIN / "ansible-vault"), "encrypt_string", "--vault-password-file", str(password),
                            "sk-secret", "--name", "topolaunch_api_key"], check=True, capture_output=True, text=True,
                           timeout=60).stdout
    (inv / "group_vars" / "all" / "zz-box.yml").write_text("lab_repo_port: 18131\n" + value)
    yield inv
    subprocess.run([sys.executable, str(ROOT / "lab" / "lab.py"), "-i", str(inv), "down"], capture_output=True,
                   check=False, timeout=120)


def test_status_reads_an_inventory_with_vault_files(inventory):
    proc = subprocess.run([sys.executable, str(ROOT / "lab" / "lab.py"), "-i", str(inventory), "status"],
                          capture_output=True, text=True, check=False, timeout=60)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "alpha" in proc.stdout


def test_the_lab_reads_its_settings_beside_the_secrets(inventory):
    sys.path.insert(0, str(ROOT / "lab"))
    try:
        import lab as labmod   # pylint: disable=import-outside-toplevel
    finally:
        sys.path.pop(0)
    lab = labmod.Lab(str(inventory))
    assert lab.repo_port == 18131                       # the plain file's setting, next to its !vault value
    assert [h.name for h in lab.hosts] == ["alpha"]


def test_a_file_that_is_not_yaml_is_named(inventory):
    bad = inventory / "group_vars" / "all" / "broken.yml"
    bad.write_text("a: [1\n")
    proc = subprocess.run([sys.executable, str(ROOT / "lab" / "lab.py"), "-i", str(inventory), "status"],
                          capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().endswith("%s: not valid YAML: while parsing a flow sequence" % bad), proc.stderr
