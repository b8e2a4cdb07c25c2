"""Known combinations: launches that fail or serve wrong output on a GPU architecture, and what the plan does instead.

Plain Python 3.9+ stdlib. RULES is the one table (data); the README's table is generated from it
(tools/known_combinations.py). A rule is keyed on what the launch runs, never on a model or GPU name:

    when        compute_capability_major (the GPUs' CUDA compute capability, major: 12 = SM120/SM121), attention
                (attention_kind(): mha_gqa, mla, dsa = MLA with DeepSeek sparse attention), quantization (SGLang's
                name of the checkpoint's quantization, model_config.quantization_of); a key left out matches all
    sglang      the SGLang versions it applies to: {"min": "0.5.9", "max": None} (inclusive; None: open)
    action      server_args (set unless the operator set the key: then the operator's value is kept, with a
                warning naming the source), env (the server's environment), or refuse (a reason: no plan)
    source      where the failure is reported (issue, PR, doc, knowledge base), source_name how the plan names it
    checked     the SGLang releases whose source the rule's claims were read against: each claim (CLAIMS) is tested
                against the facts tools/known_combinations.py reads from that release's wheel
                (known_combinations_facts.py), and the plan's reason quotes the release's own fact

The plan states every rule it applied in its reason and lists them under `known_combinations`.

BACKEND_RULES rank the backends a tune may measure as extra candidates (tune_backends.py, topolaunch_tune_backends):
each is keyed like a rule (when, sglang) and names a backend kind (the flag's name in snake case, as
sglang_facts_*.BACKENDS lists them per release) with

    close       the values the source measured near each other here, best first: the tune measures those the
                installed release offers (BACKENDS choices)
    unsupported values that do not run here (the tune never measures them, even when listed)
    concurrency what the source says about the concurrency the ranking depends on
"""
from .known_combinations_facts import FACTS

__all__ = ["RULES", "BACKEND_RULES", "ATTENTION_KINDS", "attention_kind", "applies", "apply", "check_claims", "action_text",
           "version_range_text"]

KNOWLEDGE_BASE = "https://github.com/voipmonitor/rtx6kpro/blob/07e889858b0b03c467963611d5d26fbaf15301c0/models/glm5.md"
KB_NAME = "voipmonitor/rtx6kpro models/glm5.md@07e88985"
ATTENTION_KINDS = ("mha_gqa", "mla", "dsa")
WHEN_KEYS = ("compute_capability_major", "attention", "quantization")
RULE_KEYS = ("id", "problem", "source", "source_name", "checked", "when", "sglang", "server_args", "env", "refuse",
             "claims", "note")

RULES = (
    {
        "id": "sm12-mla-kv-bf16",
        "problem": "an FP8 KV cache garbles MLA/DSA attention's output on SM120 (or it emits 1 token and stops)",
        "source": KNOWLEDGE_BASE + "#bf16-kv-cache-mandatory",
        "source_name": KB_NAME + " (BF16 KV Cache Mandatory; Error 6)",
        "checked": ("0.5.9", "0.5.23"),
        "when": {"compute_capability_major": (12,), "attention": ("mla", "dsa")},
        "sglang": {"min": "0.5.9", "max": None},
        "server_args": {"kv_cache_dtype": "bf16"},
        "claims": ("dsa_kv_default_fp8", "kv_choice"),
        "note": "the release's own default for a DSA model on SM >= 10 is fp8_e4m3; 0.5.23 has a GLM-only FP8 path "
                "for SM120 (flashinfer_sparse_mla) that the source did not measure",
    },
    {
        "id": "sm12-deepgemm-off",
        "problem": "DeepGEMM has no SM120 kernels (no WGMMA/TCGEN05): the start fails "
                   "(deep_gemm.get_num_sms AttributeError)",
        "source": KNOWLEDGE_BASE + "#all-errors-and-fixes",
        "source_name": KB_NAME + " (Error 1; SM120 Architecture Limitations)",
        "checked": ("0.5.9", "0.5.23"),
        "when": {"compute_capability_major": (12,)},
        "sglang": {"min": "0.5.9", "max": None},
        "env": {"SGLANG_ENABLE_JIT_DEEPGEMM": "0"},
        "claims": ("env_switch",),
        "note": "the source also sets SGLANG_ENABLE_DEEP_GEMM=0, which neither release reads (not set); 0.5.23 "
                "itself uses DeepGEMM on SM120/121 only when the installed deep_gemm has the SM120 kernels",
    },
    {
        "id": "sm12-dsa-attention-flashinfer",
        "problem": "the DSA attention backends SGLang picks (flashmla_*, trtllm) do not run on SM120 "
                   "(\"Unsupported architecture\"); flashinfer's MLA kernels do",
        "source": KNOWLEDGE_BASE + "#launch-parameter-reference",
        "source_name": KB_NAME + " (Launch parameter reference; Error 4)",
        "checked": ("0.5.9", "0.5.23"),
        "when": {"compute_capability_major": (12,), "attention": ("dsa",)},
        "sglang": {"min": "0.5.9", "max": None},
        "server_args": {"attention_backend": "flashinfer"},
        "claims": ("dsa_attention_fill", "dsa_backends_unsupported", "flashinfer_choice"),
        "note": "0.5.9 has no flashinfer DSA backend; 0.5.23's (flashinfer_sparse_mla) takes only an FP8 KV cache",
    },
)

BACKEND_RULES = (
    {
        "id": "sm12-fp4-moe-runner",
        "kind": "moe_runner_backend",
        "problem": "NVFP4 MoE on SM120: the fastest MoE runner depends on the concurrency",
        "source": KNOWLEDGE_BASE + "#moe-runner-backend-comparison",
        "source_name": KB_NAME + " (MoE runner backend comparison; Benchmark Results)",
        "checked": ("0.5.9", "0.5.23"),
        "when": {"compute_capability_major": (12,), "quantization": ("modelopt_fp4",)},
        "sglang": {"min": "0.5.9", "max": None},
        "close": ("cutlass", "flashinfer_cutlass", "flashinfer_cutedsl"),
        "unsupported": ("deep_gemm",),
        "concurrency": "b12x (a patched build's, in neither release) leads at 1-2 users; cutlass and "
                       "flashinfer_cutlass at 4+ (cutlass 962 tok/s at 32 with MTP); flashinfer_cutedsl runs "
                       "cutlass's code path without expert parallelism; deep_gemm falls back (no SM120 kernels)",
    },
    {
        "id": "sm12-fp4-gemm",
        "kind": "fp4_gemm_backend",
        "problem": "NVFP4 GEMM on SM120: flashinfer_cutlass races (NaN) without CUTLASS 4.4.1; flashinfer_cudnn "
                   "is the workaround",
        "source": KNOWLEDGE_BASE + "#flashinfer-cutlass-race-condition-fix",
        "source_name": KB_NAME + " (FlashInfer CUTLASS Race Condition Fix)",
        "checked": ("0.5.9", "0.5.23"),
        "when": {"compute_capability_major": (12,), "quantization": ("modelopt_fp4",)},
        "sglang": {"min": "0.5.9", "max": None},
        "close": ("flashinfer_cutlass", "flashinfer_cudnn"),
        "unsupported": (),
        "concurrency": "the source's 4+ user launch uses --fp4-gemm-backend cutlass (flashinfer_cutlass in the "
                       "releases' choices)",
    },
    {
        "id": "sm12-dsa-attention-backend",
        "kind": "attention_backend",
        "problem": "the DSA attention backends (nsa/dsa, flashmla, trtllm_mla, cutlass_mla) do not run on SM120; "
                   "flashinfer's MLA kernels do",
        "source": KNOWLEDGE_BASE + "#launch-parameter-reference",
        "source_name": KB_NAME + " (Launch parameter reference; Error 4)",
        "checked": ("0.5.9", "0.5.23"),
        "when": {"compute_capability_major": (12,), "attention": ("dsa",)},
        "sglang": {"min": "0.5.9", "max": None},
        "close": ("flashinfer",),
        "unsupported": ("nsa", "dsa", "flashmla", "trtllm_mla", "cutlass_mla"),
        "concurrency": "",
    },
)


def backend_rules(kind, model, compute_capabilities, version, rules=BACKEND_RULES):
    """The backend rules of this kind that apply to this model on these GPUs under this version."""
    return [r for r in rules if r["kind"] == kind and applies(r, model, compute_capabilities, version)]


def _version_key(version):
    return tuple(int(p) if p.isdigit() else p for p in str(version).split("."))


def version_range_text(span):
    low, high = span.get("min"), span.get("max")
    if low and high:
        return "%s to %s" % (low, high)
    return ">= %s" % low if low else ("<= %s" % high if high else "any")


def attention_kind(model):
    """dsa (MLA with DeepSeek sparse attention), mla, or mha_gqa, from model_config.model_facts."""
    if model.get("nsa"):
        return "dsa"
    return "mla" if model.get("mla") else "mha_gqa"


def _major(compute_capability):
    try:
        return int(str(compute_capability).split(".", maxsplit=1)[0])
    except ValueError:
        return None


def applies(rule, model, compute_capabilities, version):
    """Whether the rule matches this model on GPUs of these compute capabilities ("12.0") under this version."""
    when = rule["when"]
    majors = {_major(cc) for cc in compute_capabilities} - {None}
    if "compute_capability_major" in when and not majors & set(when["compute_capability_major"]):
        return False
    if "attention" in when and attention_kind(model) not in when["attention"]:
        return False
    if "quantization" in when and model.get("quantization") not in when["quantization"]:
        return False
    span, mine = rule["sglang"], _version_key(version)
    if span.get("min") and mine < _version_key(span["min"]):
        return False
    return not (span.get("max") and mine > _version_key(span["max"]))


def action_text(rule):
    """What the plan does, in words (the README's table and the plan's reason)."""
    parts = ["--%s %s" % (k.replace("_", "-"), v) for k, v in sorted((rule.get("server_args") or {}).items())]
    parts += ["%s=%s" % kv for kv in sorted((rule.get("env") or {}).items())]
    if rule.get("refuse"):
        parts.append("refuse: %s" % rule["refuse"])
    return ", ".join(parts)


# ----------------------------------------------------------------------------------------------------- claims
# Each claim: (facts of one release, its flag table) -> (problems, what the release says, for the reason).


def _claim_dsa_kv_default_fp8(facts, flags, rule):
    fact = facts.get("dsa_kv_cache_default")
    if not fact:
        return ["the release shows no DSA KV cache default"], ""
    problems = []
    if fact["then"] != "fp8_e4m3" or fact["sm_major_at_least"] > min(rule["when"]["compute_capability_major"]):
        problems.append("the release's DSA KV default on SM >= %s is %s, not fp8_e4m3"
                        % (fact["sm_major_at_least"], fact["then"]))
    return problems, "its own KV default for DSA models on SM >= %d is %s (%s)" % (
        fact["sm_major_at_least"], fact["then"], fact["where"])


def _claim_kv_choice(facts, flags, rule):
    choices = (flags.get("--kv-cache-dtype") or {}).get("choices") or []
    wanted = rule["server_args"]["kv_cache_dtype"]
    return ([] if wanted in choices else ["--kv-cache-dtype has no choice %s" % wanted]), ""


def _claim_env_switch(facts, flags, rule):
    problems, words = [], (facts.get("env_bool_words") or {}).get("false") or []
    gate = facts.get("deepgemm_gate") or {}
    for name, value in rule["env"].items():
        env = (facts.get("env") or {}).get(name)
        if not env or env["type"] != "EnvBool" or value.lower() not in words:
            problems.append("%s is no EnvBool of the release that %r turns off" % (name, value))
        if name not in gate.get("reads_env", []):
            problems.append("%s is not what the release's DeepGEMM switch reads" % name)
    return problems, "DeepGEMM is on unless %s is false (%s; SM checks: %s)" % (
        " / ".join(rule["env"]), gate.get("where"), ", ".join(gate.get("sm_checks", [])))


def _claim_dsa_attention_fill(facts, flags, rule):
    fact = facts.get("dsa_attention_backend")
    if not fact or not fact.get("only_when_unset"):
        return ["the release does not fill in the DSA attention backend only when none is set"], ""
    return [], "it sets attention backend %s for DSA models only when none is given (%s)" % (
        fact["value"], fact["where"])


def _claim_dsa_backends_unsupported(facts, flags, rule):
    picked = set((facts.get("dsa_backends_picked") or {}).get("backends") or [])
    problems = [] if picked & {"flashmla_sparse", "flashmla_kv", "trtllm"} else [
        "the release's DSA defaults include none of flashmla_sparse, flashmla_kv, trtllm"]
    choices = set()
    for flag in ("--nsa-prefill-backend", "--nsa-decode-backend", "--dsa-prefill-backend", "--dsa-decode-backend"):
        choices |= set((flags.get(flag) or {}).get("choices") or [])
    flashinfer = sorted(c for c in choices if c.startswith("flashinfer"))
    fi_kv = facts.get("dsa_flashinfer_kv")
    if flashinfer and not (fi_kv and "float8" in fi_kv["kv_cache_dtype"]):
        problems.append("the release has a flashinfer DSA backend (%s) not limited to an FP8 KV cache"
                        % ", ".join(flashinfer))
    said = "its DSA backends default to %s" % ", ".join(sorted(picked & {"flashmla_sparse", "flashmla_kv", "trtllm"}))
    said += ("; its flashinfer DSA backend takes only %s KV (%s)" % (fi_kv["kv_cache_dtype"], fi_kv["where"])
             if fi_kv else "; it has no flashinfer DSA backend")
    return problems, said


def _claim_flashinfer_choice(facts, flags, rule):
    choices = (flags.get("--attention-backend") or {}).get("choices") or []
    wanted = rule["server_args"]["attention_backend"]
    return ([] if wanted in choices else ["--attention-backend has no choice %s" % wanted]), ""


CLAIMS = {
    "dsa_kv_default_fp8": _claim_dsa_kv_default_fp8,
    "kv_choice": _claim_kv_choice,
    "env_switch": _claim_env_switch,
    "dsa_attention_fill": _claim_dsa_attention_fill,
    "dsa_backends_unsupported": _claim_dsa_backends_unsupported,
    "flashinfer_choice": _claim_flashinfer_choice,
}


def check_claims(rule, version, flags):
    """(problems, what the release says) of a rule's claims against the facts of `version` and its flag table."""
    facts = FACTS.get(version)
    if facts is None:
        return ["no facts of SGLang %s (tools/known_combinations.py)" % version], []
    problems, said = [], []
    for name in rule.get("claims", ()):
        found, text = CLAIMS[name](facts, flags, rule)
        problems.extend("%s: %s" % (name, p) for p in found)
        if text:
            said.append(text)
    return problems, said


# ----------------------------------------------------------------------------------------------------- apply


def apply(model, compute_capabilities, index, server_args, operator_args, rules=RULES):
    """The rules that match, applied: {server_args (server_args with the rules' values where nobody set the key),
    env, applied [{id, source, server_args, env, kept}], reasons (sentences for the plan's reason), warnings,
    refusals}. `index` is the version's plan_args.FlagIndex: a key the operator spelled another way (a dest, an
    alias) counts as set. `operator_args` are the operator's own server args: their values win, with a warning."""
    out = {"server_args": server_args, "env": {}, "applied": [], "reasons": [], "warnings": [], "refusals": []}
    if not isinstance(server_args, (dict, type(None))) or model is None:
        return out
    merged = dict(server_args or {})
    mine = {index.by_name.get(k, k): (k, v) for k, v in (operator_args or {}).items()} if isinstance(
        operator_args, dict) else {}
    given = {index.by_name.get(k, k) for k in merged}
    for rule in rules:
        if not applies(rule, model, compute_capabilities, index.version):
            continue
        problems, said = check_claims(rule, index.version, index.flags)
        cite = "%s; source: %s" % (rule["problem"], rule["source_name"])
        if problems:
            out["warnings"].append("known combination %s is applied, but its claims about SGLang %s do not hold "
                                   "(%s): re-read it against this release" % (rule["id"], index.version,
                                                                              "; ".join(problems)))
        if rule.get("refuse"):
            out["refusals"].append("known combination %s: %s (%s)" % (rule["id"], rule["refuse"], cite))
            continue
        entry = {"id": rule["id"], "source": rule["source"], "server_args": {}, "env": dict(rule.get("env") or {}),
                 "kept": {}}
        for key, value in sorted((rule.get("server_args") or {}).items()):
            flag = index.by_name.get(key, key)
            if flag in mine and mine[flag][1] != value:
                entry["kept"][mine[flag][0]] = mine[flag][1]
                out["warnings"].append(
                    "server_args.%s=%r is kept as set, against known combination %s (--%s %s: %s)"
                    % (mine[flag][0], mine[flag][1], rule["id"], key.replace("_", "-"), value, cite))
            elif flag not in given:
                merged[key] = value
                entry["server_args"][key] = value
        out["env"].update(entry["env"])
        done = action_text({"server_args": entry["server_args"], "env": entry["env"]})
        if done:
            release = "; SGLang %s: %s" % (index.version, "; ".join(said)) if said else ""
            out["reasons"].append("Known combination %s: %s (%s%s)." % (rule["id"], done, cite, release))
        out["applied"].append(entry)
    out["server_args"] = merged
    return out
