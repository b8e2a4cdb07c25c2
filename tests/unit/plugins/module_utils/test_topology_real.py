"""The topology reader on answers recorded from a real machine (2x H200, NVSwitch, Firecracker VM; see
tests/fixtures/nvml/README.md): its reading must match what nvidia-smi printed there, byte for byte."""
import json

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import topology
from ansible_collections.topolaunch.sglang.plugins.plugin_utils.topology_replay import Replay
import nvml_dump
import paths

FIXTURES = paths.FIXTURES / "nvml"


def recording(name):
    return json.loads((FIXTURES / name).read_text())


@pytest.fixture(name="sysfs")
def fixture_sysfs(tmp_path):
    """sysfs as that machine had it: numa_node -1 for both GPUs."""
    for bus in ("0000:00:06.0", "0000:00:07.0"):
        d = tmp_path / "bus" / "pci" / "devices" / bus
        d.mkdir(parents=True)
        (d / "numa_node").write_text("-1\n")
    return str(tmp_path)


@pytest.fixture(name="replay")
def fixture_replay():
    return Replay(recording("h200x2-vm.json"))


def test_h200_reading(replay, sysfs):
    facts = topology.read_topology(replay, sysfs)
    assert facts["gpu_count"] == 2 and facts["driver_version"] == "580.159.04"
    assert facts["cuda_driver_version"] == "13.0"
    # NV18 although every NVLink remote is the switch (FFFFFFFF:FF:FF.0), not the peer GPU.
    assert facts["links"] == [["X", "NV18"], ["NV18", "X"]]
    assert facts["pcie_levels"] == [["X", "PHB"], ["PHB", "X"]]
    assert facts["nvlink_fabric"] == "nvswitch"
    for kind in ("read", "write", "nvlink", "atomics"):
        assert facts["p2p"][kind] == [["X", "OK"], ["OK", "X"]]
    assert facts["p2p"]["pci"] == [["X", "NS"], ["NS", "X"]]
    for gpu in facts["gpus"]:
        # NUMA 0 from memory affinity: GetNumaNodeId is NOT_SUPPORTED and sysfs reads -1.
        assert (gpu["numa_node"], gpu["numa_source"], gpu["gpu_numa_id"]) == (0, "nvml_memory_affinity", None)
        assert gpu["virtualization_mode"] == "passthrough"
        assert gpu["nvlinks_active"] == 18
        assert gpu["cpu_affinity"] == "0-31"
        assert gpu["compute_capability"] == "9.0"
        assert gpu["memory"]["total_bytes"] == 150754820096
        assert gpu["persistence_mode"] is True and gpu["mig_enabled"] is False
    assert facts["in_vm"] is True
    assert facts["islands"] == {"numa": [[0, 1]], "p2p": [[0, 1]], "nvlink": [[0, 1]]}
    assert facts["findings"] == []
    asked = [json.loads(k) for k in replay.asked]
    assert ["nvmlDeviceGetNumaNodeId", {"handle": 0}] in asked
    (numa_id,) = [c for c in recording("h200x2-vm.json")["calls"]
                  if c["call"] == ["nvmlDeviceGetNumaNodeId", {"handle": 0}]]
    assert numa_id == {"call": ["nvmlDeviceGetNumaNodeId", {"handle": 0}], "error": 3}   # NOT_SUPPORTED


def test_h200_matrix_equals_nvidia_smi(replay, sysfs):
    """Byte for byte, escapes and tabs included: nvidia-smi underlines its header even into a pipe."""
    facts = topology.read_topology(replay, sysfs)
    assert topology.render_matrix(facts) == (FIXTURES / "h200x2-vm.topo_m.txt").read_text()
    assert topology.render_p2p(facts, "read") == (FIXTURES / "h200x2-vm.topo_p2p_r.txt").read_text()


def test_h200_p2p_tables_equal_nvidia_smi(replay, sysfs):
    facts = topology.read_topology(replay, sysfs)
    text = (FIXTURES / "h200x2-vm.nvidia-smi.txt").read_text()
    for kind, letter in (("write", "w"), ("nvlink", "n"), ("atomics", "a"), ("pci", "p")):
        section = text.split("### nvidia-smi topo -p2p %s\n" % letter, 1)[1].split("### ", 1)[0]
        assert topology.render_p2p(facts, kind) == section


def test_h200_busy_process_and_same_fingerprint(sysfs):
    idle = topology.read_topology(Replay(recording("h200x2-vm.json")), sysfs)
    busy_rec = recording("h200x2-vm-busy.json")
    busy = topology.read_topology(Replay(busy_rec), sysfs)
    pid = busy_rec["meta"]["holder_pid"]
    assert busy["gpus"][0]["processes"] == [{"pid": pid, "used_memory_bytes": 4838129664}]
    assert busy["gpus"][1]["processes"] == []
    (finding,) = busy["findings"]
    assert (finding["id"], finding["gpus"]) == ("gpu-busy", [0]) and str(pid) in finding["message"]
    assert busy["fingerprint"] == idle["fingerprint"]


def test_nvml_dump_of_the_recording_is_the_spec_made_on_the_machine(tmp_path):
    out = tmp_path / "spec.json"
    assert nvml_dump.main(["--recording", str(FIXTURES / "h200x2-vm.json"), "--name", "h200x2-vm-real",
                           "-o", str(out)]) == 0
    assert json.loads(out.read_text()) == json.loads((FIXTURES / "h200x2-vm.spec.json").read_text())
