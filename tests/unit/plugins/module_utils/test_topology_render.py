"""topology_render.py: `nvidia-smi topo -m` and `topo -p2p` laid out as nvidia-smi prints them, the report lines, the
kernel's cpulist format."""
import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import topology
from ansible_collections.topolaunch.sglang.plugins.module_utils.topology_render import cpulist, parse_cpulist, render_p2p
from topology_cases import EXPECTED_MATRIX, EXPECTED_P2P_READ, load_spec, read


@pytest.mark.parametrize("name", sorted(EXPECTED_MATRIX))
def test_matrix_is_what_nvidia_smi_prints(name, tmp_path):
    assert topology.render_matrix(read(load_spec(name), tmp_path)) == EXPECTED_MATRIX[name]


@pytest.mark.parametrize("name", sorted(EXPECTED_P2P_READ))
def test_p2p_table_is_what_nvidia_smi_prints(name, tmp_path):
    facts = read(load_spec(name), tmp_path)
    assert topology.render_p2p(facts, "read") == EXPECTED_P2P_READ[name]
    assert facts["rendered"]["p2p_read"] == EXPECTED_P2P_READ[name]


def test_render_p2p_rejects_unknown_kind(tmp_path):
    facts = read(load_spec("h200x2-vm-real"), tmp_path)
    with pytest.raises(ValueError, match="'copy'"):
        topology.render_p2p(facts, "copy")


def test_report_lines_are_plain_text(tmp_path):
    facts = read(load_spec("proxmox-8x-rtx-pro-6000-naive"), tmp_path)
    report = facts["rendered"]["report"]
    assert report[1] == "GPU0     X      PHB     PHB     PHB     PHB     PHB     PHB     PHB     N/A     N/A             N/A"
    assert not any("\t" in line or "\x1b" in line or line != line.rstrip() for line in report)
    assert report[-4].startswith("WARNING vm-no-numa (GPU 0-7): ")
    assert report[-3].startswith("    fix: Give the VM")


@pytest.mark.parametrize("cpus, text", [([], ""), ([3], "3"), ([0, 1, 2, 5], "0-2,5"), ([7, 0, 1, 6], "0-1,6-7"),
                                        ([0, 2, 4], "0,2,4"), (list(range(64)), "0-63")])
def test_cpulist_is_the_kernels_format(cpus, text):
    assert cpulist(cpus) == text


def test_every_p2p_kind_has_its_table_and_unknown_prints_as_u():
    facts = {"gpu_count": 2, "p2p": {k: [["X", "UNK"], ["OK", "X"]] for k in
                                     ("read", "write", "nvlink", "atomics", "pci")}}
    for kind in ("read", "write", "nvlink", "atomics", "pci"):
        lines = render_p2p(facts, kind).split("\n")
        assert lines[1] == " GPU0\tX\tU\t" and lines[2] == " GPU1\tOK\tX\t"


@pytest.mark.parametrize("text,cpus", [("0-2,5", [0, 1, 2, 5]), ("", []), ("7", [7]), ("4-5,0-1", [0, 1, 4, 5])])
def test_parse_cpulist_reads_the_kernel_format(text, cpus):
    assert parse_cpulist(text) == cpus
    assert parse_cpulist(cpulist(cpus)) == cpus
