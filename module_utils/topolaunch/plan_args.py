"""Server args of the plan checked against the installed SGLang version's own flag table, and turned into argv.

Plain Python 3.9+ stdlib. The tables are generated from each supported version's SGLang wheel by
tools/sglang_flags.py (sglang_flags_<version>.py; `tools/sglang_flags.py --all` regenerates them). A key of
`server_args` may be the ServerArgs field (`fp8_gemm_runner_backend`), argparse's dest, or a flag or alias
spelled in snake case (`fp8_gemm_backend` for `--fp8-gemm-backend`). Only the canonical long flag is ever
written (`--pp-size`, never `--pp`, which is an ambiguous prefix in 0.5.9).
"""
import json
import math
import re

from . import sglang_flags_0_5_9, sglang_flags_0_5_23
from .constants import base_version
from .text import control_character

_MODULES = (sglang_flags_0_5_9, sglang_flags_0_5_23)


def _expand(module):
    """{flag: entry with every key}: the generated tables leave out keys that hold their default."""
    out = {}
    for flag, entry in module.FLAGS.items():
        full = dict(module.ENTRY_DEFAULTS, field=entry["dest"])
        full.update(entry)
        full.setdefault("option_strings", [flag] + list(full["aliases"]))
        out[flag] = full
    return out


FLAG_TABLES = {m.VERSION: _expand(m) for m in _MODULES}

# Flags a version removed, with the flag that took their place: version -> {old ServerArgs field: new one}.
# The 0.5.23 wheel keeps no map of these (its retired flags with a Deprecated* action or a "Deprecated" help
# are in the table, as deprecated); each pair below was read from the two wheels' sources:
RENAMED = {
    "0.5.23": {
        # sglang/srt/arg_groups/fields/exec_.py dsa_prefill_backend / dsa_decode_backend: the same help as
        # 0.5.9's --nsa-*-backend (server_args.py) with "DSA (DeepSeek Sparse Attention)" for "NSA", and
        # arg_groups/choices.py ATTENTION_BACKEND_CHOICES: "nsa",  # Deprecated alias for "dsa"
        "nsa_prefill_backend": "dsa_prefill_backend",
        "nsa_decode_backend": "dsa_decode_backend",
        # fields/exec_.py: CUDA graphs are per phase; 0.5.9's one graph was the decode graph
        "cuda_graph_max_bs": "cuda_graph_max_bs_decode",
        "cuda_graph_bs": "cuda_graph_bs_decode",
        # fields/parallel.py enable_prefill_cp / cp_strategy (values zigzag, interleave; 0.5.9's
        # nsa_prefill_cp_mode took round-robin-split, in-seq-split)
        "enable_nsa_prefill_context_parallel": "enable_prefill_cp",
        "nsa_prefill_cp_mode": "cp_strategy",
        # fields/exec_.py mamba_radix_cache_strategy: 0.5.9's help, word for word
        "mamba_scheduler_strategy": "mamba_radix_cache_strategy",
        # fields/exec_.py expert_balancedness_report_mode (off, server_log, prometheus, both)
        "enable_expert_distribution_metrics": "expert_balancedness_report_mode",
    },
}


def _version_key(version):
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"[.]", version))


def supported_versions():
    """Versions with a flag table, oldest first."""
    return sorted(FLAG_TABLES, key=_version_key)


class UnknownVersion(KeyError):
    """A version without a flag table (a KeyError, as before there was more than one table)."""

    def __str__(self):
        return "SGLang %s has no flag table (supported: %s)" % (self.args[0], ", ".join(supported_versions()))


# Flags the planner writes itself; each must exist in every supported table (tested).
PLANNER_FLAGS = ("--model-path", "--served-model-name", "--host", "--port", "--tp-size", "--pp-size",
                 "--dp-size", "--ep-size", "--nnodes", "--node-rank", "--dist-init-addr")

# server_args keys the planner decides (or refuses): key -> what to use instead.
MANAGED = {
    "model_path": "the model_path input (topolaunch_model_path)",
    "tp_size": "the layout (e.g. layout=tp4pp2 or {tp: 4, pp: 2})",
    "pp_size": "the layout (e.g. layout=tp4pp2 or {tp: 4, pp: 2})",
    "dp_size": "the layout (e.g. layout=tp4dp2 or {tp: 4, dp: 2})",
    "ep_size": "the layout (e.g. layout=tp8ep8 or {tp: 8, ep: 8})",
    "nnodes": "the nnodes input", "node_rank": "the node_rank input", "dist_init_addr": "the dist_init_addr input",
    "host": "the host input (topolaunch_host)", "port": "the port input (topolaunch_port)",
    "served_model_name": "the served_model_name input (topolaunch_served_model_name)",
    "base_gpu_id": "the gpus input (topolaunch_gpus): the planner orders CUDA_VISIBLE_DEVICES itself",
    "gpu_id_step": "the gpus input (topolaunch_gpus): the planner orders CUDA_VISIBLE_DEVICES itself",
    "enable_metrics": "the metrics input (topolaunch_metrics: true by default)",
    "enable_metrics_for_all_schedulers": "the metrics input (topolaunch_metrics: the planner adds it where a TP "
                                         "rank other than 0 would not report)",
    "enable_dp_attention": "nothing: DP attention maps DP ranks onto the TP group, which this planner does not "
                           "model (use layout dp for independent replicas)",
    "attn_dp_size": "nothing: DP attention maps DP ranks onto the TP group, which this planner does not "
                    "model (use layout dp for independent replicas)",
    # SGLang takes one --config file ("Multiple config files specified!" for a second); the launch writes its own
    # (the API key goes there), and a file of the operator's would set flags the planner refuses (base_gpu_id, ...).
    "config": "each flag as its own key of topolaunch_server_args: the launch writes the server's --config file "
              "itself",
}
# Secrets never in the plan (printed, saved as plan.json and current_plan.json 0644, on the server's argv): SGLang
# 0.5.23 hides watermark_config (its keys) itself (ServerArgs.__repr__, redact_watermark_command_line). Those the
# launch stage carries, in the server's own 0600 config file (--config) as it carries the API key, and their
# variables.
SECRETS = ("api_key", "admin_api_key", "ssl_keyfile_password", "watermark_config")
SECRET_SOURCES = {"api_key": "topolaunch_api_key", "watermark_config": "topolaunch_watermark_config"}
METRICS_FLAG = "--enable-metrics"
ALL_SCHEDULERS_FLAG = "--enable-metrics-for-all-schedulers"


def metrics_argv(index, metrics, tp):
    """The words that turn SGLang's Prometheus metrics on (GET /metrics): --enable-metrics, and, where the release
    has it and the layout has TP ranks other than 0, --enable-metrics-for-all-schedulers. Without it only each TP
    group's rank 0 reports (attn_tp_rank == 0: 59:sglang/srt/managers/scheduler_metrics_mixin.py:100-102,
    523:sglang/srt/observability/metrics_collector.py:1360-1367); PP stages and DP replicas each have their
    own rank 0. [] with metrics off or a release without --enable-metrics."""
    if not metrics or not index.has(METRICS_FLAG):
        return []
    return [METRICS_FLAG] + ([ALL_SCHEDULERS_FLAG] if tp > 1 and index.has(ALL_SCHEDULERS_FLAG) else [])


class FlagIndex:
    """Lookups into one version's flag table; a local version label is ignored (0.5.9+sim is 0.5.9)."""

    def __init__(self, version):
        base = base_version(version)
        if base not in FLAG_TABLES:
            raise UnknownVersion(base)
        self.version = base
        self.flags = FLAG_TABLES[base]
        self.by_name = {}
        # field, dest and the flag in snake case first; aliases (--tensor-parallel-size) never shadow them
        for flag, entry in self.flags.items():
            for name in (entry["field"], entry["dest"], flag[2:].replace("-", "_")):
                if name:
                    self.by_name.setdefault(name, flag)
        for flag, entry in self.flags.items():
            for alias in entry["aliases"]:
                if alias.startswith("--"):
                    self.by_name.setdefault(alias[2:].replace("-", "_"), flag)

    def has(self, flag):
        return flag in self.flags

    def choices(self, flag):
        return self.flags[flag]["choices"]

    def name_of(self, flag):
        """The ServerArgs field a flag sets (else its dest): the key `values` uses."""
        return self.flags[flag]["field"] or self.flags[flag]["dest"]

    def absent(self, key):
        """Why `key` is no flag of this version, when another supported version knows it; else None."""
        renamed = RENAMED.get(self.version, {}).get(key)
        if renamed:
            return "removed in %s, use %s" % (self.version, renamed)
        mine = _version_key(self.version)
        for other in supported_versions():
            index = FlagIndex(other)
            flag = index.by_name.get(key)
            if flag is None or other == self.version:
                continue
            if _version_key(other) < mine:
                entry = index.flags[flag]
                use = _key_of(entry["replacement"]) if entry["deprecated"] and entry["replacement"] else None
                return "removed in %s%s" % (self.version, (", use %s" % use) if use else "")
            earlier = [o for o, n in RENAMED.get(other, {}).items() if n == key and o in self.by_name]
            return "added in %s%s" % (other, ("; %s has %s" % (self.version, earlier[0])) if earlier else "")
        return None


def _key_of(replacement):
    """A replacement flag as a server_args key (--swa-full-tokens-ratio -> swa_full_tokens_ratio); a replacement
    with a value or placeholder (--image-processor-backend=pil) stays as SGLang wrote it."""
    if re.match(r"^--[a-z0-9-]+$", replacement):
        return replacement[2:].replace("-", "_")
    return replacement


_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)")
_SI = {"k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12}
_IEC = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40}


def _human_int(text):
    """SGLang 0.5.23's human_readable_int (sglang/srt/utils/common.py): 32768, 32k, 25.6k, 1Mi; None if invalid."""
    text = text.strip()
    found = _HUMAN_INT.fullmatch(text)
    if found:
        number, suffix = found.groups()
        if suffix in _IEC:
            return None if "." in number else int(number) * _IEC[suffix]
        whole, _sep, frac = number.partition(".")
        return (int(whole + frac) * _SI[suffix]) // (10 ** len(frac))  # int(Decimal(number) * multiplier)
    try:
        return int(text)
    except ValueError:
        return None


def _convert(value, type_name, where):  # noqa: C901 - one branch per SGLang type
    """Value for one argparse item, as SGLang's `type` would accept it; (text, value) or raises ValueError."""
    if type_name in ("int", "human_int"):
        if isinstance(value, bool):
            raise ValueError("%s must be an integer, got %r" % (where, value))
        if isinstance(value, int):
            return str(value), value
        if isinstance(value, float) and value.is_integer():
            return str(int(value)), int(value)
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return value.strip(), int(value)
        if type_name == "human_int" and isinstance(value, str) and _human_int(value) is not None:
            return value.strip(), _human_int(value)
        raise ValueError("%s must be an integer%s, got %r" % (
            where, " (or 32k, 1Mi: SI and IEC suffixes)" if type_name == "human_int" else "", value))
    if type_name == "float":
        if isinstance(value, bool):
            raise ValueError("%s must be a number, got %r" % (where, value))
        try:
            number = float(value) if isinstance(value, (int, float)) else float(value.strip())
        except (AttributeError, ValueError):
            raise ValueError("%s must be a number, got %r" % (where, value)) from None
        if not math.isfinite(number):              # "nan", "inf": float() takes them, SGLang's arithmetic does not
            raise ValueError("%s must be a finite number, got %r" % (where, value))
        if isinstance(value, (int, float)):
            return repr(float(value)) if isinstance(value, float) else str(value), number
        return value.strip(), number
    if type_name in ("json", "json_list", "cuda_graph_config"):
        if isinstance(value, str):
            try:
                parsed = json.loads(value)
            except ValueError:
                raise ValueError("%s must be JSON, got %r" % (where, value)) from None
        else:
            parsed = value
        if type_name == "json_list" and not isinstance(parsed, list):
            raise ValueError("%s must be a JSON list, got %r" % (where, value))
        if type_name == "cuda_graph_config" and not isinstance(parsed, dict):
            raise ValueError("%s must be a JSON object ({phase: settings}), got %r" % (where, value))
        return json.dumps(parsed, separators=(",", ":"), sort_keys=True), parsed
    if isinstance(value, (dict, list)) or value is True or value is False:
        raise ValueError("%s must be a string, got %r" % (where, value))
    return str(value), value


def check_server_args(server_args, index):
    """Validate server_args against the version's flags.

    Returns (items, values, reasons, warnings): items = [(flag, [argv words])] in canonical-flag order, values =
    {field or dest: converted value} for the planner's own rules, reasons = every problem found (not just the
    first), warnings = flags written that the version marks deprecated (they still work; the warning names the
    replacement; a deprecated switch set to false writes nothing and is not warned about).
    """
    items, values, reasons, warnings, seen = [], {}, [], [], {}
    if server_args is None:
        return items, values, reasons, warnings
    if not isinstance(server_args, dict):
        return items, values, ["server_args must be a mapping of ServerArgs fields, got %s"
                               % type(server_args).__name__], warnings
    for key in sorted(server_args, key=str):
        value = server_args[key]
        where = "server_args.%s" % key
        if not isinstance(key, str):
            reasons.append("server_args key %r is not a string" % (key,))
            continue
        flag = index.by_name.get(key)
        name = key if flag is None else index.name_of(flag)
        if name in SECRETS or key in SECRETS:
            reasons.append("%s is a secret and does not belong in the plan, which is printed and saved%s" % (
                where, ": set %s, which the launch stage passes through the server's 0600 config file (--config)"
                % SECRET_SOURCES[name] if name in SECRET_SOURCES else ""))
            continue
        if name in MANAGED or key in MANAGED:
            reasons.append("%s is set by the planner: use %s" % (where, MANAGED.get(name) or MANAGED[key]))
            continue
        if flag is None:
            why = index.absent(key)
            if why and why.startswith("removed"):
                reasons.append("%s: %s" % (where, why))
                continue
            hint = [n for n in sorted(index.by_name) if key in n or n in key][:5]
            reasons.append("%s: SGLang %s has no flag for %r%s%s" % (
                where, index.version, key, (" (%s)" % why) if why else "",
                (" (similar: %s)" % ", ".join(hint)) if hint else ""))
            continue
        if flag in seen:
            reasons.append("%s and server_args.%s both set %s" % (where, seen[flag], flag))
            continue
        seen[flag] = key
        entry = index.flags[flag]
        if value is None:
            continue
        words, problems = _words(flag, entry, value, where, index.version)
        reasons.extend(problems)
        if problems:
            continue
        values[name] = _plain_value(entry, value)
        if words:
            items.append((flag, words))
        if words and entry["deprecated"] and entry["action"] != "DeprecatedAction":
            warnings.append("%s: %s is deprecated in SGLang %s%s" % (
                where, flag, index.version, ("; use %s" % entry["replacement"]) if entry["replacement"] else ""))
    items.sort(key=lambda item: item[0])
    return items, values, reasons, warnings


_NUMBER = re.compile(r"^-\d+(\.\d+)?([eE][-+]?\d+)?$")


def text_problem(text, where):
    """Why a string may not reach the unit file, the env file or the server's argv, or None: a control character
    (systemd ends a line at CR as at LF, an env file at either) or a leading '-' that is not a number (a value
    that argparse would read as another flag)."""
    text = str(text)
    bad = control_character(text)
    if bad:
        return "%s: %r contains a control character (%r); refused" % (where, text, bad)
    if text.startswith("-") and not _NUMBER.match(text):
        return "%s: %r looks like a flag (starts with '-'); refused so that it cannot set another server argument" % (
            where, text)
    return None


def _plain_value(entry, value):
    if isinstance(value, (list, bool)):
        return value
    if entry["type"] == "int":
        return int(value)
    if entry["type"] == "human_int":
        return _convert(value, "human_int", "")[1]
    if entry["type"] == "float":
        return float(value)
    return value


SWITCHES = ("store_true", "store_false", "BooleanOptionalAction", "DeprecatedStoreTrueAction")


def _words(flag, entry, value, where, version):  # noqa: C901 - one branch per argparse action
    """argv words for one flag and value, or problems."""
    action = entry["action"]
    if action == "DeprecatedAction":
        return [], ["%s: %s is deprecated in SGLang %s and does nothing; remove it" % (where, flag, version)]
    if action in SWITCHES or (action == "DeprecatedStoreConstAction" and entry["nargs"] == 0):
        if not isinstance(value, bool):
            return [], ["%s: %s is a switch (%s); give true or false, got %r" % (where, flag, action, value)]
        if action == "BooleanOptionalAction":  # argparse adds --no-<flag>
            return [flag if value else "--no-" + flag[2:]], []
        wanted = value if action != "store_false" else not value
        return ([flag] if wanted else []), []
    nargs = entry["nargs"]
    if nargs in ("+", "*") or action == "LoRAPathAction":
        items = value if isinstance(value, list) else [value]
        if nargs == "+" and not items:
            return [], ["%s: %s needs at least one value" % (where, flag)]
    elif nargs == "?" and value is True:
        return [flag], []
    else:
        if isinstance(value, list) and entry["type"] not in ("json", "json_list"):
            return [], ["%s: %s takes one value, got a list %r" % (where, flag, value)]
        items = [value]
    words, problems = [flag], []
    for k, item in enumerate(items):
        try:
            text, converted = _convert(item, entry["type"], where)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        problem = text_problem(text, where if len(items) == 1 else "%s[%d]" % (where, k))
        if problem:
            problems.append(problem)
            continue
        choices = entry["choices"]
        if choices is not None and converted not in choices:
            problems.append("%s: %r is not a choice of %s in SGLang %s (choices: %s)" % (
                where, item, flag, version, ", ".join(str(c) for c in choices)))
            continue
        words.append(text)
    return words, problems
