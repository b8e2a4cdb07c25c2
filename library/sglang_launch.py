#!/usr/bin/python
"""Ansible module sglang_service: check, write and start the SGLang unit in one call (logic in module_utils)."""

DOCUMENTATION = r"""
module: sglang_service
short_description: Check the plan's prerequisites, decide whether to replace the server, write and start its unit
description:
  - One call on the target for what the launch role needs, so that a relaunch costs few round trips.
  - Both states first check what a start needs, failing with the bad value and "nothing was stopped" when the SGLang
    python is missing or not executable, when an absolute I(plan.model_path) has no config.json, when
    I(service_user) does not exist, or when the recorded running plan cannot be read.
  - Then decide whether the server must be replaced, with the reasons (forced; the unit is not active; the plan
    changed, comparing only I(server_keys); the unit file changed; the env file changed).
  - I(state=checked) stops there and never changes anything.
  - I(state=started) creates the env file's directory and I(state_dir) (root 0755); writes the env file (root 0600,
    created 0600), the unit file (0644) and current_plan.json (0644) when they differ, atomically; reloads systemd
    when the unit file changed; clears the failed state and start-limit count of a loaded unit about to be
    (re)started; enables or disables it; restarts it when replacing, starts it when not active. A failed start
    fails with systemctl's message and the unit's last journal lines.
  - The values of I(secret_env_keys) in I(env_content) are masked in everything the module returns (SGLang logs
    its api_key at start, and a failed start returns log lines).
options:
  name:
    description: The systemd unit.
    type: str
    default: topolaunch-sglang.service
  plan:
    description: The plan (the sglang_plan result); written to I(state_dir)/current_plan.json.
    type: dict
    required: true
  unit_content:
    description: The rendered unit file.
    type: str
    required: true
  env_content:
    description: The rendered env file; holds secrets, never logged.
    type: str
    required: true
  env_file:
    description: Path of the env file.
    type: path
    default: /etc/topolaunch/sglang.env
  state_dir:
    description: Directory of current_plan.json.
    type: path
    default: /var/lib/topolaunch
  unit_dir:
    description: Directory of the unit file.
    type: path
    default: /etc/systemd/system
  python:
    description: The SGLang venv python the unit runs.
    type: path
    required: true
  service_user:
    description: User the server runs as.
    type: str
    default: sglang
  server_keys:
    description: The plan keys that make the server what it is; only these are compared with the running plan.
    type: list
    elements: str
    default: [layout, gpu_indices, cuda_visible_devices, env, argv, host, port, model_path, served_model_name,
              sglang_version]
  force:
    description: Replace the server even when the same plan already runs.
    type: bool
    default: false
  enabled:
    description: Start the unit at boot (null leaves it as it is).
    type: bool
  state:
    description: C(checked) reads and decides only; C(started) also writes and starts.
    type: str
    choices: [checked, started]
    default: checked
  journal_lines:
    description: How many journal lines a failed start shows.
    type: int
    default: 20
  secret_env_keys:
    description: Keys of I(env_content) whose values are secrets, masked in the module's output.
    type: list
    elements: str
    default: [HF_TOKEN, TOPOLAUNCH_API_KEY]
author: topolaunch
"""

EXAMPLES = r"""
- name: Decide whether the server must be replaced (changes nothing)
  sglang_service:
    plan: "{{ launch_plan }}"
    unit_content: "{{ lookup('ansible.builtin.template', 'unit.service.j2') }}"
    env_content: "{{ lookup('ansible.builtin.template', 'sglang.env.j2') }}"
    python: /opt/sglang/venvs/0.5.9/bin/python
    force: "{{ launch_force }}"
    state: checked
  register: decision

- name: Write the unit and start it
  sglang_service:
    plan: "{{ launch_plan }}"
    unit_content: "{{ lookup('ansible.builtin.template', 'unit.service.j2') }}"
    env_content: "{{ lookup('ansible.builtin.template', 'sglang.env.j2') }}"
    python: /opt/sglang/venvs/0.5.9/bin/python
    force: "{{ decision.replace }}"
    enabled: true
    state: started
"""

RETURN = r"""
replace:
  description: Whether the server is (or must be) replaced.
  returned: success
  type: bool
reasons:
  description: Why it is replaced (empty when the same plan already runs).
  returned: success
  type: list
  elements: str
reason:
  description: The reasons joined with ", ", or "the same plan already runs".
  returned: success
  type: str
unit_state:
  description: The unit's LoadState, ActiveState, SubState and UnitFileState before anything was done.
  returned: success
  type: dict
unit_path:
  description: Path of the unit file.
  returned: success
  type: str
plan_path:
  description: Path of current_plan.json.
  returned: success
  type: str
written:
  description: Directories and files created or written (in check mode, those that would be).
  returned: success
  type: list
  elements: str
actions:
  description: systemctl actions run, in order (daemon-reload, reset-failed, enable, disable, restart, start; in
    check mode, those that would run).
  returned: success
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.topolaunch.sglang.plugins.module_utils.launch import DEFAULTS, ServiceError, env_values, service


def main():
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "default": DEFAULTS["name"]},
            "plan": {"type": "dict", "required": True},
            "unit_content": {"type": "str", "required": True},
            "env_content": {"type": "str", "required": True, "no_log": True},
            "env_file": {"type": "path", "default": DEFAULTS["env_file"]},
            "state_dir": {"type": "path", "default": DEFAULTS["state_dir"]},
            "unit_dir": {"type": "path", "default": DEFAULTS["unit_dir"]},
            "python": {"type": "path", "required": True},
            "service_user": {"type": "str", "default": DEFAULTS["service_user"]},
            "server_keys": {"type": "list", "elements": "str", "default": DEFAULTS["server_keys"]},
            "force": {"type": "bool", "default": False},
            "enabled": {"type": "bool"},
            "state": {"type": "str", "choices": ["checked", "started"], "default": "checked"},
            "journal_lines": {"type": "int", "default": DEFAULTS["journal_lines"]},
            "secret_env_keys": {"type": "list", "elements": "str", "default": ["HF_TOKEN", "TOPOLAUNCH_API_KEY"]},
        },
        supports_check_mode=True,
    )
    p = module.params
    # The secrets themselves, not only the whole env content, are masked wherever they would show (log lines).
    module.no_log_values.update(env_values(p["env_content"], p["secret_env_keys"]))
    try:
        result = service(p, check_mode=module.check_mode)
    except ServiceError as exc:
        module.fail_json(msg=str(exc), **exc.result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
