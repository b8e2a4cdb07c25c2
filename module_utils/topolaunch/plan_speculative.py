"""Speculative decoding as a planned choice (issue 28 item 2): MTP (NEXTN) where the checkpoint carries its draft.

Plain Python 3.9+ stdlib. Every release fact comes from its facts table (sglang_facts_<version>.SPECULATIVE, read
from the wheel by tools/sglang_facts.py); nothing here is keyed on a model name.

Detect (as SGLang decides): the architecture is one whose checkpoint carries its own draft layers (the release's
list; it then defaults --speculative-draft-model-path to the model), config.json num_nextn_predict_layers >= 1,
and the weights hold decoder layer num_hidden_layers (model_config.has_draft_weights: what SGLang's NextN model
loads). Without those weights SGLang would draft with an empty layer, so a checkpoint without them never gets
NEXTN, whatever topolaunch_speculative says.

Plan: `--speculative-algorithm NEXTN` with the release's default draft parameters (num_steps, eagle_topk,
num_draft_tokens) written out; the environment the release needs: 0.5.9 SGLANG_ENABLE_SPEC_V2=True (without it
0.5.9 runs the old EAGLE worker with the overlap scheduler off; the field knowledge base reports it loading the
model twice and running out of memory), 0.5.23 none (always spec v2), and with pp > 1 the release's PP switch
(0.5.23 SGLANG_ENABLE_PP_SPEC; 0.5.9 refuses speculative decoding with PP). SGLang sets max_running_requests to
its cap (48) when unset: the plan's estimate and KV cap follow it. The fit adds the draft layer (one average
layer of the checkpoint per nextn layer, on the last stage, split by tp) and its KV cache.

Modes (topolaunch_speculative): off (never), on (always where the checkpoint allows; a layout the release refuses
it for is refused), auto (per layout, when the estimate with it is higher at the workload's concurrency).
The accept length (topolaunch_speculative_accept_length: tokens a request gains per verify step, > 1) drives the
estimate (plan_score: the verify pass costs num_draft_tokens tokens per request plus num_steps draft passes, so
the gain shrinks as the batch becomes compute-bound); a measured value replaces the default.
"""
# The default accept length, from the field knowledge base (voipmonitor/rtx6kpro models/glm5.md at 07e88985: GLM-5
# NVFP4, 8x RTX PRO 6000, SGLang, MTP with the default 3 steps / topk 1 / 4 draft tokens): 51 -> 95 tok/s at one
# user (x1.86), 1,011 -> 1,425 at 64 (x1.41). The default is the accept length with which this performance model
# (plan_score: the verify pass of 4 tokens per request, 3 draft passes) reproduces the one-user gain on the field
# spec (lab/specs/proxmox-8x-rtx-pro-6000-vnuma.json, GLM-5 NVFP4 fixture, tp8): 2.9 gives x1.86 (with the
# per-kernel floors of the real-GPU records; 3.2 before them). The 64-user figure is then a check, not an input:
# the model predicts x1.26 there (measured x1.41, 10.5% lower: the floors make the 4-token verify pass of 48
# requests cost more; SGLang's cap of 48 running requests included).
# tests/unit/plugins/module_utils/test_plan_speculative.py holds both.
DEFAULT_ACCEPT_LENGTH = 2.9
MODES = ("auto", "on", "off")
ALGORITHM = "NEXTN"
# A launch with NEXTN is named (plan layout.name, results, a tune's candidates) as its layout + SUFFIX: tp8ep8+nextn.
SUFFIX = "+nextn"


def split_name(name):
    """(layout, SUFFIX or "") of a layout name as results and tunes write it."""
    if isinstance(name, str) and name.endswith(SUFFIX):
        return name[:-len(SUFFIX)], SUFFIX
    return name, ""


class SpecError(ValueError):
    pass


def check_inputs(mode, accept_length):
    """The reasons (one line each, naming the variable) why the speculative inputs are unusable."""
    reasons = []
    if mode not in MODES:
        reasons.append("topolaunch_speculative must be one of %s, got %r" % (", ".join(MODES), mode))
    if accept_length is not None and (isinstance(accept_length, bool) or not isinstance(accept_length, (int, float))
                                      or not accept_length > 1):
        reasons.append("topolaunch_speculative_accept_length must be a number > 1 (tokens gained per verify step; "
                       "1 means no gain), got %r" % (accept_length,))
    return reasons


def availability(model, facts):
    """(True, why) when this checkpoint can run NEXTN on the release of `facts`, else (False, why)."""
    spec = facts.SPECULATIVE
    if not model.get("nextn_layers"):
        return False, "the model's config.json has no num_nextn_predict_layers (no MTP draft layer)"
    if model.get("architecture") not in spec["self_draft_architectures"]:
        return False, ("SGLang %s does not take the draft from the checkpoint of %s (%s)"
                       % (facts.VERSION, model.get("architecture"), spec["source"]))
    if not model.get("draft_weights"):
        return False, ("the checkpoint's weights have no MTP layer (no tensors of layer %d, num_hidden_layers, in its "
                       "weight index): SGLang would draft from an empty layer" % model["num_layers"])
    return True, ("the checkpoint carries %d MTP layer(s) (layer %d in its weights)"
                  % (model["nextn_layers"], model["num_layers"]))


def pp_reason(facts, pp):
    """Why the release cannot run NEXTN with this pp (None when it can)."""
    spec = facts.SPECULATIVE
    if pp > 1 and (spec["nextn_alias"] not in spec["pp_algorithms"] or not spec["pp_env"]):
        return "pp > 1 cannot run speculative decoding in SGLang %s (%s)" % (facts.VERSION, facts.PP["source"])
    return None


def server_args(facts):
    """The server args of NEXTN with the release's default draft parameters."""
    steps, topk, draft = facts.SPECULATIVE["default_params"]
    return {"speculative_algorithm": ALGORITHM, "speculative_num_steps": steps, "speculative_eagle_topk": topk,
            "speculative_num_draft_tokens": draft}


def model_values(facts, values):
    """The values SGLang runs with once NEXTN is asked for (what the estimates and the fit read): its request cap
    where none is set."""
    out = dict(values, **server_args(facts))
    if out.get("max_running_requests") is None:
        out["max_running_requests"] = facts.SPECULATIVE["max_running_requests"]
    return out


def env(facts, pp):
    """The environment NEXTN needs on the release of `facts` at this pp."""
    spec, out = facts.SPECULATIVE, {}
    if spec["spec_v2_env"]:
        out[spec["spec_v2_env"]] = "True"
    if pp > 1 and spec["pp_env"]:
        out[spec["pp_env"]] = "True"
    return out


def settings(facts, model, accept_length):
    """What plan_score's estimate reads: {accept_length, num_steps, num_draft_tokens, draft_layers}."""
    steps, _topk, draft = facts.SPECULATIVE["default_params"]
    return {"accept_length": float(accept_length or DEFAULT_ACCEPT_LENGTH), "num_steps": steps,
            "num_draft_tokens": draft, "draft_layers": model["nextn_layers"]}


def draft_bytes(model):
    """Bytes of the draft (MTP) layers, all TP ranks together: one average decoder layer of the checkpoint each
    (model_config's byte split counts them so); embeddings and LM head are the target's (shared)."""
    b = model["bytes"]
    layers = model["num_layers"]
    dense = model["dense_layers"] if model["moe"] else layers
    average = (b["dense_layer"] * dense + b["moe_layer"] * (layers - dense)) / float(layers)
    return model["nextn_layers"] * average
