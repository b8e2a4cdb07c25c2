"""plan_perf.py: the performance model's constants and its three lookups - a GPU's row (by name, else by its compute
capability's generation, said so), NVLink's rate per link, PCIe's rate per link."""
import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import plan_perf


@pytest.mark.parametrize("name, match", [
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX PRO 6000"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),          # the specific row before the generic "H100"
    ("NVIDIA H100 80GB HBM3", "H100"),
    ("NVIDIA GH200 480GB", "GH200"),
    ("NVIDIA H200", "H200"),
    ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
    ("NVIDIA A100-SXM4-80GB", "A100"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA L4", "L4"),
])
def test_a_gpu_is_found_by_the_first_fragment_of_its_name(name, match):
    perf = plan_perf.gpu_perf(name)
    assert perf["match"] == match and perf["fallback"] is False
    row = dict(plan_perf.GPU_TABLE)[match]
    assert perf["bf16"] == row[0] * 1e12 and perf["memory"] == row[3] * 1e9 and perf["sms"] == row[4]


def test_every_more_specific_name_comes_before_the_name_it_contains():
    keys = [key for key, _ in plan_perf.GPU_TABLE]
    for i, key in enumerate(keys):
        for later in keys[i + 1:]:
            assert key.lower() not in later.lower(), "%s would shadow %s" % (key, later)


def test_an_unknown_gpu_stands_in_by_its_generation_and_says_so():
    perf = plan_perf.gpu_perf("NVIDIA Future GPU", "12.0")
    assert (perf["match"], perf["fallback"]) == ("RTX PRO 6000", True)
    assert plan_perf.gpu_perf("Mystery", "9.0")["match"] == "H100"
    assert plan_perf.gpu_perf(None)["match"] == "H100"                    # nothing known: the Hopper row
    assert all(v in dict(plan_perf.GPU_TABLE) for v in plan_perf.GENERATION_DEFAULTS.values())


def test_precisions_a_gpu_lacks_are_none():
    a100 = plan_perf.gpu_perf("NVIDIA A100-SXM4-80GB")
    assert a100["fp8"] is None and a100["fp4"] is None
    blackwell = plan_perf.gpu_perf("NVIDIA B200")
    assert blackwell["fp4"] == 2 * blackwell["fp8"] == 4 * blackwell["bf16"]


@pytest.mark.parametrize("cc, gbps", [("8.0", 25.0), ("9.0", 25.0), ("10.0", 50.0), ("12.0", 50.0), ("7.0", 25.0),
                                      (None, 25.0), ("x", 25.0)])
def test_nvlink_rate_per_link_by_generation(cc, gbps):
    assert plan_perf.nvlink_gbps_per_link(cc) == gbps


@pytest.mark.parametrize("gen, width, gbps", [(5, 16, 63.008), (4, 16, 31.504), (3, 8, 7.88), (6, 16, 121.008),
                                              (9, 16, 31.504), (None, 16, 31.504), ("x", "y", 31.504)])
def test_pcie_rate_per_link(gen, width, gbps):
    assert plan_perf.pcie_gbps(gen, width) == pytest.approx(gbps)


def test_efficiencies_are_in_their_ranges():
    eff = plan_perf.EFFICIENCY
    for key in ("gemm", "attention", "memory"):
        assert 0 < eff[key] <= 1, key
    assert eff["eager_factor"] >= 1 and 0 <= eff["ep_skew"] < 1
    assert 0 < plan_perf.MODEL_ERROR < 1
