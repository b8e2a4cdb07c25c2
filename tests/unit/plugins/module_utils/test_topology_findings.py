"""topology_findings.py: what in a topology costs performance or blocks a launch, each with its stable id, severity,
GPUs, message and remedy - from facts the real reader made of lab specs, and from facts written by hand."""
import copy

from ansible_collections.topolaunch.sglang.plugins.module_utils.topology_findings import BUSY_BYTES, findings
from ansible_collections.topolaunch.sglang.plugins.plugin_utils.topology_replay import Handle
from topology_cases import load_spec, read

GIB = 1 << 30


def ids(facts):
    return sorted({f["id"] for f in facts["findings"]})


def test_findings_of_the_naive_vm(tmp_path):
    facts = read(load_spec("proxmox-8x-rtx-pro-6000-naive"), tmp_path)
    assert ids(facts) == ["p2p-chipset-not-supported", "vm-no-numa"]
    by_id = {f["id"]: f for f in facts["findings"]}
    assert "numa: 1" in by_id["vm-no-numa"]["remedy"] and "pxb-pcie" in by_id["vm-no-numa"]["remedy"]
    assert "x-nv-gpudirect-clique" in by_id["p2p-chipset-not-supported"]["remedy"]
    assert "every pair of the 8 GPUs" in by_id["p2p-chipset-not-supported"]["message"]
    assert all(f["gpus"] == list(range(8)) and f["severity"] == "warning" for f in facts["findings"])


def test_findings_busy_mixed_mig_persistence_pcie(tmp_path):
    spec = load_spec("proxmox-8x-rtx-pro-6000-vnuma")
    spec["gpus"][2]["mig"] = True
    spec["gpus"][3]["pcie"]["cur_width"] = 8
    spec["gpus"][4]["pcie"]["cur_gen"] = 1
    spec["gpus"][7]["name"] = "NVIDIA RTX 6000 Ada Generation"
    spec["gpus"][7]["memory_total_mib"] = 49140
    spec["gpus"][6]["memory_reserved_mib"] = 2048
    facts = read(spec, tmp_path, processes={1: [(777, GIB)]})
    by_id = {}
    for f in facts["findings"]:
        by_id.setdefault(f["id"], []).append(f)
    assert sorted(by_id) == ["gpu-busy", "mig-enabled", "mixed-gpu-models", "pcie-link-degraded"]
    assert by_id["gpu-busy"][0]["gpus"] == [1, 6] and "777" in by_id["gpu-busy"][0]["message"]
    assert "--tags cleanup" in by_id["gpu-busy"][0]["remedy"]
    assert by_id["mig-enabled"][0]["gpus"] == [2]
    assert [(f["severity"], f["gpus"]) for f in by_id["pcie-link-degraded"]] == [("warning", [3]), ("info", [4])]
    assert "x8 of x16" in by_id["pcie-link-degraded"][0]["message"]
    assert "topolaunch_gpus" in by_id["mixed-gpu-models"][0]["remedy"]
    # Persistence off is reported with the fix.
    overrides = {("nvmlDeviceGetPersistenceMode", Handle(5)): 0}
    facts = read(load_spec("proxmox-8x-rtx-pro-6000-vnuma"), tmp_path / "p", overrides=overrides)
    (persist,) = facts["findings"]
    assert (persist["id"], persist["gpus"]) == ("persistence-off", [5])
    assert "nvidia-smi -pm 1" in persist["remedy"] and "nvidia-persistenced" in persist["remedy"]


def test_findings_have_stable_shape(tmp_path):
    facts = read(load_spec("proxmox-8x-rtx-pro-6000-naive"), tmp_path)
    for f in facts["findings"]:
        assert set(f) == {"id", "severity", "gpus", "message", "remedy"}
        assert f["severity"] in ("warning", "info") and f["message"] and f["remedy"]


def test_findings_of_the_degraded_vm(tmp_path):
    facts = read(load_spec("proxmox-8x-rtx-pro-6000-degraded"), tmp_path)
    assert [(f["id"], f["severity"], f["gpus"]) for f in facts["findings"]] == [
        ("pcie-link-degraded", "warning", [5]), ("persistence-off", "info", list(range(8)))]
    assert "GPU 5 x8 of x16 (Gen4 of Gen5)" in facts["findings"][0]["message"]


def gpu(index, **kw):
    base = {"index": index, "name": "NVIDIA H100 80GB HBM3", "numa_node": 0, "processes": [], "mig_enabled": False,
            "persistence_mode": True, "memory": {"total_bytes": 80 * GIB, "used_bytes": 0},
            "pcie": {"max_gen": 5, "cur_gen": 5, "max_width": 16, "cur_width": 16}}
    base.update(kw)
    return base


def hand_facts(gpus, read_p2p=None, in_vm=False):
    n = len(gpus)
    return {"gpu_count": n, "gpus": gpus, "in_vm": in_vm,
            "p2p": {"read": read_p2p or [["X" if i == j else "OK" for j in range(n)] for i in range(n)]}}


def test_a_healthy_box_has_no_finding():
    assert findings(hand_facts([gpu(0), gpu(1)])) == []


def test_unknown_numa_is_information_on_bare_metal_and_a_warning_in_a_vm():
    facts = hand_facts([gpu(0, numa_node=None), gpu(1)])
    (f,) = findings(facts)
    assert (f["id"], f["severity"], f["gpus"]) == ("numa-unknown", "info", [0]) and "BIOS" in f["remedy"]
    facts["in_vm"] = True
    assert [(f["id"], f["severity"]) for f in findings(facts)] == [("vm-no-numa", "warning")]
    assert findings(hand_facts([gpu(0, numa_node=None)])) == []          # one GPU: nothing to keep together


def test_p2p_statuses_other_than_cns_are_p2p_unavailable():
    p2p = [["X", "OK", "GNS"], ["OK", "X", "OK"], ["UNK", "OK", "X"]]
    (f,) = findings(hand_facts([gpu(0), gpu(1), gpu(2)], p2p))
    assert (f["id"], f["gpus"]) == ("p2p-unavailable", [0, 2]) and "for 0-2 " in f["message"]


def test_cns_remedy_depends_on_whether_the_box_is_a_vm():
    p2p = [["X", "CNS"], ["CNS", "X"]]
    bare = findings(hand_facts([gpu(0), gpu(1)], p2p))[0]
    vm = findings(hand_facts([gpu(0), gpu(1)], p2p, in_vm=True))[0]
    assert bare["id"] == vm["id"] == "p2p-chipset-not-supported"
    assert "iommu=pt" in bare["remedy"] and "x-nv-gpudirect-clique" in vm["remedy"]
    assert "every pair of the 2 GPUs" in bare["message"]


def test_busy_counts_memory_above_the_threshold_even_without_processes():
    idle = gpu(0, memory={"total_bytes": 80 * GIB, "used_bytes": BUSY_BYTES})
    held = gpu(1, memory={"total_bytes": 80 * GIB, "used_bytes": BUSY_BYTES + 1})
    (f,) = findings(hand_facts([idle, held]))
    assert (f["id"], f["gpus"]) == ("gpu-busy", [1]) and "pids none visible" in f["message"]


def test_a_pcie_link_unknown_to_nvml_is_no_finding():
    unknown = gpu(0, pcie={"max_gen": None, "cur_gen": 1, "max_width": 16, "cur_width": 1})
    assert findings(hand_facts([unknown, gpu(1)])) == []


def test_findings_keep_their_order_and_input_is_not_changed():
    facts = hand_facts([gpu(0, numa_node=None, mig_enabled=True, persistence_mode=False),
                        gpu(1, name="NVIDIA L40S", memory={"total_bytes": 48 * GIB, "used_bytes": 2 * GIB})],
                       [["X", "CNS"], ["CNS", "X"]])
    before = copy.deepcopy(facts)
    assert [f["id"] for f in findings(facts)] == ["numa-unknown", "p2p-chipset-not-supported", "gpu-busy",
                                                  "mixed-gpu-models", "mig-enabled", "persistence-off"]
    assert facts == before
