"""module_utils/tune_start.py: a start's parts (weights read, CUDA-graph capture per size from the release's lists)
and a tune candidate's cheaper start (the bench's batch size only, the multi-threaded loader where it is off)."""
import json
import pathlib
import zipfile

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import planner, tune, tune_start
from plan_cases import model_path, synth_facts

LAB = {"input_len": 64, "output_len": 16, "concurrency": 4}
F059, F523 = planner.SGLANG_FACTS["0.5.9"], planner.SGLANG_FACTS["0.5.23"]
GPU = 97887 << 20   # an RTX PRO 6000's memory
TP8 = {"tp": 8, "pp": 1}
WHEEL_0523 = next((pathlib.Path(__file__).resolve().parents[4] / "build" / "wheels").glob("sglang-0.5.23-*.whl"))


@pytest.fixture(scope="module")
def vnuma(tmp_path_factory):
    return synth_facts("proxmox-8x-rtx-pro-6000-vnuma", tmp_path_factory.mktemp("vnuma"))


def test_the_figures_are_the_field_boxs():
    # the knowledge base's launch: --cuda-graph-max-bs 32 with NEXTN, whose list 0.5.23's source gives
    hook = zipfile.ZipFile(str(WHEEL_0523)).read("sglang/srt/arg_groups/cuda_graph_hook.py").decode()
    assert "list(range(1, 9, 1))\n            + list(range(10, 33, 2))" in hook
    assert len(list(range(1, 9)) + list(range(10, 33, 2))) == tune_start.KB_CAPTURED_SIZES
    # its multi-threaded load, capture and the rest make its start; read single-threaded the load is slower
    kb = tune_start.start_parts(F523, GPU, TP8, tune_start.KB_CHECKPOINT_BYTES / 8,
                                {"cuda_graph_bs_decode": list(range(1, 21)), "disable_prefill_cuda_graph": True})
    assert kb["multithread"] and kb["total_s"] == pytest.approx(tune_start.KB_START_S)
    single = tune_start.start_parts(F059, GPU, TP8, tune_start.KB_CHECKPOINT_BYTES / 8, {})
    assert not single["multithread"] and single["weights_s"] == pytest.approx(
        tune_start.KB_LOAD_S * tune_start.MULTITHREAD_SPEEDUP)


def test_each_release_captures_its_own_lists():
    # 0.5.23 also captures a prefill graph (token counts up to chunked_prefill_size 8192 on 96 GB)
    normal = tune_start.start_parts(F523, GPU, TP8, 1e9, {})
    prefill = planner.capture_sizes(F523.CUDA_GRAPH["prefill"]["capture_sizes"], 8192)
    assert normal["decode_sizes"] == 52 and normal["prefill_sizes"] == len(prefill) > 40
    assert normal["multithread"]   # 0.5.23 loads multi-threaded by default
    # below 4 GPUs per TP group 0.5.9 captures up to 256 only: fewer sizes, a shorter capture
    small = tune_start.start_parts(F059, GPU, {"tp": 2, "pp": 1}, 1e9, {})
    assert small["decode_sizes"] == len(planner.capture_sizes(F059.CUDA_GRAPH["capture_bs"], 256)) < 52
    # PP turns 0.5.23's prefill graph off
    assert tune_start.start_parts(F523, GPU, {"tp": 4, "pp": 2}, 1e9, {})["prefill_sizes"] == 0


def test_a_candidate_captures_the_bench_batch_size_only_and_reads_multithreaded():
    assert tune_start.candidate_server_args(F059, {}, [4, 4]) == {
        "cuda_graph_bs": [4], "model_loader_extra_config": json.dumps({"enable_multithread_load": True})}
    assert tune_start.candidate_server_args(F523, {}, [16, 1]) == {"cuda_graph_bs_decode": [1, 16]}
    for version, facts in (("0.5.9", F059), ("0.5.23", F523)):
        extra = tune_start.candidate_server_args(facts, {}, [4])
        cand = tune_start.start_parts(facts, GPU, TP8, 55e9, extra)
        normal = tune_start.start_parts(facts, GPU, TP8, 55e9, {})
        assert cand["decode_sizes"] == 1 and cand["multithread"], version
        assert cand["total_s"] < normal["total_s"] and cand["capture_s"] < normal["capture_s"], version
        assert cand["prefill_sizes"] == normal["prefill_sizes"], version   # the prefill graph is not the bench's


def test_what_the_operator_set_is_kept():
    assert tune_start.candidate_server_args(F059, {"cuda_graph_max_bs": 64}, [4]) == {
        "model_loader_extra_config": json.dumps({"enable_multithread_load": True})}
    assert tune_start.candidate_server_args(F523, {"disable_decode_cuda_graph": True}, [4]) == {}
    assert tune_start.candidate_server_args(F523, {"cuda_graph_backend_decode": "breakable"}, [4]) == {}
    assert tune_start.candidate_server_args(F059, {"model_loader_extra_config": "{}"}, [4]) == {"cuda_graph_bs": [4]}
    # the operator's loader config is read as the release reads it
    off = {"model_loader_extra_config": json.dumps({"enable_multithread_load": False})}
    assert not tune_start.start_parts(F523, GPU, TP8, 1e9, off)["multithread"]


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_the_tune_says_what_its_starts_cost_and_the_candidate_plans_with_it(vnuma, version):
    request = planner.PlanRequest(topology=vnuma, model_path=model_path("glm-5-nvfp4"), workload=LAB,
                                  sglang_version=version)
    _plan, _fit, selection = tune.tune_plan(request)
    cost = selection["start"]
    assert list(cost["layouts"]) == selection["measure"] and cost["batch_sizes"] == [4]
    for parts in cost["layouts"].values():
        assert parts["candidate"]["total_s"] < parts["normal"]["total_s"]
    assert cost["total_s"] == pytest.approx(cost["candidates_s"] + cost["winner_s"], abs=0.2)
    assert cost["saved_s"] > 0
    assert any(line.startswith("tune: predicted starts ") for line in selection["report"])
    # the candidate's plan carries the release's flag for the reduced graph set; the normal plan does not
    flag = "--" + planner.SGLANG_FACTS[version].CUDA_GRAPH["bs_arg"].replace("_", "-")
    name = selection["measure"][0]
    candidate = planner.plan(planner.PlanRequest(topology=vnuma, model_path=model_path("glm-5-nvfp4"), workload=LAB,
                                                 sglang_version=version, layout=name,
                                                 server_args=cost["server_args"]))
    argv = candidate["argv"]
    assert argv[argv.index(flag) + 1:argv.index(flag) + 2] == ["4"]
    assert ("--model-loader-extra-config" in argv) == (version == "0.5.9")
    normal = planner.plan(planner.PlanRequest(topology=vnuma, model_path=model_path("glm-5-nvfp4"), workload=LAB,
                                              sglang_version=version, layout=name))
    assert flag not in normal["argv"] and "--model-loader-extra-config" not in normal["argv"]
