"""A server's log lines, scripted systemd, clock and HTTP server, a state directory with the plan the unit runs: as
the tests of health.py, health_nodes.py and the module sglang_health use them."""
import json
import os
import re

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import health as module_health

ME = (os.geteuid(), os.getegid())           # owner of what the tests write (root in production)

LOG = [
    "[2026-11-30 01:00:00] server_args=ServerArgs(model_path='/srv/models/glm-5-nvfp4', tp_size=8)",
    "[2026-11-30 01:00:02 TP0] Load weight begin. avail mem=93.10 GB",
    "[2026-11-30 01:03:40 TP0] Load weight end. type=GlmMoeDsaForCausalLM, dtype=torch.bfloat16, elapsed=218.0 s",
    "[2026-11-30 01:03:41 TP0] Capture cuda graph begin. This can take up to several minutes.",
    "[2026-11-30 01:07:10 TP0] Capture cuda graph end. Time elapsed: 209.0 s.",
    "[2026-11-30 01:07:12] The server is fired up and ready to roll!",
]
CRASH = LOG[:2] + [
    "[2026-11-30 01:00:05 TP3] Scheduler hit an exception: Traceback (most recent call last):",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    "[2026-11-30 01:00:05] Received sigquit from a child process. It usually means the child failed.",
    "topolaunch-sglang.service: Main process exited, code=killed, status=9/KILL",
]


class Unit:
    """Scripted systemctl/journalctl: each poll (a systemctl call after the journal was read) advances one step of
    (properties, journal lines); journalctl answers as it does: the last -n lines, of those --grep matches (then
    newest first, as systemd 252's does)."""

    def __init__(self, steps):
        self.steps = steps
        self.i = 0
        self.read = False
        self.calls = []

    def run(self, argv):
        self.calls.append(argv)
        if argv[0] == "systemctl" and self.read:
            self.i, self.read = self.i + 1, False
        props, lines = self.steps[min(self.i, len(self.steps) - 1)]
        if argv[0] == "systemctl":
            return 0, "".join("%s=%s\n" % kv for kv in props.items()), ""
        self.read = True
        if "--grep" in argv:
            lines = [line for line in lines if re.search(argv[argv.index("--grep") + 1], line)]
        lines = lines[-int(argv[argv.index("-n") + 1]):] if "-n" in argv else lines
        if "--grep" in argv and "-n" in argv:
            lines = lines[::-1]             # systemd 252's journalctl: --grep with -n prints the newest match first
        return 0, "".join(line + "\n" for line in lines), ""


def active(**kw):
    base = {"LoadState": "loaded", "ActiveState": "active", "SubState": "running", "Result": "success",
            "NRestarts": "0", "InvocationID": "abc123", "ExecMainStatus": "0", "ExecMainCode": "0",
            "ExecMainStartTimestampMonotonic": "0"}
    base.update(kw)
    return base


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


PLAN = {"layout": {"name": "tp8", "tp": 8, "pp": 1}, "gpu_indices": list(range(8)), "host": "127.0.0.1",
        "port": 30000, "model_path": "/srv/models/glm-5-nvfp4", "served_model_name": "glm-5-nvfp4",
        "argv": ["--model-path", "/srv/models/glm-5-nvfp4", "--tp-size", "8"]}
INFO = {"model_path": "/srv/models/glm-5-nvfp4", "is_generation": True}
GENERATED = {"text": " Paris. The capital of Germany is", "meta_info": {"completion_tokens": 8, "prompt_tokens": 5}}
KEY = "tl-test-key-6f1c0b9e2d"


class Server:
    """Scripted HTTP: per path a list of (status, body) answers, taken in order, the last one repeated."""

    def __init__(self, health=((200, ""),), model_info=((200, INFO),), generate=((200, GENERATED),)):
        self.answers = {"/health": list(health), "/model_info": list(model_info), "/generate": list(generate)}
        self.calls = []

    def __call__(self, method, url, body=None, headers=None, timeout=60.0):
        path = url.split(":30000", 1)[1]
        self.calls.append({"method": method, "path": path, "body": body, "headers": dict(headers or {}),
                           "timeout": timeout})
        answers = self.answers[path]
        status, data = answers.pop(0) if len(answers) > 1 else answers[0]
        return status, data if isinstance(data, str) else json.dumps(data)

    def paths(self):
        return [c["path"] for c in self.calls]


@pytest.fixture
def state(tmp_path):
    """A state directory with current_plan.json as the launch stage writes it; returns (dir, its content)."""
    text = json.dumps(PLAN, indent=4, sort_keys=True) + "\n"
    (tmp_path / "current_plan.json").write_text(text)
    return tmp_path, text


@pytest.fixture
def ready_on_30000(monkeypatch):
    """Port 30000 of the plan 'accepts connections' (the scripted server stands behind it)."""
    monkeypatch.setattr("ansible_collections.topolaunch.sglang.plugins.module_utils.health.port_open", lambda host, port, timeout=1.0: port == 30000)
    monkeypatch.setattr(module_health, "port_open", lambda host, port, timeout=1.0: port == 30000)
