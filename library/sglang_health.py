#!/usr/bin/python
"""Ansible module sglang_health (was sglang_wait): follow a starting SGLang unit, verify it once ready (logic in module_utils)."""

DOCUMENTATION = r"""
module: sglang_health
short_description: Follow a starting SGLang unit, report its milestones; once ready, verify it and record the plan
description:
  - The health stage, one call per progress line. Formerly named C(sglang_wait); that name still works.
  - Reads the plan the unit runs (O(plan_path), written by the launch stage). The server's host, port and model come
    from it, and every result (failures included) returns it as C(plan).
  - Polls the systemd unit, its journal (this start only, by InvocationID) and the server port.
  - Returns as soon as the server is ready (port open and SGLang's ready line logged), a new milestone is reached
    (the log lines of the plan's C(sglang_version) - 0.5.9 Init torch distributed begin, Load weight begin/end,
    Capture cuda graph begin/end; 0.5.23 Init parallel begin, Load weight begin/end, Capture target prefill and
    then decode CUDA graph begin/end), or O(chunk_seconds) passed; the caller loops and prints progress between
    calls. C(already_serving) says that the first look of a new wait found it serving.
  - Fails at once when the unit died or systemd restarted it, with the log lines of this start that carry the error,
    and when the server is not ready O(startup_timeout) seconds after the unit's start. A failure also returns the
    last known good plan (C(last_good_plan)) and whether it runs another server (C(last_good_differs)), what a
    rollback needs.
  - With O(verify), a ready server is asked in the same call. GET /health until 200 (503 is normal for a moment
    after the port opened; up to O(ready_timeout) seconds), GET /model_info must name the plan's model_path or
    served_model_name, POST /generate must return text and completion tokens. Then the plan is recorded as the
    last known good one (O(last_good_path), root 0644, written only when different, C(changed) says so).
  - O(mode=serving) looks once and waits for nothing; the server must be ready, answer /health 200 now and run the
    last known good plan (what the bench stage needs before it measures). It writes nothing.
  - A server across nodes (the plan's layout.nnodes > 1). On a node with node_rank >= 1 SGLang serves only its health
    check server on that node's port. The ready line followed there is C(Dummy health check server started in
    background thread at), and /health is the only question asked. On every node the unit's scheduler processes
    must be the plan's C(per_node[node_rank].processes).
  - With O(record=false) a verified plan is not recorded. Every result then carries C(last_good_plan) and
    C(last_good_differs). O(mode=record) later records the plan the unit runs, and nothing else. The nodes of one
    server record once every node passed, and roll back together when one did not.
  - With O(verify), the answer probe follows the generation (O(answer_probe)). A question whose answer is known is
    asked with greedy decoding (temperature 0). An instruct model (a chat template, as SGLang finds one) is asked
    through /v1/chat/completions to repeat a random 8-digit number; its answer must contain it. A base model is
    skipped unless the probe is on; then it gets a text to continue through /generate. A wrong answer fails like
    any unhealthy server (C(state=answer)), naming the number and what came back.
  - With O(verify) and C(--numa-node) in the plan, every scheduler process's CPUs and memory policy must be its
    node's (C(numa_bind) in the plan - the node's CPUs from the topology facts, within the launcher's CPUs); a
    binding other than the plan's fails like any unhealthy server (C(state=numa)), one line per process.
  - Check mode writes nothing; the wait and the HTTP checks run as usual.
extends_documentation_fragment:
  - topolaunch.sglang.common
options:
  unit_name:
    aliases: [unit]
  plan_path:
    description: The plan the unit runs (JSON, written by the launch stage); default O(state_dir)/current_plan.json.
    type: path
  last_good_path:
    description: Where a verified plan is recorded as the last known good one; default
      O(state_dir)/last_good_plan.json.
    type: path
  mode:
    description: C(start) follows a start (chunks, milestones, verify); C(serving) checks once that the server
      serves the last known good plan now; C(record) records the plan the unit runs as the last known good one.
    type: str
    choices: [start, serving, record]
    default: start
  release_lock:
    description: The relaunch lock file whose holder (taken by M(topolaunch.sglang.sglang_launch)
      O(topolaunch.sglang.sglang_launch#module:relaunch_lock)) this call ends once the server is ready or the check
      failed (a chunk that is still waiting keeps it); unset = none. Only a holder of O(release_lock_owner)'s run.
    type: path
  release_lock_owner:
    description:
      - The run whose lock O(release_lock) ends (the launch's
        O(topolaunch.sglang.sglang_launch#module:relaunch_lock.owner)); another run's lock is left held.
    type: str
    default: ""
  record:
    description: Record a verified plan as the last known good one in this call (mode start).
    type: bool
    default: true
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
  answer_probe:
    description:
      - The answer probe after the generation (with O(verify)).
      - C(auto) probes instruct models only (a chat template in the model directory or C(--chat-template)), C(on)
        every model (a base model through /generate), C(off) none; C(true) and C(false) are on and off.
      - A mapping sets the probe itself. Its keys are C(prompt), C(expect) (the text the answer must contain, case
        ignored), C(mode), C(endpoint) (C(auto), C(chat) or C(generate)) and C(max_tokens) (default 64). In prompt
        and expect, C({number}) is the probe's random 8-digit number. A prompt needs expect; with a prompt the
        mode is C(on) unless given.
    type: raw
    default: auto
author:
  - topolaunch project (@topolaunch)
"""

EXAMPLES = r"""
- name: Watch the server start for 20 s; once ready, verify it and record its plan as the last known good one
  topolaunch.sglang.sglang_health:
    verify: true
  register: start

- name: Does the server serve the plan health passed for, now?
  topolaunch.sglang.sglang_health:
    mode: serving
  register: serving

- name: A node of a server across nodes - verify without recording (every node must pass first)
  topolaunch.sglang.sglang_health:
    verify: true
    record: false
  register: node_start

- name: Every node passed - record the plan the unit runs as the last known good one
  topolaunch.sglang.sglang_health:
    mode: record

- name: Verify with a known-answer probe of one's own (any model, base models included)
  topolaunch.sglang.sglang_health:
    verify: true
    answer_probe:
      prompt: "The capital of France is"
      expect: Paris
"""

RETURN = r"""
state:
  description: ready, progress or waiting (on failure also dead, timeout, ranks, numa or answer); recorded with
    O(mode=record).
  returned: when the unit was read
  type: str
milestone:
  description:
    - started, then per SGLang version - 0.5.9 init_distributed_begin, load_weight_begin, load_weight_end,
      capture_cuda_graph_begin, capture_cuda_graph_end; 0.5.23 init_parallel_begin, load_weight_begin,
      load_weight_end, capture_prefill_graph_begin, capture_prefill_graph_end, capture_decode_graph_begin,
      capture_decode_graph_end - and ready.
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
  description: The plan the unit runs (the content of plan_path).
  returned: whenever it could be read, failures included
  type: dict
already_serving:
  description: The first look of a new wait (no O(invocation_id)) found the server serving; C(since_start_s) is
    then its uptime.
  returned: mode start, when the unit was read
  type: bool
last_good_plan:
  description: The last known good plan ({} when there is none).
  returned: failure, once the plan was read; with O(record=false) always
  type: dict
last_good_differs:
  description: Whether the last known good plan runs another server than the plan that failed.
  returned: failure, once the plan was read; with O(record=false) always
  type: bool
worker:
  description: True when the node verified is a node >= 1 of a server across nodes (only /health was asked).
  returned: when a worker node was verified
  type: bool
stage:
  description: C(health).
  returned: always
  type: str
lock_released:
  description: The relaunch lock's holder this call ended (O(release_lock)) as C(<pid> <starttime>), empty when it
    ended none (none held, another run's, a chunk still waiting, check mode); the relaunch compares it with the
    holder its validate took (M(topolaunch.sglang.sglang_launch)'s C(relaunch_lock_holder)) and skips its own
    release call when they are the same.
  returned: always
  type: str
verified:
  description: True when /health, /model_info and /generate passed in this call.
  returned: when verified
  type: bool
last_good_changed:
  description: Whether last_good_path was (or in check mode would be) written.
  returned: when verified, and with O(mode=record)
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
answer_probe:
  description:
    - The answer probe - C(state) (passed, skipped, failed), C(summary) (one line), C(why) (when skipped); when
      asked also C(endpoint), C(number), C(prompt), C(expect), C(answer), C(finish_reason), C(completion_tokens).
  returned: when verified (not on a worker node), and when the probe failed
  type: dict
numa_bind:
  description:
    - With C(--numa-node) in the plan (its C(numa_bind)), one line per scheduler process saying that its CPUs
      (/proc/<pid>/status Cpus_allowed_list) and memory policy (/proc/<pid>/numa_maps) are the node's; a binding
      other than the plan's fails health (C(state) numa) with one line per such process naming what it has and
      what the plan wants.
  returned: when verified with --numa-node in the plan, and when the binding check failed
  type: list
  elements: str
error_lines:
  description: When the unit died, the log lines of this start that look like the error.
  returned: failure
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.topolaunch.sglang.plugins.module_utils.constants import (
    CURRENT_PLAN, LAST_GOOD_PLAN, STATE_DIR, UNIT_NAME, state_file)
from ansible_collections.topolaunch.sglang.plugins.module_utils.health import HealthError, check, probe_settings
from ansible_collections.topolaunch.sglang.plugins.module_utils.relaunch_lock import holder, holder_id, release

ARGUMENT_SPEC = {
    "unit_name": {"type": "str", "default": UNIT_NAME, "aliases": ["unit"]},
    "state_dir": {"type": "path", "default": STATE_DIR},
    "service_user": {"type": "str", "default": "sglang"},
    "plan_path": {"type": "path"},
    "last_good_path": {"type": "path"},
    "mode": {"type": "str", "choices": ["start", "serving", "record"], "default": "start"},
    "record": {"type": "bool", "default": True},
    "release_lock": {"type": "path"},
    "release_lock_owner": {"type": "str", "default": ""},
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
    "max_new_tokens": {"type": "int", "default": 8, "no_log": False},
    "answer_probe": {"type": "raw", "default": "auto"},
}


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    for name in ("chunk_seconds", "ready_timeout", "http_timeout", "max_new_tokens"):
        if p[name] <= 0:
            module.fail_json(msg="%s %s: must be greater than 0" % (name, p[name]), stage="health")
    try:
        probe = probe_settings(p["answer_probe"], "answer_probe")
    except ValueError as err:
        module.fail_json(msg=str(err), stage="health")
    try:
        result = check(p["unit_name"], p["plan_path"] or state_file(p["state_dir"], CURRENT_PLAN),
                       p["last_good_path"] or state_file(p["state_dir"], LAST_GOOD_PLAN),
                       invocation_id=p["invocation_id"] or None, known=p["known_milestone"],
                       chunk_s=p["chunk_seconds"], startup_timeout=p["startup_timeout"],
                       journal_lines=p["journal_lines"], verify_server=p["verify"], check_mode=module.check_mode,
                       api_key=p["api_key"], ready_timeout=p["ready_timeout"], http_timeout=p["http_timeout"],
                       prompt=p["prompt"], max_new_tokens=p["max_new_tokens"], mode=p["mode"], record=p["record"],
                       probe=probe)
    except HealthError as exc:
        module.fail_json(msg=str(exc), stage="health", lock_released=end_lock(p, module.check_mode), **exc.result)
    # a chunk still waiting keeps the lock
    released = end_lock(p, module.check_mode) if result.get("state") == "ready" else ""
    module.exit_json(changed=result.get("last_good_changed", False), stage="health", lock_released=released, **result)


def end_lock(p, check_mode):
    """Release the relaunch lock of O(release_lock_owner)'s run; the holder ended ("<pid> <starttime>"), or ''."""
    if not p["release_lock"] or check_mode:
        return ""
    held = holder(p["release_lock"])
    return holder_id(held) if held is not None and release(p["release_lock"], p["release_lock_owner"]) else ""


if __name__ == "__main__":
    main()
