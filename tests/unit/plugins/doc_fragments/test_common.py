"""Every module documents exactly its argument spec (types, defaults, aliases), its shared options come from the
doc fragment topolaunch.sglang.common, and the shared names are the same in the fragment, constants.py and the
shared role topolaunch's defaults. (ansible-test sanity's validate-modules checks the same and more in CI.)"""

import pytest
import yaml

from ansible_collections.topolaunch.sglang.plugins.doc_fragments.common import ModuleDocFragment
from ansible_collections.topolaunch.sglang.plugins.module_utils import constants
import paths

ROOT = paths.ROOT
MODULES = sorted(p.stem for p in (ROOT / "library").glob("*.py"))
ACTION_ONLY = {"sglang_bench", "proxmox_vm_config"}  # documentation of an action plugin: no argument spec of its own


FRAGMENTS = {"topolaunch.sglang.common": yaml.safe_load(ModuleDocFragment.DOCUMENTATION)["options"]}


def documented_options(module):
    """The module's options with its doc fragments merged in, as Ansible merges them (the module's keys win)."""
    doc = yaml.safe_load(module.DOCUMENTATION)
    options = {}
    for name in doc.get("extends_documentation_fragment", []):
        options.update({k: dict(v) for k, v in FRAGMENTS[name].items()})
    for key, value in doc["options"].items():
        options[key] = dict(options.get(key, {}), **value)
    return options


def _import(name):
    return __import__("ansible_collections.topolaunch.sglang.plugins.modules." + name, fromlist=[name])


@pytest.mark.parametrize("name", [m for m in MODULES if m not in ACTION_ONLY])
def test_documentation_is_the_argument_spec(name):
    module = _import(name)
    docs = documented_options(module)
    spec = module.ARGUMENT_SPEC

    def shape(options):
        return {k: (v.get("type", "str"), v.get("default"), sorted(v.get("aliases", []))) for k, v in options.items()}

    assert shape(docs) == shape(spec)
    for section in ("EXAMPLES", "RETURN"):
        assert yaml.safe_load(getattr(module, section))


def test_shared_names_are_the_same_everywhere():
    fragment = FRAGMENTS["topolaunch.sglang.common"]
    role = yaml.safe_load((ROOT / "roles" / "topolaunch" / "defaults" / "main.yml").read_text())
    assert fragment["unit_name"]["default"] == constants.UNIT_NAME == role["topolaunch_unit_name"]
    assert fragment["state_dir"]["default"] == constants.STATE_DIR == role["topolaunch_state_dir"]
    assert fragment["service_user"]["default"] == constants.SERVICE_USER == role["topolaunch_service_user"]
    assert constants.SERVICE_GROUP == role["topolaunch_service_group"]
    assert constants.ENV_FILE == role["topolaunch_env_file"]
    assert constants.VENV_ROOT == role["topolaunch_venv_root"]
    assert constants.SGLANG_VERSION_FILE == role["topolaunch_sglang_version_file"]
    assert constants.TOOLS_PYTHON == role["topolaunch_tools_venv"] + "/bin/python"
