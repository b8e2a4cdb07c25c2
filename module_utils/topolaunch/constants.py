"""Names and paths every topolaunch piece agrees on (docs/DESIGN.md "Target paths"). The roles' copy is the shared
role `topolaunch` (roles/topolaunch/defaults/main.yml: the same values under topolaunch_*); the modules' docs take
them from the doc fragment topolaunch.sglang.common. A unit test keeps the three equal. Plain Python 3.9+."""
import json
import os

__all__ = ["UNIT_NAME", "STATE_DIR", "CURRENT_PLAN", "LAST_GOOD_PLAN", "SERVER_CONFIG", "ENV_FILE", "UNIT_DIR", "VENV_ROOT",
           "SGLANG_VERSION_FILE", "SERVICE_USER", "SERVICE_GROUP", "TOOLS_PYTHON", "SERVER_KEYS", "sglang_python",
           "state_file", "server_view", "base_version"]

UNIT_NAME = "topolaunch-sglang.service"
STATE_DIR = "/var/lib/topolaunch"
CURRENT_PLAN = "current_plan.json"          # the plan the unit runs (written by the launch when it (re)starts it)
# The server's own config file (`--config FILE.yaml`, read by SGLang inside its process) beside the plan record:
# the secrets that must not be on its command line (api-key: "<JSON string>"). Written by the launch role.
SERVER_CONFIG = "sglang-config.yaml"
LAST_GOOD_PLAN = "last_good_plan.json"      # the plan health last verified (the rollback target)
ENV_FILE = "/etc/topolaunch/sglang.env"
UNIT_DIR = "/etc/systemd/system"
VENV_ROOT = "/opt/sglang/venvs"             # one SGLang venv per version: <root>/<version>
# The SGLang version installed and current (JSON {sglang_version, package_version, venv}; root 0644): written by the
# sglang role when /opt/sglang/current moves, read by the validate step.
SGLANG_VERSION_FILE = "/etc/topolaunch/sglang_version.json"
SERVICE_USER = "sglang"
SERVICE_GROUP = "sglang"
TOOLS_PYTHON = "/opt/topolaunch/tools/bin/python"
# The plan keys that make the server what it is: two plans equal on these run the same server.
SERVER_KEYS = ["layout", "gpu_indices", "cuda_visible_devices", "env", "argv", "host", "port", "model_path",
               "served_model_name", "sglang_version"]


def sglang_python(version, venv_root=VENV_ROOT):
    """The SGLang venv's python on the target for an SGLang version."""
    return os.path.join(venv_root, str(version), "bin", "python")


def base_version(version):
    """The release a version string names: a local label is dropped (0.5.9+sim -> 0.5.9)."""
    return str(version).strip().split("+", 1)[0]


def state_file(state_dir, name):
    """A state file (CURRENT_PLAN, LAST_GOOD_PLAN) under state_dir."""
    return os.path.join(state_dir or STATE_DIR, name)


def server_view(plan, keys=None):
    """The parts of a plan that make the server what it is, as key-sorted JSON (key order does not matter)."""
    keys = SERVER_KEYS if keys is None else keys
    return json.dumps({k: v for k, v in (plan or {}).items() if k in keys}, sort_keys=True)
