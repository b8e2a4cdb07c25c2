"""Model facts the planner needs, read from a Hugging Face model directory (config.json + safetensors index).

Plain Python 3.9+ stdlib; runs on the target. `load_model_dir(path)` reads the files; `model_facts(config,
total_size)` normalises the many spellings of the same fact across architectures:

| fact | config keys (first found) |
| --- | --- |
| layers | num_hidden_layers, n_layer, num_layers |
| heads / kv heads | num_attention_heads / num_key_value_heads (default: heads, i.e. MHA) |
| routed experts | n_routed_experts (DeepSeek, GLM), num_experts (Qwen MoE), num_local_experts (Mixtral) |
| MLA | kv_lora_rank present (DeepSeek V2/V3, GLM-5): KV cache is (kv_lora_rank + qk_rope_head_dim) per layer |
| DSA/NSA indexer | index_topk present with a DeepSeek/GLM-DSA architecture (sglang is_deepseek_nsa) |
| quantization | quantization_config.quant_method (+ quant_algo for modelopt), weight_block_size |

Multimodal configs keep the language model under `text_config`; its keys are used when present.
The MTP (nextn) draft layers: config.json num_nextn_predict_layers says how many; has_draft_weights(weight_names(path))
says whether the checkpoint carries them (many quantized conversions drop them).
Weight bytes come from `metadata.total_size` of model.safetensors.index.json, else from the sizes of the
*.safetensors files (a single-file checkpoint has no index).
"""
import json
import os

# Architectures whose SGLang 0.5.9 model raises when tp_size > routed experts
# (sglang/srt/models/{deepseek_v2,glm4_moe,qwen3_moe,qwen2_moe,...}.py: "Tensor parallel size ... is greater
# than the number of experts"). The planner applies the rule to every MoE model: a TP rank without an expert
# slice is never useful.
NSA_ARCHITECTURES = (
    "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLMNextN",
    "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration", "GlmMoeDsaForCausalLM",
)

# Bytes per weight by quantization (weights only; scales included approximately). Used only where a size must
# be estimated from parameter counts (expert width missing from config.json).
BYTES_PER_PARAM = {
    None: 2.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "modelopt_fp8": 1.0, "w8a8_fp8": 1.0, "w8a8_int8": 1.0,
    "compressed-tensors": 1.0, "modelopt_fp4": 0.5625, "mxfp4": 0.53, "awq": 0.53, "gptq": 0.53,
}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "half": 2, "float": 4, "auto": 2}


class ModelError(ValueError):
    """Model files or facts the planner cannot use; the message names the file or key."""


def _read_json(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise ModelError("%s not found" % path) from None
    except (OSError, ValueError) as exc:
        raise ModelError("%s cannot be read as JSON: %s" % (path, exc)) from None


def load_model_dir(path):
    """(config dict, total weight bytes) of the model directory at path."""
    if not os.path.isdir(path):
        raise ModelError("model path %s is not a directory (want config.json and model.safetensors.index.json)"
                         % path)
    config = _read_json(os.path.join(path, "config.json"))
    index_path = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index_path):
        index = _read_json(index_path)
        total = (index.get("metadata") or {}).get("total_size")
        if isinstance(total, bool) or not isinstance(total, int) or total <= 0:
            raise ModelError("%s has no positive integer metadata.total_size (got %r)" % (index_path, total))
        return config, total
    shards = [f for f in os.listdir(path) if f.endswith(".safetensors")]
    if not shards:
        raise ModelError("%s has neither model.safetensors.index.json nor *.safetensors files: cannot size the "
                         "weights" % path)
    return config, sum(os.path.getsize(os.path.join(path, f)) for f in shards)


def _safetensors_names(path):
    """The tensor names in one .safetensors file's header (8-byte little-endian length + JSON), without its data."""
    with open(path, "rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        if size <= 0 or size > 1 << 30:
            raise ValueError("header length %d" % size)
        return [k for k in json.loads(handle.read(size).decode("utf-8")) if k != "__metadata__"]


def weight_names(path):
    """Every tensor name of the checkpoint at path: the index's weight_map keys, else the single files' headers."""
    index_path = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index_path):
        weight_map = _read_json(index_path).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ModelError("%s has no weight_map mapping" % index_path)
        return list(weight_map)
    names = []
    for name in sorted(f for f in os.listdir(path) if f.endswith(".safetensors")):
        try:
            names.extend(_safetensors_names(os.path.join(path, name)))
        except (OSError, ValueError) as exc:
            raise ModelError("%s cannot be read as safetensors: %s" % (os.path.join(path, name), exc)) from None
    return names


def has_draft_weights(names, num_layers):
    """Whether a checkpoint carries its MTP (nextn) layer as SGLang's NextN models load it: the tensors of decoder
    layer `num_hidden_layers` (the one after the last; deepseek_nextn.py / glm4_moe_nextn.py map
    `model.layers.{num_hidden_layers}.` onto the draft layer). A multimodal checkpoint's language model may
    prefix the name (model.language_model.layers.N)."""
    marker = "layers.%d." % num_layers
    return any(marker in name for name in names)


def _first(cfg, *keys, default=None):
    for key in keys:
        value = cfg.get(key)
        if value is not None:
            return value
    return default


def _positive_int(cfg, key, value):
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelError("config.json %s must be a positive integer, got %r" % (key, value))
    return value


# Optional integer keys the planner reads: each, when present, must be a whole number >= 0 (config.json
# written by hand or a broken conversion would otherwise end in a Python TypeError deep in the planner).
OPTIONAL_INTS = (
    "head_dim", "n_routed_experts", "num_experts", "num_local_experts", "num_experts_per_tok", "moe_topk",
    "n_shared_experts", "num_shared_experts", "first_k_dense_replace", "moe_intermediate_size", "intermediate_size",
    "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "num_nextn_predict_layers",
    "index_head_dim", "index_topk", "index_n_heads", "sliding_window", "max_position_embeddings", "seq_length",
    "max_sequence_length", "decoder_sparse_step",
)


def _check_types(cfg):
    """One ModelError naming the first config.json key of the wrong type."""
    for key in OPTIONAL_INTS:
        value = cfg.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ModelError("config.json %s must be a whole number >= 0, got %r" % (key, value))
    for key in ("mlp_only_layers",):
        value = cfg.get(key)
        if value is not None and (not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value)):
            raise ModelError("config.json %s must be a list of layer numbers, got %r" % (key, value))
    for key in ("architectures", "layer_types"):
        value = cfg.get(key)
        if value is not None and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
            raise ModelError("config.json %s must be a list of strings, got %r" % (key, value))
    if cfg.get("tie_word_embeddings") is not None and not isinstance(cfg["tie_word_embeddings"], bool):
        raise ModelError("config.json tie_word_embeddings must be true or false, got %r" % (cfg["tie_word_embeddings"],))
    for key in ("quantization_config", "text_config"):
        if cfg.get(key) is not None and not isinstance(cfg[key], dict):
            raise ModelError("config.json %s must be a mapping, got %r" % (key, cfg[key]))


def quantization_of(cfg):
    """SGLang's name for the checkpoint's quantization (None for bf16/fp16), and the FP8 block size if any."""
    qc = cfg.get("quantization_config") or {}
    if not isinstance(qc, dict):
        return None, None
    method = qc.get("quant_method")
    if method == "modelopt":
        algo = str(qc.get("quant_algo", "")).upper()
        method = "modelopt_fp4" if "FP4" in algo else "modelopt_fp8"
    block = qc.get("weight_block_size")
    block_n = block[0] if isinstance(block, list) and block and isinstance(block[0], int) else None
    return method, block_n


def model_facts(config, total_size, name=None):
    """Normalised facts of a model: a dict the planner and the score read. Raises ModelError naming bad keys."""
    if not isinstance(config, dict):
        raise ModelError("model config must be a mapping (config.json), got %s" % type(config).__name__)
    cfg = dict(config)
    if isinstance(cfg.get("text_config"), dict):
        merged = dict(cfg["text_config"])
        for key in ("architectures", "quantization_config", "torch_dtype"):  # the outer model's class and format
            if cfg.get(key) is not None:
                merged[key] = cfg[key]
        cfg = merged
    if isinstance(total_size, bool) or not isinstance(total_size, int) or total_size <= 0:
        raise ModelError("model total_size must be a positive integer (bytes), got %r" % (total_size,))
    _check_types(cfg)
    layers = _positive_int(cfg, "num_hidden_layers", _first(cfg, "num_hidden_layers", "n_layer", "num_layers"))
    heads = _positive_int(cfg, "num_attention_heads", _first(cfg, "num_attention_heads", "n_head"))
    kv_heads = _positive_int(cfg, "num_key_value_heads", _first(cfg, "num_key_value_heads", default=heads))
    hidden = _positive_int(cfg, "hidden_size", _first(cfg, "hidden_size", "n_embd", "d_model"))
    vocab = _positive_int(cfg, "vocab_size", cfg.get("vocab_size"))
    head_dim = _first(cfg, "head_dim", default=hidden // heads)
    if head_dim < 1:
        raise ModelError("config.json hidden_size %d with num_attention_heads %d gives a head size of 0; set "
                         "head_dim or fix those keys" % (hidden, heads))
    architectures = cfg.get("architectures") or []
    arch = architectures[0] if architectures else None
    experts = _first(cfg, "n_routed_experts", "num_experts", "num_local_experts", default=0) or 0
    topk = _first(cfg, "num_experts_per_tok", "moe_topk", default=0) or 0
    mla = cfg.get("kv_lora_rank") is not None
    quant, block_n = quantization_of(cfg)
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    facts = {
        "name": name,
        "architecture": arch,
        "model_type": cfg.get("model_type"),
        "num_layers": layers,
        "nextn_layers": int(cfg.get("num_nextn_predict_layers") or 0),
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "head_dim": head_dim,
        "v_head_dim": _first(cfg, "v_head_dim", default=head_dim),
        "hidden_size": hidden,
        "intermediate_size": cfg.get("intermediate_size"),
        "vocab_size": vocab,
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "context_length": _first(cfg, "max_position_embeddings", "seq_length", "max_sequence_length"),
        "dtype": dtype,
        "dtype_bytes": DTYPE_BYTES.get(dtype, 2),
        "quantization": quant,
        "weight_block_n": block_n,
        "moe": experts > 0,
        "num_experts": experts,
        "experts_per_token": topk,
        "shared_experts": int(_first(cfg, "n_shared_experts", "num_shared_experts", default=0) or 0),
        "moe_intermediate_size": cfg.get("moe_intermediate_size"),
        "dense_layers": _dense_layers(cfg, layers, experts),
        "mla": mla,
        "q_lora_rank": cfg.get("q_lora_rank"),
        "kv_lora_rank": cfg.get("kv_lora_rank"),
        "qk_rope_head_dim": cfg.get("qk_rope_head_dim"),
        "qk_nope_head_dim": cfg.get("qk_nope_head_dim"),
        "nsa": bool(arch in NSA_ARCHITECTURES and cfg.get("index_topk") is not None),
        "index_head_dim": int(cfg.get("index_head_dim") or 128),
        "index_topk": int(cfg.get("index_topk") or 0),
        "index_n_heads": int(cfg.get("index_n_heads") or 64),
        "total_size": total_size,
        "sliding_window": _sliding_window(cfg),
        "kv_cache_quant": str((cfg.get("quantization_config") or {}).get("kv_cache_quant_algo") or "").upper() or None
        if isinstance(cfg.get("quantization_config"), dict) else None,
        "swa_layers": _swa_layers(cfg, layers),
    }
    facts["params"] = _param_estimate(facts)
    facts["bytes"] = _byte_split(facts)
    return facts


def _sliding_window(cfg):
    window = cfg.get("sliding_window")
    return window if isinstance(window, int) and not isinstance(window, bool) and window > 0 else None


def _swa_layers(cfg, layers):
    """How many layers attend over a sliding window only (layer_types: sliding_attention, as gpt-oss, Gemma)."""
    if not _sliding_window(cfg):
        return 0
    types = cfg.get("layer_types")
    if isinstance(types, list):
        return sum(1 for t in types[:layers] if str(t).startswith("sliding"))
    return 0


def _byte_split(f):
    """Checkpoint bytes by part: {embed, head (0 when tied), attention (one layer), dense_layer, moe_layer,
    per_param}. Embeddings and LM head are 16 bit (quantized checkpoints keep them so); the rest of total_size is
    spread over the layers' parameters (MTP/nextn layers included, as an average layer), so quantized experts and
    16-bit attention average out to the checkpoint's real size."""
    p = f["params"]
    embed = f["vocab_size"] * f["hidden_size"] * 2
    head = 0 if f["tie_word_embeddings"] else embed
    experts = f["num_experts"] if f["moe"] else 0
    dense_layer = p["attention_per_layer"] + p["dense_mlp_per_layer"]
    moe_layer = p["attention_per_layer"] + (experts + f["shared_experts"]) * p["expert"]
    layer_params = dense_layer * f["dense_layers"] + moe_layer * (f["num_layers"] - f["dense_layers"])
    all_params = layer_params + f["nextn_layers"] * layer_params / float(f["num_layers"])
    per_param = max(1.0, f["total_size"] - embed - head) / all_params
    return {"embed": embed, "head": head, "attention": p["attention_per_layer"] * per_param,
            "dense_layer": dense_layer * per_param, "moe_layer": moe_layer * per_param, "per_param": per_param}


def _dense_layers(cfg, layers, experts):
    """How many decoder layers have a dense MLP instead of experts."""
    if not experts:
        return layers
    if cfg.get("first_k_dense_replace") is not None:
        return min(int(cfg["first_k_dense_replace"]), layers)
    only = cfg.get("mlp_only_layers") or []
    step = int(cfg.get("decoder_sparse_step") or 1)
    sparse = [i for i in range(layers) if i not in only and (i + 1) % step == 0]
    return layers - len(sparse)


def _attention_params(f):
    h, heads = f["hidden_size"], f["num_heads"]
    if f["mla"]:
        rope = f["qk_rope_head_dim"] or 64
        nope = f["qk_nope_head_dim"] or 128
        v = f["v_head_dim"] or 128
        q = (h * f["q_lora_rank"] + f["q_lora_rank"] * heads * (nope + rope)) if f["q_lora_rank"] else \
            h * heads * (nope + rope)
        kv = h * (f["kv_lora_rank"] + rope) + f["kv_lora_rank"] * heads * (nope + v)
        return q + kv + heads * v * h
    d = f["head_dim"]
    return h * heads * d + 2 * h * f["num_kv_heads"] * d + heads * d * h


def _param_estimate(f):
    """Parameter counts from the shapes: per layer attention, dense MLP, one expert; plus embeddings.

    Where config.json lacks an MLP width (the shared GLM-5 metadata has no moe_intermediate_size), the expert
    width is solved from total_size at the checkpoint's bytes per weight, and a missing dense width is taken
    as the active expert width (top-k + shared experts). These counts only feed the score, never validity.
    """
    h = f["hidden_size"]
    attention = _attention_params(f)
    embed = f["vocab_size"] * h * (1 if f["tie_word_embeddings"] else 2)
    bpp = BYTES_PER_PARAM.get(f["quantization"], 1.0 if f["quantization"] else f["dtype_bytes"])
    layers = f["num_layers"]
    moe_layers = layers - f["dense_layers"] if f["moe"] else 0
    expert_width = f["moe_intermediate_size"]
    dense_width = f["intermediate_size"]
    if f["moe"] and not expert_width:
        # weights = (attention * layers + dense MLPs + embeddings) at ~2 bytes + experts at bpp
        known = (attention * layers) * 2.0 + embed * 2.0
        if dense_width:
            known += 3 * h * dense_width * f["dense_layers"] * 2.0
        experts_total = moe_layers * (f["num_experts"] + f["shared_experts"])
        expert_width = max(1, int((f["total_size"] - known) / bpp / max(1, experts_total) / (3 * h)))
    if not dense_width:
        dense_width = (expert_width or 4 * h) * max(1, f["experts_per_token"] + f["shared_experts"]) \
            if f["moe"] else 4 * h
    expert = 3 * h * expert_width if f["moe"] else 0
    dense_mlp = 3 * h * dense_width
    active_moe_mlp = expert * (f["experts_per_token"] + f["shared_experts"])
    active_per_token = attention * layers + dense_mlp * f["dense_layers"] + active_moe_mlp * moe_layers
    return {
        "attention_per_layer": attention,
        "dense_mlp_per_layer": dense_mlp,
        "expert": expert,
        "moe_layers": moe_layers,
        "embedding": embed,
        "active_per_token": active_per_token,
    }


# SGLang's hybrid sliding-window memory pool gives the sliding-window layers swa_full_tokens_ratio (0.8) times
# the tokens of the full-attention layers (server_args.swa_full_tokens_ratio, model_runner_kv_cache_mixin).
SWA_FULL_TOKENS_RATIO = 0.8


def kv_bytes_per_token(facts, tp, layers, kv_dtype_bytes):
    """KV cache bytes one token takes on one GPU of a TP group holding `layers` layers (SGLang 0.5.9
    model_runner_kv_cache_mixin.get_cell_size_per_token): MLA keeps (kv_lora_rank + qk_rope_head_dim) per layer,
    replicated on every TP rank; DSA adds the indexer key (index_head_dim + index_head_dim // 128 * 4 bytes);
    MHA/GQA keeps max(1, kv_heads // tp) heads of (head_dim + v_head_dim). Sliding-window layers count at
    SWA_FULL_TOKENS_RATIO (their pool's share per full-attention token)."""
    swa = facts.get("swa_layers") or 0
    if swa:
        layers = layers * (1.0 - swa / float(facts["num_layers"]) * (1.0 - SWA_FULL_TOKENS_RATIO))
    if facts["mla"]:
        cell = (facts["kv_lora_rank"] + (facts["qk_rope_head_dim"] or 64)) * layers * kv_dtype_bytes
        if facts["nsa"]:
            d = facts["index_head_dim"]
            cell += (d + d // 128 * 4) * layers
        return cell
    heads = max(1, facts["num_kv_heads"] // tp)
    return heads * (facts["head_dim"] + facts["v_head_dim"]) * layers * kv_dtype_bytes
