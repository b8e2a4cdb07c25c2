"""library/proxmox_vm_config.py: the documentation of the action plugin proxmox_vm_config documents exactly the
options the plugin validates, and its example passes that validation."""
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.topolaunch.sglang.plugins.action import proxmox_vm_config as action
from ansible_collections.topolaunch.sglang.plugins.modules import proxmox_vm_config as docs


def shape(options):
    return {k: (v.get("type", "str"), v.get("default"), bool(v.get("required")), v.get("elements"))
            for k, v in options.items()}


def test_the_documentation_is_the_action_plugins_argument_spec():
    assert shape(yaml.safe_load(docs.DOCUMENTATION)["options"]) == shape(action.ARGUMENT_SPEC)


def test_the_example_passes_the_argument_spec():
    for task in yaml.safe_load(docs.EXAMPLES):
        args = task["topolaunch.sglang.proxmox_vm_config"]
        args = {k: ({} if k == "host_topology" else [] if k == "guests" else v) for k, v in args.items()}
        assert not ArgumentSpecValidator(action.ARGUMENT_SPEC).validate(args).error_messages
    assert yaml.safe_load(docs.RETURN)["vms"]["type"] == "list"
