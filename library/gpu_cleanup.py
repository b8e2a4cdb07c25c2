#!/usr/bin/python
"""Ansible module gpu_cleanup: stop what is left of our SGLang server on our GPUs (logic in module_utils)."""

DOCUMENTATION = r"""
module: gpu_cleanup
short_description: Stop our leftover processes on our GPUs, never anyone else's
description:
  - Finds the processes that hold memory on our GPUs (NVML compute processes) or listen on our port.
  - Ours are processes in our systemd unit's cgroup or running as our service user. SGLang's process titles
    (C(sglang::*), C(sglang.launch_server)) are reported, but another user's SGLang is not ours.
  - A foreign process on one of our GPUs or on our port fails the task before anything is signalled, naming its
    pid, user, command line and GPU, unless I(stop_foreign) is true. Processes on other GPUs are never touched.
  - Ours get SIGTERM, then SIGKILL after I(term_timeout); then the module waits until NVML lists no process on our
    GPUs, their used memory is at most I(memory_threshold_mib) and the port is closed.
  - The GPUs of the plan the unit currently runs (I(current_plan_path)) are added to I(gpu_indices), its port to I(ports).
  - Runs under the tools python (nvidia-ml-py). In check mode it reports what it would stop and stops nothing.
options:
  force_service_user:
    description: Clean up for a O(service_user) that is root or has a login shell (refused otherwise, before
      anything changes - the server would run with its rights and cleanup would signal its other processes on our
      GPUs). The role topolaunch's C(topolaunch_force_service_user).
    type: bool
    default: false
  gpu_indices:
    description: NVML indices of the GPUs of the new plan.
    type: list
    elements: int
    default: []
  current_plan_path:
    description: JSON plan the unit runs now (its gpu_indices and port are added); default
      O(state_dir)/current_plan.json. Missing file = nothing added.
    type: path
  title_prefixes:
    description: Process title prefixes of SGLang's children (reported in the result).
    type: list
    elements: str
    default: ["sglang::"]
  cmdline_markers:
    description: Strings in the command line that mark an SGLang launcher (reported in the result).
    type: list
    elements: str
    default: ["sglang.launch_server"]
  ports:
    description: TCP ports our server listens on; a listener on them must go away too.
    type: list
    elements: int
    default: []
  term_timeout:
    description: Seconds to wait after SIGTERM before SIGKILL.
    type: float
    default: 30
  kill_timeout:
    description: Seconds to wait after SIGKILL before failing.
    type: float
    default: 10
  release_timeout:
    description: Seconds to wait for the GPUs to show no process and baseline memory, and the port to close.
    type: float
    default: 60
  poll_interval:
    description: Seconds between two looks while waiting.
    type: float
    default: 0.2
  stop_foreign:
    description: Also stop processes of other users that hold our GPUs or our port.
    type: bool
    default: false
  memory_threshold_mib:
    description: A GPU with no process counts as released when its used memory is at most this (driver baseline).
    type: int
    default: 2048
  stop_unit:
    description:
      - First stop I(unit_name) (C(systemctl stop), the whole cgroup; systemd SIGKILLs what outlives the unit's
        C(TimeoutStopSec)), after checking that no foreign process holds our GPUs or port (that check fails before
        anything is stopped). The result's C(unit) says how it stopped.
    type: bool
    default: false
extends_documentation_fragment:
  - topolaunch.sglang.common
author:
  - topolaunch project (@topolaunch)
"""

EXAMPLES = r"""
- name: Stop our unit, then what is left of it on our GPUs
  topolaunch.sglang.gpu_cleanup:
    gpu_indices: [0, 1, 2, 3, 4, 5, 6, 7]
    ports: [30000]
    service_user: sglang
    unit_name: topolaunch-sglang.service
    stop_unit: true
  vars:
    ansible_python_interpreter: /opt/topolaunch/tools/bin/python
"""

RETURN = r"""
stopped:
  description: Processes stopped, with what ended each (SIGTERM, SIGKILL, or exited before we signalled it).
  returned: always
  type: list
  elements: dict
  sample: [{pid: 4242, user: sglang, title: "sglang::scheduler_PP0_TP0", cmdline: "sglang::scheduler_PP0_TP0",
            gpus: {"0": 93000000000}, ports: [], ours: true, reasons: [service user, sglang title],
            signal: SIGTERM, ended_after_s: 0.4}]
would_stop:
  description: In check mode, the processes that would be stopped.
  returned: always
  type: list
  elements: dict
left_alone:
  description: Processes on GPUs that are not ours (never touched), for the record.
  returned: always
  type: list
  elements: dict
gpu_indices:
  description: The GPUs cleaned (the plan's and the running plan's).
  returned: always
  type: list
  elements: int
ports:
  description: The ports that had to close.
  returned: always
  type: list
  elements: int
unit:
  description: With I(stop_unit), how the unit stopped - name, load_state, was (ActiveState before), stopped,
    would_stop (check mode), seconds, result (systemd's Result after the stop), sigkilled (Result is timeout).
  returned: when stop_unit is true
  type: dict
  sample: {name: topolaunch-sglang.service, load_state: loaded, was: active, stopped: true, would_stop: false,
           seconds: 4.1, result: success, sigkilled: false}
running_plan:
  description: The state file whose GPUs and port were added, or null.
  returned: always
  type: str
plan:
  description: The plan the unit ran (the content of that state file; {} when there was none) - the plan stopped.
  returned: success
  type: dict
stage:
  description: C(cleanup).
  returned: always
  type: str
gpus:
  description: Used memory of our GPUs before and after.
  returned: success
  type: list
  elements: dict
elapsed_s:
  description: Seconds the whole cleanup took.
  returned: success
  type: float
summary:
  description: One line saying what was stopped and how long it took.
  returned: success
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.topolaunch.sglang.plugins.module_utils.cleanup import DEFAULTS, CleanupError, cleanup
from ansible_collections.topolaunch.sglang.plugins.module_utils.topology import TopologyError, import_nvml

ARGUMENT_SPEC = {
    "unit_name": {"type": "str", "default": DEFAULTS["unit_name"]},
    "state_dir": {"type": "path", "default": DEFAULTS["state_dir"]},
    "service_user": {"type": "str", "default": DEFAULTS["service_user"]},
    "force_service_user": {"type": "bool", "default": False},
    "gpu_indices": {"type": "list", "elements": "int", "default": []},
    "current_plan_path": {"type": "path"},
    "title_prefixes": {"type": "list", "elements": "str", "default": ["sglang::"]},
    "cmdline_markers": {"type": "list", "elements": "str", "default": ["sglang.launch_server"]},
    "ports": {"type": "list", "elements": "int", "default": []},
    "term_timeout": {"type": "float", "default": 30},
    "kill_timeout": {"type": "float", "default": 10},
    "release_timeout": {"type": "float", "default": 60},
    "poll_interval": {"type": "float", "default": 0.2},
    "stop_foreign": {"type": "bool", "default": False},
    "memory_threshold_mib": {"type": "int", "default": 2048},
    "stop_unit": {"type": "bool", "default": False},
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        nvml = import_nvml()
    except TopologyError as exc:
        module.fail_json(msg=str(exc), stage="cleanup")
    try:
        result = cleanup(dict(module.params), nvml, check_mode=module.check_mode)
    except CleanupError as exc:
        module.fail_json(msg=str(exc), stage="cleanup", **exc.result)
    except nvml.NVMLError as exc:
        module.fail_json(msg="NVML failed while cleaning GPUs %s: %s" % (module.params["gpu_indices"], exc),
                         stage="cleanup")
    module.exit_json(stage="cleanup", **result)


if __name__ == "__main__":
    main()
