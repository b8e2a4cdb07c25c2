#!/usr/bin/python
"""Ansible module sglang_wait: watch a starting SGLang unit for one chunk of time (logic in module_utils)."""

DOCUMENTATION = r"""
module: sglang_wait
short_description: Watch a starting SGLang unit for up to one chunk of time and report its milestone
description:
  - Polls the systemd unit, its journal (this start only, by InvocationID) and the server port.
  - Returns as soon as the server is ready (port open and SGLang's ready line logged), a new milestone is reached
    (Load weight begin/end, Capture cuda graph begin/end), or I(chunk_seconds) passed; the caller loops and prints
    progress between calls.
  - Fails at once when the unit died or systemd restarted it, with the log lines of this start that carry the error.
  - Reads only; never changes anything (check mode runs it as well).
options:
  unit:
    description: The systemd unit.
    type: str
    default: topolaunch-sglang.service
  host:
    description: Address the server listens on (a wildcard is reached via loopback).
    type: str
    default: 127.0.0.1
  port:
    description: Server port.
    type: int
    required: true
  invocation_id:
    description: The start to follow (returned by the first call); empty = the unit's current start.
    type: str
    default: ""
  known_milestone:
    description: The milestone already reported; the call returns early when a later one is reached.
    type: str
    default: started
  chunk_seconds:
    description: Longest time one call waits.
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
author: topolaunch
"""

EXAMPLES = r"""
- name: Watch the server start for 20 s
  sglang_wait:
    port: 30000
  register: start
"""

RETURN = r"""
state:
  description: ready, progress or waiting.
  returned: success
  type: str
milestone:
  description: started, load_weight_begin, load_weight_end, capture_cuda_graph_begin, capture_cuda_graph_end or ready.
  returned: always
  type: str
label:
  description: The milestone in SGLang's words.
  returned: always
  type: str
invocation_id:
  description: The unit start being followed; pass it to the next call.
  returned: always
  type: str
since_start_s:
  description: Seconds since the unit's main process started.
  returned: always
  type: float
port_open:
  description: Whether the port accepted a connection.
  returned: always
  type: bool
error_lines:
  description: On failure, the log lines of this start that look like the error.
  returned: failure
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.topolaunch.health import HealthError, wait_chunk


def main():
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str", "default": "topolaunch-sglang.service"},
            "host": {"type": "str", "default": "127.0.0.1"},
            "port": {"type": "int", "required": True},
            "invocation_id": {"type": "str", "default": ""},
            "known_milestone": {"type": "str", "default": "started"},
            "chunk_seconds": {"type": "float", "default": 20},
            "startup_timeout": {"type": "float", "default": 1200},
            "journal_lines": {"type": "int", "default": 50},
        },
        supports_check_mode=True,
    )
    p = module.params
    if not 0 < p["port"] < 65536:
        module.fail_json(msg="port %s: must be in 1-65535" % p["port"])
    try:
        result = wait_chunk(p["unit"], p["host"], p["port"], invocation_id=p["invocation_id"] or None,
                            known=p["known_milestone"], chunk_s=p["chunk_seconds"],
                            startup_timeout=p["startup_timeout"], journal_lines=p["journal_lines"])
    except HealthError as exc:
        module.fail_json(msg=str(exc), **exc.result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
