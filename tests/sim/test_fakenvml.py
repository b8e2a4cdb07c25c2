"""The lab's fake libnvidia-ml.so.1, driven through the real, unpatched nvidia-ml-py.

Expectations are computed from the spec JSON (lab/specs/README.md), independently of the C code,
and the behaviour a real driver shows (docs in lab/fakenvml/README.md) is pinned case by case.
"""
import copy
import ctypes
import json
import os
import pathlib
import subprocess
import sys
import time

import pynvml
import pytest


ROOT = pathlib.Path(__file__).resolve().parents[2]
FAKENVML_SRC = ROOT / "lab" / "fakenvml"
SPECS_DIR = ROOT / "lab" / "specs"
MIB = 1 << 20
GIB = 1 << 30
SPEC_NAMES = sorted(p.stem for p in SPECS_DIR.glob("*.json"))
TOPO_LEVEL = {"PIX": 10, "PXB": 20, "PHB": 30, "NODE": 40, "SYS": 50}
P2P_STATUS = {"OK": 0, "CNS": 1, "GNS": 2, "TNS": 3, "DISABLED": 4, "NS": 5, "UNKNOWN": 6}
VIRT_MODE = {"none": 0, "passthrough": 1}
P2P_NS = 5


def _wait_for(cond, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.01)


def _cpus(cpulist):
    cpus = set()
    for part in filter(None, cpulist.split(",")):
        a, _, b = part.partition("-")
        cpus.update(range(int(a), int(b or a) + 1))
    return cpus


def _bits(words):
    return {64 * w + b for w, word in enumerate(words) for b in range(64) if word >> b & 1}


def _norm_bus(bus):
    dom, rest = bus.split(":", 1)
    return f"{int(dom, 16):08X}:{rest.upper()}"


def _linked(spec, a, b):
    nv = spec.get("nvlink")
    if not nv:
        return False
    if nv["fabric"] == "nvswitch":
        return spec["gpus"][a]["nvlinks"] > 0 and spec["gpus"][b]["nvlinks"] > 0
    return any({a, b} == {x, y} for x, y, _ in nv.get("pairs", []))


def _p2p_word(spec, a, b):
    p2p = spec.get("p2p", {})
    word = p2p.get("default", "OK")
    for x, y, w in p2p.get("pairs", []):
        if {a, b} == {x, y}:
            word = w
    return P2P_STATUS[word]


def _link_peers(spec, i):
    """Expected remote of each active link of GPU i: 'switch' or a peer index (pairs fill links in order)."""
    nv = spec.get("nvlink")
    n = spec["gpus"][i]["nvlinks"]
    if not n:
        return []
    if nv["fabric"] == "nvswitch":
        return ["switch"] * n
    peers = []
    for a, b, links in nv["pairs"]:
        if i in (a, b):
            peers += [b if i == a else a] * links
    return peers


def _vnuma():
    return json.loads((SPECS_DIR / "proxmox-8x-rtx-pro-6000-vnuma.json").read_text())


def _h200():
    return json.loads((SPECS_DIR / "h200x2-vm-real.json").read_text())


# ------------------------------------------------------------------------- every field round-trips

@pytest.mark.parametrize("name", SPEC_NAMES)
def test_every_spec_field_round_trips(fake_nvml, name):
    spec = fake_nvml.use(name)
    not_supported = set(spec.get("not_supported", ["numa_node_id"]))
    assert pynvml.nvmlSystemGetDriverVersion() == spec["driver_version"]
    assert pynvml.nvmlSystemGetCudaDriverVersion() == spec["cuda_driver_version"]
    assert pynvml.nvmlSystemGetCudaDriverVersion_v2() == spec["cuda_driver_version"]
    assert pynvml.nvmlSystemGetNVMLVersion() == f"{spec['cuda_driver_version'] // 1000}.{spec['driver_version']}"
    assert pynvml.nvmlDeviceGetCount() == len(spec["gpus"])
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(len(spec["gpus"]))]
    uuids = set()
    for i, (g, h) in enumerate(zip(spec["gpus"], handles)):
        assert pynvml.nvmlDeviceGetIndex(h) == i
        assert pynvml.nvmlDeviceGetMinorNumber(h) == i
        assert pynvml.nvmlDeviceGetName(h) == g["name"]
        uuid = pynvml.nvmlDeviceGetUUID(h)
        if "uuid" in g:
            assert uuid == g["uuid"]
        assert uuid.startswith("GPU-") and len(uuid) == 40
        uuids.add(uuid)
        pci = pynvml.nvmlDeviceGetPciInfo(h)
        assert pci.busId == _norm_bus(g["pci_bus_id"])
        dom, bus, devfn = g["pci_bus_id"].split(":")
        assert (pci.domain, pci.bus, pci.device) == (int(dom, 16), int(bus, 16), int(devfn.split(".")[0], 16))
        assert pci.pciDeviceId & 0xFFFF == 0x10DE
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        reserved = g.get("memory_reserved_mib", 0) * MIB
        assert (mem.total, mem.used, mem.free) == (g["memory_total_mib"] * MIB, reserved, g["memory_total_mib"] * MIB - reserved)
        mem2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        assert (mem2.total, mem2.reserved, mem2.used) == (mem.total, reserved, 0)
        assert mem2.free == mem.total - reserved
        assert pynvml.nvmlDeviceGetCudaComputeCapability(h) == tuple(g["compute_capability"])
        assert pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h) == g["pcie"]["max_gen"]
        assert pynvml.nvmlDeviceGetMaxPcieLinkWidth(h) == g["pcie"]["max_width"]
        assert pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h) == g["pcie"]["cur_gen"]
        assert pynvml.nvmlDeviceGetCurrPcieLinkWidth(h) == g["pcie"]["cur_width"]
        assert pynvml.nvmlDeviceGetPersistenceMode(h) == int(g.get("persistence_mode", True))
        assert pynvml.nvmlDeviceGetMigMode(h) == [int(g["mig"])] * 2
        assert pynvml.nvmlDeviceGetVirtualizationMode(h) == VIRT_MODE[spec["virtualization"]]
        expected_nodes = {g["numa_node"]} if g["numa_node"] >= 0 else set()
        for scope in (pynvml.NVML_AFFINITY_SCOPE_NODE, pynvml.NVML_AFFINITY_SCOPE_SOCKET):
            assert _bits(pynvml.nvmlDeviceGetMemoryAffinity(h, 4, scope)) == expected_nodes
            assert _bits(pynvml.nvmlDeviceGetCpuAffinityWithinScope(h, 16, scope)) == _cpus(g["cpu_affinity"])
        assert _bits(pynvml.nvmlDeviceGetCpuAffinity(h, 16)) == _cpus(g["cpu_affinity"])
        if "numa_node_id" in not_supported:
            with pytest.raises(pynvml.NVMLError_NotSupported):
                pynvml.nvmlDeviceGetNumaNodeId(h)
        else:
            assert pynvml.nvmlDeviceGetNumaNodeId(h) == g["numa_node"]
        # NVLink: links 0..nvlinks-1 active, each to the expected remote
        if g["nvlinks"] == 0:
            with pytest.raises(pynvml.NVMLError_NotSupported):
                pynvml.nvmlDeviceGetNvLinkState(h, 0)
        for link, peer in enumerate(_link_peers(spec, i)):
            assert pynvml.nvmlDeviceGetNvLinkState(h, link) == pynvml.NVML_FEATURE_ENABLED
            remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link)
            kind = pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, link)
            if peer == "switch":
                assert (remote.busId, kind) == ("FFFFFFFF:FF:FF.0", pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)
            else:
                assert remote.busId == _norm_bus(spec["gpus"][peer]["pci_bus_id"])
                assert kind == pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
    assert len(uuids) == len(spec["gpus"])
    for a, ha in enumerate(handles):
        for b, hb in enumerate(handles):
            if a == b:
                continue
            assert pynvml.nvmlDeviceGetTopologyCommonAncestor(ha, hb) == TOPO_LEVEL[spec["pcie_topology"][a][b]]
            linked, word = _linked(spec, a, b), _p2p_word(spec, a, b)
            expected = [word, word, 0 if linked else P2P_NS, word, P2P_NS if linked else word]
            assert [pynvml.nvmlDeviceGetP2PStatus(ha, hb, k) for k in range(5)] == expected, (a, b)


def test_lookup_by_bus_id_and_uuid(fake_nvml):
    spec = fake_nvml.use("proxmox-8x-rtx-pro-6000-vnuma")
    h5 = pynvml.nvmlDeviceGetHandleByIndex(5)
    assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByPciBusId(spec["gpus"][5]["pci_bus_id"])) == 5
    assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByPciBusId("0000:82:00.0")) == 5
    assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(pynvml.nvmlDeviceGetUUID(h5))) == 5
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByPciBusId("00000000:99:00.0")
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByPciBusId("not-a-bus-id")


def test_spec_extensions_persistence_and_degraded_link(fake_nvml):
    fake_nvml.use("proxmox-8x-rtx-pro-6000-degraded")
    h5 = pynvml.nvmlDeviceGetHandleByIndex(5)
    assert pynvml.nvmlDeviceGetPersistenceMode(h5) == pynvml.NVML_FEATURE_DISABLED
    assert (pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h5), pynvml.nvmlDeviceGetCurrPcieLinkWidth(h5)) == (4, 8)
    assert (pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h5), pynvml.nvmlDeviceGetMaxPcieLinkWidth(h5)) == (5, 16)


def test_derived_uuid_is_stable_across_inits(fake_nvml):
    fake_nvml.use("proxmox-8x-rtx-pro-6000-naive")
    first = [pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(8)]
    fake_nvml.shutdown()
    pynvml.nvmlInit()
    assert [pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(8)] == first


# ------------------------------------------------------------------ behaviour seen on real hardware

def test_numa_node_id_not_supported_unless_the_spec_says_otherwise(fake_nvml):
    spec = _vnuma()
    del spec["not_supported"]          # absent: NOT_SUPPORTED, as on every non-Grace machine
    fake_nvml.use(spec)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNumaNodeId(pynvml.nvmlDeviceGetHandleByIndex(0))
    spec["not_supported"] = []         # a Grace-like box where GPU memory is a NUMA node
    fake_nvml.use(spec)
    assert pynvml.nvmlDeviceGetNumaNodeId(pynvml.nvmlDeviceGetHandleByIndex(4)) == 1


def test_h200_vm_answers_like_the_real_one(fake_nvml):
    fake_nvml.use("h200x2-vm-real")
    h0, h1 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(2))
    assert pynvml.nvmlDeviceGetMemoryInfo(h0).total == 150754820096
    assert pynvml.nvmlDeviceGetVirtualizationMode(h0) == pynvml.NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH
    assert pynvml.nvmlDeviceGetTopologyCommonAncestor(h0, h1) == pynvml.NVML_TOPOLOGY_HOSTBRIDGE
    assert [pynvml.nvmlDeviceGetP2PStatus(h0, h1, k) for k in range(5)] == [0, 0, 0, 0, pynvml.NVML_P2P_STATUS_NOT_SUPPORTED]
    remotes = {pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h0, link).busId for link in range(18)}
    assert remotes == {"FFFFFFFF:FF:FF.0"}   # counting links to the peer's bus id gives 0 here
    assert pynvml.nvmlDeviceGetNvLinkVersion(h0, 0) == pynvml.NVML_NVLINK_VERSION_4_0


def test_p2p_index_read_constant_is_a_tuple_and_fails_as_on_a_real_driver(fake_nvml):
    fake_nvml.use("h200x2-vm-real")
    h0, h1 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(2))
    assert pynvml.NVML_P2P_CAPS_INDEX_READ == (0,)
    with pytest.raises(ctypes.ArgumentError):
        pynvml.nvmlDeviceGetP2PStatus(h0, h1, pynvml.NVML_P2P_CAPS_INDEX_READ)
    assert pynvml.nvmlDeviceGetP2PStatus(h0, h1, 0) == pynvml.NVML_P2P_STATUS_OK


def test_p2p_and_ancestor_argument_errors(fake_nvml):
    fake_nvml.use("proxmox-8x-rtx-pro-6000-vnuma")
    h0, h1 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(2))
    for bad_index in (5, 6, -1):
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetP2PStatus(h0, h1, bad_index)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetP2PStatus(h0, h0, 0)          # the diagonal ("X") is not a pair
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetTopologyCommonAncestor(h1, h1)


def test_nvlink_link_index_limits(fake_nvml):
    spec = _h200()
    spec["gpus"][1]["nvlinks"] = 0
    spec["gpus"][0]["nvlinks"] = 16        # a degraded part: 18 links, 2 down
    spec["gpus"][0]["nvlink_links"] = 18
    fake_nvml.use(spec)
    h0, h1 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(2))
    assert [pynvml.nvmlDeviceGetNvLinkState(h0, link) for link in range(18)] == [1] * 16 + [0, 0]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h0, 16)   # a down link has no remote
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(h0, 17)
    for link in (18, pynvml.NVML_NVLINK_MAX_LINKS - 1, pynvml.NVML_NVLINK_MAX_LINKS):
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetNvLinkState(h0, link)   # links the part does not have
    for call in (pynvml.nvmlDeviceGetNvLinkState, pynvml.nvmlDeviceGetNvLinkRemotePciInfo,
                 pynvml.nvmlDeviceGetNvLinkRemoteDeviceType, pynvml.nvmlDeviceGetNvLinkVersion):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            call(h1, 0)                                  # no NVLink on this GPU at all
    # GPU 1 has no links, so NVLink no longer carries P2P between the two: PCI answers the spec's status
    assert pynvml.nvmlDeviceGetP2PStatus(h0, h1, pynvml.NVML_P2P_CAPS_INDEX_NVLINK) == pynvml.NVML_P2P_STATUS_NOT_SUPPORTED
    assert pynvml.nvmlDeviceGetP2PStatus(h0, h1, pynvml.NVML_P2P_CAPS_INDEX_PCI) == pynvml.NVML_P2P_STATUS_OK


NOT_SUPPORTED_CALLS = {
    "numa_node_id": lambda h, h2: pynvml.nvmlDeviceGetNumaNodeId(h),
    "memory_affinity": lambda h, h2: pynvml.nvmlDeviceGetMemoryAffinity(h, 1, 0),
    "cpu_affinity": lambda h, h2: pynvml.nvmlDeviceGetCpuAffinity(h, 1),
    "mig_mode": lambda h, h2: pynvml.nvmlDeviceGetMigMode(h),
    "persistence_mode": lambda h, h2: pynvml.nvmlDeviceGetPersistenceMode(h),
    "virtualization_mode": lambda h, h2: pynvml.nvmlDeviceGetVirtualizationMode(h),
    "pcie_link": lambda h, h2: pynvml.nvmlDeviceGetCurrPcieLinkWidth(h),
    "topology_common_ancestor": lambda h, h2: pynvml.nvmlDeviceGetTopologyCommonAncestor(h, h2),
    "p2p_status": lambda h, h2: pynvml.nvmlDeviceGetP2PStatus(h, h2, 0),
    "nvlink": lambda h, h2: pynvml.nvmlDeviceGetNvLinkState(h, 0),
}


@pytest.mark.parametrize("feature", sorted(NOT_SUPPORTED_CALLS))
def test_not_supported_list_turns_each_call_off(fake_nvml, feature):
    spec = _h200()
    spec["not_supported"] = []
    fake_nvml.use(spec)
    h0, h1 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(2))
    NOT_SUPPORTED_CALLS[feature](h0, h1)                 # answers while supported
    spec["not_supported"] = [feature]
    fake_nvml.use(spec)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        NOT_SUPPORTED_CALLS[feature](h0, h1)


def test_memory_info_v2_checks_the_struct_version(fake_nvml):
    fake_nvml.use("h200x2-vm-real")
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0), version=0x01000028)


def test_calls_before_init_and_after_shutdown(fake_nvml):
    fake_nvml.use("h200x2-vm-real")
    h0 = pynvml.nvmlDeviceGetHandleByIndex(0)
    pynvml.nvmlShutdown()
    for call in (pynvml.nvmlDeviceGetCount, pynvml.nvmlSystemGetDriverVersion, lambda: pynvml.nvmlDeviceGetName(h0),
                 lambda: pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlShutdown):
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            call()


def test_init_is_counted_and_every_init_rereads_the_spec(fake_nvml):
    fake_nvml.use("proxmox-8x-rtx-pro-6000-vnuma")
    fake_nvml.use("h200x2-vm-real")                      # second init, no shutdown between
    assert pynvml.nvmlDeviceGetCount() == 2
    pynvml.nvmlShutdown()
    assert pynvml.nvmlDeviceGetCount() == 2              # one init still open
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_spec_is_read_at_init_not_per_call(fake_nvml, tmp_path):
    path = tmp_path / "live.json"
    path.write_text(json.dumps(_vnuma()))
    fake_nvml.use(path)
    path.write_text("{ broken")
    assert pynvml.nvmlDeviceGetCount() == 8
    assert pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(7)).startswith("NVIDIA RTX PRO 6000")


def test_handle_from_before_reinit_with_a_smaller_spec_is_rejected(fake_nvml):
    fake_nvml.use("proxmox-8x-rtx-pro-6000-vnuma")
    h7 = pynvml.nvmlDeviceGetHandleByIndex(7)
    fake_nvml.shutdown()
    fake_nvml.use("h200x2-vm-real")
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetName(h7)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(2)
    bogus = ctypes.cast(ctypes.c_void_p(0x1000), pynvml.c_nvmlDevice_t)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetUUID(bogus)


def test_missing_symbol_is_function_not_found(fake_nvml):
    fake_nvml.use("h200x2-vm-real")
    with pytest.raises(pynvml.NVMLError_FunctionNotFound):
        pynvml.nvmlDeviceGetPowerUsage(pynvml.nvmlDeviceGetHandleByIndex(0))


def test_error_strings_are_nvmls(fake_nvml):
    fake_nvml.use("h200x2-vm-real")
    assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_NOT_SUPPORTED) == "Not Supported"
    assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_DRIVER_NOT_LOADED) == "Driver Not Loaded"
    assert str(pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)) == "Invalid Argument"


def test_missing_spec_file_is_driver_not_loaded(fake_nvml, tmp_path, capfd):
    missing = tmp_path / "no-such-spec.json"
    fake_nvml._monkeypatch.setenv("FAKE_NVML_SPEC", str(missing))
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()
    assert str(missing) in capfd.readouterr().err


# ------------------------------------------------------------------------------- malformed specs

def _spec_with(change):
    spec = _vnuma()
    change(spec)
    return spec


MALFORMED = [
    ("missing-field", lambda s: s["gpus"][3].pop("name"), "gpus[3].name: missing"),
    ("missing-top-field", lambda s: s.pop("driver_version"), "driver_version: missing"),
    ("unknown-top-key", lambda s: s.update(nvlinks=0), "nvlinks: unknown key"),
    ("unknown-gpu-key", lambda s: s["gpus"][2].update(numa=0), "gpus[2].numa: unknown key"),
    ("unknown-pcie-key", lambda s: s["gpus"][1]["pcie"].update(gen=5), "gpus[1].pcie.gen: unknown key"),
    ("wrong-type", lambda s: s["gpus"][0].update(memory_total_mib="97887"),
     "gpus[0].memory_total_mib: expected an integer, got string"),
    ("fraction", lambda s: s["gpus"][0].update(memory_total_mib=97887.5), "gpus[0].memory_total_mib: expected an integer"),
    ("wrong-bool", lambda s: s["gpus"][6].update(mig="no"), "gpus[6].mig: expected true or false"),
    ("matrix-rows", lambda s: s["pcie_topology"].pop(), "pcie_topology: expected 8 items, got 7"),
    ("matrix-cols", lambda s: s["pcie_topology"][4].pop(), "pcie_topology[4]: expected 8 items, got 7"),
    ("bad-word", lambda s: s["pcie_topology"][0].__setitem__(1, "NV12"), 'pcie_topology[0][1]: "NV12" is not one of'),
    ("diagonal", lambda s: s["pcie_topology"][2].__setitem__(2, "PIX"), "pcie_topology[2][2]"),
    ("asymmetric", lambda s: s["pcie_topology"][0].__setitem__(5, "NODE"), "pcie_topology[5][0]"),
    ("p2p-word", lambda s: s.update(p2p={"default": "YES"}), 'p2p.default: "YES" is not one of'),
    ("p2p-pair", lambda s: s.update(p2p={"pairs": [[0, 9, "OK"]]}), "p2p.pairs[0][1]: 9 is out of range"),
    ("virtualization", lambda s: s.update(virtualization="kvm"), 'virtualization: "kvm" is not one of'),
    ("not-supported-name", lambda s: s.update(not_supported=["numa_node"]), 'not_supported[0]: "numa_node" is not one of'),
    ("cur-above-max", lambda s: s["gpus"][5]["pcie"].update(cur_gen=6, max_gen=5), "gpus[5].pcie: cur_gen: 6 is above max_gen 5"),
    ("bad-width", lambda s: s["gpus"][5]["pcie"].update(cur_width=3), "gpus[5].pcie: cur_width: 3 is not a PCIe link width"),
    ("duplicate-bus", lambda s: s["gpus"][7].update(pci_bus_id="00000000:01:00.0"), "gpus[7].pci_bus_id: 00000000:01:00.0 is also gpus[0]'s"),
    ("bad-bus", lambda s: s["gpus"][7].update(pci_bus_id="0000:1:0.0"), 'gpus[7].pci_bus_id: "0000:1:0.0" is not a PCI bus id'),
    ("bad-cpulist", lambda s: s["gpus"][4].update(cpu_affinity="32-"), 'gpus[4].cpu_affinity: "32-" is not a cpu list'),
    ("reversed-cpulist", lambda s: s["gpus"][4].update(cpu_affinity="63-32"), "gpus[4].cpu_affinity"),
    ("reserved-above-total", lambda s: s["gpus"][0].update(memory_reserved_mib=10**6), "gpus[0].memory_reserved_mib"),
    ("nvlinks-without-section", lambda s: s["gpus"][0].update(nvlinks=2), "gpus[0].nvlinks: 2 links but the spec has no"),
    ("direct-pairs-mismatch", lambda s: (s["gpus"][0].update(nvlinks=4), s["gpus"][1].update(nvlinks=4),
                                         s.update(nvlink={"fabric": "direct", "pairs": [[0, 1, 2]]})),
     "gpus[0].nvlinks: 4, but nvlink.pairs connect 2 links"),
    ("fabric-word", lambda s: s.update(nvlink={"fabric": "nvlink"}), 'nvlink.fabric: "nvlink" is not one of'),
    ("switch-with-pairs", lambda s: s.update(nvlink={"fabric": "nvswitch", "pairs": [[0, 1, 1]]}), "nvlink.pairs: only for fabric"),
    ("nvlink-links-below-active", lambda s: (s["gpus"][0].update(nvlinks=2, nvlink_links=1),
                                             s.update(nvlink={"fabric": "nvswitch"})), "gpus[0].nvlink_links: 1 is out of range"),
    ("no-gpus", lambda s: s.update(gpus=[]), "gpus: 0 GPUs"),
    ("gpus-not-list", lambda s: s.update(gpus={}), "gpus: expected an array, got object"),
    ("uuid", lambda s: s["gpus"][0].update(uuid="1234"), 'gpus[0].uuid: "1234" does not start with GPU-'),
    # links: the preflight stand-in's figures (lab/specs/README.md "Extensions of this project")
    ("links-unknown-key", lambda s: s["links"].update(bandwidth=1), "links.bandwidth: unknown key"),
    ("links-no-default", lambda s: s["links"].pop("default"), "links.default: missing"),
    ("links-no-host-path", lambda s: s["links"].pop("p2p_disabled"), "links.p2p_disabled: missing"),
    ("links-default-gbps", lambda s: s["links"]["default"].update(gbps=-3), "links.default.gbps: -3 is out of range"),
    ("links-default-latency", lambda s: s["links"]["default"].update(latency_us="fast"),
     "links.default.latency_us: expected a number above 0, got string"),
    ("links-default-no-latency", lambda s: s["links"]["default"].pop("latency_us"), "links.default.latency_us: missing"),
    ("links-pair-gpu", lambda s: s["links"]["pairs"][2]["gpus"].__setitem__(1, 8),
     "links.pairs[2].gpus[1]: 8 is out of range 0..7"),
    ("links-pair-no-gpus", lambda s: s["links"]["pairs"][2].pop("gpus"), "links.pairs[2].gpus: missing"),
    ("links-pair-self", lambda s: s["links"]["pairs"][0].update(gpus=[1, 1]), "links.pairs[0].gpus: a GPU paired with itself"),
    ("links-pair-twice", lambda s: s["links"]["pairs"][5].update(gpus=[1, 0]),
     "links.pairs[5].gpus: GPUs 1 and 0 are listed twice (also links.pairs[0])"),
    ("links-pair-gbps-items", lambda s: s["links"]["pairs"][3].update(gbps=[40.0]),
     "links.pairs[3].gbps: expected a number or [a->b, b->a], got 1 items"),
    ("links-pair-gbps-direction", lambda s: s["links"]["pairs"][3].update(gbps=[40.0, 0]),
     "links.pairs[3].gbps[1]: 0 is out of range"),
    ("links-pair-hangs", lambda s: s["links"]["pairs"][4].update(hangs="yes"),
     "links.pairs[4].hangs: expected true or false, got string"),
    ("links-pair-key", lambda s: s["links"]["pairs"][4].update(bw=3), "links.pairs[4].bw: unknown key"),
    ("links-pair-host-path", lambda s: s["links"]["pairs"][4].update(p2p_disabled={"gbps": 5}),
     "links.pairs[4].p2p_disabled.latency_us: missing"),
    ("links-local-hangs", lambda s: s["links"].update(local={"gbps": 900, "latency_us": 2, "hangs": True}),
     "links.local.hangs: unknown key"),
]


@pytest.mark.parametrize("change,message", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_spec_fails_init_naming_the_field(fake_nvml, capfd, change, message):
    fake_nvml.use(_spec_with(change), init=False)
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlInit()
    err = capfd.readouterr().err
    assert message in err
    assert str(fake_nvml.spec_path) in err
    # the library's text for the failure carries the same message after NVML's own words
    text = pynvml.nvmlErrorString(pynvml.NVML_ERROR_UNKNOWN)
    assert text.startswith("Unknown Error: fake-nvml: GPU spec %s: " % fake_nvml.spec_path) and message in text
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()                      # nothing half-loaded


def test_links_with_every_key_are_accepted(fake_nvml):
    spec = _spec_with(lambda s: s.update(links={
        "default": {"gbps": 54.0, "latency_us": 0.4, "hangs": False},
        "p2p_disabled": {"gbps": 11, "latency_us": 14},
        "local": {"gbps": 1500.5, "latency_us": 2},
        "pairs": [{"gpus": [0, 4], "gbps": [41.2, 40], "latency_us": 0.5},
                  {"gpus": [3, 7], "hangs": True},
                  {"gpus": [2, 5], "p2p_disabled": {"gbps": [10, 9.5], "latency_us": 15}}]}))
    fake_nvml.use(spec)
    assert pynvml.nvmlDeviceGetCount() == 8


@pytest.mark.parametrize("text,message", [
    ("{", "line 1 column 2: string key expected"),
    ('{"name": "x",\n "gpus": [1, 2,]}', "line 2 column 16"),
    ('{"name": "a", "name": "b"}', 'duplicate key "name"'),
    ("", "unexpected end of input"),
    ('{"name": "x"} trailing', "unexpected text after the JSON value"),
], ids=["open", "trailing-comma", "duplicate-key", "empty", "trailing-text"])
def test_invalid_json_fails_init_with_position(fake_nvml, tmp_path, capfd, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    fake_nvml.use(path, init=False)
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlInit()
    err = capfd.readouterr().err
    assert "invalid JSON" in err and message in err


def test_error_text_of_a_bad_spec_goes_with_the_next_good_init(fake_nvml):
    fake_nvml.use(_spec_with(lambda s: s.pop("gpus")), init=False)
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlInit()
    assert "gpus: missing" in pynvml.nvmlErrorString(pynvml.NVML_ERROR_UNKNOWN)
    assert str(pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)) == "Unknown Error"     # nvidia-ml-py's own table
    fake_nvml.use("h200x2-vm-real")
    assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_UNKNOWN) == "Unknown Error"


def test_failed_reinit_keeps_the_previous_spec(fake_nvml, capfd):
    fake_nvml.use("h200x2-vm-real")
    fake_nvml.use(_spec_with(lambda s: s.pop("gpus")), init=False)
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlInit()
    assert "gpus: missing" in capfd.readouterr().err
    assert pynvml.nvmlDeviceGetCount() == 2


# ----------------------------------------------------------------------------- compute processes

@pytest.fixture
def child():
    """A real child process that lives until its stdin is closed."""
    procs = []

    def spawn():
        p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
        procs.append(p)
        return p

    yield spawn
    for p in procs:
        if p.poll() is None:
            p.stdin.close()
            p.wait(timeout=10)


def _procs(index):
    return [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(index))]


def _used(index):
    return pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).used


def test_registered_process_appears_and_vanishes_with_its_pid(fake_nvml, child):
    spec = fake_nvml.use("proxmox-8x-rtx-pro-6000-vnuma")
    reserved = spec["gpus"][1]["memory_reserved_mib"] * MIB
    p = child()
    fake_nvml.register(1, 3 * GIB, p.pid)
    fake_nvml.register(2, 5 * GIB, p.pid)
    assert _procs(1) == [(p.pid, 3 * GIB)]
    assert _procs(2) == [(p.pid, 5 * GIB)]
    assert _procs(0) == []
    assert _used(1) == reserved + 3 * GIB
    h1 = pynvml.nvmlDeviceGetHandleByIndex(1)
    assert [(x.pid, x.usedGpuMemory) for x in pynvml.nvmlDeviceGetComputeRunningProcesses_v2(h1)] == [(p.pid, 3 * GIB)]
    v3 = pynvml.nvmlDeviceGetComputeRunningProcesses_v3(h1)[0]
    assert (v3.gpuInstanceId, v3.computeInstanceId) == (0xFFFFFFFF, 0xFFFFFFFF)
    assert pynvml.nvmlDeviceGetGraphicsRunningProcesses(h1) == []
    assert pynvml.nvmlDeviceGetMemoryInfo(h1, version=pynvml.nvmlMemory_v2).used == 3 * GIB
    fake_nvml.register(1, 1 * GIB, p.pid)               # registering again replaces the amount
    assert _procs(1) == [(p.pid, 1 * GIB)]
    p.stdin.close()
    p.wait(timeout=10)
    assert _procs(1) == [] and _procs(2) == []
    assert _used(1) == reserved


def test_several_processes_are_listed_by_pid(fake_nvml, child):
    fake_nvml.use("h200x2-vm-real")
    a, b = child(), child()
    fake_nvml.register(0, 2 * GIB, b.pid)
    fake_nvml.register(0, 1 * GIB, a.pid)
    assert _procs(0) == sorted([(a.pid, 1 * GIB), (b.pid, 2 * GIB)])
    assert _used(0) == 615 * MIB + 3 * GIB


def test_zombie_counts_as_dead(fake_nvml):
    fake_nvml.use("h200x2-vm-real")
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    fake_nvml.register(0, GIB, p.pid)
    assert _procs(0) == [(p.pid, GIB)]
    p.stdin.close()

    def state():
        with open(f"/proc/{p.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    _wait_for(lambda: state() == "Z", f"child {p.pid} to exit and stay unreaped")
    assert _procs(0) == []
    p.wait(timeout=10)


def test_registration_with_another_starttime_is_ignored(fake_nvml, child):
    fake_nvml.use("h200x2-vm-real")
    p = child()
    path = pathlib.Path(fake_nvml.state_dir) / f"{p.pid}.0"
    start = int(open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()[19])
    path.write_text(f"{GIB} {start + 1}\n")             # the pid was reused by another process
    assert _procs(0) == []
    path.write_text(f"{GIB} {start}\n")
    assert _procs(0) == [(p.pid, GIB)]


def test_a_process_of_another_pid_namespace_is_reported_by_its_other_pid(fake_nvml, child):
    """The driver names a container's process by its pid in the driver's namespace: the registration's third
    field is the pid NVML reports, while the registered process (this namespace's pid) lives."""
    fake_nvml.use("h200x2-vm-real")
    p = child()
    fake_nvml.register(1, 2 * GIB, p.pid, reported_pid=4194301)
    assert _procs(1) == [(4194301, 2 * GIB)] and _used(1) == 615 * MIB + 2 * GIB
    script = f'"{sys.executable}" "{FAKENVML_SRC / "fakegpu.py"}" register 0 7 --reported-pid 4194302 && read -r _'
    sh = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                          env=fake_nvml.env)
    try:
        sh.stdout.readline()
        assert _procs(0) == [(4194302, 7)]
    finally:
        sh.stdin.close()
        sh.wait(timeout=10)
    p.stdin.close()
    p.wait(timeout=10)
    assert _procs(1) == [] and _procs(0) == []
    state = pathlib.Path(fake_nvml.state_dir)
    q = child()
    start = open(f"/proc/{q.pid}/stat").read().rsplit(")", 1)[1].split()[19]
    for junk in ("x", "0", "", "5000000000"):                    # a bad third field: the line is junk
        (state / f"{q.pid}.1").write_text(f"1 {start} {junk}\n")
        assert _procs(1) == [], junk
    (state / f"{q.pid}.1").write_text(f"1 {start}\n")
    assert _procs(1) == [(q.pid, 1)]


def test_junk_in_the_state_dir_is_ignored(fake_nvml, child):
    fake_nvml.use("h200x2-vm-real")
    p = child()
    state = pathlib.Path(fake_nvml.state_dir)
    start = open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()[19]
    (state / f"{p.pid}.1").write_text("garbage\n")
    (state / f"{p.pid}.x").write_text(f"1 {start}\n")
    (state / f".{p.pid}.1.tmp").write_text(f"1 {start}\n")
    (state / "README").write_text("hello\n")
    (state / "4194999.1").write_text("1 1\n")            # a pid that does not exist
    assert _procs(1) == []
    fake_nvml.register(1, 7, p.pid)
    assert _procs(1) == [(p.pid, 7)]


def test_fakegpu_cli_registers_the_calling_shell(fake_nvml):
    fake_nvml.use("h200x2-vm-real")
    # The shell registers itself (default pid: the CLI's parent), prints a line, then waits on stdin.
    script = f'"{sys.executable}" "{FAKENVML_SRC / "fakegpu.py"}" register 1 12345 && read -r _'
    sh = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                          env=fake_nvml.env)
    try:
        printed = sh.stdout.readline().strip()
        assert printed == str(pathlib.Path(fake_nvml.state_dir) / f"{sh.pid}.1")
        assert _procs(1) == [(sh.pid, 12345)]
    finally:
        sh.stdin.close()
        sh.wait(timeout=10)
    assert _procs(1) == []
    bad = subprocess.run([sys.executable, str(FAKENVML_SRC / "fakegpu.py"), "register", "0", "-5"],
                         capture_output=True, text=True, env=fake_nvml.env, check=False)
    assert bad.returncode != 0


# ----------------------------------------------------------------------------- nvidia-smi stand-in

def _smi(fake, *args):
    return subprocess.run([str(fake.smi_path), *args], capture_output=True, text=True, env=fake.env, check=False)


def test_nvidia_smi_query_gpu_and_list(fake_nvml, child):
    spec = fake_nvml.use("proxmox-8x-rtx-pro-6000-degraded")
    p = child()
    fake_nvml.register(3, 2 * GIB, p.pid)
    out = _smi(fake_nvml, "--query-gpu=index,name,uuid,pci.bus_id,driver_version,memory.total,memory.used,persistence_mode",
               "--format=csv")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == ("index, name, uuid, pci.bus_id, driver_version, memory.total [MiB], memory.used [MiB], "
                        "persistence_mode")
    uuids = [pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(8)]
    for i, (line, g) in enumerate(zip(lines[1:], spec["gpus"])):
        used = g["memory_reserved_mib"] + (2048 if i == 3 else 0)
        assert line == (f"{i}, {g['name']}, {uuids[i]}, {g['pci_bus_id']}, {spec['driver_version']}, "
                        f"{g['memory_total_mib']} MiB, {used} MiB, Disabled")
    out = _smi(fake_nvml, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits", "-i", "3")
    assert out.stdout == f"3, {spec['gpus'][3]['memory_reserved_mib'] + 2048}\n"
    out = _smi(fake_nvml, "--query-compute-apps=pid,used_memory,gpu_bus_id", "--format=csv,noheader")
    assert out.stdout == f"{p.pid}, 2048 MiB, 00000000:04:00.0\n"
    out = _smi(fake_nvml, "-L")
    assert out.stdout.splitlines() == [f"GPU {i}: {g['name']} (UUID: {uuids[i]})" for i, g in enumerate(spec["gpus"])]
    table = _smi(fake_nvml)
    assert table.returncode == 0 and f"Driver Version: {spec['driver_version']}" in table.stdout
    assert all(len(line) == 91 for line in table.stdout.splitlines()[1:] if line.startswith(("|", "+")))
    assert str(p.pid) in table.stdout


def test_nvidia_smi_errors(fake_nvml, tmp_path):
    fake_nvml.use("h200x2-vm-real")
    out = _smi(fake_nvml, "--query-gpu=index,gpu_temperature", "--format=csv")
    assert out.returncode == 2
    assert 'Field "gpu_temperature" is not a valid field to query.' in out.stderr
    assert _smi(fake_nvml, "--query-gpu=index").returncode == 2
    assert _smi(fake_nvml, "--bogus").returncode == 2
    env = dict(fake_nvml.env, FAKE_NVML_SPEC=str(tmp_path / "absent.json"))
    out = subprocess.run([str(fake_nvml.smi_path), "-L"], capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 9
    assert "couldn't communicate with the NVIDIA driver" in out.stdout
    assert str(tmp_path / "absent.json") in out.stderr


def test_pynvml_in_a_subprocess_finds_the_fake_by_soname(fake_nvml):
    fake_nvml.use("hgx-8x-h100-nvswitch")
    code = "import pynvml; pynvml.nvmlInit(); print(pynvml.nvmlDeviceGetCount(), pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=fake_nvml.env, check=True)
    assert out.stdout.strip() == "8 NVIDIA H100 80GB HBM3"


# ----------------------------------------------------------------------------------- performance

def test_full_walk_of_8_gpus_is_fast(fake_nvml, child):
    """A topology read of an 8-GPU box: all pairs, 5 P2P indices, 18 links each, processes, memory.
    The real 2-GPU H200 VM took 0.07 s; the fake must not be the slow part (spec parsed once per init)."""
    fake_nvml.use("hgx-8x-h100-nvswitch")
    for i in range(8):
        fake_nvml.register(i, GIB, child().pid)
    start = time.perf_counter()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(8)]
    for a in handles:
        pynvml.nvmlDeviceGetMemoryInfo(a)
        assert len(pynvml.nvmlDeviceGetComputeRunningProcesses(a)) == 1
        for link in range(18):
            pynvml.nvmlDeviceGetNvLinkState(a, link)
            pynvml.nvmlDeviceGetNvLinkRemotePciInfo(a, link)
            pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(a, link)
        for b in handles:
            if a is not b:
                pynvml.nvmlDeviceGetTopologyCommonAncestor(a, b)
                for k in range(5):
                    pynvml.nvmlDeviceGetP2PStatus(a, b, k)
    elapsed = time.perf_counter() - start
    # generous bound for a loaded shared CI machine; typically ~0.01 s
    assert elapsed < 0.5, f"full NVML walk took {elapsed:.3f}s"
