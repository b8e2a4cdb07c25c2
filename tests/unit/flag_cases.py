"""SGLang's argparse rebuilt from a flag table (the planner's and the flag tool's tests parse argv with it)."""
import argparse
import json

from ansible_collections.topolaunch.sglang.plugins.module_utils import plan_args


def _human_int(text):
    value = plan_args._human_int(text)
    if value is None:
        raise argparse.ArgumentTypeError("Invalid integer value: '%s'" % text)
    return value


TYPES = {"int": int, "float": float, "str": str, "json": json.loads, "json_list": json.loads,
         "cuda_graph_config": json.loads, "human_int": _human_int, None: None}


def build_parser(flags):
    """argparse as SGLang builds it, from an (expanded) table; SGLang's own actions as the argparse ones they
    behave like. The lab simulator builds its CLI the same way."""
    parser = argparse.ArgumentParser(prog="launch_server", exit_on_error=False)
    for entry in flags.values():
        kwargs = {"dest": entry["dest"], "default": entry["default"]}
        action = entry["action"]
        if action in ("store_true", "store_false"):
            kwargs["action"] = action
        elif action == "BooleanOptionalAction":
            kwargs["action"] = argparse.BooleanOptionalAction
        elif entry["nargs"] == 0:  # DeprecatedAction, DeprecatedStoreTrueAction
            kwargs["action"] = "store_true"
        else:
            kwargs["type"] = TYPES.get(entry["type"], str)
            for key in ("nargs", "choices"):
                if entry[key] is not None:
                    kwargs[key] = entry[key]
            if entry["nargs"] == "?":
                kwargs["const"] = entry["const"]
        parser.add_argument(*entry["option_strings"], **kwargs)
    return parser
