#!/usr/bin/python
"""Ansible module relaunch_lock: end this run's hold of the relaunch lock, whatever ended the relaunch."""

DOCUMENTATION = r"""
---
module: relaunch_lock
short_description: Release the relaunch lock a run holds (its validate took it), however the relaunch ended
description:
  - The validate step (M(topolaunch.sglang.sglang_launch) O(topolaunch.sglang.sglang_launch#module:relaunch_lock))
    takes the relaunch lock for its run and the health check releases it. A relaunch that ends before its health
    check (a cleanup that refuses, a launch that fails with no rollback) would leave it held until its deadline, and
    every later run would wait for it. The relaunch role calls this module when its sequence ends, however it ended.
  - Only a holder of O(owner)'s run is ended (another run's lock stays held); nothing held is no change. In check
    mode nothing is ended (no lock is taken in check mode either).
options:
  path:
    description: The lock file (topolaunch_relaunch_lock).
    type: path
    required: true
  owner:
    description: The run whose lock is released (launch_run_owner, as the validate step named it).
    type: str
    required: true
author:
  - topolaunch project (@topolaunch)
"""

EXAMPLES = r"""
- name: Release this run's relaunch lock
  topolaunch.sglang.relaunch_lock:
    path: /run/topolaunch/relaunch.lock
    owner: "{{ launch_run_owner }}"
  become: true
"""

RETURN = r"""
released:
  description: Whether a holder of this run was ended (or, in check mode, would have been).
  returned: success
  type: bool
  sample: true
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.topolaunch.sglang.plugins.module_utils.relaunch_lock import held_by, release

ARGUMENT_SPEC = {"path": {"type": "path", "required": True}, "owner": {"type": "str", "required": True}}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    path, owner = module.params["path"], module.params["owner"]
    if module.check_mode:
        ours = held_by(path, owner)
        module.exit_json(changed=ours, released=ours)
    released = release(path, owner)
    module.exit_json(changed=released, released=released)


if __name__ == "__main__":
    main()
