"""The topology reader through the lab's fake libnvidia-ml.so.1 and the real, unpatched nvidia-ml-py."""
import json

import pynvml
import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import topology
from ansible_collections.topolaunch.sglang.plugins.plugin_utils.topology_replay import Replay
from topology_cases import (EXPECTED_MATRIX, EXPECTED_P2P_READ, all_specs, assert_facts_match_spec, load_spec,
                            make_sysfs, synthesize)

GIB = 1 << 30


def read_fake(fake_nvml, spec_name, tmp_path):
    spec = fake_nvml.use(spec_name, init=False)
    return topology.read_topology(pynvml, make_sysfs(tmp_path, spec)), spec


@pytest.mark.parametrize("name", all_specs())
def test_facts_match_spec_through_fake(fake_nvml, tmp_path, name):
    facts, spec = read_fake(fake_nvml, name, tmp_path)
    assert_facts_match_spec(facts, spec)


@pytest.mark.parametrize("name", all_specs())
def test_synthesised_answers_read_like_the_fake(fake_nvml, tmp_path, name):
    """The in-test answers (used where errors are injected) must not drift from the fake's."""
    fake, spec = read_fake(fake_nvml, name, tmp_path / "fake")
    synth = topology.read_topology(Replay(synthesize(spec)), make_sysfs(tmp_path / "synth", spec))
    for facts in (fake, synth):
        for gpu in facts["gpus"]:
            gpu.pop("uuid")
        facts["rendered"].pop("report")
    assert json.dumps(fake, sort_keys=True) == json.dumps(synth, sort_keys=True)


@pytest.mark.parametrize("name", sorted(EXPECTED_MATRIX))
def test_matrix_through_fake_is_what_nvidia_smi_prints(fake_nvml, tmp_path, name):
    facts, _ = read_fake(fake_nvml, name, tmp_path)
    assert facts["rendered"]["matrix"] == EXPECTED_MATRIX[name]
    if name in EXPECTED_P2P_READ:
        assert facts["rendered"]["p2p_read"] == EXPECTED_P2P_READ[name]


def test_field_and_naive_findings_through_fake(fake_nvml, tmp_path):
    field, _ = read_fake(fake_nvml, "proxmox-8x-rtx-pro-6000-vnuma", tmp_path / "f")
    assert field["findings"] == []
    assert field["islands"]["numa"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    naive, _ = read_fake(fake_nvml, "proxmox-8x-rtx-pro-6000-naive", tmp_path / "n")
    assert [f["id"] for f in naive["findings"]] == ["vm-no-numa", "p2p-chipset-not-supported"]
    assert field["fingerprint"] != naive["fingerprint"]


def test_registered_process_makes_gpu_busy(fake_nvml, tmp_path):
    spec = fake_nvml.use("proxmox-8x-rtx-pro-6000-vnuma", init=False)
    idle = topology.read_topology(pynvml, make_sysfs(tmp_path / "a", spec))
    pid = fake_nvml.register(3, 5 * GIB)
    busy = topology.read_topology(pynvml, make_sysfs(tmp_path / "b", spec))
    assert busy["gpus"][3]["processes"] == [{"pid": pid, "used_memory_bytes": 5 * GIB}]
    assert busy["gpus"][3]["memory"]["used_bytes"] == idle["gpus"][3]["memory"]["used_bytes"] + 5 * GIB
    (finding,) = busy["findings"]
    assert (finding["id"], finding["gpus"]) == ("gpu-busy", [3]) and str(pid) in finding["message"]
    assert busy["fingerprint"] == idle["fingerprint"]


def test_sysfs_root_is_used_when_nvml_has_no_numa(fake_nvml, tmp_path):
    spec = load_spec("proxmox-8x-rtx-pro-6000-vnuma")
    for gpu in spec["gpus"]:
        gpu["sysfs_numa_node"], gpu["numa_node"] = gpu["numa_node"], -1
    fake_nvml.use(spec, init=False)
    facts = topology.read_topology(pynvml, make_sysfs(tmp_path, spec))
    assert [g["numa_node"] for g in facts["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {g["numa_source"] for g in facts["gpus"]} == {"sysfs"}
    assert facts["islands"]["numa"] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_driver_not_loaded_through_fake(fake_nvml, tmp_path, monkeypatch):
    """The fake answers DRIVER_NOT_LOADED when its spec file is missing, as a host without the kernel module."""
    fake_nvml.use("proxmox-8x-rtx-pro-6000-vnuma", init=False)
    monkeypatch.setenv("FAKE_NVML_SPEC", str(tmp_path / "missing.json"))
    with pytest.raises(topology.TopologyError, match="kernel driver not loaded.*modprobe nvidia"):
        topology.read_topology(pynvml, str(tmp_path))

