#!/usr/bin/python
"""Ansible module sglang_watchdog: install the watchdog timer that restarts a hung SGLang server (logic in
module_utils: watchdog_install.py installs, watchdog.py is what the timer runs)."""

DOCUMENTATION = r"""
module: sglang_watchdog
short_description: Install the timer that probes the SGLang server(s) and restarts a hung one
description:
  - Installs a systemd timer and oneshot service that, every O(interval) seconds, probe each server's generation
    health (C(GET /health_generate), a one-token generation in both supported SGLang releases) and restart a
    server after O(failures) consecutive failures through topolaunch's cleanup (its unit's exact cgroup, SIGTERM
    then SIGKILL on deadlines, GPU memory verified released), at most O(max_restarts) times an hour; then the
    server is stopped and left down, said in the journal and in the metrics file.
  - A server that has not served since its start is loading, not failing, for O(load_timeout) seconds; nothing is
    done while a relaunch holds O(lock_file).
  - Bad settings fail naming the field before anything is written. Idempotent; check mode says what would change.
options:
  servers:
    description: The servers to watch - each its systemd unit and the plan file it runs (host, port, GPUs); a
      replica is one more entry with its own unit.
    type: list
    elements: dict
    default: [{unit: topolaunch-sglang.service, current_plan: /var/lib/topolaunch/current_plan.json}]
  interval:
    description: Seconds between two runs; > 0.
    type: float
    default: 30
  failures:
    description: Consecutive failed probes that restart the server; > 0.
    type: int
    default: 3
  max_restarts:
    description: Restarts per hour at most; then the server is left down. 0 - never restart.
    type: int
    default: 3
  load_timeout:
    description: Seconds after a start during which a server that has not served yet is loading (the launch's
      load timeout, health_startup_timeout).
    type: float
    default: 1200
  probe_timeout:
    description: Seconds one probe may take (SGLang answers 503 after SGLANG_HEALTH_CHECK_TIMEOUT, 20 s).
    type: float
    default: 30
  lock_file:
    description: The relaunch lock; while it is held the watchdog does nothing.
    type: path
    default: /run/topolaunch/relaunch.lock
  state_dir:
    description: Where the watchdog keeps its state per unit (watchdog-<unit>.json).
    type: path
    default: /var/lib/topolaunch
  metrics_file:
    description: The node exporter textfile the watchdog writes every run (topolaunch_watchdog_* series).
    type: path
    default: /var/lib/topolaunch/metrics/topolaunch_watchdog.prom
  service_user:
    description: The server's user (the cleanup's "ours").
    type: str
    default: sglang
  term_timeout:
    description: Seconds after SIGTERM to the launcher before SIGKILL to the unit's cgroup (and the cleanup's).
    type: float
    default: 30
  kill_timeout:
    description: The cleanup's seconds after SIGKILL.
    type: float
    default: 10
  release_timeout:
    description: The cleanup's seconds for the GPUs to be released and the port closed.
    type: float
    default: 60
  answer_probe:
    description: The answer probe after a passing probe (the health stage's known-answer question, greedy; what
      health_answer_probe takes - auto, on, off, or a mapping with prompt and expect). A wrong answer counts as a
      failed probe.
    type: raw
    default: auto
  answer_every:
    description: Besides at the first pass of each start and after its own failure, the answer probe runs at every
      O(answer_every)-th passing probe; 0 - only then.
    type: int
    default: 120
  name:
    description: Name of the timer and service units.
    type: str
    default: topolaunch-watchdog
  python:
    description: The python the service runs (the tools venv's, with nvidia-ml-py).
    type: path
    default: /opt/topolaunch/tools/bin/python
  package_dir:
    description: Where the watchdog's Python package is installed.
    type: path
    default: /opt/topolaunch/watchdog
  config_file:
    description: The settings file the service reads.
    type: path
    default: /etc/topolaunch/watchdog.json
  unit_dir:
    description: systemd unit directory.
    type: path
    default: /etc/systemd/system
  state:
    description: C(present) installs and starts the timer, C(absent) stops and removes it.
    type: str
    choices: [present, absent]
    default: present
author:
  - topolaunch project (@topolaunch)
"""

EXAMPLES = r"""
- name: Watch the server, restart it after 3 failed probes 30 s apart, at most 3 times an hour
  topolaunch.sglang.sglang_watchdog:
    interval: 30
    failures: 3
    max_restarts: 3
    load_timeout: 1200
  become: true
"""

RETURN = r"""
files:
  description: The files written (or, in check mode, that would be; with state absent, removed).
  returned: always
  type: list
  elements: str
timer:
  description: The timer unit.
  returned: always
  type: str
  sample: topolaunch-watchdog.timer
settings:
  description: The settings the watchdog runs with (defaults filled in).
  returned: with state present
  type: dict
"""

import re

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.topolaunch.sglang.plugins.module_utils.watchdog import DEFAULTS
from ansible_collections.topolaunch.sglang.plugins.module_utils.watchdog_install import (
    DEFAULTS as INSTALL, InstallError, install)

SETTINGS = ("servers", "interval", "failures", "max_restarts", "load_timeout", "probe_timeout", "lock_file",
            "state_dir", "metrics_file", "service_user", "term_timeout", "kill_timeout", "release_timeout",
            "answer_probe", "answer_every")
ARGUMENT_SPEC = {
    "servers": {"type": "list", "elements": "dict", "default": DEFAULTS["servers"]},
    "interval": {"type": "float", "default": DEFAULTS["interval"]},
    "failures": {"type": "int", "default": DEFAULTS["failures"]},
    "max_restarts": {"type": "int", "default": DEFAULTS["max_restarts"]},
    "load_timeout": {"type": "float", "default": DEFAULTS["load_timeout"]},
    "probe_timeout": {"type": "float", "default": DEFAULTS["probe_timeout"]},
    "lock_file": {"type": "path", "default": DEFAULTS["lock_file"]},
    "state_dir": {"type": "path", "default": DEFAULTS["state_dir"]},
    "metrics_file": {"type": "path", "default": DEFAULTS["metrics_file"]},
    "service_user": {"type": "str", "default": DEFAULTS["service_user"]},
    "term_timeout": {"type": "float", "default": DEFAULTS["term_timeout"]},
    "kill_timeout": {"type": "float", "default": DEFAULTS["kill_timeout"]},
    "release_timeout": {"type": "float", "default": DEFAULTS["release_timeout"]},
    "answer_probe": {"type": "raw", "default": DEFAULTS["answer_probe"]},
    "answer_every": {"type": "int", "default": DEFAULTS["answer_every"]},
    "name": {"type": "str", "default": INSTALL["name"]},
    "python": {"type": "path", "default": INSTALL["python"]},
    "package_dir": {"type": "path", "default": INSTALL["package_dir"]},
    "config_file": {"type": "path", "default": INSTALL["config_file"]},
    "unit_dir": {"type": "path", "default": INSTALL["unit_dir"]},
    "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
}

# The inventory variables that set these options through the role topolaunch.sglang.watchdog: an error names both.
VARIABLES = {"interval": "topolaunch_watchdog_interval", "failures": "topolaunch_watchdog_failures",
             "max_restarts": "topolaunch_watchdog_max_restarts", "load_timeout": "topolaunch_load_timeout",
             "answer_every": "topolaunch_watchdog_answer_every", "answer_probe": "health_answer_probe"}


def named(message):
    """The error, then the inventory variables of the fields it names: 'interval must be ... (set by
    topolaunch_watchdog_interval)'."""
    message = str(message)
    found = [v for k, v in VARIABLES.items() if re.search(r"(^|; )%s[ .:]" % k, message)]
    return "%s (set by %s)" % (message, ", ".join(found)) if found else message


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    settings = {k: p[k] for k in SETTINGS}
    for key in ("interval", "load_timeout", "probe_timeout", "term_timeout", "kill_timeout", "release_timeout"):
        if float(settings[key]).is_integer():
            settings[key] = int(settings[key])   # 30, not 30.0, in the unit files and the config
    opts = {k: p[k] for k in ("name", "python", "package_dir", "config_file", "unit_dir", "state")}
    try:
        result = install(opts, settings, check_mode=module.check_mode)
    except InstallError as exc:
        module.fail_json(msg="sglang_watchdog: %s" % named(exc), stage="watchdog")
    module.exit_json(stage="watchdog", **result)


if __name__ == "__main__":
    main()
