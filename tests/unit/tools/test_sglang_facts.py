"""The committed SGLang facts tables equal what tools/sglang_facts.py extracts from each supported version's wheel,
a few facts read by hand from each wheel's source text are what the tables say, and a source whose shape the
extractor does not know stops it naming the fact."""
import socket
import zipfile

import pytest

import paths
from ansible_collections.topolaunch.sglang.plugins.module_utils import planner

ROOT = paths.ROOT


def _load(name, file):
    return paths.load_script(ROOT / "tools" / file, name)


tool = _load("sglang_facts_tool", "sglang_facts.py")
VERSIONS = sorted(tool.WHEELS)


def wheel_of(version):
    """The pinned wheel in build/wheels (`make sglang-wheel`), downloaded when missing and pypi.org is reachable."""
    path = tool.FLAGS_TOOL.WHEEL_DIR / tool.WHEELS[version]["file"]
    if not path.is_file():
        try:
            socket.create_connection(("pypi.org", 443), timeout=5).close()
        except OSError:
            pytest.skip("%s not in %s and pypi.org:443 is unreachable" % (path.name, path.parent))
    return tool.FLAGS_TOOL.download_wheel(version)


def source(version, name):
    with zipfile.ZipFile(str(wheel_of(version))) as z:
        return z.read(name).decode("utf-8")


def test_every_supported_version_has_a_facts_table():
    assert sorted(planner.SGLANG_FACTS) == sorted(VERSIONS)
    for version in VERSIONS:
        assert tool.table_path(version).is_file(), version


@pytest.mark.parametrize("version", VERSIONS)
def test_committed_table_matches_the_wheel(version):
    facts = tool.extract_facts(wheel_of(version))
    assert facts["VERSION"] == version
    assert tool.render(facts) == tool.table_path(version).read_text(encoding="utf-8"), \
        "run tools/sglang_facts.py --all"
    module = planner.SGLANG_FACTS[version]
    for key in ("MEMORY", "CUDA_GRAPH", "RUNNING", "PP", "SPARSE_ATTENTION_BACKENDS", "BACKENDS"):
        assert getattr(module, key) == facts[key], key


def test_check_mode_reports_a_stale_table(tmp_path):
    wheel = wheel_of("0.5.9")
    stale = tmp_path / "facts.py"
    stale.write_text("VERSION = '0.5.9'\n")
    assert tool.main(["--wheel", str(wheel), "--out", str(stale), "--check"]) == 1
    assert tool.main(["--wheel", str(wheel), "--out", str(tmp_path / "fresh.py")]) == 0
    assert tool.main(["--wheel", str(wheel), "--out", str(tmp_path / "fresh.py"), "--check"]) == 0


# ------------------------------------------------------- spot checks, read by hand from the wheels' text


def test_known_facts_of_0_5_23():
    f = planner.SGLANG_FACTS["0.5.23"]
    memory_hook = source("0.5.23", "sglang/srt/arg_groups/memory_hook.py")
    # elif gpu_mem < 160 * 1024: # H20, H200 ... chunked_prefill_size=8192 ... 256 if tp < 4 else 512
    assert "elif gpu_mem < 160 * 1024:" in memory_hook and "# H20, H200" in memory_hook
    h200 = next(b for b in f.MEMORY["brackets"] if b["below_mib"] == 160 * 1024)
    assert (h200["chunked_prefill_size"], h200["small_tp_below"], h200["small_tp_cuda_graph_max_bs"],
            h200["cuda_graph_max_bs"]) == (8192, 4, 256, 512)
    # A10, 4090, 5090: (chunked_prefill_size 4k, max_bs 48 if tp < 4 else 160)
    assert "(chunked_prefill_size 4k, max_bs 48 if tp < 4 else 160)" in memory_hook
    a10 = next(b for b in f.MEMORY["brackets"] if b["below_mib"] == 35 * 1024)
    assert (a10["chunked_prefill_size"], a10["small_tp_cuda_graph_max_bs"], a10["cuda_graph_max_bs"]) == (4096, 48, 160)
    # reserve_for_graph_mb: reserved_mem += len(prefill_cuda_graph_config.bs) * 8; MLA: 1.5 * 1024
    assert "reserved_mem += len(prefill_cuda_graph_config.bs) * 8" in memory_hook
    assert (f.MEMORY["reserve"]["prefill_graph_mib_per_size"], f.MEMORY["reserve"]["prefill_graph_mla_mib"]) == (8, 1536)
    assert f.MEMORY["reserve"]["graph_reserve_when_disabled"] is False and f.MEMORY["speculative_reserve_mib"] == {}
    # cuda_graph_hook.py: if cfg.cuda_graph_max_bs_decode is not None: _set(Phase.DECODE, "max_bs", ...)
    hook = source("0.5.23", "sglang/srt/arg_groups/cuda_graph_hook.py")
    assert '_set(Phase.DECODE, "max_bs", cfg.cuda_graph_max_bs_decode)' in hook
    assert (f.CUDA_GRAPH["max_bs_arg"], f.CUDA_GRAPH["bs_arg"]) == ("cuda_graph_max_bs_decode", "cuda_graph_bs_decode")
    assert "disable_decode_cuda_graph" in f.CUDA_GRAPH["disable_args"]
    assert f.CUDA_GRAPH["max_bs_capped_by_max_running_requests"] is True and f.CUDA_GRAPH["prefill"]["default_on"]
    # kv_cache_configurator.resolve_max_num_reqs: max(1, max_num_reqs // self.attn_dp_size)
    kvc = source("0.5.23", "sglang/srt/mem_cache/kv_cache_configurator.py")
    assert "requested_per_worker = max(1, max_num_reqs // self.attn_dp_size)" in kvc
    assert "estimated = max(min(estimated, 4096), 2048)" in kvc
    assert (f.RUNNING["pool_min"], f.RUNNING["pool_max"], f.RUNNING["pool_per_context_len"]) == (2048, 4096, 512)
    assert "max_num_reqs = min(requested_per_worker, token_capacity // 2)" in kvc
    assert f.RUNNING["server_arg_divided_by"] == "attention_dp_size" and f.RUNNING["server_arg_capped_by_kv_tokens"]
    assert f.PP["sets"] == {"disable_overlap_schedule": True, "cuda_graph_backend_prefill": "disabled"}
    assert "speculative_algorithm" in f.PP["refuses"] and "enable_mixed_chunk" not in f.PP["refuses"]


def test_known_facts_of_0_5_9():
    f = planner.SGLANG_FACTS["0.5.9"]
    server_args = source("0.5.9", "sglang/srt/server_args.py")
    # (chunked_prefill_size 2k, cuda_graph_max_bs 24 if tp < 4 else 80)
    assert "(chunked_prefill_size 2k, cuda_graph_max_bs 24 if tp < 4 else 80)" in server_args
    a10 = next(b for b in f.MEMORY["brackets"] if b["below_mib"] == 35 * 1024)
    assert (a10["chunked_prefill_size"], a10["small_tp_cuda_graph_max_bs"], a10["cuda_graph_max_bs"]) == (2048, 24, 80)
    assert f.MEMORY["brackets"][-1] == {"below_mib": None, "chunked_prefill_size": 16384, "cuda_graph_max_bs": 512,
                                        "small_tp_below": None, "small_tp_cuda_graph_max_bs": None}
    # reserved_mem = 512; += max(chunked_prefill_size, 2048) * 1.5; += cuda_graph_max_bs * 2; tp*pp/8*1024
    r = f.MEMORY["reserve"]
    assert (r["base_mib"], r["activation_min_tokens"], r["activation_mib_per_token"], r["graph_mib_per_bs"],
            r["parallel_mib_per_gpu"], r["floor_mib"], r["floor_above_mib"]) == (512, 2048, 1.5, 2, 128, 10240, 61440)
    assert f.MEMORY["speculative_reserve_mib"] == {"STANDALONE": 6144, "*": 2048, "except": ["NGRAM"]}
    assert (f.CUDA_GRAPH["max_bs_arg"], f.CUDA_GRAPH["bs_arg"], f.CUDA_GRAPH["disable_args"]) == (
        "cuda_graph_max_bs", "cuda_graph_bs", ["disable_cuda_graph"])
    assert f.CUDA_GRAPH["prefill"]["default_on"] is False
    # model_runner.py: self.dp_size = server_args.dp_size if server_args.enable_dp_attention else 1
    runner = source("0.5.9", "sglang/srt/model_executor/model_runner.py")
    assert "self.dp_size = server_args.dp_size if server_args.enable_dp_attention else 1" in runner
    assert "else server_args.max_running_requests // (self.dp_size)" in runner
    assert f.RUNNING["server_arg_divided_by"] == "attention_dp_size"
    assert f.RUNNING["server_arg_capped_by_kv_tokens"] is False
    # check_server_args: pp > 1 asserts disable_overlap_schedule, no speculative decoding, no mixed chunk
    assert f.PP["refuses"] == ["enable_mixed_chunk", "speculative_algorithm"]
    assert f.SPARSE_ATTENTION_BACKENDS == ["nsa_decode_backend", "nsa_prefill_backend"]


def test_the_multithreaded_loader_of_each_release():
    # 0.5.9: use_multithread = extra_config.get("enable_multithread_load", False); 0.5.23: ... True
    for version, on in (("0.5.9", False), ("0.5.23", True)):
        loader = source(version, "sglang/srt/model_loader/loader.py")
        assert 'use_multithread = extra_config.get("enable_multithread_load", %s)' % on in loader
        assert "DEFAULT_NUM_THREADS = 8" in loader
        assert planner.SGLANG_FACTS[version].LOADER == {
            "source": "sglang/srt/model_loader/loader.py:DefaultModelLoader._get_weights_iterator",
            "arg": "model_loader_extra_config", "switch": "enable_multithread_load", "default_on": on,
            "threads_key": "num_threads", "default_threads": 8,
            "allowed_keys": ["enable_multithread_load", "num_threads"]}


def test_capture_sizes_follow_the_table():
    capture = planner.SGLANG_FACTS["0.5.23"].CUDA_GRAPH["capture_bs"]
    sizes = planner.capture_sizes(capture, 100)
    assert sizes[:6] == [1, 2, 4, 8, 12, 16] and sizes[-1] == 100   # 0.5.23 appends max_bs
    assert planner.capture_sizes(planner.SGLANG_FACTS["0.5.9"].CUDA_GRAPH["capture_bs"], 100)[-1] == 96


def test_a_source_of_another_shape_stops_the_tool_naming_the_fact(tmp_path):
    wheel = tmp_path / "sglang-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(str(wheel), "w") as z:
        z.writestr("sglang-9.9.9.dist-info/METADATA", "Name: sglang\nVersion: 9.9.9\n")
        z.writestr("sglang/srt/arg_groups/memory_hook.py",
                   "def handle_gpu_memory_settings(server_args):\n    gpu_mem = 1\n    return gpu_mem\n")
    with pytest.raises(tool.FactError, match="memory_hook.py:handle_gpu_memory_settings has no `if gpu_mem < N`"):
        tool.extract_facts(wheel)
    assert tool.main(["--wheel", str(wheel), "--out", str(tmp_path / "x.py")]) == 1
