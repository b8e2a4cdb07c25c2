"""Each validity rule of the planner, inputs it refuses, and that every reason is reported (not just the first)."""
import pytest

from plan_cases import FIELD_ARGS, FIELD_ARGS_0_5_23, model_input, model_path, synth_facts
from ansible_collections.topolaunch.sglang.plugins.module_utils import planner

VNUMA = "proxmox-8x-rtx-pro-6000-vnuma"


@pytest.fixture(scope="module")
def vnuma(tmp_path_factory):
    return synth_facts(VNUMA, tmp_path_factory.mktemp("vnuma"))


def refused(facts, layout, **kwargs):
    kwargs.setdefault("model_path", model_path("glm-5-nvfp4"))
    with pytest.raises(planner.PlanError) as exc:
        planner.plan(planner.PlanRequest(topology=facts, layout=layout, **kwargs))
    return exc.value.reasons


def candidate(facts, name, **kwargs):
    kwargs.setdefault("model_path", model_path("glm-5-nvfp4"))
    try:
        plan = planner.plan(planner.PlanRequest(topology=facts, layout="auto", **kwargs))
        candidates = plan["candidates"]
    except planner.PlanError as exc:
        candidates = exc.partial["candidates"]
    return next(c for c in candidates if c["name"] == name)


# ---------------------------------------------------------------------------------------------- layouts


@pytest.mark.parametrize("text, want", [
    ("tp8", {"tp": 8, "pp": 1, "dp": 1, "ep": 1}),
    ("tp4pp2", {"tp": 4, "pp": 2, "dp": 1, "ep": 1}),
    ("TP4+PP2", {"tp": 4, "pp": 2, "dp": 1, "ep": 1}),
    ("tp2pp2ep2", {"tp": 2, "pp": 2, "dp": 1, "ep": 2}),
    ("tp4dp2", {"tp": 4, "pp": 1, "dp": 2, "ep": 1}),
    ({"tp": 4, "pp": "2"}, {"tp": 4, "pp": 2, "dp": 1, "ep": 1}),
    ("auto", "auto"), (None, "auto"),
])
def test_layout_names_and_mappings(text, want):
    assert planner.parse_layout(text) == want


@pytest.mark.parametrize("bad, words", [
    ("tp4pq2", "not 'auto' or a name"), ("tp4tp2", "names tp twice"), ("tp0", "at least 1"),
    ({"tp": 4, "cp": 2}, "unknown keys cp"), ({"tp": -1}, "tp must be a positive integer"), (8, "must be 'auto'"),
])
def test_bad_layouts_are_named(bad, words):
    with pytest.raises(planner.PlanError) as exc:
        planner.parse_layout(bad)
    assert words in exc.value.reasons[0]


def test_layout_name_round_trip():
    for c in planner.enumerate_layouts(8, moe=True):
        assert planner.parse_layout(planner.layout_name(**c)) == c
    dense = planner.enumerate_layouts(8, moe=False)
    assert {planner.layout_name(**c) for c in dense} == {
        "tp8", "tp4pp2", "tp4dp2", "tp2pp4", "tp2pp2dp2", "tp2dp4", "tp1pp8", "tp1pp4dp2", "tp1pp2dp4", "tp1dp8"}


def test_default_partition_is_sglangs():
    assert planner.default_partition(78, 2) == [39, 39]
    assert planner.default_partition(78, 4) == [19, 19, 20, 20]  # the last n % pp stages get one more
    assert planner.default_partition(61, 2) == [30, 31]


# ---------------------------------------------------------------------------------------------- rules


def test_gpus_present(vnuma):
    assert "layout tp8pp2: tp8pp2 needs 16 GPUs, 8 available" in refused(vnuma, "tp8pp2")


def test_heads_divisible_by_tp(vnuma):
    reasons = refused(vnuma, "tp3", gpus=[0, 1, 2])
    assert "layout tp3: attention heads 64 are not divisible by tp 3" in reasons


def test_kv_heads_split_or_replicated(vnuma):
    model = model_input("llama-3.1-70b", num_attention_heads=48, num_key_value_heads=6)
    reasons = refused(vnuma, "tp4", model=model, gpus=[0, 1, 2, 3])
    assert "layout tp4: KV heads 6 can be neither split nor replicated over tp 4" in reasons
    # 8 KV heads over tp 8 split; 8 KV heads over tp 2 split too
    assert candidate(vnuma, "tp8", model=model_input("llama-3.1-70b"))["valid"]


def test_vocab_divisible_by_tp(vnuma):
    model = model_input("llama-3.1-70b", num_attention_heads=48, num_key_value_heads=48, vocab_size=151552)
    reasons = refused(vnuma, "tp3", model=model, gpus=[0, 1, 2])
    assert "layout tp3: vocabulary 151552 (padded to 151552) is not divisible by tp 3" in reasons
    assert not any("heads" in r for r in reasons)


def test_tp_not_above_routed_experts(vnuma):
    model = model_input("qwen3-235b-a22b", num_experts=4, num_experts_per_tok=2)
    reasons = refused(vnuma, "tp8", model=model)
    assert "layout tp8: tp 8 is greater than the 4 routed experts" in reasons


def test_ep_rules(vnuma):
    assert "layout tp8ep2: ep 2 needs a mixture-of-experts model; this one is dense" in refused(
        vnuma, "tp8ep2", model_path=model_path("llama-3.1-70b"))
    reasons = refused(vnuma, "tp4ep3", gpus=[0, 1, 2, 3])
    assert "layout tp4ep3: ep 3 does not divide tp 4 (SGLang's MoE TP size is tp / ep)" in reasons
    assert "layout tp4ep3: 256 routed experts cannot be split over ep 3" in reasons
    # flashinfer_cutlass MoE runner: ep in {1, tp}
    args = {"moe_runner_backend": "flashinfer_cutlass"}
    assert "layout tp8ep2: moe_runner_backend flashinfer_cutlass needs ep 1 or ep = tp 8, not 2" in refused(
        vnuma, "tp8ep2", server_args=args)
    assert candidate(vnuma, "tp8ep8", server_args=args)["valid"]
    assert candidate(vnuma, "tp8", server_args=args)["valid"]
    # all-to-all backends force ep = tp: another ep is refused, not silently changed
    args = {"moe_a2a_backend": "deepep"}
    assert any("moe_a2a_backend deepep makes SGLang set ep = tp 8; ask for ep 8 (layout tp8ep8)" in r
               for r in refused(vnuma, "tp8", server_args=args))
    assert candidate(vnuma, "tp8ep8", server_args=args)["valid"]
    # pp > 1 with ep > 1 through an all-to-all backend is a valid combination
    assert candidate(vnuma, "tp4pp2ep4", server_args=args)["valid"]
    # flashinfer all-to-all needs the flashinfer_cutlass runner (a global rule: every layout fails)
    assert any("moe_a2a_backend flashinfer needs moe_runner_backend flashinfer_cutlass" in r
               for r in refused(vnuma, "tp8ep8", server_args={"moe_a2a_backend": "flashinfer"}))
    # cutlass MoE with fp8 quantization: ep 1 only
    assert any("moe_runner_backend cutlass with fp8 quantization needs ep 1, not 8" in r for r in refused(
        vnuma, "tp8ep8", server_args={"moe_runner_backend": "cutlass", "quantization": "fp8"},
        model_path=model_path("glm-4.7")))
    # EPLB balances experts between EP ranks: it needs some
    assert "layout tp8: enable_eplb needs ep > 1" in refused(vnuma, "tp8", server_args={"enable_eplb": True})


def test_fp8_block_quantized_experts(vnuma):
    fp8 = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
    model = model_input("qwen3-235b-a22b", quantization_config=fp8)
    model["total_size"] //= 2
    reasons = refused(vnuma, "tp8", model=model)
    assert ("layout tp8: FP8 block-quantized experts: moe_intermediate_size 1536 / (tp/ep = 8) must be a multiple "
            "of the block size 128") in reasons
    assert candidate(vnuma, "tp8ep2", model=model)["valid"]  # 1536 / 4 = 384 = 3 blocks
    assert candidate(vnuma, "tp4pp2", model=model)["valid"]


def test_layers_and_partition(vnuma):
    model = model_input("llama-2-7b", num_hidden_layers=2)
    assert "layout tp2pp4: pp 4 is larger than the 2 layers" in refused(vnuma, "tp2pp4", model=model)
    reasons = refused(vnuma, "tp4pp2", pp_layer_partition=[40, 40])
    assert "layout tp4pp2: pp_layer_partition [40, 40] must give every stage >= 1 layer and sum to 78 layers" in reasons
    assert "layout tp4pp2: pp_layer_partition has 3 entries for pp 2" in refused(
        vnuma, "tp4pp2", pp_layer_partition=[26, 26, 26])
    plan = planner.plan(planner.PlanRequest(topology=vnuma, model_path=model_path("glm-5-nvfp4"), layout="tp4pp2",
                                            pp_layer_partition=[37, 41]))
    assert plan["env"]["SGLANG_PP_LAYER_PARTITION"] == "37,41"
    assert [(s["first_layer"], s["last_layer"]) for s in plan["pp_layer_partition"]] == [(0, 36), (37, 77)]
    covered = [layer for s in plan["pp_layer_partition"] for layer in range(s["first_layer"], s["last_layer"] + 1)]
    assert covered == list(range(78))


def test_pp_refuses_speculative_decoding_and_mixed_chunk(vnuma):
    reasons = refused(vnuma, "tp4pp2", server_args={"speculative_algorithm": "EAGLE", "enable_mixed_chunk": True})
    assert "layout tp4pp2: pp > 1 cannot run speculative decoding (EAGLE)" in reasons
    assert "layout tp4pp2: pp > 1 cannot run enable_mixed_chunk" in reasons
    assert candidate(vnuma, "tp8", server_args={"speculative_algorithm": "EAGLE"})["valid"]


def test_memory_fit_uses_sglangs_default_fraction(vnuma):
    # 97887 MiB RTX PRO 6000, tp8: reserved = 512 + 8192*1.5 + 512*2 + 8/8*1024 = 14848 MiB
    assert planner.sglang_default_mem_fraction(97887 << 20, 8, 1, {}) == round((97887 - 14848) / 97887, 3)
    # tp2: cuda graph max bs 256 -> reserved = 512 + 12288 + 512 + 256 = 13568 MiB
    assert planner.sglang_default_mem_fraction(97887 << 20, 2, 1, {}) == round((97887 - 13568) / 97887, 3)
    # a 24 GB card: chunk 2048, graph bs 24 (tp < 4): 512 + 3072 + 48 + 128 = 3760 MiB, no 10 GiB floor
    assert planner.sglang_default_mem_fraction(24564 << 20, 1, 1, {}) == round((24564 - 3760) / 24564, 3)
    plan = planner.plan(planner.PlanRequest(topology=vnuma, model_path=model_path("glm-5-nvfp4"), layout="tp8"))
    mem = plan["memory"]
    assert mem["mem_fraction_static"] == 0.848 and mem["mem_fraction_source"] == "sglang_0.5.9_default"
    assert mem["usable_bytes"] == int((mem["gpu_memory_bytes"] - (1 << 30)) * 0.848)
    assert mem["kv_room_bytes"] == mem["usable_bytes"] - mem["weights_per_gpu_bytes"] or \
        abs(mem["kv_room_bytes"] - (mem["usable_bytes"] - mem["weights_per_gpu_bytes"])) <= 1
    # a lower fraction makes the same layout not fit
    reasons = refused(vnuma, "tp8", server_args={"mem_fraction_static": 0.5})
    assert any(r.startswith("layout tp8: does not fit:") for r in reasons)


def test_kv_cache_of_mla_is_per_layer_not_per_head(vnuma):
    tp8 = planner.plan(planner.PlanRequest(topology=vnuma, model_path=model_path("glm-5-nvfp4"), layout="tp8"))["memory"]
    # SGLang's own split (39/39), so that both stages hold the same number of layers
    pp2 = planner.plan(planner.PlanRequest(topology=vnuma, model_path=model_path("glm-5-nvfp4"), layout="tp4pp2",
                                           pp_layer_partition=[39, 39]))["memory"]
    # MLA keeps the latent on every TP rank: half the layers per GPU halves the bytes per token
    assert tp8["kv_bytes_per_token"] == 2 * pp2["kv_bytes_per_token"]
    # GLM-5 is DSA on SM 12: the known combination sm12-mla-kv-bf16 sets a bf16 KV cache (2 bytes for the latent
    # 512 + 64; the indexer's keys stay fp8 128 + 4 scale bytes) x 78 layers
    assert tp8["kv_bytes_per_token"] == (512 + 64) * 2 * 78 + (128 + 4) * 78
    # an FP8 cache the operator asks for is 1 byte
    fp8 = planner.plan(planner.PlanRequest(topology=vnuma, model_path=model_path("glm-5-nvfp4"), layout="tp8",
                                           server_args={"kv_cache_dtype": "fp8_e4m3"}))["memory"]
    assert fp8["kv_bytes_per_token"] == (512 + 64) * 78 + (128 + 4) * 78
    gqa = planner.plan(planner.PlanRequest(topology=vnuma, model_path=model_path("llama-3.1-70b"), layout="tp8"))["memory"]
    assert gqa["kv_bytes_per_token"] == 1 * (128 + 128) * 80 * 2  # 8 KV heads / tp 8, bf16


# ------------------------------------------------------------------------- every reason, the planner's inputs
def test_every_reason_is_reported(vnuma):
    args = {"attention_backend": "flashinf", "no_such_arg": 1, "moe_runner_backend": "flashinfer_cutlass"}
    reasons = refused(vnuma, "tp3pp2ep2", server_args=args, gpus=[0, 1, 2, 3, 4, 5], port=70000,
                      served_model_name="glm:5")
    text = "\n".join(reasons)
    for words in ("'flashinf' is not a choice of --attention-backend", "no flag for 'no_such_arg'",
                  "port (topolaunch_port) must be between 1 and 65535", "served_model_name 'glm:5' contains ':'",
                  "attention heads 64 are not divisible by tp 3", "ep 2 does not divide tp 3",
                  "flashinfer_cutlass needs ep 1 or ep = tp 3"):
        assert words in text, words
    assert len(reasons) >= 7


def test_unknown_version_and_missing_inputs(vnuma):
    reasons = refused(vnuma, "tp8", sglang_version="0.5.7")
    assert any("sglang_version 0.5.7 has no flag table (supported: 0.5.9, 0.5.23)" in r for r in reasons)
    with pytest.raises(planner.PlanError) as exc:
        planner.plan(planner.PlanRequest(model_path=model_path("glm-5-nvfp4")))
    assert "give topology (ansible_facts.gpu_topology) or node_topologies (one per node)" in exc.value.reasons
    reasons = refused(vnuma, "tp8", model_path="/nonexistent/model")
    assert any("model path /nonexistent/model is not a directory" in r for r in reasons)
    reasons = refused(vnuma, "tp8", gpus=[0, 9])
    assert "gpus [9] are not present on node 0 (GPUs [0, 1, 2, 3, 4, 5, 6, 7])" in reasons


def test_nccl_rules(tmp_path):
    naive = synth_facts("proxmox-8x-rtx-pro-6000-naive", tmp_path / "naive")
    plan = planner.plan(planner.PlanRequest(topology=naive, model_path=model_path("glm-5-nvfp4"), layout="tp8"))
    assert plan["env"]["NCCL_P2P_DISABLE"] == "1" and "NCCL_P2P_LEVEL" not in plan["env"]
    assert any("NCCL_TOPO_FILE" in w for w in plan["warnings"])
    hgx = synth_facts("hgx-8x-h100-nvswitch", tmp_path / "hgx")
    plan = planner.plan(planner.PlanRequest(topology=hgx, model_path=model_path("llama-3.1-70b"), layout="tp8"))
    assert not any(k.startswith("NCCL_") for k in plan["env"])
    vnuma = synth_facts(VNUMA, tmp_path / "vnuma")
    plan = planner.plan(planner.PlanRequest(topology=vnuma, model_path=model_path("llama-3.1-70b"), layout="tp8"))
    # P2P across the sockets is left to NCCL (off) until a preflight measurement proves it on this topology
    assert "NCCL_P2P_LEVEL" not in plan["env"]
    assert any("NCCL_P2P_LEVEL=SYS measured 37-42 GB/s" in w and "preflight" in w for w in plan["warnings"])
    assert any("spans NUMA nodes 0,1" in w for w in plan["warnings"])
    plan = planner.plan(planner.PlanRequest(topology=vnuma, model_path=model_path("llama-3.1-70b"), layout="tp4"))
    assert "NCCL_P2P_LEVEL" not in plan["env"] and plan["gpu_indices"] == [0, 1, 2, 3]
    assert any("GPUs [4, 5, 6, 7] stay idle" in w for w in plan["warnings"])


def test_nvlink_pairs_become_tp2_groups(tmp_path):
    facts = synth_facts("8x-h100-nvl-direct-nvlink-pairs", tmp_path)
    plan = planner.plan(planner.PlanRequest(topology=facts, model_path=model_path("llama-3.1-70b"), layout="tp2dp4"))
    assert plan["tp_groups"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    # a spec whose NVLink pairs cross the PCIe order: the pairs still form the groups
    facts["links"] = [row[:] for row in facts["links"]]
    for a, b in ((0, 1), (2, 3), (4, 5), (6, 7)):
        facts["links"][a][b] = facts["links"][b][a] = facts["pcie_levels"][a][b]
    for a, b in ((0, 2), (1, 3), (4, 6), (5, 7)):
        facts["links"][a][b] = facts["links"][b][a] = "NV12"
    plan = planner.plan(planner.PlanRequest(topology=facts, model_path=model_path("llama-3.1-70b"), layout="tp2dp4"))
    assert sorted(map(sorted, plan["tp_groups"])) == [[0, 2], [1, 3], [4, 6], [5, 7]]


def test_processes_on_planned_gpus_are_warned(tmp_path):
    facts = synth_facts(VNUMA, tmp_path)
    facts["gpus"][2]["processes"] = [{"pid": 4242, "used_memory_bytes": 5 << 30}]
    plan = planner.plan(planner.PlanRequest(topology=facts, model_path=model_path("glm-5-nvfp4"), layout="tp8"))
    assert any(w.startswith("GPU 2 holds processes (GPU 2: 4242)") for w in plan["warnings"]), plan["warnings"]


def test_nvml_order_that_is_not_bus_order_is_warned(tmp_path):
    facts = synth_facts(VNUMA, tmp_path)
    plan = planner.plan(planner.PlanRequest(topology=facts, model_path=model_path("glm-5-nvfp4"), layout="tp8"))
    assert not any("PCI bus order" in w for w in plan["warnings"])
    facts["gpus"][0]["pci_bus_id"], facts["gpus"][1]["pci_bus_id"] = facts["gpus"][1]["pci_bus_id"], \
        facts["gpus"][0]["pci_bus_id"]
    plan = planner.plan(planner.PlanRequest(topology=facts, model_path=model_path("glm-5-nvfp4"), layout="tp8"))
    assert any("NVML index order [1, 0, 2, 3, 4, 5, 6, 7] differs from PCI bus order" in w for w in plan["warnings"])


def test_flashinfer_all_to_all_with_pp_is_warned(vnuma):
    args = {"moe_a2a_backend": "flashinfer", "moe_runner_backend": "flashinfer_cutlass"}
    plan = planner.plan(planner.PlanRequest(topology=vnuma, model_path=model_path("glm-5-nvfp4"), layout="tp4pp2ep4", server_args=args))
    assert any("pp_size=1 (token_dispatcher/flashinfer.py)" in w for w in plan["warnings"])
    plan = planner.plan(planner.PlanRequest(topology=vnuma, model_path=model_path("glm-5-nvfp4"), layout="tp8ep8", server_args=args))
    assert not any("pp_size=1" in w for w in plan["warnings"])


def test_plan_takes_one_request_object(vnuma):
    with pytest.raises(planner.PlanError) as exc:
        planner.PlanRequest(topology=vnuma, model_path=model_path("glm-5-nvfp4"), layot="tp8")
    assert exc.value.reasons == ["unknown plan request field(s) layot (known: allow_cross_node_tp, api_key_set, backends, "
                                 "dist_init_addr, fits, gateway_node, gpus, host, layout, listen_without_api_key, "
                                 "measured, metrics, model, model_path, nccl_topo_file, nnodes, node_rank, "
                                 "node_servers, node_topologies, port, pp_layer_partition, preflight, replica_nodes, "
                                 "served_model_name, server_args, sglang_version, speculative, "
                                 "speculative_accept_length, topology, workload)"]
    with pytest.raises(planner.PlanError, match="plan\\(\\) takes a PlanRequest, got dict"):
        planner.plan({"topology": vnuma})
    request = planner.PlanRequest(topology=vnuma, model_path=model_path("glm-5-nvfp4"), layout="tp8")
    assert (request.layout, request.port, request.nnodes, request.gpus) == ("tp8", 30000, 1, None)
    assert planner.plan(request)["layout"]["name"] == "tp8"


def test_the_plan_follows_the_installed_version(vnuma):
    """0.5.23: the field launch with dsa_* plans; nsa_* is refused naming dsa_*; a deprecated flag is a warning."""
    plan = planner.plan(planner.PlanRequest(topology=vnuma, model_path=model_path("glm-5-nvfp4"), layout="tp4pp2",
                        sglang_version="0.5.23+sim", server_args=dict(FIELD_ARGS_0_5_23, disable_cuda_graph=True)))
    assert "--dsa-prefill-backend" in plan["argv"] and "--disable-cuda-graph" in plan["argv"]
    assert any(w.startswith("server_args.disable_cuda_graph: --disable-cuda-graph is deprecated in SGLang 0.5.23")
               for w in plan["warnings"]), plan["warnings"]
    reasons = refused(vnuma, "tp4pp2", sglang_version="0.5.23", server_args=FIELD_ARGS)
    assert "server_args.nsa_prefill_backend: removed in 0.5.23, use dsa_prefill_backend" in reasons


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_metrics_are_on_by_default(vnuma, version):
    """--enable-metrics always; --enable-metrics-for-all-schedulers with TP > 1 (else only TP rank 0 reports);
    metrics=False: neither."""
    request = dict(topology=vnuma, model_path=model_path("glm-5-nvfp4"), layout="tp4pp2", sglang_version=version)
    argv = planner.plan(planner.PlanRequest(**request))["argv"]
    assert argv.count("--enable-metrics") == 1 and argv.count("--enable-metrics-for-all-schedulers") == 1
    argv = planner.plan(planner.PlanRequest(**dict(request, metrics=False)))["argv"]
    assert "--enable-metrics" not in argv and "--enable-metrics-for-all-schedulers" not in argv
    assert "metrics (topolaunch_metrics) must be true or false, got 'yes'" in refused(
        vnuma, "tp4pp2", sglang_version=version, metrics="yes")


# ---------------------------------------------------------------------------------------------- hostile input


@pytest.mark.parametrize("server_args, key", [
    ({"log_requests_target": ["stdout", "--tp-size", "1", "--host", "0.0.0.0"]}, "log_requests_target[1]"),
    ({"uvicorn_access_log_exclude_prefixes": ["/x", "--api-key", "sk-secret"]}, "uvicorn_access_log_exclude_prefixes[1]"),
    ({"chat_template": "-x"}, "chat_template"),
])
def test_a_list_item_or_value_that_looks_like_a_flag_is_refused(vnuma, server_args, key):
    reasons = refused(vnuma, "tp8", server_args=server_args)
    assert any(r.startswith("server_args.%s: " % key) and "looks like a flag" in r for r in reasons), reasons
    assert not any("sk-secret" in r for r in reasons)


def test_negative_numbers_are_values_not_flags(vnuma):
    plan = planner.plan(planner.PlanRequest(topology=vnuma, model_path=model_path("glm-5-nvfp4"), layout="tp8",
                                            server_args={"random_seed": -1}))
    assert plan["argv"][plan["argv"].index("--random-seed") + 1] == "-1"


@pytest.mark.parametrize("field, value", [
    ("served_model_name", "glm\r5"), ("served_model_name", "glm\x005"), ("host", "127.0.0.1\r"),
    ("host", "--host"), ("served_model_name", "a\u2028b"),
])
def test_control_characters_and_flags_in_names_are_refused(vnuma, field, value):
    reasons = refused(vnuma, "tp8", **{field: value})
    assert any(r.startswith("%s: %r" % (field, value)) for r in reasons), reasons


def test_control_characters_in_server_arg_values_are_refused(vnuma):
    reasons = refused(vnuma, "tp8", server_args={"served_model_name": None, "chat_template": "a\rb"})
    assert any("server_args.chat_template" in r and "control character" in r for r in reasons), reasons


def test_a_gpu_named_twice_is_refused(vnuma):
    assert "gpus [0, 0] names GPU [0] more than once" in refused(vnuma, "tp2", gpus=[0, 0])


# ----------------------------------------------------------------- the installed version's SGLang facts (0.5.23)

F523 = planner.SGLANG_FACTS["0.5.23"]
F059 = planner.SGLANG_FACTS["0.5.9"]
# 0.5.23's prefill CUDA graph (on by default on CUDA) captures these token counts up to chunked_prefill_size 8192
# (arg_groups/cuda_graph_hook.py generate_prefill_cuda_graph_batch_sizes): 8 + 14 + 8 + 8 + 12 + 8 sizes
PREFILL_SIZES_8192 = len(list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
                         + list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, 8193, 512)))


def test_0_5_23_memory_defaults_are_its_own():
    """0.5.23 arg_groups/memory_hook.py: reserved = 512 + chunk x 1.5 + decode max_bs x 2 + tp*pp/8 GiB + 8 MiB per
    prefill graph size (MLA: 1.5 GiB), at least 10 GiB over 60 GiB."""
    assert PREFILL_SIZES_8192 == 58
    reserved = 512 + 8192 * 1.5 + 512 * 2 + 1024 + 58 * 8
    assert planner.sglang_default_mem_fraction(97887 << 20, 8, 1, {}, F523) == round((97887 - reserved) / 97887, 3)
    mla = 512 + 8192 * 1.5 + 512 * 2 + 1024 + 1536
    assert planner.sglang_default_mem_fraction(97887 << 20, 8, 1, {}, F523, mla=True) == round((97887 - mla) / 97887, 3)
    # PP turns the prefill graph off (cuda_graph_hook: breakable prefill disabled under pp > 1)
    pp2 = 512 + 8192 * 1.5 + 512 * 2 + 1024
    assert planner.sglang_default_mem_fraction(97887 << 20, 4, 2, {}, F523) == round((97887 - pp2) / 97887, 3)
    # ... unless a prefill backend is asked for; the per-phase off switch drops its reserve
    asked = {"cuda_graph_backend_prefill": "breakable"}
    assert planner.sglang_default_mem_fraction(97887 << 20, 4, 2, asked, F523) == round((97887 - reserved) / 97887, 3)
    off = {"disable_prefill_cuda_graph": True}
    assert planner.sglang_default_mem_fraction(97887 << 20, 8, 1, off, F523) == round((97887 - pp2) / 97887, 3)
    # a 24 GB card: 0.5.23's bracket is chunk 4096, decode max_bs 48 at tp < 4 (0.5.9: 2048 and 24)
    d = planner.sglang_memory_defaults(24564 << 20, 1, 1, {}, F523)
    assert (d["chunked_prefill_size"], d["cuda_graph_max_bs"]) == (4096, 48)
    d = planner.sglang_memory_defaults(24564 << 20, 1, 1, {}, F059)
    assert (d["chunked_prefill_size"], d["cuda_graph_max_bs"]) == (2048, 24)


def test_0_5_23_reads_the_decode_graph_size_under_its_new_name():
    # 0.5.23 renamed cuda_graph_max_bs to cuda_graph_max_bs_decode (arg_groups/fields/exec_.py, cuda_graph_hook.py)
    assert F523.CUDA_GRAPH["max_bs_arg"] == "cuda_graph_max_bs_decode"
    assert F059.CUDA_GRAPH["max_bs_arg"] == "cuda_graph_max_bs"
    d = planner.sglang_memory_defaults(97887 << 20, 8, 1, {"cuda_graph_max_bs_decode": 64}, F523)
    assert d["cuda_graph_max_bs"] == 64
    assert planner.sglang_memory_defaults(97887 << 20, 8, 1, {"cuda_graph_max_bs": 64}, F523)["cuda_graph_max_bs"] == 512
    assert planner.sglang_memory_defaults(97887 << 20, 8, 1, {"cuda_graph_max_bs": 64}, F059)["cuda_graph_max_bs"] == 64
    # a defaulted decode max_bs is capped at max_running_requests in 0.5.23 only
    assert planner.sglang_memory_defaults(97887 << 20, 8, 1, {"max_running_requests": 100}, F523)["cuda_graph_max_bs"] == 100
    assert planner.sglang_memory_defaults(97887 << 20, 8, 1, {"max_running_requests": 100}, F059)["cuda_graph_max_bs"] == 512
    # off: 0.5.23's per-phase switch; then no decode graph reserve either (reserve_for_graph_mb)
    off = planner.sglang_memory_defaults(97887 << 20, 8, 1, {"disable_decode_cuda_graph": True}, F523)
    assert off["cuda_graph_max_bs"] == 0


def test_the_plan_uses_the_installed_versions_facts(vnuma):
    request = planner.PlanRequest(topology=vnuma, model_path=model_path("llama-3.1-70b"), sglang_version="0.5.23",
                                  server_args={"cuda_graph_max_bs_decode": 96})
    c = planner.evaluate_layouts(request, [{"tp": 8, "pp": 1, "dp": 1, "ep": 1}])[0]
    assert c["estimate"]["inputs"]["settings"]["cuda_graph_max_bs"] == 96
    assert c["memory"]["mem_fraction_source"] == "sglang_0.5.23_default"
    gpu_mib = c["memory"]["gpu_memory_bytes"] / float(1 << 20)
    reserved = 512 + 8192 * 1.5 + 96 * 2 + 1024 + PREFILL_SIZES_8192 * 8
    assert c["memory"]["mem_fraction_static"] == round((gpu_mib - max(reserved, 10240)) / gpu_mib, 3)
    plan = planner.plan(planner.PlanRequest(topology=vnuma, model_path=model_path("llama-3.1-70b"),
                                            sglang_version="0.5.9+sim", layout="tp8"))
    assert plan["memory"]["mem_fraction_source"] == "sglang_0.5.9_default"


def test_sparse_attention_backend_warning_names_the_versions_fields(vnuma):
    assert F523.SPARSE_ATTENTION_BACKENDS == ["dsa_decode_backend", "dsa_prefill_backend"]
    plan = planner.plan(planner.PlanRequest(topology=vnuma, model_path=model_path("llama-3.1-70b"), layout="tp8",
                                            sglang_version="0.5.23", server_args={"dsa_prefill_backend": "flashmla_sparse"}))
    assert ("dsa_prefill_backend only apply to models with DSA (NSA) sparse attention; this model has none"
            in plan["warnings"]), plan["warnings"]
    plan = planner.plan(planner.PlanRequest(topology=vnuma, model_path=model_path("llama-3.1-70b"), layout="tp8",
                                            server_args={"nsa_decode_backend": "flashmla_sparse"}))
    assert ("nsa_decode_backend only apply to models with DSA (NSA) sparse attention; this model has none"
            in plan["warnings"]), plan["warnings"]


def test_what_pp_refuses_is_the_versions(vnuma):
    # 0.5.9 check_server_args refuses mixed chunked prefill with pp > 1; 0.5.23 check_pipeline_parallel_compat
    # does not, and refuses min_free_slots_delay instead
    assert "enable_mixed_chunk" in F059.PP["refuses"] and "enable_mixed_chunk" not in F523.PP["refuses"]
    assert candidate(vnuma, "tp4pp2", sglang_version="0.5.23", server_args={"enable_mixed_chunk": True})["valid"]
    reasons = refused(vnuma, "tp4pp2", sglang_version="0.5.23", server_args={"min_free_slots_delay": 2})
    assert "layout tp4pp2: pp > 1 cannot run min_free_slots_delay" in reasons
    reasons = refused(vnuma, "tp4pp2", sglang_version="0.5.23", server_args={"speculative_algorithm": "EAGLE"})
    assert "layout tp4pp2: pp > 1 cannot run speculative decoding (EAGLE)" in reasons


@pytest.mark.parametrize("version, args, reason", [
    ("0.5.23", {"cuda_graph_max_bs_decode": 0}, "server_args.cuda_graph_max_bs_decode must be at least 1, got 0"),
    ("0.5.23", {"cuda_graph_bs_decode": [8, -1]},
     "server_args.cuda_graph_bs_decode must list batch sizes of at least 1, got [8, -1]"),
    ("0.5.9", {"cuda_graph_max_bs": -4}, "server_args.cuda_graph_max_bs must be at least 1, got -4"),
])
def test_a_bad_decode_graph_size_is_named_in_the_versions_field(vnuma, version, args, reason):
    assert reason in refused(vnuma, "tp8", sglang_version=version, server_args=args)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", " 0.0.0.0 "])
def test_listening_everywhere_without_an_api_key_is_refused_unless_asked_for(vnuma, host):
    """Issue 25 item 2: 0.0.0.0 or :: without an API key served anyone who reached the port, silently."""
    reasons = refused(vnuma, "tp8", host=host)
    assert any(r.startswith("host %s (topolaunch_host) listens on every address without an API key: set "
                            "topolaunch_api_key" % host.strip()) for r in reasons), reasons
    kept = planner.plan(planner.PlanRequest(topology=vnuma, layout="tp8", model_path=model_path("glm-5-nvfp4"),
                                            host=host, listen_without_api_key=True))
    assert any("listens on every address without an API key" in w and "topolaunch_listen_without_api_key is true"
               in w for w in kept["warnings"]), kept["warnings"]
    keyed = planner.plan(planner.PlanRequest(topology=vnuma, layout="tp8", model_path=model_path("glm-5-nvfp4"),
                                             host=host, api_key_set=True))
    assert not any("every address" in w for w in keyed["warnings"])
    loopback = planner.plan(planner.PlanRequest(topology=vnuma, layout="tp8", model_path=model_path("glm-5-nvfp4")))
    assert not any("every address" in w for w in loopback["warnings"])


@pytest.mark.parametrize("value, words", [
    ("nan", "server_args.mem_fraction_static must be a finite number, got 'nan'"),
    ("inf", "server_args.mem_fraction_static must be a finite number, got 'inf'"),
    (float("nan"), "server_args.mem_fraction_static must be a finite number, got nan"),
    (1e308, "server_args.mem_fraction_static must be between 0 and 1, got 1e+308"),
    ("²", "server_args.mem_fraction_static must be a number, got '²'"),
    ("--5", "server_args.mem_fraction_static must be a number, got '--5'"),
])
def test_a_fraction_that_is_not_a_fraction_is_refused_naming_the_field(vnuma, value, words):
    """Issue 25 item 14: "nan", "inf" and 1e308 raised a traceback (int(NaN) in the memory estimate)."""
    assert words in refused(vnuma, "tp8", server_args={"mem_fraction_static": value})


@pytest.mark.parametrize("field, value, words", [
    ("host", ["127.0.0.1"], "host (topolaunch_host) must be one address (a non-empty string), got ['127.0.0.1']"),
    ("host", "127.0.0.1:30000", "host (topolaunch_host) '127.0.0.1:30000' is an address with a port"),
    ("host", "[::1]:30000", "host (topolaunch_host) '[::1]:30000' is an address with a port"),
    ("host", "127.0.0.1 10.0.0.1", "host (topolaunch_host) '127.0.0.1 10.0.0.1' contains a blank"),
    ("port", True, "port (topolaunch_port) must be an integer, got True"),
    ("port", 80, "port (topolaunch_port) 80 is below 1024: the unit runs the server as the service user without "
                 "CAP_NET_BIND_SERVICE"),
    ("model_path", "models/glm-5-nvfp4", "model_path (topolaunch_model_path) 'models/glm-5-nvfp4' is not an "
                                         "absolute path"),
])
def test_a_listen_address_or_model_path_the_unit_cannot_use_is_refused_naming_the_field(vnuma, field, value, words):
    """Issue 25 item 9: a list host became --host "['127.0.0.1']", host:port and port 1 (true) passed, a port the
    capability-less unit cannot bind and a relative model path (the unit has no working directory) too."""
    reasons = refused(vnuma, "tp8", **{field: value})
    assert any(words in r for r in reasons), reasons


@pytest.mark.parametrize("host", ["::1", "fe80::1", "10.0.0.5", "gpu-box.lan"])
def test_an_ipv6_address_or_a_name_is_one_host(host):
    assert planner.host_problem(host, "host") is None


def test_no_valid_layout_is_one_short_line_the_table_says_why_each(vnuma):
    """Issue 25 item 18: the reason listed every candidate's reasons, which the failed task printed beside the
    candidates table (msg and reasons: the candidates twice)."""
    reasons = refused(vnuma, "auto", gpus=[0, 1, 2, 3])
    last = reasons[-1]
    assert last.startswith("no valid layout for 4 GPUs: 10 candidate(s) refused (does not fit: 10)"), last
    assert "tp1dp4" not in last and "GB" not in last and "\n" not in last


def test_the_watermark_config_is_a_secret_like_the_api_key(vnuma):
    """Issue 25 item 10: watermark_config (SGLang's watermark keys, which SGLang itself redacts) went into argv,
    plan.json and the 0644 state files."""
    reasons = refused(vnuma, "tp8", sglang_version="0.5.23", server_args={"watermark_config": '{"key": "s3cr3t"}'})
    assert ("server_args.watermark_config is a secret and does not belong in the plan, which is printed and saved: "
            "set topolaunch_watermark_config, which the launch stage passes through the server's 0600 config file "
            "(--config)") in reasons, reasons
    assert not any("s3cr3t" in r for r in reasons)
