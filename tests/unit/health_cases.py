"""A server's log lines and scripted systemd and clock, as the tests of health.py and health_nodes.py use them."""
import os

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
    """Scripted systemctl/journalctl: each poll advances one step of (properties, journal lines)."""

    def __init__(self, steps):
        self.steps = steps
        self.i = 0
        self.calls = []

    def run(self, argv):
        self.calls.append(argv)
        props, lines = self.steps[min(self.i, len(self.steps) - 1)]
        if argv[0] == "systemctl":
            return 0, "".join("%s=%s\n" % kv for kv in props.items()), ""
        self.i += 1                        # journalctl is read after systemctl: one step per poll
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
