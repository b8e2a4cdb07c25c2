"""tools/known_combinations.py: the committed facts equal what it reads from each pinned wheel, its readers find
each fact in a small wheel (and report None where a release lacks it), and the README's table is the rules'."""
import socket
import zipfile

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import known_combinations as kc
from ansible_collections.topolaunch.sglang.plugins.module_utils import known_combinations_facts
import paths

ROOT = paths.ROOT


def _load_tool():
    return paths.load_script(ROOT / "tools" / "known_combinations.py", "known_combinations_tool")


tool = _load_tool()
VERSIONS = tool.versions()


def _pypi_reachable():
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


def wheel_of(version):
    """The pinned wheel in build/wheels (`make sglang-wheel` fetches them); downloaded here when missing."""
    path = tool.flags_tool.WHEEL_DIR / tool.flags_tool.WHEELS[version]["file"]
    if not path.is_file() and not _pypi_reachable():
        pytest.skip("%s not in %s and pypi.org:443 is unreachable" % (path.name, tool.flags_tool.WHEEL_DIR))
    return tool.flags_tool.download_wheel(version)


@pytest.fixture(scope="module")
def extracted():
    return {v: tool.extract_facts(wheel_of(v)) for v in VERSIONS}


def test_committed_facts_are_the_wheels(extracted):
    facts = {}
    for version in VERSIONS:
        got_version, facts[version] = extracted[version]
        assert got_version == version
        assert facts[version] == known_combinations_facts.FACTS[version], version
    assert set(known_combinations_facts.FACTS) == set(VERSIONS)
    assert tool.render_facts(facts) == tool.FACTS_MODULE.read_text(), "run tools/known_combinations.py"


def test_readme_table_is_the_rules():
    text = tool.README.read_text()
    assert tool.readme_with_table(text, kc.RULES) == text, "README's known combinations: run tools/known_combinations.py"
    table = text[text.index(tool.BEGIN):text.index(tool.END)]
    for rule in kc.RULES:
        assert "`%s`" % rule["id"] in table and rule["source"] in table
    # a rule changed in the data makes the committed table stale
    changed = [dict(kc.RULES[0], server_args={"kv_cache_dtype": "bfloat16"})] + list(kc.RULES[1:])
    assert tool.readme_with_table(text, changed) != text
    with pytest.raises(ValueError, match="markers"):
        tool.readme_with_table("# no table here\n", kc.RULES)


def _wheel(tmp_path, files, version="9.9.9"):
    path = tmp_path / ("sglang-%s-py3-none-any.whl" % version)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("sglang-%s.dist-info/METADATA" % version, "Metadata-Version: 2.1\nName: sglang\nVersion: %s\n" % version)
        for name, text in files.items():
            zf.writestr(name, text)
    return str(path)


ENVIRON = (
    "class EnvBool:\n"
    "    def parse(self, value):\n"
    "        value = value.lower()\n"
    "        if value in ['true', '1']:\n            return True\n"
    "        if value in ['false', '0']:\n            return False\n"
    "class Envs:\n"
    "    SGLANG_ENABLE_JIT_DEEPGEMM = EnvBool(True)\n"
    "    OTHER = EnvBool(False)\n"
)
CONFIGURER = (
    "def _compute_enable_deep_gemm():\n"
    "    sm_version = get_device_sm()\n"
    "    if sm_version < 90:\n        return False\n"
    "    return envs.SGLANG_ENABLE_JIT_DEEPGEMM.get()\n"
)
OVERRIDES = (
    "def _dsa_kv_cache_dtype_default(view):\n"
    "    major, _ = get()\n"
    "    kv = 'fp8_e4m3' if major >= 11 and not sinks else 'bfloat16'\n"
    "    return {'kv_cache_dtype': kv}\n"
    "def _dsa_split_backend_resolution(view):\n"
    "    declared = {}\n"
    "    default = 'trtllm' if major >= 10 else 'flashmla_kv'\n"
    "    declared['dsa_prefill_backend'] = default\n"
    "    declared['dsa_decode_backend'] = 'fa3'\n"
    "    return declared\n"
)
DEEPSEEK = (
    "def _deepseek_family_overrides(server_args, hf_config):\n"
    "    if is_deepseek_dsa(hf_config):\n"
    "        if is_attention_backend_not_set(cfg):\n"
    "            overrides['attention_backend'] = 'dsa'\n"
)


def test_readers_find_each_fact_in_a_small_wheel(tmp_path):
    version, facts = tool.extract_facts(_wheel(tmp_path, {
        "sglang/srt/environ.py": ENVIRON,
        "sglang/srt/layers/deep_gemm_wrapper/configurer.py": CONFIGURER,
        "sglang/srt/arg_groups/overrides.py": OVERRIDES,
        "sglang/srt/arg_groups/model_overrides/deepseek_v2.py": DEEPSEEK,
    }))
    assert version == "9.9.9"
    assert facts["env"] == {"SGLANG_ENABLE_JIT_DEEPGEMM": {"type": "EnvBool", "default": True},
                            "SGLANG_ENABLE_DEEP_GEMM": None, "SGLANG_ENABLE_SPEC_V2": None}
    assert facts["env_bool_words"] == {"true": ["true", "1"], "false": ["false", "0"]}
    assert facts["deepgemm_gate"]["reads_env"] == ["SGLANG_ENABLE_JIT_DEEPGEMM"]
    assert facts["deepgemm_gate"]["sm_checks"] == ["sm_version < 90"]
    assert facts["dsa_kv_cache_default"] == {
        "where": "sglang/srt/arg_groups/overrides.py:_dsa_kv_cache_dtype_default", "sm_major_at_least": 11,
        "then": "fp8_e4m3", "else": "bfloat16"}
    assert facts["dsa_backends_picked"]["backends"] == ["fa3", "flashmla_kv", "trtllm"]
    assert facts["dsa_attention_backend"] == {"where": "sglang/srt/arg_groups/model_overrides/deepseek_v2.py",
                                              "value": "dsa", "only_when_unset": True}
    assert facts["dsa_flashinfer_kv"] is None
    # a release whose SM threshold is 11 still claims fp8 on SM 12; one of 13 would not
    rule = kc.RULES[0]
    assert kc._claim_dsa_kv_default_fp8(facts, {}, rule)[0] == []
    facts["dsa_kv_cache_default"]["sm_major_at_least"] = 13
    assert kc._claim_dsa_kv_default_fp8(facts, {}, rule)[0]


def test_a_release_without_the_code_gives_none(tmp_path):
    _version, facts = tool.extract_facts(_wheel(tmp_path, {"sglang/srt/server_args.py": "class ServerArgs:\n    pass\n"}))
    assert facts == {"env": None, "env_bool_words": None, "deepgemm_gate": None, "dsa_kv_cache_default": None,
                     "dsa_attention_backend": None, "dsa_backends_picked": None, "dsa_flashinfer_kv": None}
