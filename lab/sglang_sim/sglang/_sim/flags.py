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
import os
import re
import sys

from sglang._sim import release, resources

logger = logging.getLogger("sglang.srt.server_args")


# The architectures whose checkpoint carries its own draft (MTP) layers: the draft model path defaults to the model
# (59:sglang/srt/server_args.py:2396-2407; 523:sglang/srt/arg_groups/speculative_hook.py:1118-1134).
SELF_DRAFT_059 = ("DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "Glm4MoeForCausalLM", "Glm4MoeLiteForCausalLM",
                  "GlmMoeDsaForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM",
                  "BailingMoeV2_5ForCausalLM", "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration")
SELF_DRAFT_0523 = SELF_DRAFT_059 + ("DeepseekV4ForCausalLM", "HYV3ForCausalLM", "HYV4ForCausalLM",
                                    "Qwen4ExpForConditionalGeneration")


def env_bool(name):  # sglang.srt.environ EnvBool: true/1/yes/y, case-insensitive
    return os.environ.get(name, "false").strip().lower() in ("true", "1", "yes", "y")


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


def table(of_version=None):
    return resources.load("sglang_flags_" + (of_version or release.version()).replace(".", "_")).FLAGS


def build_parser(of_version=None):
    """launch_server's ArgumentParser: prog is the script name in 0.5.9 (`ArgumentParser()`,
    59:sglang/srt/server_args.py:5579), `sglang serve` in 0.5.23 (523:sglang/srt/server_args.py:679), so argparse
    errors begin `launch_server.py: error:` or `sglang serve: error:` as in each release."""
    newer = release.parse(of_version or release.version()) >= release.parse("0.5.23")
    parser = argparse.ArgumentParser(prog="sglang serve") if newer else argparse.ArgumentParser()
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


# ---------------------------------------------------------------------------------------------- --config FILE.yaml
def _config_keys(action):
    """The YAML keys that name an action: its dest; in 0.5.23 also every long spelling with `_` for `-`
    (523:sglang/srt/utils/server_args_config_parser.py:17-22)."""
    keys = {action.dest}
    if release.at_least("0.5.23"):
        keys |= {option[2:].replace("-", "_") for option in action.option_strings if option.startswith("--")}
    return keys


def _config_supported(action):
    """store_true and store only (59:sglang/srt/server_args_config_parser.py:25-40); 0.5.23 adds any action that
    takes one value, `nargs is None` (523:...server_args_config_parser.py:25-27, 40-66)."""
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreAction)):  # noqa: SLF001 - as SGLang does
        return True
    return release.at_least("0.5.23") and action.nargs is None


class ConfigArgumentMerger:
    """sglang's ConfigArgumentMerger (server_args_config_parser.py of each release): `--config FILE.yaml` becomes
    command-line words put before the others. A key is written as the flag is spelled (`api-key: X` gives
    `--api-key X`; `api_key: X` gives `--api_key X`, which argparse then refuses, printing the value); underscores
    only serve to look the action up. Errors are SGLang's ValueErrors (a traceback, exit status 1)."""

    def __init__(self, parser):
        actions = [a for a in parser._actions if a.option_strings]  # noqa: SLF001 - as SGLang does
        self.store_true_actions = {key for a in actions if isinstance(a, argparse._StoreTrueAction)  # noqa: SLF001
                                   for key in _config_keys(a)}
        supported_keys = {key for a in actions if _config_supported(a) for key in _config_keys(a)}
        self.unsupported_actions = {}
        for a in actions:
            if _config_supported(a) or set(a.option_strings) & {"--config", "--help", "-h"}:
                continue
            for key in _config_keys(a):
                if not release.at_least("0.5.23") or key not in supported_keys:
                    self.unsupported_actions[key] = a

    def merge_config_with_args(self, cli_args):
        indices = [i for i, arg in enumerate(cli_args) if arg == "--config"]
        if len(indices) > 1:
            raise ValueError("Multiple config files specified! Only one allowed.")
        if not indices:
            return cli_args
        index = indices[0]
        if index == len(cli_args) - 1:
            raise ValueError("No config file specified after --config flag!")
        config_args = self._convert_config_to_args(self._parse_yaml_config(cli_args[index + 1]))
        return config_args + cli_args[:index] + cli_args[index + 2:]

    def _parse_yaml_config(self, file_path):
        import yaml  # PyYAML: SGLang's [all] extra brings it, as it does for SGLang

        suffix = os.path.splitext(file_path)[1]
        if suffix.lower() not in (".yaml", ".yml"):
            raise ValueError("Config file must be YAML format, got: %s" % suffix)
        if not os.path.exists(file_path):
            raise ValueError("Config file not found: %s" % file_path)
        try:
            with open(file_path, "r") as file:
                config_data = yaml.safe_load(file)
        except Exception as e:
            logging.getLogger("sglang.srt.server_args_config_parser").error(
                "Failed to read config file %s: %s", file_path, e)
            raise
        if config_data is None:
            config_data = {}
        if not isinstance(config_data, dict):
            raise ValueError("Config file must contain a dictionary at root level")
        return config_data

    def _convert_config_to_args(self, config):
        args = []
        for key, value in config.items():
            key_norm = key.replace("-", "_")
            if key_norm in self.unsupported_actions:
                raise ValueError("Unsupported config option '%s' with action '%s'"
                                 % (key_norm, self.unsupported_actions[key_norm].__class__.__name__))
            if isinstance(value, bool):
                if key_norm in self.store_true_actions:
                    if value:
                        args.append("--%s" % key)
                else:
                    args.extend(["--%s" % key, str(value).lower()])
            elif isinstance(value, list):
                if value:
                    args.append("--%s" % key)
                    args.extend(str(item) for item in value)
            elif isinstance(value, dict) and release.at_least("0.5.23"):
                args.extend(["--%s" % key, json.dumps(value)])
            else:
                args.extend(["--%s" % key, str(value)])
        return args


WATERMARK_SECRETS = ("watermark_key", "watermark_key_b", "watermark_config")  # 523:.../watermarking/core.py:25-27


def redact_watermark_command_line(argv, watermark_config=None):
    """0.5.23's launch_command: the argv after the --config merge, joined by spaces, with only
    `--watermark-config`'s value redacted (523:sglang/srt/sampling/watermarking/core.py:110-134)."""
    result, redact_next = [], False
    for argument in argv:
        if redact_next:
            result.append("<redacted>")
            redact_next = False
        elif watermark_config is not None and argument == watermark_config:
            result.append("<redacted>")
        elif watermark_config is not None and "=" in argument and argument.split("=", 1)[1] == watermark_config:
            result.append("%s=<redacted>" % argument.split("=", 1)[0])
        elif argument == "--watermark-config":
            result.append(argument)
            redact_next = True
        elif argument.startswith("--watermark-config="):
            result.append("--watermark-config=<redacted>")
        else:
            result.append(argument)
    return " ".join(result)


def prepare_server_args(argv):
    """sglang.srt.server_args.prepare_server_args: the parser, the `--config` merge when the word `--config` is in
    argv (59:sglang/srt/server_args.py:5583, 523:sglang/srt/server_args.py:683), parse, ServerArgs."""
    parser = build_parser()
    if "--config" in argv:
        argv = ConfigArgumentMerger(parser).merge_config_with_args(list(argv))
    namespace = parser.parse_args(argv)
    args = ServerArgs(namespace)
    args.__dict__["launch_command"] = redact_watermark_command_line(argv, getattr(namespace, "watermark_config", None))
    return args


A2A_FORCE_EP = ("deepep", "mooncake", "ascend_fuseep", "flashinfer", "mori")


def fields_of(of_version=None):
    """argparse dest -> ServerArgs field, from the table: `field` where it differs from dest (0.5.9's
    `tensor_parallel_size` is the field `tp_size`), None for a dest that is not a field (`config`)."""
    out = {}
    for entry in table(of_version).values():
        out.setdefault(entry["dest"], entry.get("field", entry["dest"]))
    return out


def prefill_graph_sizes(max_bs):
    """0.5.23 generate_prefill_cuda_graph_batch_sizes (523:sglang/srt/arg_groups/cuda_graph_hook.py:480-497)."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32)) + list(range(576, 1025, 64))
             + list(range(1280, 4097, 256)) + list(range(4608, max_bs + 1, 512)))
    return [s for s in sizes if s <= max_bs]


def decode_graph_sizes(max_bs):
    """0.5.23 generate_decode_cuda_graph_batch_sizes, no speculative decoding (cuda_graph_hook.py:500-515), which
    also captures max_bs itself when the list misses it (`if max_bs not in capture_bs: capture_bs.append(max_bs)`;
    0.5.9's _generate_cuda_graph_batch_sizes does not)."""
    sizes = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + list(range(512, max_bs + 1, 32))
    sizes = [s for s in sizes if s <= max_bs]
    if release.at_least("0.5.23") and max_bs not in sizes:
        sizes.append(max_bs)
    return sizes


class ServerArgs:
    """The parsed arguments under ServerArgs' field names, with the defaults SGLang derives at start.

    Attribute access reads the fields; as_dict() is what /server_info shows. `launch_command` (0.5.23) is kept
    beside the fields, as SGLang keeps it on the record.
    """

    def __init__(self, namespace):
        fields = {}
        names = fields_of()
        for key, value in vars(namespace).items():
            field = names.get(key, key)
            if field is not None:
                fields[field] = value
        self.__dict__["_fields"] = fields
        self.__dict__["launch_command"] = None

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
        """0.5.9: dataclasses.asdict(server_args). 0.5.23: resolved_dict(), where the deprecated
        `enable_dp_attention` reports `attn_dp_size > 1` (523:sglang/srt/server_args.py:316-332)."""
        out = dict(self._fields)
        if release.at_least("0.5.23"):
            out["enable_dp_attention"] = self.dp_attention()
        return out

    def for_logging(self):
        """What the launcher logs as `server_args=...` at start: 0.5.9 the dataclass repr, every field and api_key
        included (59:sglang/srt/entrypoints/engine.py:1031); 0.5.23 the resolved dict with only the watermark
        secrets redacted, api_key included (523:sglang/srt/entrypoints/engine.py:173-174, 1185)."""
        if not release.at_least("0.5.23"):
            return "ServerArgs(%s)" % ", ".join("%s=%r" % kv for kv in self._fields.items())
        out = self.as_dict()
        for key in WATERMARK_SECRETS:
            if out.get(key) is not None:
                out[key] = "<redacted>"
        return repr(out)

    def dp_attention(self):
        """DP attention on: 0.5.9 `--enable-dp-attention`; 0.5.23 an attention-DP width > 1 (`--attn-dp-size`, or
        the deprecated `--enable-dp-attention`, which resolution turns into `--attn-dp-size <dp-size>`)."""
        if release.at_least("0.5.23"):
            return (self.get("attn_dp_size") or 1) > 1
        return bool(self.get("enable_dp_attention"))

    def graphs(self):
        """The CUDA graphs each rank captures, in capture order: [(phase, backend, batch sizes)].

        0.5.9: one decode graph unless --disable-cuda-graph (59:model_runner.py:2146-2163). 0.5.23: prefill
        (default backend breakable) then decode (default full), each unless disabled
        (523:model_executor/model_runner_components/cuda_graph_setup.py:421-440)."""
        if not release.at_least("0.5.23"):
            return [] if self.disable_cuda_graph else [("decode", "full", self.cuda_graph_bs)]
        config = self.cuda_graph_config
        return [(phase, config[phase]["backend"], config[phase]["bs"]) for phase in ("prefill", "decode")
                if config[phase]["backend"] != "disabled"]

    def post_init(self, gpu_memory_mib, mla=False, architecture=None):
        """The part of ServerArgs' start-up resolution the lab can meet (defaults that depend on the GPU)."""
        f = self._fields
        self._speculative(architecture)
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
        if release.at_least("0.5.23"):
            if f.get("enable_dp_attention") and (f.get("attn_dp_size") or 1) == 1:
                f["attn_dp_size"] = f["dp_size"]
            self._gpu_memory_settings_0523(gpu_memory_mib, mla)
        else:
            if f["dp_size"] == 1:
                f["enable_dp_attention"] = False
            self._gpu_memory_settings_059(gpu_memory_mib)
        if f["pp_size"] > 1:
            if not f.get("disable_overlap_schedule"):
                logger.warning("Pipeline parallelism is incompatible with overlap schedule.")
            f["disable_overlap_schedule"] = True

    def _speculative(self, architecture):
        """EAGLE-family speculative decoding as the release resolves it (59:sglang/srt/server_args.py:2330-2448
        _handle_speculative_decoding; 523:sglang/srt/arg_groups/speculative_hook.py:81-119, 1072-1283
        _resolve_speculative_algorithm_alias and _handle_eagle_family): NEXTN is EAGLE; max_running_requests 48
        where unset; 0.5.9 runs the overlapped spec v2 worker only with SGLANG_ENABLE_SPEC_V2 (else the overlap
        scheduler is off); a self-drafting architecture drafts from its own checkpoint; the default
        (num_steps, eagle_topk, num_draft_tokens) is (3, 1, 4); with topk 1 num_draft_tokens is num_steps + 1."""
        f = self._fields
        if f.get("speculative_algorithm") is None:
            return
        algorithm = f["speculative_algorithm"].upper()
        if algorithm == "NEXTN":
            algorithm = "EAGLE"
        f["speculative_algorithm"] = algorithm
        if algorithm not in ("EAGLE", "EAGLE3", "STANDALONE"):
            return
        if f.get("max_running_requests") is None:
            f["max_running_requests"] = 48
            logger.warning("Max running requests is reset to 48 for speculative decoding. You can override this by "
                           "explicitly setting --max-running-requests.")
        if not release.at_least("0.5.23"):
            if env_bool("SGLANG_ENABLE_SPEC_V2"):
                f["disable_overlap_schedule"] = False
                logger.warning("Spec v2 is enabled for eagle/eagle3 speculative decoding and overlap schedule is "
                               "turned on.")
                if f.get("speculative_eagle_topk") is not None and f["speculative_eagle_topk"] > 1:
                    raise ValueError("Spec v2 currently only supports topk = 1 for speculative decoding.")
            else:
                f["disable_overlap_schedule"] = True
                logger.warning("Overlap scheduler is disabled when spec v2 is off or using unsupported speculative "
                               "algorithm. You can set env SGLANG_ENABLE_SPEC_V2=True to enable the experimental "
                               "overlap scheduler. ")
        self_draft = SELF_DRAFT_0523 if release.at_least("0.5.23") else SELF_DRAFT_059
        if architecture in self_draft and f.get("speculative_draft_model_path") is None:
            f["speculative_draft_model_path"] = f["model_path"]
        if f.get("speculative_num_steps") is None:
            assert f.get("speculative_eagle_topk") is None and f.get("speculative_num_draft_tokens") is None
            f["speculative_num_steps"], f["speculative_eagle_topk"], f["speculative_num_draft_tokens"] = 3, 1, 4
        if f["speculative_eagle_topk"] == 1 and f["speculative_num_draft_tokens"] != f["speculative_num_steps"] + 1:
            logger.warning("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                           "speculative_eagle_topk == 1")
            f["speculative_num_draft_tokens"] = f["speculative_num_steps"] + 1

    def speculative(self):
        """(num_steps, num_draft_tokens) of an EAGLE-family run, else None."""
        if self._fields.get("speculative_algorithm") not in ("EAGLE", "EAGLE3", "STANDALONE"):
            return None
        return self._fields["speculative_num_steps"], self._fields["speculative_num_draft_tokens"]

    def _gpu_memory_settings_059(self, gpu_memory_mib):
        """ServerArgs._handle_gpu_memory_settings (59:sglang/srt/server_args.py:911-1045), gpu_mem in MiB."""
        f = self._fields
        if f.get("chunked_prefill_size") is None:
            f["chunked_prefill_size"] = 4096 if gpu_memory_mib < 90 * 1024 else (8192 if gpu_memory_mib < 160 * 1024 else 16384)
        if f.get("cuda_graph_max_bs") is None:
            f["cuda_graph_max_bs"] = (32 if f["tp_size"] < 4 else 160) if gpu_memory_mib < 60 * 1024 else (
                (256 if f["tp_size"] < 4 else 512) if gpu_memory_mib < 160 * 1024 else 512)
        if f.get("cuda_graph_bs") is None:
            f["cuda_graph_bs"] = decode_graph_sizes(f["cuda_graph_max_bs"])
        else:
            f["cuda_graph_max_bs"] = max(f["cuda_graph_bs"])
        if f.get("mem_fraction_static") is None:
            reserved = 512 + max(f["chunked_prefill_size"], 2048) * 1.5 + f["cuda_graph_max_bs"] * 2
            reserved += f["tp_size"] * f["pp_size"] / 8 * 1024
            if gpu_memory_mib > 60 * 1024:
                reserved = max(reserved, 10 * 1024)
            f["mem_fraction_static"] = round((gpu_memory_mib - reserved) / gpu_memory_mib, 3)

    def _gpu_memory_settings_0523(self, gpu_memory_mib, mla):
        """handle_gpu_memory_settings and reserve_for_graph_mb (523:sglang/srt/arg_groups/memory_hook.py:47-399)
        without speculative decoding, disaggregation or DeepEP; the per-phase CUDA graph settings fold into
        cuda_graph_config as cuda_graph_config.py resolves them (decode full, prefill breakable on CUDA)."""
        f = self._fields
        tp = f["tp_size"]
        for below_gib, chunk, small_tp, large_tp in ((20, 2048, 8, 8), (35, 4096, 48, 160), (60, 4096, 32, 160),
                                                     (160, 8192, 256, 512), (float("inf"), 16384, 512, 512)):
            if gpu_memory_mib < below_gib * 1024:
                break
        if f.get("chunked_prefill_size") is None:
            f["chunked_prefill_size"] = chunk
        legacy_off = bool(f.get("disable_cuda_graph"))
        phases = {}
        for phase, default_backend in (("decode", "full"), ("prefill", "breakable")):
            backend = f.get("cuda_graph_backend_" + phase) or default_backend
            if legacy_off or f.get("disable_%s_cuda_graph" % phase):
                backend = "disabled"
            elif phase == "prefill" and f["pp_size"] > 1 and not f.get("cuda_graph_backend_prefill"):
                # PP prefill graph replay is opt-in (523:sglang/srt/arg_groups/cuda_graph_hook.py:146-160)
                logger.info("Disabling breakable prefill CUDA graph by default for pipeline parallelism. Set "
                            "--cuda-graph-backend-prefill=breakable to opt in.")
                backend = "disabled"
            phases[phase] = {"backend": backend, "max_bs": f.get("cuda_graph_max_bs_" + phase),
                             "bs": f.get("cuda_graph_bs_" + phase)}
        decode, prefill = phases["decode"], phases["prefill"]
        if decode["max_bs"] is None and decode["bs"] is None:
            decode["max_bs"] = small_tp if tp < 4 else large_tp
            if f.get("max_running_requests") is not None:
                decode["max_bs"] = min(decode["max_bs"], f["max_running_requests"])
        if decode["bs"] is None:
            decode["bs"] = decode_graph_sizes(decode["max_bs"])
        else:
            decode["max_bs"] = max(decode["bs"])
        if prefill["max_bs"] is None and prefill["bs"] is None:
            prefill["max_bs"] = min(8192, f["chunked_prefill_size"]) if mla else f["chunked_prefill_size"]
            if f["pp_size"] > 1 and prefill["backend"] == "breakable":
                prefill["max_bs"] = min(prefill["max_bs"], 8192)
            if f.get("max_total_tokens") is not None:
                prefill["max_bs"] = min(prefill["max_bs"], f["max_total_tokens"])
            if "llama-2" in f["model_path"].lower():
                prefill["max_bs"] = min(prefill["max_bs"], 4096)
        if prefill["bs"] is None:
            prefill["bs"] = prefill_graph_sizes(prefill["max_bs"])
        f["cuda_graph_config"] = phases
        if f.get("mem_fraction_static") is None:
            reserved = 512 + max(f["chunked_prefill_size"], 2048) * 1.5 + tp * f["pp_size"] / 8 * 1024
            reserved += self.graph_reserve_mib(mla)
            if gpu_memory_mib > 60 * 1024:
                reserved = max(reserved, 10 * 1024)
            f["mem_fraction_static"] = round((gpu_memory_mib - reserved) / gpu_memory_mib, 3)

    def graph_reserve_mib(self, mla=False):
        """0.5.23 reserve_for_graph_mb (523:sglang/srt/arg_groups/memory_hook.py:357-399): decode max_bs * 2, more
        with DP attention, and the prefill graph (MLA 1.5 GiB, else 8 MiB per captured size)."""
        config = self._fields["cuda_graph_config"]
        decode, prefill = config["decode"], config["prefill"]
        reserved = 0.0
        if decode["backend"] != "disabled":
            reserved += decode["max_bs"] * 2
        if self.dp_attention():
            attn_dp = self._fields.get("attn_dp_size") or 1
            reserved += decode["max_bs"] * attn_dp * 3
            if decode["max_bs"] > 300:
                reserved += decode["max_bs"] * attn_dp * 1.5
        if prefill["backend"] != "disabled":
            reserved += 1.5 * 1024 if mla else len(prefill["bs"]) * 8
        return reserved

    def check(self):
        """ServerArgs.check_server_args, for what the lab can meet. AssertionError as in SGLang."""
        f = self._fields
        assert (f["tp_size"] * f["pp_size"]) % f["nnodes"] == 0, "tp_size must be divisible by number of nodes"
        if f["pp_size"] > 1 and release.at_least("0.5.23"):
            # 523:sglang/srt/arg_groups/validation_hook.py:119-171 check_pipeline_parallel_compat (no DSPARK here)
            assert f.get("disable_overlap_schedule"), "Pipeline parallelism is not compatible with overlap schedule"
            algorithm = f.get("speculative_algorithm")
            if algorithm is not None:
                assert algorithm.upper() == "EAGLE" and not f.get("enable_multi_layer_eagle"), (
                    "Pipeline parallelism currently only supports EAGLE (non-multi-layer) speculative decoding")
                if env_bool("SGLANG_ENABLE_PP_SPEC"):
                    assert (f.get("disaggregation_mode") or "null") == "null", (
                        "SGLANG_ENABLE_PP_SPEC is not compatible with --disaggregation-mode")
                    assert not f.get("speculative_adaptive"), (
                        "SGLANG_ENABLE_PP_SPEC is not compatible with --speculative-adaptive")
                    assert not self.dp_attention(), (
                        "SGLANG_ENABLE_PP_SPEC is not compatible with attention DP (--attn-dp-size)")
                else:
                    assert f.get("disaggregation_mode") == "prefill", (
                        "PP + speculative decoding (MTP) is only supported on prefill nodes "
                        "(disaggregation-mode=prefill)")
        elif f["pp_size"] > 1:
            assert (f.get("disable_overlap_schedule") and f.get("speculative_algorithm") is None
                    and not f.get("enable_mixed_chunk")), (
                "Pipeline parallelism is not compatible with overlap schedule, speculative decoding, "
                "mixed chunked prefill.")
        assert not (f["dp_size"] > 1 and f["nnodes"] != 1 and not self.dp_attention()), \
            "multi-node data parallel is not supported unless dp attention!"
        assert f.get("base_gpu_id", 0) >= 0, "base_gpu_id must be non-negative"
        assert f.get("gpu_id_step", 1) >= 1, "gpu_id_step must be positive"
        assert ":" not in f["served_model_name"], (
            "served_model_name cannot contain a colon (':') character. The colon is reserved for the "
            "'model:adapter' syntax used in LoRA adapter specification. Invalid value: '%s'" % f["served_model_name"])
