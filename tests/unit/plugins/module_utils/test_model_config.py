"""model_config: reading a model directory and normalising config.json spellings."""
import json

import pytest

from plan_cases import model_input, model_path
from ansible_collections.topolaunch.sglang.plugins.module_utils import model_config


def test_reads_config_and_index():
    config, total = model_config.load_model_dir(model_path("glm-5-nvfp4"))
    assert config["num_hidden_layers"] == 78 and total == 440000000000


def test_single_file_checkpoint_is_sized_from_the_files(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2}))
    (tmp_path / "model.safetensors").write_bytes(b"x" * 1234)
    assert model_config.load_model_dir(str(tmp_path))[1] == 1234


@pytest.mark.parametrize("files, words", [
    ({}, "config.json not found"),
    ({"config.json": "{"}, "cannot be read as JSON"),
    ({"config.json": "{}"}, "neither model.safetensors.index.json nor *.safetensors"),
    ({"config.json": "{}", "model.safetensors.index.json": '{"metadata": {"total_size": "big"}}'},
     "no positive integer metadata.total_size (got 'big')"),
])
def test_bad_model_dirs_are_named(tmp_path, files, words):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(model_config.ModelError) as exc:
        model_config.load_model_dir(str(tmp_path))
    assert words in str(exc.value) and str(tmp_path) in str(exc.value)


def test_facts_of_each_family():
    glm5 = model_config.model_facts(**{k: v for k, v in model_input("glm-5-nvfp4").items() if k != "name"})
    assert glm5["moe"] and glm5["mla"] and glm5["nsa"] and glm5["quantization"] == "modelopt_fp4"
    assert glm5["num_experts"] == 256 and glm5["dense_layers"] == 3 and glm5["nextn_layers"] == 1
    qwen = model_config.model_facts(**{k: v for k, v in model_input("qwen3-235b-a22b").items() if k != "name"})
    assert qwen["moe"] and not qwen["mla"] and qwen["num_experts"] == 128 and qwen["dense_layers"] == 0
    assert qwen["num_kv_heads"] == 4 and qwen["head_dim"] == 128
    ds = model_config.model_facts(**{k: v for k, v in model_input("deepseek-v3").items() if k != "name"})
    assert ds["weight_block_n"] == 128 and ds["quantization"] == "fp8" and not ds["nsa"]
    llama = model_config.model_facts(**{k: v for k, v in model_input("llama-2-7b").items() if k != "name"})
    assert not llama["moe"] and llama["num_kv_heads"] == 32 and llama["dtype_bytes"] == 2
    # Llama-2-7B: 32 layers x (4 x 4096^2 attention + 3 x 4096 x 11008 MLP) ~ 6.5e9 active parameters
    assert 6.0e9 < llama["params"]["active_per_token"] < 7.0e9


def test_text_config_of_multimodal_models():
    inner = model_input("llama-2-7b")["config"]
    facts = model_config.model_facts({"architectures": ["LlavaForConditionalGeneration"], "text_config": inner}, 10)
    assert facts["num_layers"] == 32 and facts["architecture"] == "LlavaForConditionalGeneration"


@pytest.mark.parametrize("change, words", [
    ({"num_hidden_layers": 0}, "num_hidden_layers must be a positive integer, got 0"),
    ({"num_attention_heads": None}, "num_attention_heads must be a positive integer, got None"),
    ({"vocab_size": "many"}, "vocab_size must be a positive integer, got 'many'"),
])
def test_bad_config_keys_are_named(change, words):
    config = dict(model_input("llama-2-7b")["config"], **change)
    with pytest.raises(model_config.ModelError) as exc:
        model_config.model_facts(config, 10)
    assert words in str(exc.value)


@pytest.mark.parametrize("overrides, words", [
    ({"n_routed_experts": None, "num_experts": "128"}, "config.json num_experts must be a whole number >= 0, got '128'"),
    ({"head_dim": "128"}, "config.json head_dim must be a whole number >= 0, got '128'"),
    ({"first_k_dense_replace": "two"}, "config.json first_k_dense_replace must be a whole number >= 0, got 'two'"),
    ({"qk_rope_head_dim": 64.5}, "config.json qk_rope_head_dim must be a whole number >= 0, got 64.5"),
    ({"tie_word_embeddings": "no"}, "config.json tie_word_embeddings must be true or false, got 'no'"),
    ({"quantization_config": "fp8"}, "config.json quantization_config must be a mapping, got 'fp8'"),
])
def test_typed_fields_fail_naming_the_field(overrides, words):
    model = model_input("glm-5-nvfp4", **overrides)
    with pytest.raises(model_config.ModelError) as exc:
        model_config.model_facts(model["config"], model["total_size"])
    assert str(exc.value) == words


def test_a_head_size_of_zero_is_refused():
    model = model_input("llama-3.1-70b", hidden_size=16, num_attention_heads=32)
    model["config"].pop("head_dim", None)
    with pytest.raises(model_config.ModelError, match="hidden_size 16 with num_attention_heads 32 gives a head size "
                                                      "of 0"):
        model_config.model_facts(model["config"], model["total_size"])


def test_the_planner_names_the_model_file_in_the_error(tmp_path):
    import shutil

    from plan_cases import synth_facts
    from ansible_collections.topolaunch.sglang.plugins.module_utils import planner

    shutil.copytree(model_path("glm-5-nvfp4"), tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["n_routed_experts"] = "256"
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    facts = synth_facts("proxmox-8x-rtx-pro-6000-vnuma", tmp_path / "facts")
    with pytest.raises(planner.PlanError) as exc:
        planner.plan(planner.PlanRequest(topology=facts, model_path=str(tmp_path / "m")))
    assert exc.value.reasons == ["model %s: config.json n_routed_experts must be a whole number >= 0, got '256'"
                                 % (tmp_path / "m")]
