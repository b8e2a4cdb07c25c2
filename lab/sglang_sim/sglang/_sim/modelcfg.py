"""The model as the simulator sees it: config.json and the size of the weights, no weights.

The facts (layers, heads, experts, MLA, parameter counts, KV bytes per token) come from the planner's
module_utils/topolaunch/model_config.py, bundled into the wheel, so planner and simulator agree on the model.
This module only adds what the performance model needs on top: bytes per parameter (total_size over the
counted parameters: ~0.56 for NVFP4, 1 for FP8, 2 for BF16) and which layers hold experts.
"""
import os

from sglang._sim import resources


class ModelError(Exception):
    """The model directory cannot be used."""


class Model:
    def __init__(self, path, facts):
        self.path = path
        self.facts = facts
        params = facts["params"]
        self.architecture = facts["architecture"] or "UnknownForCausalLM"
        self.architectures = [self.architecture]
        self.model_type = facts["model_type"]
        self.hidden = facts["hidden_size"]
        self.layers = facts["num_layers"]
        self.heads = facts["num_heads"]
        self.kv_heads = facts["num_kv_heads"]
        self.head_dim = facts["head_dim"]
        self.vocab = facts["vocab_size"]
        self.context_len = int(facts["context_length"] or 4096)
        self.dtype = facts["dtype"]
        self.experts = facts["num_experts"]
        self.topk = facts["experts_per_token"]
        self.shared_experts = facts["shared_experts"]
        self.dense_layers = facts["dense_layers"]
        self.moe_layers = params["moe_layers"]
        self.is_mla = facts["mla"]
        self.nextn_layers = facts["nextn_layers"]
        self.draft_weights = facts.get("draft_weights", False)
        self.kv_lora_rank = facts["kv_lora_rank"]
        self.qk_rope = facts["qk_rope_head_dim"] or 0
        self.p_attn = params["attention_per_layer"]
        self.p_dense_mlp = params["dense_mlp_per_layer"]
        self.p_expert = params["expert"]
        self.p_embed = self.vocab * self.hidden  # one of embedding / LM head
        self.p_total = (
            params["embedding"]
            + self.layers * self.p_attn
            + self.dense_layers * self.p_dense_mlp
            + self.moe_layers * (self.experts + self.shared_experts) * self.p_expert
        )
        self.total_size = facts["total_size"]
        self.bytes_per_param = self.total_size / self.p_total

    def is_moe_layer(self, layer):
        return bool(self.experts) and layer >= self.dense_layers

    def active_params_per_token(self):
        return self.facts["params"]["active_per_token"] + self.p_embed

    def kv_bytes_per_token_layer(self, tp, kv_dtype_bytes=2):
        """KV cache bytes per token and layer on one GPU (MLA keeps the latent whole on every rank)."""
        return resources.load("model_config").kv_bytes_per_token(self.facts, tp, 1, kv_dtype_bytes)

    def summary(self):
        return {
            "architecture": self.architecture,
            "layers": self.layers,
            "hidden_size": self.hidden,
            "attention_heads": self.heads,
            "routed_experts": self.experts,
            "experts_per_token": self.topk,
            "total_params": self.p_total,
            "active_params_per_token": self.active_params_per_token(),
            "weights_bytes": self.total_size,
            "bytes_per_param": round(self.bytes_per_param, 3),
        }


def load(path):
    """Model of a local model directory; ModelError naming the file or key when it is not one."""
    mc = resources.load("model_config")
    if not os.path.isdir(path):
        raise ModelError(
            "Can't load the configuration of '%s': not a local directory with a config.json file "
            "(the lab has no network; use a local model directory)" % path
        )
    try:
        config, total_size = mc.load_model_dir(path)
        facts = mc.model_facts(config, total_size, name=os.path.basename(os.path.normpath(path)))
        # the MTP (nextn) layer SGLang's NextN draft model loads: decoder layer num_hidden_layers in the weights
        facts["draft_weights"] = bool(facts["nextn_layers"]) and mc.has_draft_weights(mc.weight_names(path),
                                                                                    facts["num_layers"])
    except mc.ModelError as err:
        raise ModelError(str(err)) from None
    return Model(path, facts)
