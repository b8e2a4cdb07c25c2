"""Action plugin proxmox_vm_config: the Proxmox VM config changes the findings call for, computed and validated on the
controller in-process (module_utils proxmox_vm), returned with a per-key diff. Writes nothing."""
import json
import os

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase

from ansible_collections.topolaunch.sglang.plugins.module_utils.proxmox_config import ProxmoxConfigError
from ansible_collections.topolaunch.sglang.plugins.plugin_utils.results import ResultsError, artifacts_host_dir
from ansible_collections.topolaunch.sglang.plugins.module_utils.proxmox_vm import changes, diff_text, module_params


ARGUMENT_SPEC = {
    "host_topology": {"type": "dict", "required": True},
    "guests": {"type": "list", "elements": "dict", "required": True},
    "artifacts_dir": {"type": "path"},
    "hugepages": {"type": "str"},
}


def findings_of(host, task_vars, artifacts_dir):
    """The guest's topology findings: this run's facts, else the controller's saved topology.json, else []."""
    facts = ((task_vars.get("hostvars") or {}).get(host) or {}).get("ansible_facts") or {}
    topo = facts.get("gpu_topology")
    if topo is None and artifacts_dir:
        try:
            path = os.path.join(artifacts_host_dir(artifacts_dir, host), "topology.json")
        except ResultsError as exc:
            raise AnsibleActionFail("proxmox_vm_config: guest %r: %s" % (host, exc)) from None
        if os.path.exists(path):
            try:
                with open(path) as f:
                    topo = json.load(f)
            except (OSError, ValueError) as exc:
                raise AnsibleActionFail("proxmox_vm_config: %s: %s" % (path, exc))
    return [f["id"] for f in (topo or {}).get("findings") or [] if isinstance(f, dict) and "id" in f], topo is not None


class ActionModule(ActionBase):
    """Compute, validate, diff; no remote call."""

    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        checked = ArgumentSpecValidator(ARGUMENT_SPEC).validate(dict(self._task.args))
        if checked.error_messages:
            raise AnsibleActionFail("proxmox_vm_config: %s" % "; ".join(checked.error_messages))
        args = checked.validated_parameters
        host = args["host_topology"]
        guests = args["guests"]
        hugepages = args.get("hugepages")
        vms, diff, warnings = [], [], []
        for guest in guests:
            if isinstance(guest, dict) and "item" in guest:      # a uri loop's result: item {host, vmid}, json.data
                guest = dict(guest["item"], config=(guest.get("json") or {}).get("data"))
            if not isinstance(guest, dict) or not isinstance(guest.get("config"), dict) or "host" not in guest:
                raise AnsibleActionFail("proxmox_vm_config: guest %r has no host or no config" % (guest.get("host")
                                        if isinstance(guest, dict) else guest,))
            ids, known = findings_of(guest["host"], task_vars or {}, args.get("artifacts_dir"))
            if not known:
                warnings.append("%s: no topology read yet (run the topology stage first); only settings topolaunch "
                                "already made are kept" % guest["host"])
            try:
                change = changes(guest["config"], host, ids, None if hugepages in (None, "") else str(hugepages),
                                 vmid="%s (%s)" % (guest["vmid"], guest["host"]))
            except ProxmoxConfigError as exc:
                raise AnsibleActionFail("proxmox_vm_config: %s" % exc)
            kvm, api = module_params(change)
            vms.append({"host": guest["host"], "vmid": guest["vmid"], "change": change, "module_params": kvm,
                        "api_params": api, "findings": ids})
            if change["changed"]:
                header = "/etc/pve/qemu-server/%s.conf (%s)" % (guest["vmid"], guest["host"])
                diff.append({"before_header": header, "after_header": header,
                             "before": diff_text(change["before"]), "after": diff_text(change["after"])})
        result.update(changed=any(v["change"]["changed"] for v in vms), vms=vms)
        if warnings:
            result["warnings"] = warnings
        if diff:
            result["diff"] = diff
        return result
