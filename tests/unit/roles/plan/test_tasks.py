"""The plan role run by Ansible itself on localhost: topolaunch_nodes that is no list is refused naming the field
(issue 25 item 17: "box" listed "b, o, x"); a plan the planner refuses fails with its one line and shows the
candidates table, not the whole result as JSON (item 18)."""
import json
import sys

import pytest
from local_play import run_plays
from plan_cases import model_path, synth_facts


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("plan_role")
    facts = synth_facts("proxmox-8x-rtx-pro-6000-vnuma", base / "sysfs")
    common = {"topolaunch_tools_python": sys.executable, "topolaunch_model_path": model_path("glm-5-nvfp4"),
              "topolaunch_artifacts_dir": str(base / "artifacts"), "topolaunch_results_dir": str(base / "results"),
              "topolaunch_sglang_version_file": str(base / "none.json"), "topolaunch_preflight_record": str(base / "p"),
              "topolaunch_nccl_topo_file": str(base / "n.xml")}
    cases = {"box": {"topolaunch_nodes": "box"}, "too few GPUs": {"topolaunch_gpus": [0, 1, 2, 3]}}
    plays = [{"name": "facts", "hosts": "localhost", "gather_facts": False, "tasks": [
        {"ansible.builtin.set_fact": {"gpu_topology": facts, "cacheable": True}}]}]
    for i, case in enumerate(cases.values()):
        plays.append({"name": "case %d" % i, "hosts": "localhost", "gather_facts": False,
                      "vars": dict(common, **case), "tasks": [{"block": [
                          {"ansible.builtin.include_role": {"name": "topolaunch.sglang.plan"}},
                          {"ansible.builtin.set_fact": {"case_%d" % i: "passed"}}],
                          "rescue": [{"ansible.builtin.set_fact": {"case_%d" % i: "{{ ansible_failed_result.msg }}"}}]}]})
    said, output = run_plays(plays, base, ["case_%d" % i for i in range(len(cases))], with_output=True)
    return dict(zip(cases, said)), output


def test_topolaunch_nodes_that_is_no_list_is_refused_naming_the_field(runs):
    said, _ = runs
    assert said["box"].startswith('topolaunch_nodes must be a list of inventory hostnames in node-rank order (or [] '
                                  'for one node), got "box"'), said["box"]
    assert "b, o, x" not in said["box"]


def test_a_refused_plan_fails_with_one_line_and_the_table(runs):
    said, output = runs
    assert said["too few GPUs"].startswith("sglang_plan: 1 problem(s): no valid layout for 4 GPUs: 10 candidate(s) "
                                           "refused (does not fit: 10)"), said["too few GPUs"]
    assert "\n" not in said["too few GPUs"]
    # the table once (the debug task), the reasons nowhere else: no task dumped the module's result
    assert output.count("tp1pp2dp2      no") == 1, output
    assert '"reasons"' not in output and '"candidates"' not in output, output
