"""plan_args.py: server_args checked against the installed version's own flag table (keys by field, dest, flag or
alias; values converted as SGLang's argparse types take them; every problem named), written as canonical argv."""
import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import plan_args
from ansible_collections.topolaunch.sglang.plugins.module_utils.plan_args import FlagIndex, check_server_args, text_problem
from plan_cases import FIELD_ARGS, FIELD_ARGS_0_5_23


def test_server_args_are_flags_of_the_pinned_version():
    index = FlagIndex("0.5.9")
    items, values, reasons, warnings = check_server_args(dict(
        FIELD_ARGS, kv_cache_dtype="fp8_e4m3", trust_remote_code=True, enable_cache_report=False,
        context_length="32768"), index)
    assert reasons == [] and warnings == []
    flags = [flag for flag, _ in items]
    assert flags == sorted(flags) and "--enable-cache-report" not in flags
    words = dict(items)
    assert words["--trust-remote-code"] == ["--trust-remote-code"]
    assert words["--context-length"] == ["--context-length", "32768"]
    assert values["fp8_gemm_runner_backend"] == "cutlass" and values["context_length"] == 32768


@pytest.mark.parametrize("args, words", [
    ({"attention_backends": "flashinfer"}, "SGLang 0.5.9 has no flag for 'attention_backends'"),
    ({"pp": 2}, "server_args.pp: SGLang 0.5.9 has no flag for 'pp' (similar: "),
    ({"tp_size": 4}, "server_args.tp_size is set by the planner: use the layout"),
    ({"tensor_parallel_size": 4}, "server_args.tensor_parallel_size is set by the planner"),
    ({"api_key": "secret"}, "server_args.api_key is a secret"),
    ({"mem_fraction_static": "lots"}, "server_args.mem_fraction_static must be a number, got 'lots'"),
    ({"max_running_requests": 1.5}, "server_args.max_running_requests must be an integer"),
    ({"trust_remote_code": "yes"}, "--trust-remote-code is a switch (store_true); give true or false"),
    ({"kv_cache_dtype": "fp9"}, "'fp9' is not a choice of --kv-cache-dtype in SGLang 0.5.9 (choices: auto, "),
    ({"hybrid_kvcache_ratio": True}, "--hybrid-kvcache-ratio is deprecated in SGLang 0.5.9"),
    ({"fp8_gemm_backend": "cutlass", "fp8_gemm_runner_backend": "triton"}, "both set --fp8-gemm-backend"),
    ({"enable_dp_attention": True}, "DP attention"),
    ({"enable_metrics": True}, "server_args.enable_metrics is set by the planner: use the metrics input (topolaunch_metrics"),
    ({"enable_metrics_for_all_schedulers": True}, "server_args.enable_metrics_for_all_schedulers is set by the planner"),
])
def test_bad_server_args_are_named(args, words):
    _, _, reasons, _ = check_server_args(args, FlagIndex("0.5.9"))
    assert any(words in r for r in reasons), reasons


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_a_config_file_of_the_operator_is_refused_as_managed(version):
    """Issue 25 item 4: server_args {config: ...} gave the server a second --config (both releases exit "Multiple
    config files specified!" once the launch writes its own, after cleanup), or set flags the planner refuses."""
    _, _, reasons, _ = check_server_args({"config": "/etc/sglang/extra.yaml"}, FlagIndex(version))
    assert reasons == ["server_args.config is set by the planner: use each flag as its own key of "
                       "topolaunch_server_args: the launch writes the server's --config file itself"], reasons


def test_both_tables_load_and_a_local_label_maps_to_its_base():
    assert plan_args.supported_versions() == ["0.5.9", "0.5.23"]
    for version in ("0.5.9", "0.5.23"):
        index = FlagIndex(version + "+sim")
        assert index.version == version and len(index.flags) > 300 and index.has("--tp-size")
    assert FlagIndex("0.5.23").flags["--tp-size"]["dest"] == "tp_size"
    assert FlagIndex("0.5.9").flags["--tp-size"]["dest"] == "tensor_parallel_size"


def test_unknown_version_names_the_supported_ones():
    with pytest.raises(KeyError) as exc:
        FlagIndex("0.4.0")
    assert str(exc.value) == "SGLang 0.4.0 has no flag table (supported: 0.5.9, 0.5.23)"


def test_field_launch_for_0_5_23():
    items, values, reasons, warnings = check_server_args(FIELD_ARGS_0_5_23, FlagIndex("0.5.23"))
    assert reasons == [] and warnings == []
    words = dict(items)
    assert words["--dsa-prefill-backend"] == ["--dsa-prefill-backend", "trtllm"]
    assert words["--fp8-gemm-backend"] == ["--fp8-gemm-backend", "cutlass"]
    assert values["dsa_decode_backend"] == "trtllm" and values["fp8_gemm_runner_backend"] == "cutlass"


@pytest.mark.parametrize("args, words", [
    # hand-written renames (plan_args.RENAMED)
    ({"nsa_prefill_backend": "trtllm"}, "server_args.nsa_prefill_backend: removed in 0.5.23, use dsa_prefill_backend"),
    ({"nsa_decode_backend": "trtllm"}, "nsa_decode_backend: removed in 0.5.23, use dsa_decode_backend"),
    ({"cuda_graph_max_bs": 256}, "cuda_graph_max_bs: removed in 0.5.23, use cuda_graph_max_bs_decode"),
    # the 0.5.9 wheel's own deprecation ("Please use --swa-full-tokens-ratio instead.")
    ({"hybrid_kvcache_ratio": 0.5}, "hybrid_kvcache_ratio: removed in 0.5.23, use swa_full_tokens_ratio"),
    # gone without a successor
    ({"enable_double_sparsity": True}, "server_args.enable_double_sparsity: removed in 0.5.23"),
    ({"no_such_arg": 1}, "SGLang 0.5.23 has no flag for 'no_such_arg'"),
    ({"attn_dp_size": 2}, "server_args.attn_dp_size is set by the planner: use nothing: DP attention"),
    ({"ssl_keyfile_password": "x"}, "server_args.ssl_keyfile_password is a secret"),
    ({"context_length": "32q"}, "server_args.context_length must be an integer (or 32k, 1Mi"),
])
def test_flags_of_0_5_9_that_0_5_23_does_not_take(args, words):
    _, _, reasons, _ = check_server_args(args, FlagIndex("0.5.23"))
    assert any(words in r for r in reasons), reasons


def test_a_flag_added_later_is_named_as_such():
    _, _, reasons, _ = check_server_args({"dsa_prefill_backend": "trtllm", "attn_cp_size_x": 1}, FlagIndex("0.5.9"))
    assert reasons[0] == ("server_args.attn_cp_size_x: SGLang 0.5.9 has no flag for 'attn_cp_size_x' (similar: "
                          "attn_cp_size)")
    assert reasons[1] == ("server_args.dsa_prefill_backend: SGLang 0.5.9 has no flag for 'dsa_prefill_backend' "
                          "(added in 0.5.23; 0.5.9 has nsa_prefill_backend)")


def test_deprecated_flag_warns_and_still_launches():
    index = FlagIndex("0.5.23")
    items, values, reasons, warnings = check_server_args(
        {"disable_cuda_graph": True, "grpc_mode": False, "enable_fused_qk_norm_rope": False,
         "context_length": "128k", "tensor_parallel_size_x": None}, index)
    assert reasons == ["server_args.tensor_parallel_size_x: SGLang 0.5.23 has no flag for 'tensor_parallel_size_x' "
                       "(similar: tensor_parallel_size)"]
    assert warnings == [  # grpc_mode: false writes nothing, so no warning
        "server_args.disable_cuda_graph: --disable-cuda-graph is deprecated in SGLang 0.5.23; use "
        "--cuda-graph-backend-{decode,prefill}=disabled"]
    _, _, _, warnings = check_server_args({"grpc_mode": True, "disable_fast_image_processor": True}, index)
    assert warnings == [
        "server_args.disable_fast_image_processor: --disable-fast-image-processor is deprecated in SGLang 0.5.23; "
        "use --image-processor-backend=pil",
        "server_args.grpc_mode: --grpc-mode is deprecated in SGLang 0.5.23; use --smg-grpc-mode"]
    words = dict(items)
    assert words["--disable-cuda-graph"] == ["--disable-cuda-graph"] and "--grpc-mode" not in words
    # BooleanOptionalAction: false is spelled --no-<flag>; human_readable_int keeps the text, the value is the int
    assert words["--enable-fused-qk-norm-rope"] == ["--no-enable-fused-qk-norm-rope"]
    assert words["--context-length"] == ["--context-length", "128k"] and values["context_length"] == 128000


def test_aliases_are_keys_too():
    index = FlagIndex("0.5.23")
    assert index.by_name["tensor_parallel_size"] == "--tp-size" and index.by_name["enable_hicache"] == \
        "--enable-hierarchical-cache"
    items, _, reasons, _ = check_server_args({"hierarchical_sparse_attention_extra_config": "{}"}, index)
    assert reasons == [] and items == [("--hisparse-config", ["--hisparse-config", "{}"])]


@pytest.mark.parametrize("text, value", [("32768", 32768), ("32k", 32000), ("25.6k", 25600), ("1Mi", 1 << 20),
                                         ("1.5Mi", None), ("32K", None), ("x", None)])
def test_human_readable_int_as_sglang_0_5_23(text, value):
    assert plan_args._human_int(text) == value


def test_pp_alone_is_not_a_flag():
    index = FlagIndex("0.5.9")
    assert "pp" not in index.by_name or index.by_name["pp"] != "--pp-size"
    assert index.by_name["pp_size"] == "--pp-size" and index.by_name["pipeline_parallel_size"] == "--pp-size"


@pytest.mark.parametrize("text, where, words", [
    ("a\rb", "server_args.x", "server_args.x: 'a\\rb' contains a control character ('\\r'); refused"),
    ("a\nb", "x", "contains a control character ('\\n')"),
    ("--api-key=1", "server_args.x", "'--api-key=1' looks like a flag (starts with '-'); refused"),
    ("-x", "y", "looks like a flag"),
])
def test_text_that_could_break_a_file_or_set_another_flag_is_refused(text, where, words):
    assert words in text_problem(text, where)


@pytest.mark.parametrize("text", ["-1", "-0.5", "-1e-3", "flashinfer", "a-b", ""])
def test_numbers_and_plain_words_pass(text):
    assert text_problem(text, "x") is None


def test_values_are_written_as_each_argparse_type_takes_them():
    index = FlagIndex("0.5.23")
    items, values, reasons, _ = check_server_args({
        "numa_node": [0, 1],                                # nargs +, int
        "bucket_time_to_first_token": [0.1, 1],             # nargs +, float
        "sidecar_args": ["--a", "b"],                       # json_list: one JSON word
        "cuda_graph_config": {"decode": {"max_bs": 8}},     # cuda_graph_config: a JSON object
        "radix_eviction_policy_config": '{"b": 1, "a": 2}',  # json given as text: normalised
        "mem_fraction_static": 0.9, "tokenizer_worker_num": 2.0,
    }, index)
    assert reasons == []
    words = dict(items)
    assert words["--numa-node"] == ["--numa-node", "0", "1"] and values["numa_node"] == [0, 1]
    assert words["--bucket-time-to-first-token"] == ["--bucket-time-to-first-token", "0.1", "1"]
    assert words["--sidecar-args"] == ["--sidecar-args", '["--a","b"]']
    assert words["--cuda-graph-config"] == ["--cuda-graph-config", '{"decode":{"max_bs":8}}']
    assert words["--radix-eviction-policy-config"] == ["--radix-eviction-policy-config", '{"a":2,"b":1}']
    assert words["--mem-fraction-static"] == ["--mem-fraction-static", "0.9"] and values["mem_fraction_static"] == 0.9
    assert words["--tokenizer-worker-num"] == ["--tokenizer-worker-num", "2"] and values["tokenizer_worker_num"] == 2


@pytest.mark.parametrize("args, words", [
    ({"numa_node": []}, "--numa-node needs at least one value"),
    ({"numa_node": [0, "-1x"]}, "server_args.numa_node must be an integer, got '-1x'"),
    ({"log_requests_target": ["stdout", "--x"]}, "server_args.log_requests_target[1]: '--x' looks like a flag"),
    ({"sidecar_args": {"a": 1}}, "server_args.sidecar_args must be a JSON list"),
    ({"cuda_graph_config": "[1]"}, "must be a JSON object ({phase: settings})"),
    ({"radix_eviction_policy_config": "{bad"}, "server_args.radix_eviction_policy_config must be JSON"),
    ({"mem_fraction_static": [0.9]}, "--mem-fraction-static takes one value, got a list [0.9]"),
    ({"model_checksum": {"a": 1}}, "server_args.model_checksum must be a string"),
    ({"tokenizer_worker_num": True}, "server_args.tokenizer_worker_num must be an integer, got True"),
    ({"enable_tf32_matmul": "no"}, "--enable-tf32-matmul is a switch (BooleanOptionalAction); give true or false"),
    ({1: 2}, "server_args key 1 is not a string"),
])
def test_bad_values_are_named_by_their_key(args, words):
    _, _, reasons, _ = check_server_args(args, FlagIndex("0.5.23"))
    assert any(words in r for r in reasons), reasons


def test_an_optional_value_may_be_given_as_true_and_nothing_is_written_for_none():
    items, _, reasons, _ = check_server_args({"model_checksum": True, "quantization_param_path": None},
                                             FlagIndex("0.5.9"))
    assert reasons == [] and items == [("--model-checksum", ["--model-checksum"])]


def test_server_args_must_be_a_mapping():
    assert check_server_args(None, FlagIndex("0.5.9")) == ([], {}, [], [])
    assert check_server_args(["tp_size"], FlagIndex("0.5.9"))[2] == [
        "server_args must be a mapping of ServerArgs fields, got list"]


def test_the_planners_own_flags_exist_in_every_table():
    for version in plan_args.supported_versions():
        assert [f for f in plan_args.PLANNER_FLAGS if not FlagIndex(version).has(f)] == [], version


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_metrics_words(version):
    index = FlagIndex(version)
    assert plan_args.metrics_argv(index, True, 1) == ["--enable-metrics"]
    assert plan_args.metrics_argv(index, True, 4) == ["--enable-metrics", "--enable-metrics-for-all-schedulers"]
    assert plan_args.metrics_argv(index, False, 4) == []


def test_metrics_words_follow_the_table():
    """A release without --enable-metrics-for-all-schedulers gets --enable-metrics alone; one without metrics none."""
    index = FlagIndex("0.5.9")
    index.flags = {k: v for k, v in index.flags.items() if k != "--enable-metrics-for-all-schedulers"}
    assert plan_args.metrics_argv(index, True, 8) == ["--enable-metrics"]
    index.flags = {k: v for k, v in index.flags.items() if k != "--enable-metrics"}
    assert plan_args.metrics_argv(index, True, 8) == []
