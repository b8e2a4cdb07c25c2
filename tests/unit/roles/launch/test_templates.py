"""The launch role's templates (roles/launch/templates), rendered by Ansible itself: the unit's Description= escapes
`%`, the API key reaches the server only through its config file (`--config PATH` on the command line, nothing in
the env file), and the hardened unit is one systemd loads (`systemd-analyze verify`) and rates <= 4.5
(`systemd-analyze security --offline`), without the settings that would break a GPU server."""
import re
import shutil
import subprocess

import pytest
import yaml
from local_play import run_plays
import paths

ROOT = paths.ROOT
TEMPLATES = ROOT / "roles" / "launch" / "templates"
KEY = 'sk-t0p "s3cr3t" %h $HOME \\ end'
PLAN = {"layout": {"name": "tp8", "tp": 8, "pp": 1, "dp": 1, "ep": 1, "nnodes": 1}, "gpu_indices": [0, 1],
        "cuda_visible_devices": "0,1", "topology_fingerprint": "a1b2c3d4e5f6", "sglang_version": "0.5.9",
        "served_model_name": "glm 100%", "model_path": "/srv/models/glm",
        "argv": ["--model-path", "/srv/models/glm", "--served-model-name", "glm 100%", "--tp-size", "2"],
        "env": {"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}}
CASES = {
    "keyed": {"topolaunch_api_key": KEY, "model_weights_hf_token": "hf_t0ken"},
    "plain": {},
    "lab": {"launch_read_write_paths": ["/run/fake-nvml"], "launch_nvidia_modprobe": ""},
    "home": {"relaunch_plan": dict(PLAN, model_path="/home/ops/models/glm")},
    "watermark": {"topolaunch_watermark_config": '{"key": "wm-s3cr3t"}', "relaunch_plan": dict(PLAN, sglang_version="0.5.23")},
    "hub": {"relaunch_plan": dict(PLAN, model_path="zai-org/GLM-5"), "model_weights_hf_token": "hf_t0ken"},
    "soft": {"launch_hardening": False},
}
NAMES = ["unit.service.j2", "sglang.env.j2", "sglang-config.yaml.j2"]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """{case: {template: text}}: every case rendered by one ansible-playbook run (a play per case with the roles'
    defaults and vars and the case's vars; a last play writes them all, one module call)."""
    base = tmp_path_factory.mktemp("templates")
    plays = []
    for case, extra in CASES.items():
        variables = {}
        for names in ("topolaunch/defaults", "launch/defaults", "launch/vars"):    # the role's own precedence
            variables.update(yaml.safe_load((ROOT / "roles" / names / "main.yml").read_text()))
        variables.update({"relaunch_plan": PLAN})    # the plan the relaunch role hands the launch role
        variables.update(extra)
        plays.append({"name": case, "hosts": "localhost", "gather_facts": False, "vars": variables, "tasks": [
            {"ansible.builtin.set_fact": {"rendered_" + case: {
                n: "{{ lookup('ansible.builtin.template', '%s/%s') }}" % (TEMPLATES, n) for n in NAMES}}}]})
    return dict(zip(CASES, run_plays(plays, base, ["rendered_" + c for c in CASES])))


def unit_lines(text):
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_description_escapes_specifiers(rendered):
    description = [line for line in unit_lines(rendered["plain"]["unit.service.j2"]) if line.startswith("Description=")]
    assert description == ["Description=SGLang server glm 100%% (tp8, topolaunch)"]


def test_the_api_key_is_only_in_the_servers_config_file(rendered):
    files = rendered["keyed"]
    assert KEY not in files["unit.service.j2"] and KEY not in files["sglang.env.j2"]
    assert "TOPOLAUNCH_API_KEY" not in files["sglang.env.j2"] and "api-key" not in files["unit.service.j2"].lower()
    assert '"--config" "/var/lib/topolaunch/sglang-config.yaml"' in files["unit.service.j2"]
    assert yaml.safe_load(files["sglang-config.yaml.j2"]) == {"api-key": KEY}   # as SGLang reads it
    # issue 25 item 15: a local model directory needs no token, the server's environment does not get it
    assert "hf_t0ken" not in files["sglang.env.j2"] and "HF_TOKEN" not in files["sglang.env.j2"]
    assert 'HF_TOKEN="hf_t0ken"' in rendered["hub"]["sglang.env.j2"]      # a model the server loads from the Hub
    plain = rendered["plain"]
    assert not plain["sglang-config.yaml.j2"] and "--config" not in plain["unit.service.j2"]   # "" (None in 2.19)


def test_the_watermark_config_is_only_in_the_servers_config_file(rendered):
    """Issue 25 item 10: SGLang's watermark config (its keys) travels as the API key does."""
    files = rendered["watermark"]
    assert "wm-s3cr3t" not in files["unit.service.j2"] and "wm-s3cr3t" not in files["sglang.env.j2"]
    assert '"--config" "/var/lib/topolaunch/sglang-config.yaml"' in files["unit.service.j2"]
    assert yaml.safe_load(files["sglang-config.yaml.j2"]) == {"watermark-config": '{"key": "wm-s3cr3t"}'}
    keyed = yaml.safe_load(rendered["keyed"]["sglang-config.yaml.j2"])
    assert keyed == {"api-key": KEY}           # no empty watermark-config beside the key


def test_hardening_settings(rendered):
    unit = unit_lines(rendered["plain"]["unit.service.j2"])
    for setting in ("NoNewPrivileges=yes", "CapabilityBoundingSet=", "ProtectSystem=strict",
                    'ReadWritePaths="/var/lib/sglang"', "PrivateTmp=yes", "ProtectHome=yes", "ProtectKernelTunables=yes",
                    "ProtectKernelModules=yes", "ProtectKernelLogs=yes", "ProtectControlGroups=yes",
                    "RestrictSUIDSGID=yes", "LockPersonality=yes", "RestrictRealtime=yes", "UMask=0077",
                    "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
                    "ExecStartPre=-+/usr/bin/nvidia-modprobe -u -c=0"):
        assert setting in unit, setting
    # What would break a GPU server is never set.
    for forbidden in ("PrivateDevices=", "DevicePolicy=", "DeviceAllow=", "MemoryDenyWriteExecute=",
                      "SystemCallFilter=", "PrivateNetwork=", "ProcSubset=", "ProtectClock="):
        assert not [line for line in unit if line.startswith(forbidden)], forbidden
    assert 'ReadWritePaths="/var/lib/sglang" "-/run/fake-nvml"' in unit_lines(rendered["lab"]["unit.service.j2"])
    assert not [line for line in unit_lines(rendered["lab"]["unit.service.j2"]) if "nvidia-modprobe" in line]
    assert "ProtectHome=read-only" in unit_lines(rendered["home"]["unit.service.j2"])
    assert not [line for line in unit_lines(rendered["soft"]["unit.service.j2"]) if line.startswith("Protect")]


ANALYZE = shutil.which("systemd-analyze")


def _unit_dir(tmp_path, text):
    """The unit with its ExecStart python and the service user made to exist here (verify checks both)."""
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    text = text.replace("/opt/sglang/venvs/0.5.9/bin/python", str(python))
    text = re.sub(r"^(User|Group)=.*$", r"\1=root", text, flags=re.M)
    path = tmp_path / "topolaunch-sglang.service"
    path.write_text(text)
    return path


@pytest.mark.skipif(not ANALYZE, reason="needs systemd-analyze")
@pytest.mark.parametrize("case", ["keyed", "plain", "lab", "home"])
def test_systemd_loads_the_unit(rendered, case, tmp_path):
    path = _unit_dir(tmp_path, rendered[case]["unit.service.j2"])
    proc = subprocess.run([ANALYZE, "verify", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and str(path) not in proc.stderr, proc.stderr


@pytest.mark.skipif(not ANALYZE, reason="needs systemd-analyze")
def test_security_exposure_at_most_4_5(rendered, tmp_path):
    def exposure(text, where):
        where.mkdir()
        path = _unit_dir(where, text)
        proc = subprocess.run([ANALYZE, "security", "--offline=true", "--no-pager", str(path)],
                              capture_output=True, text=True, check=False)
        found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", proc.stdout + proc.stderr)
        assert found, proc.stdout + proc.stderr
        return float(found.group(1))

    assert exposure(rendered["plain"]["unit.service.j2"], tmp_path / "hard") <= 4.5
    assert exposure(rendered["soft"]["unit.service.j2"], tmp_path / "soft") > 9      # what it was before
