"""SGLang simulator (lab/sglang_sim): the pure parts, without processes.

Argparse from the 0.5.9 flag table, SGLang's checks, CUDA device numbering, the performance model and the
client's statistics. The end-to-end behaviour (processes, ports, signals, faults) is in test_sim_server.py.
"""
import argparse
import json
import math
import pathlib
import sys

import numpy
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

from sglang import bench_serving  # noqa: E402
from sglang._sim import flags, hardware, modelcfg, perf, validate  # noqa: E402
from sglang._sim.launcher import Launcher, SimConfigError, parse_faults, scheduler_title  # noqa: E402

MODELS = ROOT / "tests/fixtures/models"
SPECS = ROOT / "lab/specs"
GIB = 1 << 30


def parse(argv, capsys):
    parser = flags.build_parser()
    parser.prog = "launch_server.py"
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(argv)
    return exc.value.code, capsys.readouterr().err


# ------------------------------------------------------------------------------------------ command line
def test_ambiguous_pp_prefix_exits_2_like_sglang(capsys):
    code, err = parse(["--model-path", "/m", "--pp", "2"], capsys)
    assert code == 2
    assert "ambiguous option: --pp could match --pp-size, --pp-max-micro-batch-size, --pp-async-batch-depth" in err


def test_unknown_flag_and_bad_choice_exit_2(capsys):
    code, err = parse(["--model-path", "/m", "--tp-size", "2", "--no-such-flag"], capsys)
    assert code == 2 and "unrecognized arguments: --no-such-flag" in err
    code, err = parse(["--model-path", "/m", "--attention-backend", "flashinfr"], capsys)
    assert code == 2 and "argument --attention-backend: invalid choice: 'flashinfr'" in err
    code, err = parse(["--tp-size", "2"], capsys)
    assert code == 2 and "the following arguments are required: --model-path/--model" in err


def test_every_table_flag_parses_with_its_aliases():
    table = flags.table()
    parser = flags.build_parser()
    args = parser.parse_args(["--model", "/m", "--tensor-parallel-size", "4", "--pp-size", "2",
                              "--kv-cache-dtype", "fp8_e4m3", "--json-model-override-args", '{"a": 1}'])
    sargs = flags.ServerArgs(args)
    assert (sargs.model_path, sargs.tp_size, sargs.pp_size, sargs.kv_cache_dtype) == ("/m", 4, 2, "fp8_e4m3")
    # every dest of the table is a field under SGLang's name for it, except those that are not fields (--config)
    fields = set(sargs.as_dict())
    assert {e.get("field", e["dest"]) for e in table.values()} - {None} == fields
    assert "tp_size" in fields and "tensor_parallel_size" not in fields and "config" not in fields


def test_server_args_defaults_and_checks():
    sargs = flags.ServerArgs(flags.build_parser().parse_args(["--model-path", "/m", "--tp-size", "4",
                                                              "--pp-size", "2"]))
    sargs.post_init(97887)
    sargs.check()
    assert sargs.served_model_name == "/m" and sargs.disable_overlap_schedule is True
    assert 0.8 < sargs.mem_fraction_static < 0.9
    bad = flags.ServerArgs(flags.build_parser().parse_args(["--model-path", "/m", "--served-model-name", "a:b"]))
    bad.post_init(97887)
    with pytest.raises(AssertionError, match="served_model_name cannot contain a colon"):
        bad.check()


def test_faults_parse_and_refuse_typos():
    assert parse_faults("die_after_requests:5, ignore_sigterm") == {"die_after_requests": 5, "ignore_sigterm": True}
    with pytest.raises(SimConfigError, match="unknown fault 'crash_during_lod'"):
        parse_faults("crash_during_lod")
    with pytest.raises(SimConfigError, match="positive count"):
        parse_faults("die_after_requests:x")
    assert parse_faults("hang_after_requests:0") == {"hang_after_requests": 0}
    assert parse_faults("hang_after_requests:3") == {"hang_after_requests": 3}
    with pytest.raises(SimConfigError, match="hang_after_requests needs a count >= 0"):
        parse_faults("hang_after_requests:-1")


def test_a_fault_can_be_kept_for_one_layout():
    # `fault@LAYOUT`: only a server of that layout has it (a tune's one failing candidate); plain items apply to all
    raw = "crash_during_load@tp4pp2, die_after_requests:3@tp8, ignore_sigterm"
    assert parse_faults(raw, "tp4pp2") == {"crash_during_load": True, "ignore_sigterm": True}
    assert parse_faults(raw, "tp8") == {"die_after_requests": 3, "ignore_sigterm": True}
    assert parse_faults(raw, "tp2pp4") == {"ignore_sigterm": True}
    with pytest.raises(SimConfigError, match=r"bad item 'crash_during_load@pp2tp4': 'pp2tp4' is not a layout name"):
        parse_faults("crash_during_load@pp2tp4", "tp8")
    with pytest.raises(SimConfigError, match="unknown fault 'crash'"):
        parse_faults("crash@tp8", "tp4pp2")  # a typo is refused whatever the layout


def test_process_titles_follow_sglang():
    sargs = argparse.Namespace(pp_size=2, tp_size=4, ep_size=1)
    assert scheduler_title(None, 1, 3, 0, sargs)[0] == "sglang::scheduler_PP1_TP3"
    sargs = argparse.Namespace(pp_size=1, tp_size=8, ep_size=1)
    assert scheduler_title(None, 0, 5, 0, sargs) == ("sglang::scheduler_TP5", " TP5")


def test_ep_ranks_in_titles_follow_sglang(monkeypatch, tmp_path):
    """moe_ep_rank = tp_rank // (tp // ep): TP8 EP2 puts TP0-3 in EP0 and TP4-7 in EP1 (was tp_rank % ep)."""
    monkeypatch.setenv("SGLANG_SIM_GPU_SPEC", str(SPECS / "proxmox-8x-rtx-pro-6000-vnuma.json"))
    monkeypatch.setenv("FAKE_NVML_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    launcher = Launcher(["--model-path", str(MODELS / "glm-4.7"), "--tp-size", "8", "--ep-size", "2"])
    launcher.prepare()
    assert [p["title"] for p in launcher.plan_ranks()] == ["sglang::scheduler_TP%d_EP%d" % (t, t // 4)
                                                           for t in range(8)]


# ------------------------------------------------------------------------------------------ SGLang's checks
def test_pp_split_default_and_partition_errors():
    assert validate.pp_layer_split(78, 2) == [(0, 39), (39, 78)]
    assert [e - s for s, e in validate.pp_layer_split(78, 4)] == [19, 19, 20, 20]
    assert validate.pp_layer_split(78, 2, "40,38") == [(0, 40), (40, 78)]
    with pytest.raises(ValueError, match=r"^Invalid partition string: 39;39$"):
        validate.pp_layer_split(78, 2, "39;39")
    with pytest.raises(ValueError, match=r"^len\(partitions\)=3 does not match pp_size=2\.$"):
        validate.pp_layer_split(78, 2, "26,26,26")
    with pytest.raises(ValueError, match=r"^sum\(partitions\)=77 does not match num_layers=78\.$"):
        validate.pp_layer_split(78, 2, "39,38")


def test_construction_errors():
    glm5 = modelcfg.load(str(MODELS / "glm-5-nvfp4"))
    assert validate.construction_error(glm5, 8, 1, 8, None) is None
    assert validate.construction_error(glm5, 8, 2, 8, "39,38")[0] == "ValueError"
    llama = modelcfg.load(str(MODELS / "llama-2-7b"))
    assert validate.construction_error(llama, 3, 1, 3, None) == ("AssertionError",
                                                                 "assert num_heads % attn_tp_size == 0")
    assert validate.construction_error(llama, 1, 33, 1, None)[0] == "AssertionError"
    small_moe = modelcfg.Model("/x", dict(glm5.facts, num_experts=4))
    assert validate.construction_error(small_moe, 8, 1, 8, None) == (
        "ValueError", "Tensor parallel size 8 is greater than the number of experts 4.")


def test_memory_plan_fit_oom_kv_and_imbalance():
    total, reserved = 97887 << 20, 560 << 20
    free = total - reserved
    ok = validate.memory_plan(total, reserved, 0, 55 * 10 ** 9, 0.85, [free] * 8, 8, 1152 * 78)
    assert ok["error"] is None and ok["max_total_num_tokens"] > 100000
    assert ok["context"] + ok["weights"] + ok["kv_bytes"] <= total * 0.85
    oom = validate.memory_plan(total, reserved, 0, 110 * 10 ** 9, 0.85, [free] * 4, 4, 1152 * 78)
    assert oom["error"][:2] == ("load", "OutOfMemoryError") and 0 < oom["oom_after_bytes"] < 110 * 10 ** 9
    kv = validate.memory_plan(total, reserved, 0, 82 * GIB, 0.85, [free] * 4, 4, 1152 * 78)
    assert kv["error"][0] == "kv" and "Not enough memory. Please try to increase --mem-fraction-static" in kv["error"][2]
    # a leftover process holds 80 GiB on one GPU of the group: the others refuse, as SGLang does
    unbalanced = validate.memory_plan(total, reserved, 0, 55 * 10 ** 9, 0.85, [free] * 7 + [free - 80 * GIB], 8,
                                      1152 * 78)
    assert unbalanced["error"][0] == "init"
    assert unbalanced["error"][2].startswith(
        "The memory capacity is unbalanced. Some GPUs may be occupied by other processes.")


def test_visible_devices_as_cuda_parses_them():
    spec = hardware.load_spec(str(SPECS / "proxmox-8x-rtx-pro-6000-vnuma.json"))
    assert hardware.visible_devices(spec, {}) == list(range(8))
    assert hardware.visible_devices(spec, {"CUDA_VISIBLE_DEVICES": "4,5,6,7,0,1,2,3"}) == [4, 5, 6, 7, 0, 1, 2, 3]
    assert hardware.visible_devices(spec, {"CUDA_VISIBLE_DEVICES": "0,1,9,2"}) == [0, 1]
    assert hardware.visible_devices(spec, {"CUDA_VISIBLE_DEVICES": "0,0"}) == [0]
    assert hardware.visible_devices(spec, {"CUDA_VISIBLE_DEVICES": ""}) == []


# ------------------------------------------------------------------------------------------ performance model
def layout_model(model_dir, spec_name, tp, pp, gpus=None):
    model = modelcfg.load(str(MODELS / model_dir))
    spec = hardware.load_spec(str(SPECS / spec_name))
    layout = perf.Layout(tp, pp, 1, gpus or list(range(tp * pp)), validate.pp_layer_split(model.layers, pp),
                         overlap=pp == 1)
    return perf.PerfModel(model, spec, layout)


@pytest.mark.parametrize("batch", [1, 8, 32, 128])
def test_glm5_tp8_ahead_of_tp4pp2_on_the_field_machine(batch):
    spec = "proxmox-8x-rtx-pro-6000-vnuma.json"
    tp8 = layout_model("glm-5-nvfp4", spec, 8, 1)
    tp4pp2 = layout_model("glm-5-nvfp4", spec, 4, 2)
    ctx = batch * 1536
    ratio = tp4pp2.decode_step(batch, ctx) / tp8.decode_step(batch, ctx)
    assert 1.3 < ratio < 2.6, ratio  # the field measured TP8 about 2x ahead


def test_links_matter_cross_socket_tp4_is_slower_than_same_socket():
    spec = "proxmox-8x-rtx-pro-6000-vnuma.json"
    same = layout_model("llama-3.1-70b", spec, 4, 1, [0, 1, 2, 3])
    split = layout_model("llama-3.1-70b", spec, 4, 1, [0, 1, 4, 5])
    assert same.stage_links[0][2] == ["NODE"] and "SYS" in split.stage_links[0][2]
    assert split.decode_step(64, 64 * 1024) > same.decode_step(64, 64 * 1024)
    no_p2p = layout_model("llama-3.1-70b", "proxmox-8x-rtx-pro-6000-naive.json", 4, 1)
    assert no_p2p.decode_step(64, 64 * 1024) > same.decode_step(64, 64 * 1024)


def test_a_degraded_pcie_link_slows_the_groups_it_is_in():
    healthy = layout_model("glm-5-nvfp4", "proxmox-8x-rtx-pro-6000-vnuma.json", 4, 1, [4, 5, 6, 7])
    degraded = layout_model("glm-5-nvfp4", "proxmox-8x-rtx-pro-6000-degraded.json", 4, 1, [4, 5, 6, 7])
    spared = layout_model("glm-5-nvfp4", "proxmox-8x-rtx-pro-6000-degraded.json", 4, 1, [0, 1, 2, 3])
    assert "NODE/degraded" in degraded.stage_links[0][2]  # GPU 5 trained at Gen4 x8
    assert degraded.decode_step(64, 64 * 1024) > healthy.decode_step(64, 64 * 1024)
    assert spared.decode_step(64, 64 * 1024) == pytest.approx(healthy.decode_step(64, 64 * 1024))


def test_bigger_batch_more_throughput_but_slower_steps():
    tp8 = layout_model("glm-5-nvfp4", "proxmox-8x-rtx-pro-6000-vnuma.json", 8, 1)
    steps = [tp8.decode_step(b, b * 1024) for b in (1, 16, 128)]
    assert steps[0] < steps[1] < steps[2]
    assert 1 / steps[0] < 16 / steps[1] < 128 / steps[2]


def test_default_time_scale_keeps_128_tokens_under_a_second():
    tp8 = layout_model("glm-5-nvfp4", "proxmox-8x-rtx-pro-6000-vnuma.json", 8, 1)
    wall = (tp8.prefill(1024) + sum(tp8.decode_step(1, 1024 + i) for i in range(127))) * 0.1
    assert wall < 0.5


# ------------------------------------------------------------------------------------------ bench client
def test_percentiles_match_numpy():
    values = [0.3, 1.2, 0.7, 5.0, 2.2, 2.2, 0.01]
    for q in (50, 90, 95, 99):
        assert math.isclose(bench_serving.percentile(values, q), numpy.percentile(values, q))
    assert math.isclose(bench_serving.std(values), numpy.std(values))


def test_metrics_of_a_partial_failure():
    rows = [bench_serving.DatasetRow("x", 10, 4) for _ in range(3)]
    ok = bench_serving.RequestFuncOutput(success=True, latency=0.5, ttft=0.2, itl=[0.1, 0.1, 0.1], prompt_len=10,
                                         output_len=4, start_time=100.0)
    failed = bench_serving.RequestFuncOutput(success=False, error="Connection reset", prompt_len=10)
    m, output_lens = bench_serving.calculate_metrics(rows, [ok, ok, failed], 2.0)
    assert m["completed"] == 2 and output_lens == [4, 4, 0]
    assert m["total_input"] == 20 and m["output_throughput"] == 4.0
    assert math.isclose(m["median_tpot_ms"], 100.0) and math.isclose(m["mean_ttft_ms"], 200.0)
    assert m["max_concurrent_requests"] == 2


def test_all_failed_gives_nan_latencies_like_numpy():
    rows = [bench_serving.DatasetRow("x", 10, 4)]
    with pytest.warns(UserWarning, match="All requests failed"):
        m, _ = bench_serving.calculate_metrics(rows, [bench_serving.RequestFuncOutput()], 1.0)
    assert m["completed"] == 0 and m["mean_ttft_ms"] == 0.0 and math.isnan(m["mean_e2e_latency_ms"])
    assert json.loads(json.dumps(m))["completed"] == 0


def test_a_dp_replica_gets_the_whole_request_cap(monkeypatch, tmp_path):
    """SGLang divides --max-running-requests only by the attention-DP size (0.5.9 ModelRunner.dp_size is 1 without
    --enable-dp-attention): each of --dp-size 2's replicas admits the whole 64."""
    monkeypatch.setenv("SGLANG_SIM_GPU_SPEC", str(SPECS / "proxmox-8x-rtx-pro-6000-vnuma.json"))
    monkeypatch.setenv("FAKE_NVML_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    launcher = Launcher(["--model-path", str(MODELS / "llama-3.1-70b"), "--tp-size", "4", "--dp-size", "2",
                         "--max-running-requests", "64"])
    launcher.prepare()
    assert {p["sched"]["max_running_requests"] for p in launcher.plan_ranks()} == {64}
