"""topology.py: facts per spec, NVSwitch counts, NUMA order, errors, fingerprint (the nvidia-smi layouts:
test_topology_render.py; the findings: test_topology_findings.py).

NVML answers come from topology_cases.synthesize (a recording synthesised from a lab spec) replayed through
plugin_utils topology_replay.Replay; test_topology_fake.py runs the same checks through the C fake and the real
nvidia-ml-py, test_topology_real.py through answers recorded on a real 2x H200 machine.
"""
import copy
import json
import sys

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import topology
from ansible_collections.topolaunch.sglang.plugins.plugin_utils.topology_replay import Handle, Replay, ReplayNVMLError
from topology_cases import all_specs, assert_facts_match_spec, load_spec, make_sysfs, read, synthesize

GIB = 1 << 30


@pytest.mark.parametrize("name", all_specs())
def test_facts_match_spec(name, tmp_path):
    spec = load_spec(name)
    assert_facts_match_spec(read(spec, tmp_path), spec)


def test_islands_of_the_field_machine(tmp_path):
    facts = read(load_spec("proxmox-8x-rtx-pro-6000-vnuma"), tmp_path)
    assert facts["islands"] == {"numa": [[0, 1, 2, 3], [4, 5, 6, 7]], "p2p": [[0, 1, 2, 3, 4, 5, 6, 7]], "nvlink": []}
    assert facts["findings"] == []


def test_p2p_islands_split_where_p2p_fails(tmp_path):
    spec = load_spec("proxmox-8x-rtx-pro-6000-vnuma")
    spec["p2p"] = {"default": "OK", "pairs": [[a, b, "CNS"] for a in range(4) for b in range(4, 8)]}
    facts = read(spec, tmp_path)
    assert facts["islands"]["p2p"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    (finding,) = [f for f in facts["findings"] if f["id"] == "p2p-chipset-not-supported"]
    assert finding["gpus"] == list(range(8))
    assert "0-4" in finding["message"] and "0-1" not in finding["message"]


def test_direct_nvlink_pairs(tmp_path):
    spec = load_spec("proxmox-8x-rtx-pro-6000-vnuma")
    for i, g in enumerate(spec["gpus"]):
        g["nvlinks"] = 4 if i < 4 else 0
    spec["nvlink"] = {"fabric": "direct", "pairs": [[0, 1, 2], [2, 3, 2], [0, 3, 2], [1, 2, 2]]}
    facts = read(spec, tmp_path)
    assert facts["links"][0][:4] == ["X", "NV2", "NODE", "NV2"]
    assert facts["links"][1][2] == "NV2" and facts["links"][0][2] == "NODE"
    assert facts["nvlink_fabric"] == "direct"
    assert facts["islands"]["nvlink"] == [[0, 1, 2, 3]]     # a ring is one island (connected, not a clique)


def test_nvswitch_counts_come_from_the_switch_not_the_peer(tmp_path):
    """Remote of every link is the switch (bus FFFFFFFF:FF:FF.0): counting links whose remote is the peer gives 0."""
    spec = load_spec("h200x2-vm-real")
    facts = read(spec, tmp_path)
    assert facts["nvlink_counts"] == [[0, 18], [18, 0]] and facts["nvlink_fabric"] == "nvswitch"
    # Without RemoteDeviceType (older drivers) the switch bus id alone must still give NV18.
    overrides = {("nvmlDeviceGetNvLinkRemoteDeviceType", Handle(g), link): ReplayNVMLError(3)
                 for g in range(2) for link in range(18)}
    assert read(spec, tmp_path / "b", overrides=overrides)["links"][0][1] == "NV18"
    # A pair the fabric does not connect (P2P over NVLink not OK) is not NV#.
    spec["p2p"] = {"default": "NS", "pairs": []}
    assert read(spec, tmp_path / "c")["links"][0][1] == "PHB"


def test_p2p_indices_are_plain_ints(tmp_path):
    replay = Replay(synthesize(load_spec("h200x2-vm-real")))
    topology.read_topology(replay, make_sysfs(tmp_path, load_spec("h200x2-vm-real")))
    p2p = [json.loads(k) for k in replay.asked if k.startswith('["nvmlDeviceGetP2PStatus"')]
    assert sorted({c[3] for c in p2p}) == [0, 1, 2, 3, 4]
    assert all(type(c[3]) is int for c in p2p)   # pylint: disable=unidiomatic-typecheck
    assert len(p2p) == 2 * 5


def test_numa_order_node_id_then_affinity_then_sysfs(tmp_path):
    spec = load_spec("proxmox-8x-rtx-pro-6000-vnuma")
    facts = read(spec, tmp_path / "a")
    assert [g["numa_source"] for g in facts["gpus"]] == ["nvml_memory_affinity"] * 8
    # GetNumaNodeId answering (Grace) wins.
    spec_grace = copy.deepcopy(spec)
    spec_grace["not_supported"] = []
    g0 = read(spec_grace, tmp_path / "b")["gpus"][0]
    assert (g0["numa_source"], g0["gpu_numa_id"]) == ("nvml_numa_node_id", 0)
    # Memory affinity empty: sysfs decides; sysfs -1: unknown.
    spec_sysfs = copy.deepcopy(spec)
    for g in spec_sysfs["gpus"]:
        g["sysfs_numa_node"], g["numa_node"] = g["numa_node"], -1
    facts = read(spec_sysfs, tmp_path / "c")
    assert [(g["numa_node"], g["numa_source"]) for g in facts["gpus"]] == [(0, "sysfs")] * 4 + [(1, "sysfs")] * 4
    facts = read(load_spec("proxmox-8x-rtx-pro-6000-naive"), tmp_path / "d")
    assert {(g["numa_node"], g["numa_source"]) for g in facts["gpus"]} == {(None, "none")}


def test_sysfs_bus_id_and_cpulist():
    assert topology.sysfs_bus_id("00000000:8A:00.0") == "0000:8a:00.0"
    assert topology.cpulist([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert topology.cpulist([]) == ""


@pytest.mark.parametrize("code,needle", [
    (12, "driver is not installed"), (9, "modprobe nvidia"), (18, "Reboot the host")])
def test_init_errors_name_the_fix(tmp_path, code, needle):
    overrides = {("nvmlInit",): ReplayNVMLError(code)}
    with pytest.raises(topology.TopologyError, match=needle):
        read(load_spec("h200x2-vm-real"), tmp_path, overrides=overrides)


@pytest.mark.parametrize("call,code", [
    (("nvmlDeviceGetP2PStatus", Handle(0), Handle(1), 2), 15),           # GPU is lost mid-query
    (("nvmlDeviceGetMemoryInfo", Handle(1)), 999),                      # Unknown on a handle
    (("nvmlDeviceGetNvLinkState", Handle(1), 3), 15)])
def test_gpu_lost_mid_query_names_the_fix(tmp_path, call, code):
    gpu = call[1].index
    with pytest.raises(topology.TopologyError, match=r"GPU lost .* on GPU %d .*nvidia-smi -r -i %d" % (gpu, gpu)):
        read(load_spec("h200x2-vm-real"), tmp_path, overrides={call: ReplayNVMLError(code)})


def test_unknown_error_at_init_is_not_called_a_lost_gpu(tmp_path):
    with pytest.raises(topology.TopologyError, match=r"^NVML call nvmlInit failed: error 999"):
        read(load_spec("h200x2-vm-real"), tmp_path, overrides={("nvmlInit",): ReplayNVMLError(999)})


class _OldNvml:
    """An nvidia-ml-py that predates some calls: attribute lookups for them fail."""

    def __init__(self, replay, missing):
        self._replay, self._missing = replay, missing
        self.NVMLError = replay.NVMLError

    def __getattr__(self, name):
        if name in self._missing:
            raise AttributeError(name)
        return getattr(self._replay, name)


def test_old_nvidia_ml_py_without_optional_calls(tmp_path):
    spec = load_spec("h200x2-vm-real")
    old = _OldNvml(Replay(synthesize(spec)), {"nvmlDeviceGetNvLinkRemoteDeviceType", "nvmlDeviceGetNumaNodeId"})
    facts = topology.read_topology(old, make_sysfs(tmp_path, spec))
    assert facts["links"][0][1] == "NV18" and facts["gpus"][0]["numa_source"] == "nvml_memory_affinity"
    with pytest.raises(topology.TopologyError, match="has no nvmlDeviceGetUUID: upgrade it in the tools venv"):
        topology.read_topology(_OldNvml(Replay(synthesize(spec)), {"nvmlDeviceGetUUID"}), "/nonexistent")


def test_missing_nvidia_ml_py_names_the_venv(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)   # import pynvml raises ImportError
    monkeypatch.setattr(sys, "prefix", "/opt/topolaunch/tools")
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    with pytest.raises(topology.TopologyError) as err:
        topology.import_nvml()
    assert "pip install nvidia-ml-py into the venv /opt/topolaunch/tools" in str(err.value)
    assert "--tags provision" in str(err.value)


def test_missing_nvidia_ml_py_in_system_python_points_to_the_venv(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setattr(sys, "prefix", "/usr")
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    with pytest.raises(topology.TopologyError, match="is a system python, not the tools venv: set topolaunch_tools_python"):
        topology.import_nvml()


def test_fingerprint_ignores_use_and_identity(tmp_path):
    spec = load_spec("proxmox-8x-rtx-pro-6000-vnuma")
    base = read(spec, tmp_path / "a")
    busy = read(spec, tmp_path / "b", processes={0: [(4242, 5 * GIB)]})
    assert busy["gpus"][0]["processes"] == [{"pid": 4242, "used_memory_bytes": 5 * GIB}]
    other = copy.deepcopy(spec)
    other["driver_version"] = "580.105.08"
    for i, g in enumerate(other["gpus"]):
        g["uuid"] = "GPU-other-%d" % i
        g["pcie"]["cur_gen"] = 1
    assert base["fingerprint"] == busy["fingerprint"] == read(other, tmp_path / "c")["fingerprint"]
    assert len(base["fingerprint"]) == 12 and int(base["fingerprint"], 16) >= 0
    # What determines performance changes it.
    numa_flat = read(load_spec("proxmox-8x-rtx-pro-6000-naive"), tmp_path / "d")
    assert numa_flat["fingerprint"] != base["fingerprint"]
    fewer = copy.deepcopy(spec)
    fewer["gpus"][7]["memory_total_mib"] = 49152
    assert read(fewer, tmp_path / "e")["fingerprint"] != base["fingerprint"]


def test_fingerprint_independent_of_key_order(tmp_path):
    facts = read(load_spec("proxmox-8x-rtx-pro-6000-vnuma"), tmp_path)
    shuffled = json.loads(json.dumps(facts, sort_keys=True))
    assert topology.fingerprint(shuffled) == facts["fingerprint"]
