"""The committed SGLang flag table equals what tools/sglang_flags.py extracts from the pinned wheel."""
import argparse
import glob
import importlib.util
import io
import pathlib
import socket
import subprocess
import sys
import zipfile

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import sglang_flags_0_5_9 as table

ROOT = pathlib.Path(__file__).resolve().parents[2]
WHEEL_DIR = ROOT / "build" / "wheels"


def _load_tool():
    spec = importlib.util.spec_from_file_location("sglang_flags_tool", ROOT / "tools" / "sglang_flags.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tool = _load_tool()


def _pypi_reachable():
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def wheel():
    found = sorted(glob.glob(str(WHEEL_DIR / ("sglang-%s-*.whl" % table.VERSION))))
    if found:
        return found[0]
    if not _pypi_reachable():
        pytest.skip("sglang %s wheel not in %s and pypi.org:443 is unreachable" % (table.VERSION, WHEEL_DIR))
    WHEEL_DIR.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "sglang==%s" % table.VERSION, "-d", str(WHEEL_DIR)], check=True)
    return sorted(glob.glob(str(WHEEL_DIR / ("sglang-%s-*.whl" % table.VERSION))))[0]


def test_committed_table_matches_the_wheel(wheel):
    version, flags = tool.extract_flags(wheel)
    assert version == table.VERSION
    assert list(flags) == list(table.FLAGS), "flag set or order differs: regenerate with tools/sglang_flags.py"
    for flag, entry in flags.items():
        assert entry == table.FLAGS[flag], flag
    module_file = ROOT / "module_utils" / "topolaunch" / "sglang_flags_0_5_9.py"
    assert tool.render_module(version, flags, pathlib.Path(wheel).name) == module_file.read_text()


def test_check_mode_reports_a_stale_table(wheel, tmp_path):
    stale = tmp_path / "flags.py"
    stale.write_text("VERSION = '0.5.9'\nFLAGS = {}\n")
    assert tool.main(["--wheel", wheel, "--out", str(stale), "--check"]) == 1
    assert tool.main(["--wheel", wheel, "--out", str(tmp_path / "fresh.py")]) == 0
    assert tool.main(["--wheel", wheel, "--out", str(tmp_path / "fresh.py"), "--check"]) == 0


def test_known_flags_of_0_5_9():
    flags = table.FLAGS
    assert flags["--tp-size"]["option_strings"] == ["--tensor-parallel-size", "--tp-size"]
    assert flags["--tp-size"]["dest"] == "tensor_parallel_size" and flags["--tp-size"]["field"] == "tp_size"
    assert flags["--pp-size"]["aliases"] == ["--pipeline-parallel-size"]
    assert flags["--ep-size"]["option_strings"] == ["--expert-parallel-size", "--ep-size", "--ep"]
    assert flags["--fp8-gemm-backend"]["field"] == "fp8_gemm_runner_backend"
    assert "cutlass" in flags["--fp8-gemm-backend"]["choices"]
    assert "flashinfer_cutlass" in flags["--moe-runner-backend"]["choices"]
    assert "trtllm" in flags["--nsa-decode-backend"]["choices"]
    assert flags["--trust-remote-code"]["action"] == "store_true"
    assert flags["--trust-remote-code"]["default"] is False
    assert flags["--model-path"]["required"] is True
    assert flags["--mem-fraction-static"]["type"] == "float"
    assert "--pp" not in flags and "--tp" not in flags


def _mini_wheel(tmp_path, server_args_source):
    path = tmp_path / "sglang-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("sglang-9.9.9.dist-info/METADATA", "Metadata-Version: 2.1\nName: sglang\nVersion: 9.9.9\n")
        zf.writestr("sglang/srt/server_args.py", server_args_source)
        zf.writestr("sglang/srt/other.py", "NAMES = ['x', 'y']\nclass Reg:\n    M = {'k1': object, 'k2': int}\n")
    return str(path)


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
        "    @classmethod\n"
        "    def from_cli_args(cls, args):\n"
        "        args.size = args.long_size\n"
    )
    version, flags = tool.extract_flags(_mini_wheel(tmp_path, src))
    assert version == "9.9.9"
    assert flags["--size"]["default"] == 6 and flags["--size"]["dest"] == "long_size"
    assert flags["--size"]["aliases"] == ["--long-size"]
    assert flags["--items"]["choices"] == ["a", "b", "x", "y"] and flags["--items"]["default"] == []
    assert flags["--reg"]["choices"] == ["k1", "k2"]
    assert flags["--gone"]["choices"] is None
    assert any("GONE" in note for note in flags["--gone"]["notes"])


def test_extractor_refuses_add_argument_inside_a_condition(tmp_path):
    src = (
        "class ServerArgs:\n"
        "    def add_cli_args(parser):\n"
        "        if True:\n"
        "            parser.add_argument('--hidden')\n"
    )
    with pytest.raises(ValueError, match="inside If"):
        tool.extract_flags(_mini_wheel(tmp_path, src))


def build_parser(flags):
    """argparse as SGLang builds it, from the table (the lab simulator does the same)."""
    parser = argparse.ArgumentParser(prog="launch_server", exit_on_error=False)
    types = {"int": int, "float": float, "str": str, None: None}
    for entry in flags.values():
        kwargs = {"dest": entry["dest"], "default": entry["default"]}
        if entry["action"] in ("store_true", "store_false"):
            kwargs["action"] = entry["action"]
        elif entry["action"] == "DeprecatedAction":
            kwargs["action"] = "store_true"
        else:
            kwargs["type"] = types.get(entry["type"], str)
            for key in ("nargs", "choices", "const"):
                if entry[key] is not None:
                    kwargs[key] = entry[key]
        parser.add_argument(*entry["option_strings"], **kwargs)
    return parser


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


def test_table_reproduces_argparse_behaviour():
    parser = build_parser(table.FLAGS)
    ns = parser.parse_args(["--model-path", "/m", "--tp-size", "4", "--pp-size", "2", "--ep", "1"])
    assert (ns.tensor_parallel_size, ns.pipeline_parallel_size, ns.expert_parallel_size) == (4, 2, 1)
    message = _parse_error(parser, ["--model-path", "/m", "--pp", "2"])
    assert message and "ambiguous option: --pp" in message
    for name in ("--pp-size", "--pp-max-micro-batch-size", "--pp-async-batch-depth"):
        assert name in message
    message = _parse_error(parser, ["--model-path", "/m", "--moe-runner-backend", "no_such_runner"])
    assert message and "invalid choice" in message


def test_everything_the_planner_writes_or_names_exists_in_each_table():
    """Flags the planner writes itself, server-arg keys it manages, and every choice its rules name."""
    from ansible_collections.topolaunch.sglang.plugins.module_utils import plan_args
    from ansible_collections.topolaunch.sglang.plugins.module_utils import planner

    for version, flags in plan_args.FLAG_TABLES.items():
        index = plan_args.FlagIndex(version)
        for flag in plan_args.PLANNER_FLAGS:
            assert flag in flags, (version, flag)
        for key in plan_args.MANAGED:
            assert key in index.by_name, (version, key)  # refusing a key that is not a flag would be pointless
        for key in plan_args.SECRETS:
            assert key in index.by_name, (version, key)
        a2a = flags["--moe-a2a-backend"]["choices"]
        assert set(planner.A2A_BACKENDS) <= set(a2a), version
        runners = flags["--moe-runner-backend"]["choices"]
        assert {"auto", "flashinfer_cutlass", "flashinfer_trtllm", "cutlass"} <= set(runners), version
        quant = flags["--quantization"]["choices"]
        assert {"fp8", "mxfp8", "modelopt_fp4", "modelopt_fp8", "compressed-tensors"} <= set(quant), version
        assert set(planner.KV_DTYPE_BYTES) | {"auto"} == set(flags["--kv-cache-dtype"]["choices"]), version
        assert {"STANDALONE", "NGRAM", "EAGLE"} <= set(flags["--speculative-algorithm"]["choices"]), version
        for switch in ("--enable-mixed-chunk", "--enable-eplb", "--disable-overlap-schedule", "--trust-remote-code"):
            assert flags[switch]["action"] == "store_true", (version, switch)
        for name in ("mem_fraction_static", "max_running_requests", "chunked_prefill_size", "cuda_graph_max_bs",
                     "max_prefill_tokens", "kv_cache_dtype", "moe_runner_backend", "moe_a2a_backend", "quantization",
                     "speculative_algorithm", "enable_mixed_chunk", "enable_eplb", "nsa_prefill_backend",
                     "nsa_decode_backend", "disable_overlap_schedule"):
            assert name in index.by_name, (version, name)  # server-arg values the planner's rules read


def test_planner_argv_uses_only_canonical_long_flags():
    from ansible_collections.topolaunch.sglang.plugins.module_utils import plan_args

    flags = plan_args.FLAG_TABLES["0.5.9"]
    for flag in plan_args.PLANNER_FLAGS:
        assert flag.startswith("--") and flags[flag]["aliases"] == [s for s in flags[flag]["option_strings"] if s != flag]
    # an abbreviation SGLang's argparse would take is never a key: keys are full option strings
    assert all(flag in flags[flag]["option_strings"] for flag in flags)
