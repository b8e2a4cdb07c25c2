"""Module gpu_topology: facts through the fake NVML, check mode, failures as module errors."""
import json

import pytest

from ansible_collections.topolaunch.sglang.plugins.modules import gpu_topology
from topology_cases import EXPECTED_MATRIX, make_sysfs


@pytest.mark.parametrize("check_mode", [False, True])
def test_module_returns_facts(fake_nvml, tmp_path, run_module, check_mode):
    spec = fake_nvml.use("proxmox-8x-rtx-pro-6000-vnuma", init=False)
    code, out, _ = run_module(gpu_topology, {"sysfs_root": make_sysfs(tmp_path, spec)}, check_mode)
    assert code == 0 and out["changed"] is False
    assert isinstance(out["query_seconds"], float) and out["query_seconds"] > 0   # the figure: perf/topology_speed.py
    facts = out["ansible_facts"]["gpu_topology"]
    assert facts["gpu_count"] == 8
    assert facts["rendered"]["matrix"] == EXPECTED_MATRIX["proxmox-8x-rtx-pro-6000-vnuma"]
    assert facts["islands"]["numa"] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_module_uses_sysfs_root(fake_nvml, tmp_path, run_module):
    spec = fake_nvml.use("proxmox-8x-rtx-pro-6000-naive", init=False)
    for gpu in spec["gpus"]:
        gpu["sysfs_numa_node"] = 0 if gpu["pci_bus_id"] < "00000000:14" else 1
    code, out, _ = run_module(gpu_topology, {"sysfs_root": make_sysfs(tmp_path, spec)})
    assert code == 0
    facts = out["ansible_facts"]["gpu_topology"]
    assert facts["islands"]["numa"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [f["id"] for f in facts["findings"]] == ["p2p-chipset-not-supported"]


def test_module_fails_with_the_fix(fake_nvml, tmp_path, run_module, monkeypatch):
    fake_nvml.use("proxmox-8x-rtx-pro-6000-vnuma", init=False)
    monkeypatch.setenv("FAKE_NVML_SPEC", str(tmp_path / "missing.json"))   # the fake: driver not loaded
    code, out, _ = run_module(gpu_topology, {})
    assert code == 1 and out["failed"] is True
    assert "kernel driver not loaded" in out["msg"] and "modprobe nvidia" in out["msg"]


def test_module_fails_without_nvidia_ml_py(run_module, monkeypatch):
    def missing():
        raise gpu_topology.TopologyError("nvidia-ml-py (import name pynvml) is not importable by /x/bin/python")
    monkeypatch.setattr(gpu_topology, "import_nvml", missing)
    code, out, _ = run_module(gpu_topology, {})
    assert code == 1 and out["msg"].startswith("nvidia-ml-py (import name pynvml) is not importable")


def test_module_failure_on_a_bad_lab_spec_names_the_field(fake_nvml, run_module):
    """The lab's fake answers nvmlInit of a malformed spec with NVML_ERROR_UNKNOWN; the module's message must
    carry the spec's own error (file and field), not only "error 999"."""
    spec = json.loads((fake_nvml.specs_dir / "proxmox-8x-rtx-pro-6000-vnuma.json").read_text())
    spec["gpus"][5]["pcie"].update(cur_gen=6, max_gen=5)
    fake_nvml.use(spec, init=False)
    code, out, _ = run_module(gpu_topology, {})
    assert code == 1 and out["failed"] is True
    assert "nvmlInit" in out["msg"] and "error 999" in out["msg"] and "Unknown Error" in out["msg"]
    assert "gpus[5].pcie: cur_gen: 6 is above max_gen 5" in out["msg"]
    assert str(fake_nvml.spec_path) in out["msg"]
