"""plugin_utils/spec_facts.py: NVML answers synthesised from a lab spec (CPU masks, P2P codes, processes, NUMA not
supported, NVLink remotes), the fake sysfs, and the facts the real reader makes of them."""
import json

from ansible_collections.topolaunch.sglang.plugins.plugin_utils import spec_facts
from ansible_collections.topolaunch.sglang.plugins.plugin_utils.topology_replay import Handle, Replay, ReplayNVMLError
import paths

SPECS = paths.ROOT / "lab" / "specs"
MIB = 1 << 20


def spec(name="proxmox-8x-rtx-pro-6000-vnuma"):
    return json.loads((SPECS / (name + ".json")).read_text())


def test_cpu_masks_are_words_of_64_bits():
    assert spec_facts.mask("0-3,8", 1) == [0b100001111]
    assert spec_facts.mask("63-64", 2) == [1 << 63, 1]
    assert spec_facts.mask("", 2) == [0, 0]


def test_p2p_status_of_a_pair_or_the_default():
    box = {"p2p": {"default": "CNS", "pairs": [[3, 7, "OK"]]}}
    assert spec_facts.p2p_status(box, 7, 3) == spec_facts.P2P_CODES["OK"]
    assert spec_facts.p2p_status(box, 0, 1) == spec_facts.P2P_CODES["CNS"]
    assert spec_facts.p2p_status({}, 0, 1) == spec_facts.P2P_CODES["OK"]


def test_answers_carry_the_spec_and_the_processes():
    box = spec()
    nvml = Replay(spec_facts.synthesize(box, processes={2: [(4242, 4096 * MIB)]}))
    assert nvml.nvmlDeviceGetCount() == len(box["gpus"])
    assert nvml.nvmlDeviceGetName(Handle(0)) == box["gpus"][0]["name"]
    held = nvml.nvmlDeviceGetMemoryInfo(Handle(2))
    assert held.used == (box["gpus"][2].get("memory_reserved_mib", 0) + 4096) * MIB
    assert held.free == held.total - held.used
    (proc,) = nvml.nvmlDeviceGetComputeRunningProcesses(Handle(2))
    assert (proc.pid, proc.usedGpuMemory) == (4242, 4096 * MIB)
    assert nvml.nvmlDeviceGetComputeRunningProcesses(Handle(3)) == []


def test_numa_node_id_not_supported_when_the_spec_says_so():
    box = dict(spec(), not_supported=["numa_node_id"])
    nvml = Replay(spec_facts.synthesize(box))
    try:
        nvml.nvmlDeviceGetNumaNodeId(Handle(0))
    except ReplayNVMLError as exc:
        assert exc.value == spec_facts.NOT_SUPPORTED
    else:
        raise AssertionError("GetNumaNodeId answered although the spec says NOT_SUPPORTED")


def test_sysfs_has_the_numa_node_of_each_gpu(tmp_path):
    box = spec()
    root = spec_facts.make_sysfs(tmp_path, box)
    found = sorted((tmp_path / "sysfs" / "bus" / "pci" / "devices").glob("*/numa_node"))
    assert len(found) == len(box["gpus"]) and root == str(tmp_path / "sysfs")
    assert {p.read_text() for p in found} == {"%d\n" % g["numa_node"] for g in box["gpus"]}


def test_facts_from_a_file_or_a_dict_are_the_same(tmp_path):
    path = SPECS / "proxmox-8x-rtx-pro-6000-vnuma.json"
    from_file = spec_facts.facts_from_spec(str(path), tmp_path / "a")
    from_dict = spec_facts.facts_from_spec(spec(), tmp_path / "b")
    assert from_file["fingerprint"] == from_dict["fingerprint"] and from_file["gpu_count"] == 8
    assert from_file["islands"]["numa"] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_nvswitch_and_direct_nvlink_remotes():
    h200 = Replay(spec_facts.synthesize(spec("h200x2-vm-real")))
    assert h200.nvmlDeviceGetNvLinkRemotePciInfo(Handle(0), 0).busId == spec_facts.SWITCH_BUS
    box = spec()
    box["gpus"][0]["nvlinks"] = box["gpus"][1]["nvlinks"] = 2
    box["nvlink"] = {"pairs": [[0, 1, 2]]}
    direct = Replay(spec_facts.synthesize(box))
    assert direct.nvmlDeviceGetNvLinkRemotePciInfo(Handle(0), 1).busId == box["gpus"][1]["pci_bus_id"]
