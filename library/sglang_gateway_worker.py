#!/usr/bin/python
"""Ansible module sglang_gateway_worker: take one replica out of the model gateway and drain it, or put it back
(a rolling relaunch's gateway steps; logic in module_utils/topolaunch/rolling.py)."""

DOCUMENTATION = r"""
module: sglang_gateway_worker
short_description: Take a replica out of the model gateway and drain it, or add it back
description:
  - One replica's gateway step of a rolling relaunch (README "Rolling relaunches"), run on the host where the
    gateway (smg) listens.
  - O(state=absent) removes worker O(url) from the gateway (C(DELETE /workers/{id})), waits until the gateway no
    longer routes to it (smg 1.13.0 lists it C(draining) for its drain settle time, then drops it), then until the
    replica's own C(GET /v1/loads) shows no request running or waiting, each wait at most O(drain_timeout) seconds;
    past it the task fails naming the replica and C(topolaunch_drain_timeout). A replica that refuses the connection
    (stopped) has nothing in flight.
  - O(state=present) waits until the gateway has dropped a C(draining) entry of the same URL (smg refuses to add it
    meanwhile, 409), adds the worker back (C(POST /workers)) and waits until the gateway routes to it (listed
    C(ready), its health check passed), at most O(drain_timeout) seconds.
  - Idempotent; check mode only reads the gateway's worker list and says whether it would change.
options:
  gateway_url:
    description: The gateway's base URL (http://host:port).
    type: str
    required: true
  url:
    description: The replica's worker URL, as the gateway knows it (the plan's replica url).
    type: str
    required: true
  state:
    description: C(absent) removes and drains the worker, C(present) adds it back.
    type: str
    choices: [absent, present]
    default: present
  drain_timeout:
    description: Seconds each wait may take (the drain; the gateway routing to an added worker); > 0.
    type: float
    default: 120
  api_key:
    description: The API key the gateway enforces (sent in the Authorization header only).
    type: str
    default: ""
  http_timeout:
    description: Seconds one HTTP call may take.
    type: float
    default: 10
author:
  - topolaunch project (@topolaunch)
"""

EXAMPLES = r"""
- name: Take replica 0 out of the gateway and let its requests finish
  topolaunch.sglang.sglang_gateway_worker:
    gateway_url: http://127.0.0.1:8000
    url: http://127.0.0.1:30001
    state: absent
    drain_timeout: 120

- name: Put it back
  topolaunch.sglang.sglang_gateway_worker:
    gateway_url: http://127.0.0.1:8000
    url: http://127.0.0.1:30001
    state: present
"""

RETURN = r"""
drained_s:
  description: Seconds the drain took (0 when nothing was drained).
  returned: always
  type: float
url:
  description: The replica's worker URL.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.topolaunch.sglang.plugins.module_utils.rolling import Gateway, RollingError, worker

ARGUMENT_SPEC = {
    "gateway_url": {"type": "str", "required": True},
    "url": {"type": "str", "required": True},
    "state": {"type": "str", "choices": ["absent", "present"], "default": "present"},
    "drain_timeout": {"type": "float", "default": 120},
    "api_key": {"type": "str", "default": "", "no_log": True},
    "http_timeout": {"type": "float", "default": 10},
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    if p["http_timeout"] <= 0:
        module.fail_json(msg="http_timeout %s: must be greater than 0" % p["http_timeout"], url=p["url"])
    try:
        result = worker(Gateway(p["gateway_url"], api_key=p["api_key"] or None, timeout=p["http_timeout"]),
                        p["url"], p["state"], p["drain_timeout"], check_mode=module.check_mode)
    except RollingError as exc:
        module.fail_json(msg=str(exc), url=p["url"])
    module.exit_json(url=p["url"], **result)


if __name__ == "__main__":
    main()
