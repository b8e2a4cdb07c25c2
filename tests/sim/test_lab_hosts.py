"""lab/lab.py stop HOST / start HOST: one host of an inventory powered off and booted again (the lab's
"unreachable" node). Bad input is refused before anything changes, without root; the verbs themselves on booted
hosts are in tests/lab/test_lab.py (test_stop_and_start_one_host)."""
import pathlib
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def inventory(tmp_path):
    inv = tmp_path / "unit-hosts"
    inv.mkdir()
    (inv / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": {
        "alpha": {"ansible_port": 2301, "lab_gpu_spec": "proxmox-8x-rtx-pro-6000-vnuma"},
        "beta": {"ansible_port": 2302, "lab_gpu_spec": "proxmox-8x-rtx-pro-6000-vnuma"}}}}))
    yield inv
    assert not (ROOT / ".lab" / "unit-hosts").exists(), "a refused command left lab state behind"


def lab(inventory, *args):
    return subprocess.run([sys.executable, str(ROOT / "lab" / "lab.py"), "-i", str(inventory), *args],
                          capture_output=True, text=True, check=False, timeout=60)


@pytest.mark.parametrize("verb", ["stop", "start"])
def test_a_host_not_in_the_inventory_is_refused(inventory, verb):
    proc = lab(inventory, verb, "gamma")
    assert proc.returncode == 1
    assert proc.stderr.strip() == (f"lab.py {verb}: error: host 'gamma' is not in inventory {inventory} "
                                   "(its hosts: alpha, beta)")


@pytest.mark.parametrize("verb", ["stop", "start"])
def test_the_host_is_required(inventory, verb):
    proc = lab(inventory, verb)
    assert proc.returncode == 2 and "the following arguments are required: host" in proc.stderr
