"""module_utils/topolaunch/nccl_topo.py: when an NCCL topology file is needed, what it says, and the proof from a
real GPU (tests/fixtures/preflight/h200x1-vm/nccl: NCCL 2.28.9 loading files made by nccl_topo.render)."""
import copy
import json
import sys
import xml.etree.ElementTree as ET

from plan_cases import fake_facts
from ansible_collections.topolaunch.sglang.plugins.module_utils import nccl_topo, preflight
from topology_cases import load_spec
import paths

ROOT = paths.ROOT
STANDIN = str(ROOT / "lab" / "preflight" / "worker_standin.py")
PROOF = ROOT / "tests" / "fixtures" / "preflight" / "h200x1-vm"
ALL_CPUS = range(64)


def naive_with_clique(numa=False):
    """The naive Proxmox VM (one emulated host bridge: PHB everywhere, no NUMA) after x-nv-gpudirect-clique
    (P2P OK), with the field box's link figures; numa: sysfs says 0 for GPUs 0-3 and 1 for 4-7."""
    spec = copy.deepcopy(load_spec("proxmox-8x-rtx-pro-6000-naive"))
    spec["p2p"] = {"default": "OK", "pairs": []}
    spec["links"] = load_spec("proxmox-8x-rtx-pro-6000-vnuma")["links"]
    if numa:
        for i, gpu in enumerate(spec["gpus"]):
            gpu["sysfs_numa_node"] = 0 if i < 4 else 1
    return spec


def measure(fake_nvml, spec):
    """A preflight record of `spec` by the lab stand-in (the spec file the fake NVML uses)."""
    return preflight.run_preflight(sys.executable, STANDIN, list(range(len(spec["gpus"]))),
                                   settings={"step_timeout": 5}, env={"FAKE_NVML_SPEC": str(fake_nvml.spec_path)})


def test_cpumask_is_sysfs_cpumap():
    assert nccl_topo.cpumask(range(16)) == "0000ffff"
    assert nccl_topo.cpumask({0, 33}) == "00000002,00000001"
    assert nccl_topo.cpumask(range(64)) == "ffffffff,ffffffff"
    assert nccl_topo.cpumask([]) == "00000000"


def test_cpu_info_as_nccl_fills_it(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 207\n"
                       "model name\t: Intel(R) Xeon(R)\n\nprocessor\t: 1\nvendor_id\t: Other\n")
    info = nccl_topo.cpu_info(str(cpuinfo))
    assert {k: info[k] for k in ("vendor", "familyid", "modelid")} == {"vendor": "GenuineIntel", "familyid": "6",
                                                                       "modelid": "207"}
    assert nccl_topo.cpu_info(str(tmp_path / "absent")) == {}


def test_not_needed_where_nccl_sees_the_grouping(fake_nvml, tmp_path):
    facts = fake_facts(fake_nvml, "proxmox-8x-rtx-pro-6000-vnuma", tmp_path)
    decision = nccl_topo.needed(facts)
    assert decision["needed"] is False and "NCCL reads the grouping itself" in decision["reason"]
    assert nccl_topo.for_node(facts)[1] is None


def test_not_needed_for_nvlink_or_one_gpu(fake_nvml, tmp_path):
    facts = fake_facts(fake_nvml, "hgx-8x-h100-nvswitch", tmp_path / "a")
    assert "NVLinked" in nccl_topo.needed(facts)["reason"]
    facts = json.loads((PROOF / "facts.json").read_text())
    assert nccl_topo.needed(facts) == {"needed": False, "groups": [], "source": None,
                                       "reason": "one GPU: nothing to group"}


def test_flat_vm_without_numa_needs_a_measurement(fake_nvml, tmp_path):
    spec = naive_with_clique()
    facts = fake_facts(fake_nvml, spec, tmp_path)
    decision = nccl_topo.needed(facts)
    assert decision["needed"] is False
    assert "flat but neither NUMA nor measured P2P bandwidth shows groups (no preflight record yet)" in decision["reason"]


def test_flat_vm_grouped_by_measured_bandwidth(fake_nvml, tmp_path):
    spec = naive_with_clique()
    facts = fake_facts(fake_nvml, spec, tmp_path)
    record = measure(fake_nvml, spec)
    decision, text = nccl_topo.for_node(facts, record, cpu={}, all_cpus=ALL_CPUS)
    assert decision["needed"] and decision["source"] == "measured"
    assert decision["groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert "flat (PHB between every pair)" in decision["reason"]
    gpu = '      <pci busid="0000:%02x:00.0" class="0x030200" link_speed="32.0 GT/s PCIe" link_width="16"/>'
    assert text == "\n".join(
        ['<system version="1" name="topolaunch-%s">' % facts["fingerprint"],
         '  <cpu numaid="0" affinity="ffffffff,ffffffff">',
         '    <pci busid="ffff:ff:01.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16">']
        + [gpu % b for b in (0x10, 0x11, 0x12, 0x13)] +
        ['    </pci>', '  </cpu>',
         '  <cpu numaid="1" affinity="ffffffff,ffffffff">',
         '    <pci busid="ffff:ff:02.0" class="0x060400" link_speed="32.0 GT/s PCIe" link_width="16">']
        + [gpu % b for b in (0x14, 0x15, 0x16, 0x17)] + ['    </pci>', '  </cpu>', '</system>']) + "\n"
    root = ET.fromstring(text)                      # well-formed, the shape NCCL's parser walks
    assert root.tag == "system" and root.get("version") == "1"
    assert [[p.get("busid") for p in c.iter("pci") if p.get("class") == nccl_topo.GPU_CLASS] for c in root] == [
        ["0000:%02x:00.0" % b for b in range(0x10, 0x14)], ["0000:%02x:00.0" % b for b in range(0x14, 0x18)]]


def test_flat_vm_with_sysfs_numa_uses_the_numa_islands(fake_nvml, tmp_path):
    from topology_cases import make_sysfs
    from ansible_collections.topolaunch.sglang.plugins.module_utils import topology
    import pynvml

    spec = naive_with_clique(numa=True)
    fake_nvml.use(spec, init=False)
    facts = topology.read_topology(pynvml, make_sysfs(tmp_path, spec))
    decision, text = nccl_topo.for_node(facts, None, cpu={"arch": "x86_64", "vendor": "AuthenticAMD",
                                                          "familyid": "25", "modelid": "17"}, all_cpus=range(8))
    assert decision["needed"] and decision["source"] == "numa" and decision["groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    root = ET.fromstring(text)
    assert [c.get("numaid") for c in root] == ["0", "1"]
    assert root[0].attrib == {"numaid": "0", "affinity": "000000ff",   # no CPU affinity in the facts: all CPUs
                              "arch": "x86_64", "vendor": "AuthenticAMD", "familyid": "25", "modelid": "17"}
    # without a record the P2P groups are NVML's (all OK after the clique): one switch per socket
    assert [len(list(c)) for c in root] == [1, 1] and all(c[0].get("class") == nccl_topo.BRIDGE_CLASS for c in root)


def test_a_gpu_whose_p2p_hung_is_not_put_under_the_switch(fake_nvml, tmp_path):
    spec = naive_with_clique()
    spec["links"]["pairs"].append({"gpus": [1, 2], "hangs": True})
    spec["links"]["pairs"] = [p for p in spec["links"]["pairs"] if p["gpus"] != [1, 2] or p.get("hangs")]
    facts = fake_facts(fake_nvml, spec, tmp_path)
    record = measure(fake_nvml, spec)
    assert any(p["status"] == "hang" for p in record["pairs"])
    decision, text = nccl_topo.for_node(facts, record, cpu={}, all_cpus=ALL_CPUS)
    root = ET.fromstring(text)
    first = root[0]
    switch = [p.get("busid") for p in first[0]]
    assert first[0].get("class") == nccl_topo.BRIDGE_CLASS and switch == ["0000:10:00.0", "0000:11:00.0", "0000:13:00.0"]
    assert first[1].get("busid") == "0000:12:00.0"            # GPU 2 straight on the CPU: NCCL sees PHB, no P2P


def test_measured_groups_need_a_clear_drop():
    def record(speed):
        return {"pairs": [{"src": a, "dst": b, "gbps": speed(a, b), "status": "ok", "local": False,
                           "p2p_disabled": False} for a in range(4) for b in range(4) if a != b]}
    assert nccl_topo.measured_groups(record(lambda a, b: 50.0), list(range(4))) == []
    assert nccl_topo.measured_groups(record(lambda a, b: 54.0 if (a < 2) == (b < 2) else 40.0),
                                     list(range(4))) == [[0, 1], [2, 3]]
    # a GPU left alone is no grouping
    assert nccl_topo.measured_groups(record(lambda a, b: 20.0 if 3 in (a, b) else 54.0), list(range(4))) == []
    assert nccl_topo.measured_groups(None, list(range(4))) == []


def test_write_is_atomic_and_world_readable(tmp_path):
    path = tmp_path / "etc" / "topolaunch" / "nccl_topo.xml"
    nccl_topo.write(str(path), "<system version=\"1\"/>\n")
    assert path.read_text() == "<system version=\"1\"/>\n" and path.stat().st_mode & 0o777 == 0o644


# ------------------------------------------------------------------------------------ the real-GPU proof

def test_the_proof_files_are_what_render_writes():
    facts = json.loads((PROOF / "facts.json").read_text())
    cpu = {"arch": "x86_64", "vendor": "GenuineIntel", "familyid": "6", "modelid": "207"}   # /proc/cpuinfo there
    assert nccl_topo.render(facts, [[0]], [[0]], cpu=cpu, name="topolaunch-proof-bridge") == \
        (PROOF / "nccl" / "topo-bridge.xml").read_text()
    assert nccl_topo.render(facts, [[0]], [], cpu=cpu, name="topolaunch-proof-direct") == \
        (PROOF / "nccl" / "topo-direct.xml").read_text()


def test_nccl_took_the_file_as_its_topology():
    nccl = PROOF / "nccl"
    default = ET.parse(nccl / "dump-default.xml").getroot()
    bridge = ET.parse(nccl / "dump-bridge.xml").getroot()
    # Without a file NCCL saw the VM's tree: an unknown NUMA node, no affinity, the GPU straight on the CPU.
    cpu = default.find("cpu")
    assert cpu.get("numaid") == "-1" and cpu.get("affinity") is None
    assert [p.get("busid") for p in cpu.findall("pci")] == ["0000:00:06.0"]
    # With the file: its CPU node (numaid, affinity) and its made-up switch holding the GPU, which NCCL filled.
    cpu = bridge.find("cpu")
    assert (cpu.get("numaid"), cpu.get("affinity")) == ("0", "0000ffff")
    switch = cpu.find("pci")
    assert (switch.get("busid"), switch.get("class")) == ("ffff:ff:01.0", "0x060400")
    gpu = switch.find("pci")
    assert gpu.get("busid") == "0000:00:06.0" and gpu.get("vendor") == "0x10de"
    assert gpu.find("gpu").attrib == {"dev": "0", "sm": "90", "rank": "0", "gdr": "1"}
    direct = ET.parse(nccl / "dump-direct.xml").getroot().find("cpu")
    assert direct.get("numaid") == "0" and [p.get("busid") for p in direct.findall("pci")] == ["0000:00:06.0"]
    logs = {name: (nccl / ("log-%s.txt" % name)).read_text() for name in ("default", "bridge", "badversion")}
    assert "Loading topology file" not in logs["default"]
    assert "Affinity for GPU 0 is empty, ignoring" in logs["default"]
    assert "Loading topology file /tmp/pf/nccl/topo-bridge.xml" in logs["bridge"]
    assert "Loading topology topolaunch-proof-bridge" in logs["bridge"]
    assert "+ PCI[48.0] - PCI/0-ffffff010" in logs["bridge"]         # NCCL's own system printout: the switch
    assert "Affinity for GPU 0 is 0-15" in logs["bridge"]
    # The negative control: a file NCCL must refuse, refused, so NCCL really reads the file it is given.
    assert "XML Topology has wrong version 2, 1 needed" in logs["badversion"]
    assert logs["badversion"].startswith("status failed")
