"""Issue 25 item 1: host keys are checked for every inventory but the lab's. ansible.cfg set host_key_checking =
False and ssh_args with UserKnownHostsFile=/dev/null and StrictHostKeyChecking=no for every inventory, so on a
production inventory an impostor host would receive the decrypted HF token and API key."""
import configparser
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent
LAB_ONLY = ("UserKnownHostsFile=/dev/null", "StrictHostKeyChecking=no")


def host_vars(inventory, host):
    out = subprocess.run([str(BIN / "ansible-inventory"), "-i", str(ROOT / inventory), "--host", host],
                         capture_output=True, text=True, check=True, timeout=120, cwd=ROOT,
                         env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg")))
    return json.loads(out.stdout)


def test_ansible_cfg_checks_host_keys():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "ansible.cfg")
    assert cfg.getboolean("defaults", "host_key_checking") is True
    ssh_args = cfg.get("ssh_connection", "ssh_args")
    assert not [o for o in LAB_ONLY if o in ssh_args], ssh_args


def test_the_example_inventory_keeps_them_checked():
    hv = host_vars("inventory/example", "gpu-box-01")
    assert "ansible_host_key_checking" not in hv
    assert not [o for o in LAB_ONLY if o in str(hv.get("ansible_ssh_common_args", ""))]


def test_the_lab_inventories_turn_checking_off_for_their_throwaway_hosts():
    for inventory in ("inventory/lab", "inventory/lab-multinode"):
        hosts = json.loads(subprocess.run([str(BIN / "ansible-inventory"), "-i", str(ROOT / inventory), "--list"],
                                          capture_output=True, text=True, check=True, timeout=120, cwd=ROOT,
                                          env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))).stdout)
        names = sorted(hosts["_meta"]["hostvars"])
        assert names, inventory
        for name in names:
            hv = hosts["_meta"]["hostvars"][name]
            assert hv["ansible_host_key_checking"] is False, (inventory, name)
            assert all(o in hv["ansible_ssh_common_args"] for o in LAB_ONLY), (inventory, name)
