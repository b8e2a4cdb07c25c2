"""Speculative decoding as a planned choice (issue 28 item 2): the field spec + a GLM-5-like checkpoint with its MTP
layer gets NEXTN with the flags and environment of each release; a checkpoint without MTP weights never does; the
accept length's default reproduces the field's one-user figure and the gain shrinks with the concurrency."""
import json
import shutil
import struct

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import (model_config, plan_speculative, planner,
                                                                         sglang_facts_0_5_9, sglang_facts_0_5_23, tune)
from plan_cases import MODELS, synth_facts

VNUMA = "proxmox-8x-rtx-pro-6000-vnuma"   # the field box
LAYERS = 78                               # the GLM-5 fixture's num_hidden_layers


@pytest.fixture(scope="module")
def field(tmp_path_factory):
    return synth_facts(VNUMA, tmp_path_factory.mktemp("vnuma"))


def _checkpoint(root, mtp=True):
    """The GLM-5 NVFP4 fixture with a weight index naming its tensors: layer 78 (the MTP layer) or not."""
    root.mkdir()
    shutil.copy(str(MODELS / "glm-5-nvfp4" / "config.json"), str(root / "config.json"))
    index = json.loads((MODELS / "glm-5-nvfp4" / "model.safetensors.index.json").read_text())
    names = ["model.embed_tokens.weight", "lm_head.weight"] + [
        "model.layers.%d.self_attn.kv_a_proj_with_mqa.weight" % k for k in range(LAYERS)]
    if mtp:
        names += ["model.layers.%d.eh_proj.weight" % LAYERS, "model.layers.%d.mlp.experts.0.up_proj.weight" % LAYERS]
    index["weight_map"] = {n: "model-00001-of-00001.safetensors" for n in names}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    return str(root)


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory):
    return _checkpoint(tmp_path_factory.mktemp("m") / "glm-5-mtp")


@pytest.fixture(scope="module")
def plain_model(tmp_path_factory):
    return _checkpoint(tmp_path_factory.mktemp("p") / "glm-5-no-mtp", mtp=False)


def _plan(topology, path, version="0.5.9", layout="tp8", concurrency=1, **fields):
    return planner.plan(planner.PlanRequest(
        topology=topology, model_path=path, layout=layout, sglang_version=version,
        workload={"input_len": 1024, "output_len": 1024, "concurrency": concurrency}, **fields))


def _pairs(argv):
    return {w: argv[k + 1] for k, w in enumerate(argv[:-1]) if w.startswith("--")}


# ------------------------------------------------------------------------------------- detection


def test_mtp_weights_are_found_as_sglang_loads_them(mtp_model, plain_model, tmp_path):
    assert model_config.has_draft_weights(model_config.weight_names(mtp_model), LAYERS)
    assert not model_config.has_draft_weights(model_config.weight_names(plain_model), LAYERS)
    # a single-file checkpoint: the names come from the safetensors header
    header = json.dumps({"model.layers.2.eh_proj.weight": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]},
                         "__metadata__": {}}).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0\0")
    assert model_config.weight_names(str(tmp_path)) == ["model.layers.2.eh_proj.weight"]
    assert model_config.has_draft_weights(model_config.weight_names(str(tmp_path)), 2)


def test_release_facts_come_from_each_wheel():
    assert sglang_facts_0_5_9.SPECULATIVE["spec_v2_env"] == "SGLANG_ENABLE_SPEC_V2"
    assert sglang_facts_0_5_23.SPECULATIVE["spec_v2_env"] is None          # 0.5.23 always runs spec v2
    for facts in (sglang_facts_0_5_9, sglang_facts_0_5_23):
        spec = facts.SPECULATIVE
        assert spec["nextn_alias"] == "EAGLE" and spec["max_running_requests"] == 48
        assert spec["default_params"] == [3, 1, 4]
        assert "GlmMoeDsaForCausalLM" in spec["self_draft_architectures"]
    assert sglang_facts_0_5_9.SPECULATIVE["pp_algorithms"] == []
    assert sglang_facts_0_5_23.SPECULATIVE["pp_env"] == "SGLANG_ENABLE_PP_SPEC"


# ------------------------------------------------------------------------------------- the plan


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_field_spec_with_mtp_weights_gets_nextn_with_its_release_flags_and_env(field, mtp_model, version):
    plan = _plan(field, mtp_model, version, speculative="on")
    pairs = _pairs(plan["argv"])
    assert pairs["--speculative-algorithm"] == "NEXTN"
    assert (pairs["--speculative-num-steps"], pairs["--speculative-eagle-topk"],
            pairs["--speculative-num-draft-tokens"]) == ("3", "1", "4")
    assert "--max-running-requests" not in pairs          # SGLang's own cap (48) where unset: modelled, not passed
    if version == "0.5.9":
        assert plan["env"]["SGLANG_ENABLE_SPEC_V2"] == "True"
    else:
        assert "SGLANG_ENABLE_SPEC_V2" not in plan["env"]
    assert plan["speculative"]["on"] and plan["speculative"]["accept_length"] == plan_speculative.DEFAULT_ACCEPT_LENGTH
    assert "Speculative decoding NEXTN" in plan["reason"] and "layer 78 in its weights" in plan["reason"]
    assert plan["estimate"]["batch"] <= 48


def test_spec_v2_env_is_set_whenever_nextn_is_planned_on_0_5_9(field, mtp_model):
    plan = _plan(field, mtp_model, "0.5.9", speculative="auto", concurrency=1)
    assert plan["speculative"]["on"]
    assert plan["env"]["SGLANG_ENABLE_SPEC_V2"] == "True"


@pytest.mark.parametrize("mode", ["on", "auto"])
def test_a_checkpoint_without_mtp_weights_never_gets_nextn(field, plain_model, mode):
    fixture = str(MODELS / "glm-5-nvfp4")   # its index names no tensors at all
    for path in (plain_model, fixture):
        if mode == "on":
            with pytest.raises(planner.PlanError) as exc:
                _plan(field, path, speculative=mode)
            assert any("weights have no MTP layer" in r for r in exc.value.reasons)
        else:
            plan = _plan(field, path, speculative=mode)
            assert "--speculative-algorithm" not in plan["argv"] and "SGLANG_ENABLE_SPEC_V2" not in plan["env"]
            assert any("weights have no MTP layer" in w for w in plan["warnings"])


def test_off_is_the_default_and_plans_nothing(field, mtp_model):
    plan = _plan(field, mtp_model)
    assert "--speculative-algorithm" not in plan["argv"] and plan["speculative"] == {"on": False}


@pytest.mark.parametrize("bad", [1, 0.5, 0, -2, True, "3"])
def test_accept_length_of_one_or_less_is_one_line_naming_the_field(field, mtp_model, bad):
    with pytest.raises(planner.PlanError) as exc:
        _plan(field, mtp_model, speculative="on", speculative_accept_length=bad)
    line = [r for r in exc.value.reasons if "accept_length" in r]
    assert len(line) == 1 and "topolaunch_speculative_accept_length must be a number > 1" in line[0]
    assert "\n" not in line[0]


def test_bad_mode_is_one_line_naming_the_field(field, mtp_model):
    with pytest.raises(planner.PlanError) as exc:
        _plan(field, mtp_model, speculative="yes")
    assert exc.value.reasons == ["topolaunch_speculative must be one of auto, on, off, got 'yes'"]


def test_pp_follows_the_release(field, mtp_model):
    with pytest.raises(planner.PlanError) as exc:
        _plan(field, mtp_model, "0.5.9", layout="tp4pp2", speculative="on")
    assert any("pp > 1 cannot run speculative decoding in SGLang 0.5.9" in r for r in exc.value.reasons)
    plan = _plan(field, mtp_model, "0.5.23", layout="tp4pp2", speculative="on")
    assert _pairs(plan["argv"])["--speculative-algorithm"] == "NEXTN"
    assert plan["env"]["SGLANG_ENABLE_PP_SPEC"] == "True"


def test_the_draft_layer_takes_memory_in_the_fit(field, mtp_model):
    off = _plan(field, mtp_model, "0.5.23")
    on = _plan(field, mtp_model, "0.5.23", speculative="on")
    assert on["memory"]["weights_per_gpu_bytes"] > off["memory"]["weights_per_gpu_bytes"]
    assert on["memory"]["kv_bytes_per_token"] > off["memory"]["kv_bytes_per_token"]


# ------------------------------------------------------------------------------------- the estimate


def _gain(field, path, concurrency, **fields):
    off = _plan(field, path, "0.5.23", concurrency=concurrency)["estimate"]["tokens_per_s"]
    on = _plan(field, path, "0.5.23", concurrency=concurrency, speculative="on", **fields)["estimate"]["tokens_per_s"]
    return on / off


def test_default_accept_length_reproduces_the_field_figures(field, mtp_model):
    one, many = _gain(field, mtp_model, 1), _gain(field, mtp_model, 64)
    assert one == pytest.approx(95 / 51.0, rel=0.05)          # the input: 51 -> 95 tok/s at one user
    assert many == pytest.approx(1425 / 1011.0, rel=0.15)     # the check: 1,011 -> 1,425 at 64 (x1.26 predicted)
    assert many < one                                         # it helps least at high concurrency


def test_gain_follows_the_accept_length_and_auto_leaves_it_off_where_it_loses(field, mtp_model):
    assert _gain(field, mtp_model, 1, speculative_accept_length=2.0) < _gain(field, mtp_model, 1)
    plan = _plan(field, mtp_model, "0.5.23", concurrency=256, speculative="auto")
    assert not plan["speculative"]["on"] and "--speculative-algorithm" not in plan["argv"]
    assert "left off" in plan["speculative"]["reason"]


# ------------------------------------------------------------------------------------- the tune


def _record(layout, tput, concurrency=128):
    return {"model": "glm-5-mtp", "topology_fingerprint": None, "layout": layout, "max_concurrency": concurrency,
            "output_throughput": tput, "input_len": 1024, "output_len": 1024, "source": "measured"}


def test_a_tune_measures_both_where_the_model_says_they_are_close(field, mtp_model):
    request = planner.PlanRequest(topology=field, model_path=mtp_model, sglang_version="0.5.23", speculative="auto",
                                  workload={"input_len": 1024, "output_len": 1024, "concurrency": 128})
    _plan, _fit, selection = tune.tune_plan(request, tune_max=6)
    names = selection["measure"]
    pairs = [n for n in names if n + plan_speculative.SUFFIX in names]
    assert pairs, names                                     # a layout with and without NEXTN
    assert selection["start"]["layouts"]                    # the start cost of the plain layouts
    # far apart (one user: NEXTN ~x1.9): only the faster is offered
    request.workload = {"input_len": 1024, "output_len": 1024, "concurrency": 1}
    names = tune.tune_plan(request, tune_max=6)[2]["measure"]
    assert not [n for n in names if n + plan_speculative.SUFFIX in names] and any(
        n.endswith(plan_speculative.SUFFIX) for n in names)


@pytest.mark.parametrize("on, off, expect_on", [(150.0, 100.0, True), (90.0, 100.0, False)])
def test_the_faster_measured_variant_is_kept(field, mtp_model, on, off, expect_on):
    fingerprint = field["fingerprint"]
    measured = [dict(_record("tp8" + plan_speculative.SUFFIX, on), topology_fingerprint=fingerprint),
                dict(_record("tp8", off), topology_fingerprint=fingerprint)]
    plan = _plan(field, mtp_model, "0.5.23", layout="tp8", concurrency=128, speculative="auto", measured=measured)
    assert plan["source"] == "measured" and plan["speculative"]["on"] is expect_on
    assert plan["layout"]["name"] == "tp8" + (plan_speculative.SUFFIX if expect_on else "")
    assert ("--speculative-algorithm" in plan["argv"]) is expect_on
    assert "measured faster with%s it" % ("" if expect_on else "out") in plan["speculative"]["reason"]
