"""Modules the simulator shares with the rest of the project, found in the wheel or in the source tree.

build_wheel.py copies them into the wheel as sglang/_sim/<name>.py (the single sources stay in the repository:
module_utils/topolaunch/sglang_flags_<version>.py, sglang_metrics_<version>.py and lab/fakenvml/fakegpu.py). Run from the source tree (tests,
development), the simulator loads the repository's files directly.
"""
import importlib
import importlib.util
import pathlib

_HERE = pathlib.Path(__file__).resolve().parent
# sglang/_sim -> sglang -> lab/sglang_sim -> lab -> repository root
_REPO = _HERE.parents[3]

SOURCES = {
    "sglang_flags_0_5_9": "module_utils/topolaunch/sglang_flags_0_5_9.py",
    "sglang_flags_0_5_23": "module_utils/topolaunch/sglang_flags_0_5_23.py",
    "sglang_metrics_0_5_9": "module_utils/topolaunch/sglang_metrics_0_5_9.py",
    "sglang_metrics_0_5_23": "module_utils/topolaunch/sglang_metrics_0_5_23.py",
    "model_config": "module_utils/topolaunch/model_config.py",
    "fakegpu": "lab/fakenvml/fakegpu.py",
}

_cache = {}


def load(name):
    """The module `name` (a key of SOURCES): the wheel's bundled copy, else the repository's file."""
    if name in _cache:
        return _cache[name]
    try:
        module = importlib.import_module("sglang._sim." + name)
    except ModuleNotFoundError as err:
        if err.name != "sglang._sim." + name:
            raise
        path = _REPO / SOURCES[name]
        if not path.is_file():
            raise RuntimeError(
                "simulator resource %s is missing: not bundled in this install and %s does not exist "
                "(build the wheel with lab/sglang_sim/build_wheel.py)" % (name, path)
            ) from None
        spec = importlib.util.spec_from_file_location("sglang._sim." + name, str(path))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    _cache[name] = module
    return module
