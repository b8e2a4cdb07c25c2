"""Server args of the plan checked against the pinned SGLang version's own flag table, and turned into argv.

Plain Python 3.9+ stdlib. The tables are generated from the SGLang wheel by tools/sglang_flags.py
(sglang_flags_<version>.py). A key of `server_args` may be the ServerArgs field (`fp8_gemm_runner_backend`),
argparse's dest, or the flag spelled in snake case (`fp8_gemm_backend` for `--fp8-gemm-backend`). Only the
canonical long flag is ever written (`--pp-size`, never `--pp`, which is an ambiguous prefix in 0.5.9).
"""
import json

from . import sglang_flags_0_5_9

FLAG_TABLES = {sglang_flags_0_5_9.VERSION: sglang_flags_0_5_9.FLAGS}

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
    "enable_dp_attention": "nothing: DP attention maps DP ranks onto the TP group, which this planner does not "
                           "model (use layout dp for independent replicas)",
}
SECRETS = ("api_key", "admin_api_key")


class FlagIndex:
    """Lookups into one version's flag table."""

    def __init__(self, version):
        if version not in FLAG_TABLES:
            raise KeyError(version)
        self.version = version
        self.flags = FLAG_TABLES[version]
        self.by_name = {}
        for flag, entry in self.flags.items():
            for name in (entry.get("field"), entry["dest"], flag[2:].replace("-", "_")):
                if name:
                    self.by_name.setdefault(name, flag)

    def has(self, flag):
        return flag in self.flags

    def choices(self, flag):
        return self.flags[flag]["choices"]


def supported_versions():
    return sorted(FLAG_TABLES)


def _convert(value, type_name, where):
    """Value for one argparse item, as SGLang's `type` would accept it; (text, value) or raises ValueError."""
    if type_name == "int":
        if isinstance(value, bool):
            raise ValueError("%s must be an integer, got %r" % (where, value))
        if isinstance(value, int):
            return str(value), value
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return value.strip(), int(value)
        if isinstance(value, float) and value.is_integer():
            return str(int(value)), int(value)
        raise ValueError("%s must be an integer, got %r" % (where, value))
    if type_name == "float":
        if isinstance(value, bool):
            raise ValueError("%s must be a number, got %r" % (where, value))
        if isinstance(value, (int, float)):
            return repr(float(value)) if isinstance(value, float) else str(value), float(value)
        try:
            return value.strip(), float(value)
        except (AttributeError, ValueError):
            raise ValueError("%s must be a number, got %r" % (where, value)) from None
    if type_name in ("json", "json_list"):
        if isinstance(value, str):
            try:
                parsed = json.loads(value)
            except ValueError:
                raise ValueError("%s must be JSON, got %r" % (where, value)) from None
        else:
            parsed = value
        if type_name == "json_list" and not isinstance(parsed, list):
            raise ValueError("%s must be a JSON list, got %r" % (where, value))
        return json.dumps(parsed, separators=(",", ":"), sort_keys=True), parsed
    if isinstance(value, (dict, list)) or value is True or value is False:
        raise ValueError("%s must be a string, got %r" % (where, value))
    return str(value), value


def check_server_args(server_args, index):
    """Validate server_args against the version's flags.

    Returns (items, values, reasons): items = [(flag, [argv words])] in canonical-flag order, values = {field
    or dest: converted value} for the planner's own rules, reasons = every problem found (not just the first).
    """
    items, values, reasons, seen = [], {}, [], {}
    if server_args is None:
        return items, values, reasons
    if not isinstance(server_args, dict):
        return items, values, ["server_args must be a mapping of ServerArgs fields, got %s"
                               % type(server_args).__name__]
    for key in sorted(server_args, key=str):
        value = server_args[key]
        where = "server_args.%s" % key
        if not isinstance(key, str):
            reasons.append("server_args key %r is not a string" % (key,))
            continue
        flag = index.by_name.get(key)
        name = key if flag is None else (index.flags[flag].get("field") or index.flags[flag]["dest"])
        if name in SECRETS or key in SECRETS:
            reasons.append("%s is a secret and does not belong in the plan, which is printed and saved%s" % (
                where, ": set topolaunch_api_key, which the launch stage passes through the unit's 0600 env file"
                if name == "api_key" else ""))
            continue
        if name in MANAGED or key in MANAGED:
            reasons.append("%s is set by the planner: use %s" % (where, MANAGED.get(name) or MANAGED[key]))
            continue
        if flag is None:
            hint = [n for n in sorted(index.by_name) if key in n or n in key][:5]
            reasons.append("%s: SGLang %s has no flag for %r%s" % (
                where, index.version, key, (" (similar: %s)" % ", ".join(hint)) if hint else ""))
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
        if not problems:
            values[name] = _plain_value(entry, value)
            if words:
                items.append((flag, words))
    items.sort(key=lambda item: item[0])
    return items, values, reasons


def _plain_value(entry, value):
    if entry["type"] == "int" and not isinstance(value, (list, bool)):
        return int(value)
    if entry["type"] == "float" and not isinstance(value, (list, bool)):
        return float(value)
    return value


def _words(flag, entry, value, where, version):
    """argv words for one flag and value, or problems."""
    action = entry["action"]
    if action == "DeprecatedAction":
        return [], ["%s: %s is deprecated in SGLang %s and does nothing; remove it" % (where, flag, version)]
    if action in ("store_true", "store_false"):
        if not isinstance(value, bool):
            return [], ["%s: %s is a switch (%s); give true or false, got %r" % (where, flag, action, value)]
        wanted = value if action == "store_true" else not value
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
    for item in items:
        try:
            text, converted = _convert(item, entry["type"], where)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        choices = entry["choices"]
        if choices is not None and converted not in choices:
            problems.append("%s: %r is not a choice of %s in SGLang %s (choices: %s)" % (
                where, item, flag, version, ", ".join(str(c) for c in choices)))
            continue
        words.append(text)
    return words, problems
