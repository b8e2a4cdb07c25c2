"""Action plugin gpu_topology: read the topology on the host, keep it on the controller in-process.

save_to: the facts are written there as pretty JSON (directories made, 0644, only when changed), in check mode too,
in this process instead of as two tasks delegated to localhost. The file is a report of what was read, not a change
of the host: the result stays changed=false and `saved` says whether the file was written.
"""
import os

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.topolaunch.sglang.plugins.plugin_utils.artifacts import save_json


class ActionModule(ActionBase):
    """gpu_topology with save_to handled on the controller."""

    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        save_to = args.pop("save_to", None)
        result.update(self._execute_module(module_name="topolaunch.sglang.gpu_topology", module_args=args,
                                           task_vars=task_vars))
        if save_to and not result.get("failed"):
            path = os.path.expanduser(save_to)
            try:
                result["saved"] = save_json(path, result["ansible_facts"]["gpu_topology"])
            except OSError as exc:
                raise AnsibleActionFail("gpu_topology: cannot save the topology to %s: %s" % (path, exc))
            result["saved_to"] = path
        return result
