"""The committed SGLang flag tables equal what tools/sglang_flags.py extracts from each supported version's wheel,
and a few flags read by hand from each wheel's source text are what the tables say."""
import argparse
import importlib.util
import io
import json
import socket
import sys
import zipfile

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import plan_args
import paths
from flag_cases import build_parser

ROOT = paths.ROOT


def _load_tool():
    return paths.load_script(ROOT / "tools" / "sglang_flags.py", "sglang_flags_tool")


tool = _load_tool()
VERSIONS = sorted(tool.WHEELS)


def _pypi_reachable():
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


def wheel_of(version):
    """The pinned wheel in build/wheels (`make sglang-wheel` fetches them); downloaded here when missing."""
    path = tool.WHEEL_DIR / tool.WHEELS[version]["file"]
    if not path.is_file() and not _pypi_reachable():
        pytest.skip("%s not in %s and pypi.org:443 is unreachable" % (path.name, tool.WHEEL_DIR))
    return tool.download_wheel(version)


@pytest.fixture(scope="module")
def extracted():
    cache = {}

    def get(version):
        if version not in cache:
            cache[version] = tool.extract_flags(wheel_of(version))
        return cache[version]
    return get


def flags_of(version):
    return plan_args.FLAG_TABLES[version]


# ------------------------------------------------------------------------------- tables = their wheels


def test_supported_versions_are_the_pinned_wheels():
    assert plan_args.supported_versions() == ["0.5.9", "0.5.23"]
    assert set(tool.WHEELS) == set(plan_args.supported_versions())
    for version in VERSIONS:
        assert tool.module_path(version).is_file(), version


@pytest.mark.parametrize("version", VERSIONS)
def test_committed_table_matches_the_wheel(version, extracted):
    got_version, flags = extracted(version)
    assert got_version == version
    assert list(flags) == list(flags_of(version)), "flag set or order differs: run tools/sglang_flags.py --all"
    for flag, entry in flags.items():
        assert entry == flags_of(version)[flag], flag
    module_file = tool.module_path(version)
    assert tool.render_module(version, flags, tool.WHEELS[version]["file"]) == module_file.read_text()


@pytest.mark.parametrize("version", VERSIONS)
def test_tables_are_compact_and_expand_back(version):
    module = importlib.import_module("ansible_collections.topolaunch.sglang.plugins.module_utils.sglang_flags_%s"
                                     % version.replace(".", "_"))
    text = tool.module_path(version).read_text()
    assert len(text.splitlines()) < 3 * len(module.FLAGS)  # a line per flag, wrapped only where pep8 needs it
    for flag, entry in module.FLAGS.items():
        assert tool.expand(flag, entry) == flags_of(version)[flag]
        assert tool.compact(flag, flags_of(version)[flag]) == entry


def test_check_mode_reports_a_stale_table(tmp_path):
    wheel = wheel_of("0.5.9")
    stale = tmp_path / "flags.py"
    stale.write_text("VERSION = '0.5.9'\nFLAGS = {}\n")
    assert tool.main(["--wheel", wheel, "--out", str(stale), "--check"]) == 1
    assert tool.main(["--wheel", wheel, "--out", str(tmp_path / "fresh.py")]) == 0
    assert tool.main(["--wheel", wheel, "--out", str(tmp_path / "fresh.py"), "--check"]) == 0


# ------------------------------------------------------- spot checks, read by hand from the wheels' text


def test_known_flags_of_0_5_9():
    """sglang-0.5.9-py3-none-any.whl, sglang/srt/server_args.py."""
    flags = flags_of("0.5.9")
    # 3302: parser.add_argument("--tensor-parallel-size", "--tp-size", type=int, default=ServerArgs.tp_size)
    # 350: tp_size: int = 1; from_cli_args: args.tp_size = args.tensor_parallel_size
    tp = flags["--tp-size"]
    assert tp["option_strings"] == ["--tensor-parallel-size", "--tp-size"] and tp["aliases"] == ["--tensor-parallel-size"]
    assert (tp["dest"], tp["field"], tp["type"], tp["default"]) == ("tensor_parallel_size", "tp_size", "int", 1)
    # 3322: "--pipeline-parallel-size", "--pp-size"
    assert flags["--pp-size"]["aliases"] == ["--pipeline-parallel-size"]
    assert flags["--ep-size"]["option_strings"] == ["--expert-parallel-size", "--ep-size", "--ep"]
    # 122-144: ATTENTION_BACKEND_CHOICES
    assert flags["--attention-backend"]["choices"] == [
        "triton", "torch_native", "flex_attention", "nsa", "cutlass_mla", "fa3", "fa4", "flashinfer", "flashmla",
        "trtllm_mla", "trtllm_mha", "dual_chunk_flash_attn", "aiter", "wave", "intel_amx", "ascend", "intel_xpu"]
    # 3871 --nsa-prefill-backend type=str choices=NSA_CHOICES (162-170), default None (457)
    nsa = flags["--nsa-prefill-backend"]
    assert nsa["choices"] == ["flashmla_sparse", "flashmla_kv", "flashmla_auto", "fa3", "tilelang", "aiter", "trtllm"]
    assert (nsa["type"], nsa["default"]) == ("str", None)
    # 2956 --trust-remote-code action="store_true"; 293 trust_remote_code: bool = False
    assert (flags["--trust-remote-code"]["action"], flags["--trust-remote-code"]["default"]) == ("store_true", False)
    # 4484 --cuda-graph-bs type=int nargs="+"; 4749 --numa-node type=int nargs="+"
    for flag in ("--cuda-graph-bs", "--numa-node"):
        assert (flags[flag]["type"], flags[flag]["nargs"], flags[flag]["default"]) == ("int", "+", None)
    # 3239 --hybrid-kvcache-ratio action=DeprecatedAction, help "... Please use --swa-full-tokens-ratio instead."
    old = flags["--hybrid-kvcache-ratio"]
    assert (old["action"], old["nargs"], old["deprecated"], old["replacement"]) == (
        "DeprecatedAction", 0, True, "--swa-full-tokens-ratio")
    assert flags["--fp8-gemm-backend"]["field"] == "fp8_gemm_runner_backend"
    assert flags["--model-path"]["required"] is True and flags["--model-path"]["aliases"] == ["--model"]
    assert flags["--mem-fraction-static"]["type"] == "float"
    assert "--pp" not in flags and "--tp" not in flags
    assert sum(e["deprecated"] for e in flags.values()) == 2


def test_known_flags_of_0_5_23():
    """sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl, sglang/srt/arg_groups/fields/*.py and server_args.py."""
    flags = flags_of("0.5.23")
    # parallel.py:45 tp_size: A[int, Arg(help=..., aliases=["--tensor-parallel-size"])] = 1
    tp = flags["--tp-size"]
    assert (tp["dest"], tp["field"], tp["type"], tp["default"]) == ("tp_size", "tp_size", "int", 1)
    assert tp["option_strings"] == ["--tp-size", "--tensor-parallel-size"]
    assert flags["--pp-size"]["aliases"] == ["--pipeline-parallel-size"]
    # parallel.py ep_size aliases=["--expert-parallel-size", "--ep"]
    assert flags["--ep-size"]["option_strings"] == ["--ep-size", "--expert-parallel-size", "--ep"]
    # arg_groups/choices.py:69 ATTENTION_BACKEND_CHOICES ("nsa": Deprecated alias for "dsa")
    assert flags["--attention-backend"]["choices"] == [
        "triton", "torch_native", "flex_attention", "dsa", "nsa", "qsa", "dsv4", "compressed", "fa3", "fa4",
        "flashinfer", "llada2_cfg_flashinfer", "flashmla", "trtllm_mla", "cutedsl_mla", "tokenspeed_mla",
        "trtllm_mha", "hpc_ops", "minicpm_flashattn", "minicpm_flashinfer", "aiter", "wave", "intel_amx", "ascend",
        "intel_xpu"]
    assert flags["--attention-backend"]["default"] is None
    # exec_.py:299 dsa_prefill_backend: A[Optional[str], Arg(choices=[...])] = None
    dsa = flags["--dsa-prefill-backend"]
    assert dsa["choices"] == ["flashmla_sparse", "flashmla_sparse_q8", "flashmla_kv", "flashmla_auto",
                              "flashinfer_sparse_mla", "triton_sparse_mla", "fa3", "tilelang", "triton", "aiter",
                              "trtllm", "intel_xpu"]
    assert (dsa["type"], dsa["default"]) == ("str", None)
    assert "trtllm" in flags["--dsa-decode-backend"]["choices"]
    assert "--nsa-prefill-backend" not in flags and "--nsa-decode-backend" not in flags
    # memory.py:98 enable_hierarchical_cache: A[bool, Arg(aliases=["--enable-hicache"])] = False -> store_true
    hicache = flags["--enable-hierarchical-cache"]
    assert (hicache["action"], hicache["default"], hicache["aliases"]) == ("store_true", False, ["--enable-hicache"])
    # device.py:80 numa_node: A[Optional[List[int]], "..."] = None -> type int, nargs "+"
    assert (flags["--numa-node"]["type"], flags["--numa-node"]["nargs"]) == ("int", "+")
    # exec_.py:45 enable_tf32_matmul: Arg(action=argparse.BooleanOptionalAction) = None
    assert (flags["--enable-tf32-matmul"]["action"], flags["--enable-tf32-matmul"]["default"]) == (
        "BooleanOptionalAction", None)
    # model.py:110 context_length: Arg(type_parser=human_readable_int)
    assert flags["--context-length"]["type"] == "human_int"
    # model.py:51 model_path: A[str, Arg(aliases=["--model"])] with no default -> required
    assert flags["--model-path"]["required"] is True and flags["--model-path"]["aliases"] == ["--model"]
    # exec_.py fp8_gemm_runner_backend: Arg(cli_name="--fp8-gemm-backend")
    assert flags["--fp8-gemm-backend"]["dest"] == "fp8_gemm_runner_backend"
    # server_args.py:418 --enable-dp-attention action=DeprecatedStoreTrueAction, new_flag="--attn-dp-size <dp-size>"
    dpa = flags["--enable-dp-attention"]
    assert (dpa["action"], dpa["nargs"], dpa["default"], dpa["deprecated"], dpa["replacement"]) == (
        "DeprecatedStoreTrueAction", 0, False, True, "--attn-dp-size <dp-size>")
    assert flags["--disable-cuda-graph"]["replacement"] == "--cuda-graph-backend-{decode,prefill}=disabled"
    # server_args.py:426 --monokernel-backend DeprecatedStoreConstAction dest=enable_amd_monokernel nargs=None
    mono = flags["--monokernel-backend"]
    assert (mono["dest"], mono["nargs"], mono["choices"], mono["const"]) == ("enable_amd_monokernel", None, ["amd"], True)
    # exec_.py cuda_graph_backend_decode: Optional[Literal[...]], Arg(choices=Backend.ALL, type_parser=...)
    assert flags["--cuda-graph-backend-decode"]["choices"] == ["full", "breakable", "disabled"]
    assert "--cuda-graph-max-bs" not in flags and flags["--cuda-graph-max-bs-decode"]["type"] == "int"
    assert flags["--dist-timeout"]["default"] is None and flags["--host"]["default"] == "127.0.0.1"
    # the dataclass fields come first in POSITIONAL_FIELD_ORDER (arg_groups/field_order.py), the manual ones last
    assert list(flags)[:3] == ["--model-path", "--tokenizer-path", "--tokenizer-mode"]
    assert list(flags)[-1] == "--enable-flashinfer-allreduce-fusion"


# ------------------------------------------------------------------- the extractor on made-up wheels


def _mini_wheel(tmp_path, files, version="9.9.9"):
    path = tmp_path / ("sglang-%s-py3-none-any.whl" % version)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("sglang-%s.dist-info/METADATA" % version,
                    "Metadata-Version: 2.1\nName: sglang\nVersion: %s\n" % version)
        for name, text in files.items():
            zf.writestr(name, text)
    return str(path)


OTHER = "NAMES = ['x', 'y']\nclass Reg:\n    M = {'k1': object, 'k2': int}\n"


def test_extractor_resolves_constants_imports_and_field_defaults(tmp_path):
    src = (
        "import dataclasses\n"
        "from sglang.srt.other import NAMES, Reg\n"
        "from sglang.missing import GONE\n"
        "LOCAL = ['a', 'b']\n"
        "@dataclasses.dataclass\n"
        "class ServerArgs:\n"
        "    size: int = 2 * 3\n"
        "    items: list = dataclasses.field(default_factory=list)\n"
        "    def add_cli_args(parser):\n"
        "        extra = list(Reg.M.keys())\n"
        "        parser.add_argument('--long-size', '--size', type=int, default=ServerArgs.size)\n"
        "        parser.add_argument('--items', nargs='+', default=ServerArgs.items, choices=[*LOCAL, *NAMES])\n"
        "        parser.add_argument('--reg', choices=extra)\n"
        "        parser.add_argument('--gone', choices=GONE)\n"
        "        parser.add_argument('--old', action=DeprecatedAction, help='Note: --old is deprecated now. '\n"
        "                            'Please use --size instead.')\n"
        "    @classmethod\n"
        "    def from_cli_args(cls, args):\n"
        "        args.size = args.long_size\n"
        "class DeprecatedAction:\n"
        "    def __init__(self, option_strings, dest, nargs=0, **kwargs):\n"
        "        pass\n"
    )
    version, flags = tool.extract_flags(_mini_wheel(tmp_path, {"sglang/srt/server_args.py": src,
                                                                "sglang/srt/other.py": OTHER}))
    assert version == "9.9.9"
    assert flags["--size"]["default"] == 6 and flags["--size"]["dest"] == "long_size"
    assert flags["--size"]["aliases"] == ["--long-size"]
    assert flags["--items"]["choices"] == ["a", "b", "x", "y"] and flags["--items"]["default"] == []
    assert flags["--reg"]["choices"] == ["k1", "k2"]
    assert flags["--gone"]["choices"] is None
    assert any("GONE" in note for note in flags["--gone"]["notes"])
    assert (flags["--old"]["nargs"], flags["--old"]["deprecated"], flags["--old"]["replacement"]) == (0, True, "--size")
    assert flags["--size"]["deprecated"] is False


FIELD_ORDER = "POSITIONAL_FIELD_ORDER = ('second', 'first')\n"
FIELDS_INIT = ("from sglang.srt.arg_groups.field_order import POSITIONAL_FIELD_ORDER\n"
               "def collect_input_fields(sources):\n    pass\n")
NAMESPACE = (
    "import argparse\n"
    "import msgspec\n"
    "from typing import List, Literal, Optional, Union\n"
    "from sglang.srt.arg_groups.arg_utils import A, Arg\n"
    "from sglang.srt.other import NAMES\n"
    "def parse_it(raw):\n    return raw\n"
    "class Phase:\n    ONE = 'one'\n    TWO = 'two'\n    ALL = (ONE, TWO)\n"
    "class Ns(msgspec.Struct):\n"
    "    _NS_PATH = 'ns'\n"
    "    first: A[str, Arg(help='needs a value')]\n"
    "    tp_size: A[int, Arg(help='tp', aliases=['--tensor-parallel-size'])] = 1\n"
    "    mode: A[Optional[Literal['a', 'b']], 'literal'] = None\n"
    "    level: A[Literal[1, 2], 'int literal'] = 1\n"
    "    phase: A[Optional[Literal['one', 'two', 'three']], Arg(choices=Phase.ALL, type_parser=parse_it)] = None\n"
    "    sizes: A[Optional[List[int]], 'list'] = None\n"
    "    names: A[List[str], Arg(help='list', nargs='*', choices=NAMES)] = msgspec.field(default_factory=list)\n"
    "    parsed: A[Optional[List[str]], Arg(type_parser=json_list_type)] = None\n"
    "    mixed: A[Optional[Union[set[str], List[str]]], Arg(nargs='*')] = None\n"
    "    switch: A[bool, 'a switch'] = False\n"
    "    maybe: A[Optional[bool], Arg(action=argparse.BooleanOptionalAction)] = None\n"
    "    paths: A[Optional[List[str]], Arg(action=PathAction, action_kwargs={'type': str, 'nargs': '*'})] = None\n"
    "    runner: A[str, Arg(cli_name='--run', choices=NAMES + ['z'])] = 'x'\n"
    "    hidden: A[bool, Arg(no_cli=True)] = False\n"
    "    plain: Optional[str] = None\n"
    "    second: A[float, '(Deprecated, use --first) old'] = 0.5\n"
)
SERVER_ARGS_523 = (
    "import msgspec\n"
    "from sglang.srt.arg_groups.arg_utils import add_cli_args_from_dataclass\n"
    "from sglang.srt.arg_groups.actions import DeprecatedStoreTrueAction\n"
    "from sglang.srt.arg_groups.fields import collect_input_fields\n"
    "from sglang.srt.arg_groups.fields.ns import Ns\n"
    "class ServerArgs:\n"
    "    @staticmethod\n"
    "    def add_cli_args(parser):\n"
    "        add_cli_args_from_dataclass(parser, ServerArgs)\n"
    "        parser.add_argument('--plain', type=str, default=_declared_default('plain'))\n"
    "        parser.add_argument('--hidden-old', action=DeprecatedStoreTrueAction, dest='hidden', new_flag='--x y')\n"
    "_INPUT_NAMESPACES = [Ns]\n"
    "_annotations, _defaults, _namespaces = collect_input_fields(_INPUT_NAMESPACES)\n"
    "def _declared_default(name):\n    pass\n"
)
ACTIONS = ("class DeprecatedStoreTrueAction:\n"
           "    def __init__(self, option_strings, dest, new_flag=None, nargs=0, const=True, default=False, **kw):\n"
           "        pass\n")


def test_extractor_mirrors_add_cli_args_from_dataclass(tmp_path):
    files = {"sglang/srt/server_args.py": SERVER_ARGS_523, "sglang/srt/other.py": OTHER,
             "sglang/srt/arg_groups/field_order.py": FIELD_ORDER, "sglang/srt/arg_groups/fields/__init__.py": FIELDS_INIT,
             "sglang/srt/arg_groups/fields/ns.py": NAMESPACE, "sglang/srt/arg_groups/actions.py": ACTIONS,
             "sglang/srt/arg_groups/arg_utils.py": "A = None\nclass Arg:\n    pass\n"}
    _, flags = tool.extract_flags(_mini_wheel(tmp_path, files))
    full = {flag: tool.expand(flag, tool.compact(flag, entry)) for flag, entry in flags.items()}
    assert full == flags
    # POSITIONAL_FIELD_ORDER first (second, first), then declaration order; no_cli and un-annotated skipped
    assert list(flags) == ["--second", "--first", "--tp-size", "--mode", "--level", "--phase", "--sizes", "--names",
                           "--parsed", "--mixed", "--switch", "--maybe", "--paths", "--run", "--plain", "--hidden-old"]
    assert flags["--first"]["required"] is True and flags["--first"]["type"] == "str"
    assert (flags["--tp-size"]["dest"], flags["--tp-size"]["aliases"], flags["--tp-size"]["default"]) == (
        "tp_size", ["--tensor-parallel-size"], 1)
    assert (flags["--mode"]["type"], flags["--mode"]["choices"], flags["--mode"]["required"]) == ("str", ["a", "b"], False)
    assert (flags["--level"]["type"], flags["--level"]["choices"]) == ("int", [1, 2])
    assert flags["--phase"]["choices"] == ["one", "two"] and flags["--phase"]["notes"] == [
        "type parse_it is not known to the extractor"]
    assert (flags["--sizes"]["type"], flags["--sizes"]["nargs"]) == ("int", "+")
    assert (flags["--names"]["nargs"], flags["--names"]["choices"], flags["--names"]["default"]) == ("*", ["x", "y"], [])
    assert (flags["--parsed"]["type"], flags["--parsed"]["nargs"]) == ("json_list", None)
    assert (flags["--mixed"]["type"], flags["--mixed"]["nargs"]) == ("str", "*")  # a Union stays a scalar
    assert (flags["--switch"]["action"], flags["--switch"]["default"], flags["--switch"]["type"]) == (
        "store_true", False, None)
    assert (flags["--maybe"]["action"], flags["--maybe"]["default"]) == ("BooleanOptionalAction", None)
    assert (flags["--paths"]["action"], flags["--paths"]["type"], flags["--paths"]["nargs"]) == ("PathAction", "str", "*")
    assert (flags["--run"]["dest"], flags["--run"]["choices"], flags["--run"]["default"]) == ("runner", ["x", "y", "z"], "x")
    assert flags["--plain"]["default"] is None and flags["--plain"]["field"] == "plain"
    old = flags["--hidden-old"]
    assert (old["dest"], old["nargs"], old["default"], old["deprecated"], old["replacement"]) == (
        "hidden", 0, False, True, "--x y")
    assert (flags["--second"]["deprecated"], flags["--second"]["replacement"]) == (True, "--first")
    assert not any(flags[f]["deprecated"] for f in flags if f not in ("--second", "--hidden-old"))


def test_extractor_refuses_add_argument_inside_a_condition(tmp_path):
    src = (
        "class ServerArgs:\n"
        "    def add_cli_args(parser):\n"
        "        if True:\n"
        "            parser.add_argument('--hidden')\n"
    )
    with pytest.raises(ValueError, match="inside If"):
        tool.extract_flags(_mini_wheel(tmp_path, {"sglang/srt/server_args.py": src}))


# --------------------------------------------------------- the tables rebuild SGLang's argparse behaviour


def _parse_error(parser, argv):
    """The message argparse gives for argv (exits or raises, depending on the Python version)."""
    err = io.StringIO()
    saved, sys.stderr = sys.stderr, err
    try:
        parser.parse_args(argv)
    except argparse.ArgumentError as exc:
        return str(exc)
    except SystemExit:
        return err.getvalue()
    finally:
        sys.stderr = saved
    return None


@pytest.mark.parametrize("version, dests", [
    ("0.5.9", ("tensor_parallel_size", "pipeline_parallel_size", "expert_parallel_size")),
    ("0.5.23", ("tp_size", "pp_size", "ep_size")),
])
def test_table_reproduces_argparse_behaviour(version, dests):
    parser = build_parser(flags_of(version))
    ns = parser.parse_args(["--model-path", "/m", "--tp-size", "4", "--pp-size", "2", "--ep", "1"])
    assert tuple(getattr(ns, d) for d in dests) == (4, 2, 1)
    message = _parse_error(parser, ["--model-path", "/m", "--pp", "2"])
    assert message and "ambiguous option: --pp" in message
    for name in ("--pp-size", "--pp-max-micro-batch-size", "--pp-async-batch-depth"):
        assert name in message
    message = _parse_error(parser, ["--model-path", "/m", "--moe-runner-backend", "no_such_runner"])
    assert message and "invalid choice" in message


def test_0_5_23_argparse_knows_the_renamed_flags():
    parser = build_parser(flags_of("0.5.23"))
    ns = parser.parse_args(["--model", "/m", "--dsa-prefill-backend", "trtllm", "--context-length", "32k",
                            "--no-enable-tf32-matmul", "--numa-node", "0", "1", "--enable-dp-attention"])
    assert (ns.model_path, ns.dsa_prefill_backend, ns.context_length) == ("/m", "trtllm", 32000)
    assert ns.enable_tf32_matmul is False and ns.numa_node == [0, 1] and ns.enable_dp_attention is True
    message = _parse_error(parser, ["--model-path", "/m", "--nsa-prefill-backend", "trtllm"])
    assert message and "--nsa-prefill-backend" in message


UNSIZED_KV_DTYPES = {"0.5.9": set(), "0.5.23": {"fp4_mx_block16", "mxfp8", "nvfp4"}}


def test_everything_the_planner_writes_or_names_exists_in_each_table():
    """Flags the planner writes itself, server-arg keys it manages, and every choice its rules name."""
    from ansible_collections.topolaunch.sglang.plugins.module_utils import planner

    for version, flags in plan_args.FLAG_TABLES.items():
        index = plan_args.FlagIndex(version)
        for flag in plan_args.PLANNER_FLAGS:
            assert flag in flags, (version, flag)
        for key in ("model_path", "tp_size", "pp_size", "dp_size", "ep_size", "nnodes", "node_rank", "host", "port",
                    "dist_init_addr", "served_model_name", "base_gpu_id", "gpu_id_step", "api_key", "admin_api_key"):
            assert key in index.by_name, (version, key)
        a2a = flags["--moe-a2a-backend"]["choices"]
        assert set(planner.A2A_BACKENDS) <= set(a2a), version
        runners = flags["--moe-runner-backend"]["choices"]
        assert {"auto", "flashinfer_cutlass", "flashinfer_trtllm", "cutlass"} <= set(runners), version
        quant = flags["--quantization"]["choices"]
        assert {"fp8", "mxfp8", "modelopt_fp4", "modelopt_fp8", "compressed-tensors"} <= set(quant), version
        # KV dtypes the planner has no byte size for (it sizes them as the model's dtype: an over-estimate)
        unsized = set(flags["--kv-cache-dtype"]["choices"]) - set(planner.KV_DTYPE_BYTES) - {"auto"}
        assert unsized == UNSIZED_KV_DTYPES[version], version
        spec = flags["--speculative-algorithm"]["choices"]  # 0.5.23: any registered name (None)
        assert spec is None or {"STANDALONE", "NGRAM", "EAGLE"} <= set(spec), version
        for switch in ("--enable-mixed-chunk", "--enable-eplb", "--disable-overlap-schedule", "--trust-remote-code"):
            assert flags[switch]["action"] == "store_true", (version, switch)
        renamed = plan_args.RENAMED.get(version, {})
        for name in ("mem_fraction_static", "max_running_requests", "chunked_prefill_size", "cuda_graph_max_bs",
                     "max_prefill_tokens", "kv_cache_dtype", "moe_runner_backend", "moe_a2a_backend", "quantization",
                     "speculative_algorithm", "enable_mixed_chunk", "enable_eplb", "nsa_prefill_backend",
                     "nsa_decode_backend", "disable_overlap_schedule"):
            assert renamed.get(name, name) in index.by_name, (version, name)  # server-arg values the rules read
    for key in list(plan_args.MANAGED) + list(plan_args.SECRETS):
        assert any(key in plan_args.FlagIndex(v).by_name for v in plan_args.supported_versions()), key


def test_renamed_flags_exist_before_and_after():
    """Every hand-written rename names a flag of the version before and one of its own version."""
    versions = plan_args.supported_versions()
    for version, renames in plan_args.RENAMED.items():
        before = plan_args.FlagIndex(versions[versions.index(version) - 1])
        now = plan_args.FlagIndex(version)
        for old, new in renames.items():
            assert old in before.by_name and old not in now.by_name, old
            assert new in now.by_name, new


@pytest.mark.parametrize("version", VERSIONS)
def test_planner_argv_uses_only_canonical_long_flags(version):
    flags = flags_of(version)
    for flag in plan_args.PLANNER_FLAGS:
        assert flag.startswith("--") and flags[flag]["aliases"] == [s for s in flags[flag]["option_strings"] if s != flag]
    # an abbreviation SGLang's argparse would take is never a key: keys are full option strings
    assert all(flag in flags[flag]["option_strings"] for flag in flags)


def test_diff_lists_what_a_user_meets():
    lines = tool.diff_tables("0.5.9", "0.5.23")
    removed = lines[2:lines.index("### Flags of 0.5.9 that are aliases in 0.5.23 (1)")]
    assert "- `--nsa-prefill-backend`" in removed and "- `--cuda-graph-max-bs`" in removed
    assert "- `--tp-size`" not in removed
    assert "- `--hierarchical-sparse-attention-extra-config` -> `--hisparse-config`" in lines
    assert "- `--enable-dp-attention`: use `--attn-dp-size <dp-size>`" in lines
    assert "- `--tp-size`: dest 'tensor_parallel_size' -> 'tp_size'" in lines
