"""Known combinations: the table's shape (keyed on architecture, attention, quantization and version, never a name),
each rule's claims against the facts read from the releases' wheels, and the planner applying the rules (issue 28's
acceptance: the field spec + GLM-5)."""
import copy
import re

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import known_combinations as kc
from ansible_collections.topolaunch.sglang.plugins.module_utils import model_config, planner
from ansible_collections.topolaunch.sglang.plugins.module_utils.plan_args import FLAG_TABLES, FlagIndex, supported_versions
from flag_cases import build_parser
from plan_cases import FIELD_ARGS, FIELD_ARGS_0_5_23, MODEL_NAMES, model_input, model_path, synth_facts

VNUMA = "proxmox-8x-rtx-pro-6000-vnuma"   # the field box: 8 x RTX PRO 6000, compute capability 12.0
HGX = "hgx-8x-h100-nvswitch"              # compute capability 9.0
GLM5 = model_path("glm-5-nvfp4")


@pytest.fixture(scope="module")
def field(tmp_path_factory):
    return synth_facts(VNUMA, tmp_path_factory.mktemp("vnuma"))


@pytest.fixture(scope="module")
def hgx(tmp_path_factory):
    return synth_facts(HGX, tmp_path_factory.mktemp("hgx"))


def _plan(topology, version="0.5.9", **fields):
    return planner.plan(planner.PlanRequest(topology=topology, model_path=GLM5, layout="tp8", sglang_version=version,
                                            **fields))


def _pairs(argv):
    return {w: argv[k + 1] for k, w in enumerate(argv[:-1]) if w.startswith("--")}


# ------------------------------------------------------------------------------------------ the table itself


def test_rules_are_keyed_on_what_runs_never_on_a_name():
    ids = [r["id"] for r in kc.RULES]
    assert len(ids) == len(set(ids)) and all(re.match(r"^[a-z0-9-]+$", i) for i in ids)
    names = {n.lower() for n in model_config.NSA_ARCHITECTURES} | {n.lower() for n in MODEL_NAMES}
    for rule in kc.RULES:
        assert set(rule) <= set(kc.RULE_KEYS), rule["id"]
        assert set(rule["when"]) <= set(kc.WHEN_KEYS), rule["id"]
        assert all(isinstance(m, int) for m in rule["when"].get("compute_capability_major", ())), rule["id"]
        assert set(rule["when"].get("attention", ())) <= set(kc.ATTENTION_KINDS), rule["id"]
        for value in rule["when"].get("quantization", ()):
            assert value in FLAG_TABLES["0.5.9"]["--quantization"]["choices"], rule["id"]
        keyed = repr(rule["when"]).lower() + repr(rule["sglang"]).lower()
        assert not any(name in keyed for name in names), rule["id"]
        assert sum(bool(rule.get(k)) for k in ("server_args", "env", "refuse")) >= 1, rule["id"]
        assert rule["source"].startswith("https://") and rule["source_name"], rule["id"]
        assert set(rule["sglang"]) == {"min", "max"}, rule["id"]


def test_each_rule_was_checked_against_every_supported_release_it_applies_to():
    for rule in kc.RULES:
        covered = [v for v in supported_versions()
                   if kc.applies(dict(rule, when={}), {}, [], v)]   # the version range alone
        assert set(covered) <= set(rule["checked"]), rule["id"]
        for version in rule["checked"]:
            index = FlagIndex(version)
            for key in rule.get("server_args") or {}:
                assert key in index.by_name, (rule["id"], version, key)


@pytest.mark.parametrize("rule", kc.RULES, ids=lambda r: r["id"])
def test_claims_hold_against_the_facts_of_each_checked_release(rule):
    for version in rule["checked"]:
        problems, said = kc.check_claims(rule, version, FLAG_TABLES[version])
        assert problems == [], (version, problems)
        assert said, version  # the plan's reason quotes the release


def test_a_claim_the_release_contradicts_is_reported(monkeypatch):
    facts = copy.deepcopy(kc.FACTS)
    facts["0.5.23"]["dsa_kv_cache_default"]["then"] = "bfloat16"     # a release that already defaults to bf16
    facts["0.5.23"]["env"]["SGLANG_ENABLE_JIT_DEEPGEMM"] = None         # a release without the switch
    facts["0.5.23"]["dsa_flashinfer_kv"] = None                         # a flashinfer DSA backend for any KV
    monkeypatch.setattr(kc, "FACTS", facts)
    rules = {r["id"]: r for r in kc.RULES}
    flags = FLAG_TABLES["0.5.23"]
    assert any("fp8_e4m3" in p for p in kc.check_claims(rules["sm12-mla-kv-bf16"], "0.5.23", flags)[0])
    assert any("SGLANG_ENABLE_JIT_DEEPGEMM" in p for p in kc.check_claims(rules["sm12-deepgemm-off"], "0.5.23", flags)[0])
    assert any("flashinfer_sparse_mla" in p
               for p in kc.check_claims(rules["sm12-dsa-attention-flashinfer"], "0.5.23", flags)[0])
    assert kc.check_claims(rules["sm12-mla-kv-bf16"], "9.9.9", flags)[0]
    # the plan still applies the rule, and says that its claims no longer hold for this release
    index = FlagIndex("0.5.23")
    got = kc.apply({"nsa": True, "mla": True}, ["12.0"], index, {}, {})
    assert any("claims about SGLang 0.5.23 do not hold" in w for w in got["warnings"])


def test_attention_kind_and_matching():
    glm5 = model_config.model_facts(model_input("glm-5-nvfp4")["config"], 1)
    v3 = model_config.model_facts(model_input("deepseek-v3")["config"], 1)
    llama = model_config.model_facts(model_input("llama-3.1-70b")["config"], 1)
    assert [kc.attention_kind(m) for m in (glm5, v3, llama)] == ["dsa", "mla", "mha_gqa"]
    rule = dict(kc.RULES[0], when={"compute_capability_major": (12,), "attention": ("mla",),
                                   "quantization": ("fp8",)}, sglang={"min": "0.5.10", "max": "0.5.23"})
    assert kc.applies(rule, v3, ["12.0"], "0.5.23")
    assert not kc.applies(rule, v3, ["9.0"], "0.5.23")           # another architecture
    assert not kc.applies(rule, llama, ["12.0"], "0.5.23")       # another attention kind
    assert not kc.applies(rule, dict(v3, quantization=None), ["12.0"], "0.5.23")
    assert not kc.applies(rule, v3, ["12.0"], "0.5.9")           # below the range
    assert not kc.applies(rule, v3, ["12.0"], "0.6.0")           # above it
    assert kc.applies(rule, v3, ["9.0", "12.0"], "0.5.23")       # any GPU of the plan


def test_operator_value_wins_in_any_spelling_and_a_refusal_refuses():
    index = FlagIndex("0.5.9")
    dsa = {"nsa": True, "mla": True}
    got = kc.apply(dsa, ["12.0"], index, {"kv_cache_dtype": "fp8_e4m3"}, {"kv_cache_dtype": "fp8_e4m3"})
    assert got["server_args"]["kv_cache_dtype"] == "fp8_e4m3"
    assert got["server_args"]["attention_backend"] == "flashinfer"
    assert got["applied"][0]["kept"] == {"kv_cache_dtype": "fp8_e4m3"}
    # the same value as the rule: no warning; a preflight fix (not the operator's) is never replaced either
    got = kc.apply(dsa, ["12.0"], index, {"kv_cache_dtype": "bf16"}, {"kv_cache_dtype": "bf16"})
    assert got["warnings"] == [] and got["applied"][0]["server_args"] == {}
    refusing = [dict(kc.RULES[0], id="refuse-it", server_args=None, refuse="this cannot serve", claims=())]
    got = kc.apply(dsa, ["12.0"], index, {}, {}, rules=refusing)
    assert got["refusals"] == ["known combination refuse-it: this cannot serve (%s; source: %s)"
                               % (kc.RULES[0]["problem"], kc.RULES[0]["source_name"])]
    assert kc.apply(None, ["12.0"], index, {}, {})["applied"] == []


# ------------------------------------------------------------------------------------ the planner applies them


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_field_spec_glm5_gets_bf16_kv_and_deepgemm_off_with_their_sources(field, version):
    plan = _plan(field, version)
    pairs = _pairs(plan["argv"])
    assert pairs["--kv-cache-dtype"] == "bf16" and pairs["--attention-backend"] == "flashinfer"
    assert plan["env"]["SGLANG_ENABLE_JIT_DEEPGEMM"] == "0"
    assert "SGLANG_ENABLE_DEEP_GEMM" not in plan["env"]  # the source's second switch: neither release reads it
    rules = {r["id"]: r for r in kc.RULES}
    for rule_id in ("sm12-mla-kv-bf16", "sm12-deepgemm-off", "sm12-dsa-attention-flashinfer"):
        assert "Known combination %s:" % rule_id in plan["reason"]
        assert rules[rule_id]["source_name"] in plan["reason"]
    assert "fp8_e4m3 (%s)" % kc.FACTS[version]["dsa_kv_cache_default"]["where"] in plan["reason"]
    assert [a["id"] for a in plan["known_combinations"]] == [r["id"] for r in kc.RULES]
    assert plan["known_combinations"][0]["source"] == rules["sm12-mla-kv-bf16"]["source"]
    # the memory fit is made with the bf16 cache: 2 bytes for the latent
    assert plan["memory"]["kv_bytes_per_token"] == (512 + 64) * 2 * 78 + (128 + 4) * 78
    # the release's own argparse (rebuilt from its flag table, as the lab's simulator does) takes the argv
    ns = build_parser(FLAG_TABLES[version]).parse_args(plan["argv"])
    assert ns.kv_cache_dtype == "bf16" and ns.attention_backend == "flashinfer"


def test_explicit_fp8_kv_is_kept_with_a_warning_naming_the_source(field):
    plan = _plan(field, server_args={"kv_cache_dtype": "fp8_e4m3"})
    assert _pairs(plan["argv"])["--kv-cache-dtype"] == "fp8_e4m3"
    warning = [w for w in plan["warnings"] if "sm12-mla-kv-bf16" in w]
    assert len(warning) == 1 and "server_args.kv_cache_dtype='fp8_e4m3' is kept" in warning[0]
    assert kc.RULES[0]["source_name"] in warning[0]
    assert "Known combination sm12-mla-kv-bf16" not in plan["reason"]
    assert plan["known_combinations"][0]["kept"] == {"kv_cache_dtype": "fp8_e4m3"}
    assert plan["memory"]["kv_bytes_per_token"] == (512 + 64) * 78 + (128 + 4) * 78
    # the other rules still apply
    assert plan["env"]["SGLANG_ENABLE_JIT_DEEPGEMM"] == "0"


def test_the_field_args_keep_their_backends(field):
    """The field launch already names flashinfer attention: nothing to warn about, the KV rule still applies."""
    for version, args in (("0.5.9", FIELD_ARGS), ("0.5.23", FIELD_ARGS_0_5_23)):
        plan = _plan(field, version, server_args=args)
        pairs = _pairs(plan["argv"])
        assert pairs["--attention-backend"] == "flashinfer" and pairs["--kv-cache-dtype"] == "bf16"
        assert not any("known combination" in w for w in plan["warnings"]), version


def test_the_same_model_on_sm90_gets_neither_rule(hgx):
    plan = _plan(hgx, server_args={"mem_fraction_static": 0.9})
    pairs = _pairs(plan["argv"])
    assert "--kv-cache-dtype" not in pairs and "--attention-backend" not in pairs
    assert "SGLANG_ENABLE_JIT_DEEPGEMM" not in plan["env"]
    assert plan["known_combinations"] == [] and "Known combination" not in plan["reason"]


def test_a_gqa_model_on_sm120_gets_only_the_architecture_rule(field):
    plan = planner.plan(planner.PlanRequest(topology=field, model_path=model_path("llama-3.1-70b"), layout="tp8"))
    pairs = _pairs(plan["argv"])
    assert "--kv-cache-dtype" not in pairs and "--attention-backend" not in pairs
    assert plan["env"]["SGLANG_ENABLE_JIT_DEEPGEMM"] == "0"
    assert [a["id"] for a in plan["known_combinations"]] == ["sm12-deepgemm-off"]


def test_only_the_gpus_the_plan_uses_count(field):
    mixed = copy.deepcopy(field)
    for gpu in mixed["gpus"][4:]:
        gpu["compute_capability"] = "9.0"
    plan = planner.plan(planner.PlanRequest(topology=mixed, model_path=model_path("llama-3.1-70b"), layout="tp4",
                                            gpus=[4, 5, 6, 7]))
    assert plan["known_combinations"] == []


@pytest.mark.parametrize("gpus", [[[0]], ["a"], [{"x": 1}]])
def test_malformed_gpus_are_reported_not_a_traceback(field, gpus):
    with pytest.raises(planner.PlanError) as exc:
        planner.plan(planner.PlanRequest(topology=field, model_path=GLM5, layout="tp8", gpus=gpus))
    assert any(r.startswith("gpus must be a list of GPU indices") for r in exc.value.reasons)
