#!/usr/bin/python
"""Ansible module sglang_launch: validate the plan, decide whether to replace the server, write and start its unit."""

DOCUMENTATION = r"""
module: sglang_launch
short_description: Validate a plan on the host, decide whether to replace the server, write and start its unit
description:
  - The stages validate (O(state=checked)) and launch (O(state=started)) of a relaunch, one call on the target each.
    Formerly named C(sglang_service); that name still works.
  - Both states first validate (O(state=started) not when O(validated) - the validate step of the same relaunch
    checked these very inputs), failing with every problem and "nothing was stopped" - the plan is complete and
    consistent (argv, GPU indices, CUDA_VISIBLE_DEVICES, env, port, topology fingerprint, SGLang version, layout)
    and made for this host's GPUs (O(topology_fingerprint), O(gpu_count)), no string of the server's part of the
    plan and no line of the rendered env file, unit or server config holds a control character, the env file's
    lines are NAME="value", the plan's SGLang version is the one installed and current (O(sglang_version_file)),
    the SGLang python exists and is executable, an absolute C(plan.model_path) has a config.json, O(service_user)
    exists and is neither root nor a login user (unless O(force_service_user)), each key of O(config_content) is a
    flag of the plan's SGLang release, C(systemd-analyze verify) accepts the rendered unit (a temporary copy; skipped when systemd-analyze is
    missing), the recorded running plan can be read, and the plan's port (and the running server's) is free or held
    by a process this host shows - not by a socket no process here holds (another container or PID namespace
    sharing the network), not answering while nothing here listens (a forward, another network namespace), not
    refusing to bind.
  - Then decide whether the server must be replaced, with the reasons (forced; the unit is not active; the plan
    changed, comparing only O(server_keys), naming what changed; the unit file, the env file or the server config
    changed).
  - O(state=checked) stops there and never changes anything.
  - O(state=started) creates the env file's directory and O(state_dir) (root 0755); writes the env file (root 0600,
    created 0600), the server config (O(config_file), 0600 owned by O(service_user); removed when
    O(config_content) is empty) and the unit file (0644) when they differ and C(current_plan.json) (0644) when the server is
    (re)started, atomically; reloads systemd when the unit file changed; clears the failed state and start-limit
    count of a loaded unit about to be (re)started; enables or disables it; restarts it when replacing. A failed
    start fails with systemctl's message and the unit's last journal lines.
  - The values of O(secret_env_keys) in O(env_content) and every value of O(config_content) are masked in
    everything the module returns (SGLang logs its api_key at start, and a failed start returns log lines).
extends_documentation_fragment:
  - topolaunch.sglang.common
options:
  force_service_user:
    description: Run the server as a O(service_user) that is root or has a login shell (refused otherwise, before
      anything changes - the server would run with its rights and cleanup would signal its other processes on our
      GPUs). The role topolaunch's C(topolaunch_force_service_user).
    type: bool
    default: false
  unit_name:
    aliases: [name]
  plan:
    description: The plan (the sglang_plan result's C(plan)); written to O(state_dir)/current_plan.json.
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
  config_content:
    description: The rendered server config (SGLang C(--config FILE.yaml), one C(key) and JSON string a line),
      the secrets that must not be on the server's command line (C(api-key)); never logged. Empty = no such file.
    type: str
    default: ""
  config_file:
    description: Path of the server config (default O(state_dir)/sglang-config.yaml); the unit passes it as
      C(--config).
    type: path
  unit_dir:
    description: Directory of the unit file.
    type: path
    default: /etc/systemd/system
  venv_root:
    description: Directory of the SGLang venvs, one per version; the plan's C(sglang_version) picks one.
    type: path
    default: /opt/sglang/venvs
  python:
    description: The SGLang venv python the unit runs (default O(venv_root)/<plan sglang_version>/bin/python).
    type: path
  sglang_version_file:
    description:
      - The SGLang version installed and current on the host, as the sglang role records it (JSON with
        C(sglang_version)). A plan for another version is refused before anything is stopped; a missing file is
        not checked (a host provisioned before the record existed).
    type: path
    default: /etc/topolaunch/sglang_version.json
  server_keys:
    description: The plan keys that make the server what it is; only these are compared with the running plan.
    type: list
    elements: str
    default: [layout, gpu_indices, cuda_visible_devices, env, argv, host, port, model_path, served_model_name,
              sglang_version]
  topology_fingerprint:
    description: This host's topology fingerprint, when the run read it; the plan must have been made for it.
    type: str
  gpu_count:
    description: This host's GPU count, when the run read it; the plan's GPUs must exist.
    type: int
  force:
    description: Replace the server even when the same plan already runs.
    type: bool
    default: false
  cleanup:
    description:
      - O(state=started) - when the server is replaced, first stop it and clean our GPUs in this same call, as the
        module M(topolaunch.sglang.gpu_cleanup) does with these of its options (C(gpu_indices), C(ports),
        C(term_timeout), C(kill_timeout), C(release_timeout), C(memory_threshold_mib), C(stop_foreign), ...;
        O(unit_name), O(state_dir) and O(service_user) are this module's, and the unit is stopped). Needs
        nvidia-ml-py (run it with the tools venv's python). Its result is C(cleanup). Not given - nothing is stopped
        first.
    type: dict
  validated:
    description: O(state=started) - these very inputs (plan and rendered files) were checked with O(state=checked)
      in this relaunch (the relaunch role's validate step), so the checks are not run again; the decision is.
    type: bool
    default: false
  enabled:
    description: Start the unit at boot (null leaves it as it is).
    type: bool
  relaunch_lock:
    description:
      - O(state=checked) - take the relaunch lock (an flock on O(relaunch_lock.path)) before validating, held by a
        detached process until the health check releases it
        (O(topolaunch.sglang.sglang_health#module:release_lock)) or O(relaunch_lock.seconds) passed; the watchdog
        does nothing while it is held. Not in check mode. A failed validate releases it.
    type: dict
    suboptions:
      path:
        description: The lock file.
        type: path
        required: true
      seconds:
        description: The longest the lock is held (a relaunch cut short frees it then).
        type: float
        required: true
      owner:
        description:
          - The run taking it (the play, its controller, a run id). The same run takes its own lock again (a
            rollback's validate); another run's is waited for up to O(relaunch_lock.wait) seconds, then the call
            fails naming its holder (pid, since when, the run), before anything is stopped.
        type: str
        default: ""
      wait:
        description: Seconds to wait for another run's lock (or the watchdog's) before failing.
        type: float
        default: 120
  state:
    description: C(checked) validates and decides only (the validate stage); C(started) also writes and starts.
    type: str
    choices: [checked, started]
    default: checked
  list_units:
    description:
      - Shell patterns of unit file names in O(unit_dir) to list in the result (C(units_present)); the relaunch reads
        its units of the other shape this way in the validate call instead of a call of its own. Empty = none listed.
    type: list
    elements: str
    default: []
  journal_lines:
    description: How many journal lines a failed start shows.
    type: int
    default: 20
  secret_env_keys:
    description: Keys of O(env_content) whose values are secrets, masked in the module's output.
    type: list
    elements: str
    default: [HF_TOKEN, TOPOLAUNCH_API_KEY]
author:
  - topolaunch project (@topolaunch)
"""

EXAMPLES = r"""
- name: Validate the plan and decide whether the server must be replaced (changes nothing)
  topolaunch.sglang.sglang_launch:
    plan: "{{ topolaunch_plan }}"
    unit_content: "{{ lookup('ansible.builtin.template', 'unit.service.j2') }}"
    env_content: "{{ lookup('ansible.builtin.template', 'sglang.env.j2') }}"
    topology_fingerprint: "{{ ansible_facts.gpu_topology.fingerprint }}"
    force: false
    state: checked
  register: decision

- name: Stop the old server, clean its GPUs, write the unit and start it (one call)
  topolaunch.sglang.sglang_launch:
    plan: "{{ topolaunch_plan }}"
    unit_content: "{{ lookup('ansible.builtin.template', 'unit.service.j2') }}"
    env_content: "{{ lookup('ansible.builtin.template', 'sglang.env.j2') }}"
    force: "{{ decision.replace }}"
    validated: true
    cleanup: {gpu_indices: "{{ topolaunch_plan.gpu_indices }}", ports: ["{{ topolaunch_plan.port }}"]}
    enabled: true
    state: started
  vars:
    ansible_python_interpreter: /opt/topolaunch/tools/bin/python
"""

RETURN = r"""
plan:
  description: The plan validated (and with O(state=started) launched).
  returned: success
  type: dict
stage:
  description: C(validate) (O(state=checked)) or C(launch) (O(state=started)); a failed cleanup in the start call
    says C(cleanup).
  returned: always
  type: str
last_good_plan:
  description: O(state=started) failures - the last known good plan (health's record), what the relaunch's rollback
    puts back; empty when there is none.
  returned: failure
  type: dict
last_good_differs:
  description: O(state=started) failures - whether the last known good plan runs another server than O(plan).
  returned: failure
  type: bool
server_stopped:
  description: O(state=started) failures - whether the old server was stopped (the unit or processes of ours
    stopped, or a restart tried); when not, the server that ran still runs and there is nothing to roll back.
  returned: failure
  type: bool
replace:
  description: Whether the server is (or must be) replaced.
  returned: success
  type: bool
enabled_as_wanted:
  description: Whether the unit's start at boot is already as O(enabled) asks (true when O(enabled) is null) - with
    C(replace) false, the launch has nothing to do.
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
cleanup:
  description: O(cleanup) given and the server replaced - what was stopped and cleaned (gpu_cleanup's result).
  returned: state started with cleanup, when replacing
  type: dict
written:
  description: Directories and files created or written (in check mode, those that would be).
  returned: success
  type: list
  elements: str
units_present:
  description: The names in O(unit_dir) that match O(list_units), sorted.
  returned: success, with O(list_units)
  type: list
  elements: str
relaunch_lock_holder:
  description: O(state=checked) with O(relaunch_lock) - the process holding the lock for this run, as
    C(<pid> <starttime>) (empty when none was taken); the health call that ends it says the same
    (M(topolaunch.sglang.sglang_health)'s C(lock_released)).
  returned: success
  type: str
actions:
  description: systemctl actions run, in order (daemon-reload, reset-failed, enable, disable, restart; in check
    mode, those that would run).
  returned: success
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.topolaunch.sglang.plugins.module_utils.cleanup import CleanupError, cleanup
from ansible_collections.topolaunch.sglang.plugins.module_utils.launch import (
    DEFAULTS, LaunchError, config_values, env_values, launch, rollback_facts)
from ansible_collections.topolaunch.sglang.plugins.module_utils.relaunch_lock import acquire, holder, holder_id, release
from ansible_collections.topolaunch.sglang.plugins.module_utils.topology import TopologyError, import_nvml

ARGUMENT_SPEC = {
    "unit_name": {"type": "str", "default": DEFAULTS["unit_name"], "aliases": ["name"]},
    "state_dir": {"type": "path", "default": DEFAULTS["state_dir"]},
    "service_user": {"type": "str", "default": DEFAULTS["service_user"]},
    "force_service_user": {"type": "bool", "default": False},
    "plan": {"type": "dict", "required": True},
    "unit_content": {"type": "str", "required": True},
    "env_content": {"type": "str", "required": True, "no_log": True},
    "env_file": {"type": "path", "default": DEFAULTS["env_file"]},
    "config_content": {"type": "str", "default": "", "no_log": True},
    "config_file": {"type": "path"},
    "unit_dir": {"type": "path", "default": DEFAULTS["unit_dir"]},
    "venv_root": {"type": "path", "default": DEFAULTS["venv_root"]},
    "python": {"type": "path"},
    "sglang_version_file": {"type": "path", "default": DEFAULTS["sglang_version_file"]},
    "server_keys": {"type": "list", "elements": "str", "default": DEFAULTS["server_keys"], "no_log": False},
    "topology_fingerprint": {"type": "str"},
    "gpu_count": {"type": "int"},
    "force": {"type": "bool", "default": False},
    "validated": {"type": "bool", "default": False},
    "cleanup": {"type": "dict"},
    "enabled": {"type": "bool"},
    "state": {"type": "str", "choices": ["checked", "started"], "default": "checked"},
    "relaunch_lock": {"type": "dict", "options": {"path": {"type": "path", "required": True},
                                                  "seconds": {"type": "float", "required": True},
                                                  "owner": {"type": "str", "default": ""},
                                                  "wait": {"type": "float", "default": 120.0}}},
    "list_units": {"type": "list", "elements": "str", "default": []},
    "journal_lines": {"type": "int", "default": DEFAULTS["journal_lines"]},
    "secret_env_keys": {"type": "list", "elements": "str", "default": ["HF_TOKEN", "TOPOLAUNCH_API_KEY"],
                        "no_log": False},
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    # The secrets themselves, not only the whole env content, are masked wherever they would show (log lines).
    module.no_log_values.update(env_values(p["env_content"], p["secret_env_keys"]))
    module.no_log_values.update(config_values(p["config_content"]))
    clean = None
    if p["cleanup"] is not None and p["state"] == "started":
        try:
            nvml = import_nvml()
        except TopologyError as exc:
            module.fail_json(msg=str(exc), stage="cleanup")
        # The gpu_cleanup module's options: stop this unit, then what of ours is left on our GPUs and port.
        options = dict(p["cleanup"], unit_name=p["unit_name"], state_dir=p["state_dir"],
                       service_user=p["service_user"], force_service_user=p["force_service_user"], stop_unit=True)

        def clean(check_mode):
            try:
                return cleanup(options, nvml, check_mode=check_mode)
            except CleanupError as exc:
                failure = dict(exc.result, stage="cleanup", running_plan=exc.result.get("plan"))
                failure.update(rollback_facts(p["state_dir"], p["plan"], exc.result))
                module.fail_json(msg=str(exc), **failure)
            except nvml.NVMLError as exc:
                module.fail_json(msg="NVML failed while cleaning GPUs %s: %s" % (options.get("gpu_indices"), exc),
                                 stage="cleanup")
    lock = p.pop("relaunch_lock")
    lock = lock if lock and p["state"] == "checked" and not module.check_mode else None
    held = ""
    if lock:
        try:
            acquire(lock["path"], lock["seconds"], wait=lock["wait"], owner=lock["owner"])
            held = holder_id(holder(lock["path"]))
        except OSError as exc:
            module.fail_json(msg="relaunch_lock: %s; nothing was stopped" % exc, stage="validate")
    try:
        result = launch(p, check_mode=module.check_mode, clean=clean)
    except LaunchError as exc:
        if lock:
            release(lock["path"], lock["owner"])
        failure = {"stage": "validate" if p["state"] == "checked" else "launch"}
        failure.update(exc.result)
        if p["state"] == "started" and isinstance(p["plan"], dict) and p["plan"]:
            failure.update(rollback_facts(p["state_dir"], p["plan"], exc.result))   # for the relaunch's rollback
        module.fail_json(msg=str(exc), **failure)
    module.exit_json(relaunch_lock_holder=held, **result)


if __name__ == "__main__":
    main()
