"""Action plugin gpu_preflight: measure (or reuse the record) on the host, keep the results on the controller.

save_to: the record is kept there under its topology fingerprint (a JSON object {fingerprint: record}: a host whose
GPUs change keeps the record of each topology it had), and its bandwidth heatmap beside it with the same name and
.png (plugin_utils/preflight_plot.py, matplotlib), in this process rather than as tasks delegated to localhost. Both
are written only when the record changed (or the PNG is missing), in check mode too: they are reports on the
controller, not changes of the host. `saved` says whether the JSON was written.
"""
import json
import os

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

from ansible_collections.topolaunch.sglang.plugins.plugin_utils.artifacts import save_json
from ansible_collections.topolaunch.sglang.plugins.plugin_utils.preflight_plot import draw


def keep(save_to, record, title=""):
    """Put `record` under its fingerprint in the JSON object at `save_to`, and draw the heatmap beside it.
    Returns the result keys saved, saved_to, heatmap."""
    path = os.path.expanduser(save_to)
    records = {}
    try:
        with open(path, encoding="utf-8") as f:
            records = json.load(f)
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:
        raise AnsibleActionFail("gpu_preflight: %s is not a JSON object of preflight records (%s): move it away"
                                % (path, exc))
    if not isinstance(records, dict):
        raise AnsibleActionFail("gpu_preflight: %s is not a JSON object of preflight records: move it away" % path)
    records[record["fingerprint"]] = record
    png = os.path.splitext(path)[0] + ".png"
    try:
        saved = save_json(path, records)
        if saved or not os.path.exists(png):
            draw(record, png, title)
    except OSError as exc:
        raise AnsibleActionFail("gpu_preflight: cannot save the record to %s: %s" % (path, exc))
    return {"saved": saved, "saved_to": path, "heatmap": png}


class ActionModule(ActionBase):
    """gpu_preflight with save_to handled on the controller."""

    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        save_to = args.pop("save_to", None)
        result.update(self._execute_module(module_name="topolaunch.sglang.gpu_preflight", module_args=args,
                                           task_vars=task_vars))
        record = result.get("record") or {}
        if save_to and not result.get("failed") and record.get("fingerprint"):
            result.update(keep(save_to, record, task_vars.get("inventory_hostname", "")))
        return result
