"""`sglang.launch_server`'s command line, built from the flag table extracted from the real wheel of the version
the simulator stands in for (sglang.version: 0.5.9+sim -> 0.5.9).

The table (module_utils/topolaunch/sglang_flags_<version>.py, bundled into the wheel) lists every flag with its
option strings in declaration order, dest, type, default, choices, action, nargs; keys that hold their default
are left out (ENTRY_DEFAULTS). Declaring them in the same order with the same option strings gives argparse's
own behaviour: unknown flags, bad choices and ambiguous prefixes (`--pp 2`) exit with status 2 and the same
message as SGLang.
"""
import argparse
import decimal
import json
import logging
import re
import sys

from sglang._sim import resources

logger = logging.getLogger("sglang.srt.server_args")


def nullable_str(val):  # sglang.srt.utils.common.nullable_str
    if not val or val == "None":
        return None
    return val


def json_list_type(value):  # sglang.srt.utils.common.json_list_type
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError("Invalid JSON list: %s. Please provide a valid JSON list." % value) from None


def human_readable_int(value):  # sglang.srt.utils.common.human_readable_int (0.5.23)
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        iec = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40}
        if suffix in iec:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    "Decimals are not allowed with IEC suffixes like '%s'. Use an integer IEC value such as '%d%s', "
                    "or an SI value such as '%s%s'." % (suffix, int(decimal.Decimal(number)), suffix, number, suffix[0]))
            return int(number) * iec[suffix]
        return int(decimal.Decimal(number) * {"k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12}[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            "Invalid integer value: '%s'. Use a plain integer, SI suffixes (1k, 1M), or IEC suffixes (1Ki, 1Mi). "
            "Suffixes are case-sensitive." % value) from None


def parse_cuda_graph_backend_arg(raw):  # sglang.srt.model_executor.cuda_graph_config (0.5.23)
    if raw == "tc_piecewise":
        raise argparse.ArgumentTypeError("tc_piecewise was removed; select breakable, full, or disabled")
    return raw


def parse_cuda_graph_config_arg(raw):  # sglang.srt.model_executor.cuda_graph_config (0.5.23), the JSON checks
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError("--cuda-graph-config must be JSON: %s" % e) from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(
            "--cuda-graph-config must be a JSON object, got %s" % type(parsed).__name__)
    return parsed


TYPES = {"int": int, "float": float, "str": str, "json": json.loads, "json_list": json_list_type,
         "nullable_str": nullable_str, "human_int": human_readable_int,
         "cuda_graph_backend": parse_cuda_graph_backend_arg, "cuda_graph_config": parse_cuda_graph_config_arg,
         None: None}


class DeprecatedAction(argparse.Action):  # sglang.srt.server_args.DeprecatedAction
    def __init__(self, option_strings, dest, nargs=0, **kwargs):
        super().__init__(option_strings, dest, nargs=nargs, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        print("\033[33m[WARNING] The command line argument '%s' is deprecated and will be removed in future "
              "versions.\033[0m" % option_string, file=sys.stderr)


_deprecation_log = logging.getLogger("sglang.srt.arg_groups.argparse_actions")


class DeprecatedStoreTrueAction(argparse.Action):  # 0.5.23 sglang.srt.arg_groups.argparse_actions
    def __init__(self, option_strings, dest, new_flag=None, nargs=0, const=True, default=False, **kwargs):
        self.new_flag = new_flag
        super().__init__(option_strings, dest, nargs=nargs, const=const, default=default, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        replacement = " Use '%s' instead." % self.new_flag if self.new_flag else ""
        _deprecation_log.warning("\033[1;33m'%s' is deprecated and will be removed in a future release.%s\033[0m"
                                 % (option_string, replacement))
        setattr(namespace, self.dest, True)


class DeprecatedStoreConstAction(argparse.Action):  # 0.5.23 sglang.srt.arg_groups.argparse_actions
    def __init__(self, option_strings, dest, new_flag=None, const_value=None, nargs=0, default=None, **kwargs):
        self.new_flag = new_flag
        self.const_value = const_value
        super().__init__(option_strings, dest, nargs=nargs, default=default, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        replacement = " Use '%s' instead." % self.new_flag if self.new_flag else ""
        _deprecation_log.warning("\033[1;33m'%s' is deprecated and will be removed in a future release.%s\033[0m"
                                 % (option_string, replacement))
        setattr(namespace, self.dest, self.const_value)


class LoRAPathAction(argparse.Action):  # sglang.srt.server_args.LoRAPathAction (values kept as given)
    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, list(values or []))


ACTIONS = {"DeprecatedAction": DeprecatedAction, "LoRAPathAction": LoRAPathAction,
           "DeprecatedStoreTrueAction": DeprecatedStoreTrueAction,
           "DeprecatedStoreConstAction": DeprecatedStoreConstAction,
           "BooleanOptionalAction": argparse.BooleanOptionalAction}
# actions whose table entry carries no value-related keys to pass on (nargs fixed by the action itself)
NO_VALUE_ACTIONS = ("DeprecatedAction", "DeprecatedStoreTrueAction", "BooleanOptionalAction")


def version():
    """The SGLang release this simulator stands in for: its own version without the +sim label."""
    from sglang.version import __version__
    return __version__.split("+", 1)[0]


def table(of_version=None):
    return resources.load("sglang_flags_" + (of_version or version()).replace(".", "_")).FLAGS


def build_parser(of_version=None):
    """argparse.ArgumentParser() of launch_server (prog defaults to the script name, as in SGLang 0.5.9)."""
    parser = argparse.ArgumentParser()
    for canonical, entry in table(of_version).items():
        names = entry.get("option_strings") or [canonical] + list(entry.get("aliases") or [])
        kwargs = {"dest": entry["dest"]}
        action = entry.get("action")
        if action in ACTIONS:
            kwargs["action"] = ACTIONS[action]
        elif action:
            kwargs["action"] = action
        if action in ("store_true", "store_false"):
            if entry.get("default") is not None:
                kwargs["default"] = entry["default"]
        elif action == "store_const":
            kwargs["default"] = entry.get("default")
            kwargs["const"] = entry.get("const")
        elif action == "DeprecatedStoreConstAction":
            kwargs.update(default=entry.get("default"), const_value=entry.get("const"), nargs=entry.get("nargs"))
            if entry.get("choices") is not None:
                kwargs["choices"] = entry["choices"]
        else:
            kwargs["default"] = entry.get("default")
            if action not in NO_VALUE_ACTIONS:
                if entry.get("type") not in TYPES:
                    raise ValueError("flag table: %s has unknown type %r" % (canonical, entry.get("type")))
                if TYPES[entry.get("type")] is not None:
                    kwargs["type"] = TYPES[entry["type"]]
                if entry.get("choices") is not None:
                    kwargs["choices"] = entry["choices"]
                if entry.get("const") is not None:
                    kwargs["const"] = entry["const"]
            if entry.get("nargs") is not None and action != "DeprecatedStoreTrueAction":
                kwargs["nargs"] = entry["nargs"]
        if entry.get("required"):
            kwargs["required"] = True
        parser.add_argument(*names, **kwargs)
    return parser


# argparse dest -> ServerArgs field (ServerArgs.from_cli_args)
RENAMES = {
    "tensor_parallel_size": "tp_size",
    "pipeline_parallel_size": "pp_size",
    "attention_context_parallel_size": "attn_cp_size",
    "moe_data_parallel_size": "moe_dp_size",
    "data_parallel_size": "dp_size",
    "expert_parallel_size": "ep_size",
}
A2A_FORCE_EP = ("deepep", "mooncake", "ascend_fuseep", "flashinfer", "mori")


class ServerArgs:
    """The parsed arguments under ServerArgs' field names, with the defaults SGLang derives at start.

    Attribute access reads the fields; as_dict() is what /server_info shows.
    """

    def __init__(self, namespace):
        fields = {}
        for key, value in vars(namespace).items():
            fields[RENAMES.get(key, key)] = value
        self.__dict__["_fields"] = fields

    def __getattr__(self, name):
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        self._fields[name] = value

    def get(self, name, default=None):
        return self._fields.get(name, default)

    def as_dict(self):
        return dict(self._fields)

    def __repr__(self):
        # as SGLang's dataclass repr: every field, api_key included (SGLang logs it: see README, "Secrets")
        return "ServerArgs(%s)" % ", ".join("%s=%r" % kv for kv in self._fields.items())

    def post_init(self, gpu_memory_mib):
        """The part of ServerArgs.__post_init__ that the lab can meet (defaults that depend on the GPU)."""
        f = self._fields
        f.setdefault("tp_size", 1)
        f.setdefault("pp_size", 1)
        f.setdefault("dp_size", 1)
        f.setdefault("ep_size", 1)
        if f.get("tokenizer_path") is None:
            f["tokenizer_path"] = f["model_path"]
        if f.get("served_model_name") is None:
            f["served_model_name"] = f["model_path"]
        if f.get("device") is None:
            f["device"] = "cuda"
        if f.get("random_seed") is None:
            f["random_seed"] = 42
        if f.get("moe_a2a_backend") in A2A_FORCE_EP:
            f["ep_size"] = f["tp_size"]
            logger.warning("%s MoE A2A is enabled. The expert parallel size is adjusted to be the same as the "
                           "tensor parallel size[%s].", f["moe_a2a_backend"], f["tp_size"])
        if f.get("moe_runner_backend") == "flashinfer_cutlass":
            assert f.get("quantization") in ["modelopt_fp4", "modelopt_fp8", None], (
                "Invalid quantization '%s'. \nFlashInfer Cutlass MOE supports only: 'modelopt_fp4', "
                "'modelopt_fp8', or bfloat16 (None)." % f.get("quantization"))
            assert f["ep_size"] in [1, f["tp_size"]], \
                "The expert parallel size must be 1 or the same as the tensor parallel size"
        if f["dp_size"] == 1:
            f["enable_dp_attention"] = False
        # GPU-dependent defaults (ServerArgs._handle_gpu_memory_settings), gpu_mem in MiB
        if f.get("chunked_prefill_size") is None:
            f["chunked_prefill_size"] = 4096 if gpu_memory_mib < 90 * 1024 else (8192 if gpu_memory_mib < 160 * 1024 else 16384)
        if f.get("cuda_graph_max_bs") is None:
            f["cuda_graph_max_bs"] = (32 if f["tp_size"] < 4 else 160) if gpu_memory_mib < 60 * 1024 else (
                (256 if f["tp_size"] < 4 else 512) if gpu_memory_mib < 160 * 1024 else 512)
        if f.get("mem_fraction_static") is None:
            reserved = 512 + max(f["chunked_prefill_size"], 2048) * 1.5 + f["cuda_graph_max_bs"] * 2
            reserved += f["tp_size"] * f["pp_size"] / 8 * 1024
            if gpu_memory_mib > 60 * 1024:
                reserved = max(reserved, 10 * 1024)
            f["mem_fraction_static"] = round((gpu_memory_mib - reserved) / gpu_memory_mib, 3)
        if f["pp_size"] > 1:
            if not f.get("disable_overlap_schedule"):
                logger.warning("Pipeline parallelism is incompatible with overlap schedule.")
            f["disable_overlap_schedule"] = True

    def check(self):
        """ServerArgs.check_server_args, for what the lab can meet. AssertionError as in SGLang."""
        f = self._fields
        assert (f["tp_size"] * f["pp_size"]) % f["nnodes"] == 0, "tp_size must be divisible by number of nodes"
        if f["pp_size"] > 1:
            assert (f.get("disable_overlap_schedule") and f.get("speculative_algorithm") is None
                    and not f.get("enable_mixed_chunk")), (
                "Pipeline parallelism is not compatible with overlap schedule, speculative decoding, "
                "mixed chunked prefill.")
        assert not (f["dp_size"] > 1 and f["nnodes"] != 1 and not f.get("enable_dp_attention")), \
            "multi-node data parallel is not supported unless dp attention!"
        assert f.get("base_gpu_id", 0) >= 0, "base_gpu_id must be non-negative"
        assert f.get("gpu_id_step", 1) >= 1, "gpu_id_step must be positive"
        assert ":" not in f["served_model_name"], (
            "served_model_name cannot contain a colon (':') character. The colon is reserved for the "
            "'model:adapter' syntax used in LoRA adapter specification. Invalid value: '%s'" % f["served_model_name"])
