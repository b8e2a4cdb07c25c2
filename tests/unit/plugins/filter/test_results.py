"""filter_plugins/results.py: where a plan's results are filed (the rule of plugin_utils/results.py), the bench's
points, a sweep's default layouts."""
from ansible_collections.topolaunch.sglang.plugins.filter.results import (FilterModule, bench_points,
                                                                         results_fingerprint, slo_verdict,
                                                                         sweep_layouts)
from ansible_collections.topolaunch.sglang.plugins.module_utils.plan_score import check_workload


def test_a_server_across_nodes_is_filed_under_its_cluster_fingerprint():
    assert results_fingerprint({"topology_fingerprint": "a" * 12}) == "a" * 12
    assert results_fingerprint({"topology_fingerprint": "a" * 12, "cluster_fingerprint": "c" * 12}) == "c" * 12
    assert results_fingerprint(None) is None


def test_points_take_the_workload_concurrency_and_a_floor_of_prompts():
    assert bench_points([8, 1, 32], 128, 4, 16) == [
        {"max_concurrency": 1, "num_prompts": 16}, {"max_concurrency": 8, "num_prompts": 32},
        {"max_concurrency": 32, "num_prompts": 128}, {"max_concurrency": 128, "num_prompts": 512}]
    assert bench_points(["8"], "8", "2", "16") == [{"max_concurrency": 8, "num_prompts": 16}]   # once, as ints


def test_a_sweep_takes_the_best_valid_layout_of_each_shape():
    candidates = [{"name": "tp8", "tp": 8, "pp": 1, "dp": 1, "valid": True},
                  {"name": "tp8ep8", "tp": 8, "pp": 1, "dp": 1, "valid": True},     # the same shape: left out
                  {"name": "tp3", "tp": 3, "pp": 1, "dp": 1, "valid": False},
                  {"name": "tp4pp2", "tp": 4, "pp": 2, "dp": 1, "valid": True},
                  {"name": "tp2pp4", "tp": 2, "pp": 4, "dp": 1, "valid": True},
                  {"name": "tp4dp2", "tp": 4, "pp": 1, "dp": 2, "valid": True}]
    assert sweep_layouts(candidates, 3) == ["tp8", "tp4pp2", "tp2pp4"]
    assert sweep_layouts(candidates, "2") == ["tp8", "tp4pp2"] and sweep_layouts([], 3) == []


def test_the_filters_are_named():
    assert set(FilterModule().filters()) == {"results_fingerprint", "bench_points", "sweep_layouts", "slo_verdict",
                                             "artifacts_host_dir"}


def test_a_measured_point_is_judged_on_the_slos_percentiles():
    slo = check_workload({"slo": {"ttft_ms": 500, "tpot_ms": 40}})[0]["slo"]
    point = {"max_concurrency": 32, "ttft_p99_ms": 620.0, "ttft_p50_ms": 200.0, "tpot_p50_ms": 35.0,
             "tpot_p99_ms": 90.0}
    assert slo_verdict(point, slo) == ("concurrency 32: SLO p99 TTFT <= 500 ms, p50 TPOT <= 40 ms missed: "
                                       "measured p99 TTFT 620.0 ms > 500 ms")
    median = check_workload({"slo": {"ttft_ms": 500, "ttft_percentile": 50}})[0]["slo"]
    assert slo_verdict(point, median) == "concurrency 32: SLO p50 TTFT <= 500 ms met"
    assert "missed: measured p99 TPOT not known" in slo_verdict(
        {"max_concurrency": 1}, check_workload({"slo": {"tpot_ms": 9, "tpot_percentile": 99}})[0]["slo"])


def test_a_host_name_with_dot_dot_stays_inside_the_artifacts_folder(tmp_path):
    """Issue 25 item 12: artifacts/<host>/ was joined from the inventory name, '../' included."""
    import os
    import pytest
    from ansible.errors import AnsibleFilterError
    artifacts = str(tmp_path / "artifacts")
    out = FilterModule().filters()["artifacts_host_dir"](artifacts, "../../etc")
    assert os.path.dirname(out) == artifacts and os.path.basename(out) == ".._.._etc"
    assert FilterModule().filters()["artifacts_host_dir"](artifacts, "gpu-box.lan") == artifacts + "/gpu-box.lan"
    with pytest.raises(AnsibleFilterError, match=r"inventory host '\.\.' cannot name a folder"):
        FilterModule().filters()["artifacts_host_dir"](artifacts, "..")


def test_every_role_keeps_a_hosts_artifacts_under_the_safe_folder():
    """The roles' artifacts/<host> paths go through topolaunch_host_artifacts_dir, none joins inventory_hostname."""
    import pathlib
    import re
    roles = pathlib.Path(__file__).resolve().parents[4] / "roles"
    joined = [str(p) for p in roles.glob("*/*/*.yml")
              if re.search(r"artifacts_dir\W+(\{\{ *|~ *)?inventory_hostname", p.read_text())]
    assert joined == []
