#!/usr/bin/python
"""Ansible module sglang_wait: watch a starting SGLang unit for a chunk; verify it once ready (logic in module_utils)."""

DOCUMENTATION = r"""
module: sglang_wait
short_description: Watch a starting SGLang unit, report its milestone; once ready, verify it and record the plan
description:
  - Reads the plan the unit runs (I(plan_path), written by the launch stage). The server's host, port and model come
    from it, and every result (failures included) returns it as C(plan), without its candidates table.
  - Polls the systemd unit, its journal (this start only, by InvocationID) and the server port.
  - Returns as soon as the server is ready (port open and SGLang's ready line logged), a new milestone is reached
    (Load weight begin/end, Capture cuda graph begin/end), or I(chunk_seconds) passed; the caller loops and prints
    progress between calls.
  - Fails at once when the unit died or systemd restarted it, with the log lines of this start that carry the error,
    and when the server is not ready I(startup_timeout) seconds after the unit's start.
  - With I(verify), a ready server is asked in the same call. GET /health until 200 (503 is normal for a moment
    after the port opened; up to I(ready_timeout) seconds), GET /model_info must name the plan's model_path or
    served_model_name, POST /generate must return text and completion tokens. Then the plan is recorded as the
    last known good one (I(last_good_path), root 0644, written only when different, C(changed) says so).
  - Check mode writes nothing; the wait and the HTTP checks run as usual.
options:
  unit:
    description: The systemd unit.
    type: str
    default: topolaunch-sglang.service
  plan_path:
    description: The plan the unit runs (JSON, written by the launch stage).
    type: path
    default: /var/lib/topolaunch/current_plan.json
  last_good_path:
    description: Where a verified plan is recorded as the last known good one.
    type: path
    default: /var/lib/topolaunch/last_good_plan.json
  invocation_id:
    description: The start to follow (returned by the first call); empty = the unit's current start.
    type: str
    default: ""
  known_milestone:
    description: The milestone already reported; the call returns early when a later one is reached.
    type: str
    default: started
  chunk_seconds:
    description: Longest time one call waits for a milestone.
    type: float
    default: 20
  startup_timeout:
    description: Fail when the server is not ready this many seconds after the unit's start (0 = no limit).
    type: float
    default: 1200
  journal_lines:
    description: How many error lines to return when the unit died.
    type: int
    default: 50
  verify:
    description: Once ready, check /health, /model_info and one /generate, then record the last known good plan.
    type: bool
    default: false
  api_key:
    description: The server's API key, sent as a Bearer token to /model_info and /generate; empty = none.
    type: str
    default: ""
  ready_timeout:
    description: Seconds /health may answer other than 200 after the server's ready line.
    type: float
    default: 30
  http_timeout:
    description: Timeout of one HTTP request, in seconds.
    type: float
    default: 60
  prompt:
    description: Prompt of the test generation.
    type: str
    default: The capital of France is
  max_new_tokens:
    description: Tokens the test generation asks for.
    type: int
    default: 8
author: topolaunch
"""

EXAMPLES = r"""
- name: Watch the server start for 20 s; once ready, verify it and record its plan as the last known good one
  sglang_wait:
    verify: true
  register: start
"""

RETURN = r"""
state:
  description: ready, progress or waiting (on failure also dead or timeout).
  returned: when the unit was read
  type: str
milestone:
  description: started, load_weight_begin, load_weight_end, capture_cuda_graph_begin, capture_cuda_graph_end or ready.
  returned: when the unit was read
  type: str
label:
  description: The milestone in SGLang's words.
  returned: when the unit was read
  type: str
invocation_id:
  description: The unit start being followed; pass it to the next call.
  returned: when the unit was read
  type: str
since_start_s:
  description: Seconds since the unit's main process started.
  returned: when the unit was read
  type: float
port_open:
  description: Whether the port accepted a connection.
  returned: when the unit was read
  type: bool
plan:
  description: The plan the unit runs (the content of plan_path), without its candidates table.
  returned: whenever it could be read, failures included
  type: dict
verified:
  description: True when /health, /model_info and /generate passed in this call.
  returned: when verified
  type: bool
last_good_changed:
  description: Whether last_good_path was (or in check mode would be) written.
  returned: when verified
  type: bool
url:
  description: The server's base URL that was asked.
  returned: when verified
  type: str
health_s:
  description: Seconds from the ready line until /health answered 200.
  returned: when verified
  type: float
generated_tokens:
  description: Completion tokens of the test generation.
  returned: when verified
  type: int
generated_text:
  description: Text of the test generation.
  returned: when verified
  type: str
error_lines:
  description: When the unit died, the log lines of this start that look like the error.
  returned: failure
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.topolaunch.sglang.plugins.module_utils.health import HealthError, check


def main():
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str", "default": "topolaunch-sglang.service"},
            "plan_path": {"type": "path", "default": "/var/lib/topolaunch/current_plan.json"},
            "last_good_path": {"type": "path", "default": "/var/lib/topolaunch/last_good_plan.json"},
            "invocation_id": {"type": "str", "default": ""},
            "known_milestone": {"type": "str", "default": "started"},
            "chunk_seconds": {"type": "float", "default": 20},
            "startup_timeout": {"type": "float", "default": 1200},
            "journal_lines": {"type": "int", "default": 50},
            "verify": {"type": "bool", "default": False},
            "api_key": {"type": "str", "default": "", "no_log": True},
            "ready_timeout": {"type": "float", "default": 30},
            "http_timeout": {"type": "float", "default": 60},
            "prompt": {"type": "str", "default": "The capital of France is"},
            "max_new_tokens": {"type": "int", "default": 8},
        },
        supports_check_mode=True,
    )
    p = module.params
    for name in ("chunk_seconds", "ready_timeout", "http_timeout", "max_new_tokens"):
        if p[name] <= 0:
            module.fail_json(msg="%s %s: must be greater than 0" % (name, p[name]))
    try:
        result = check(p["unit"], p["plan_path"], p["last_good_path"], invocation_id=p["invocation_id"] or None,
                       known=p["known_milestone"], chunk_s=p["chunk_seconds"], startup_timeout=p["startup_timeout"],
                       journal_lines=p["journal_lines"], verify_server=p["verify"], check_mode=module.check_mode,
                       api_key=p["api_key"], ready_timeout=p["ready_timeout"], http_timeout=p["http_timeout"],
                       prompt=p["prompt"], max_new_tokens=p["max_new_tokens"])
    except HealthError as exc:
        module.fail_json(msg=str(exc), **exc.result)
    module.exit_json(changed=result.get("last_good_changed", False), **result)


if __name__ == "__main__":
    main()
