"""Real processes spawned for the cleanup tests (renamed as SGLang's schedulers, GPU memory registered with the fake
NVML), the fake NVML on the field spec, and cleanup's options: shared by the tests of cleanup.py and gpu_cleanup."""
import os
import subprocess
import threading
import time

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils.cleanup import read_process

SPEC = "proxmox-8x-rtx-pro-6000-vnuma"        # 8 GPUs, 560 MiB used with no process
GIB = 1 << 30
OURS = "nobody"
OTHER = "daemon"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):   # gone, also between open and read
        return False


def _wait_for(cond, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %ss waiting for %s" % (timeout, what))
        time.sleep(0.02)


def _execed(pid, argv0):
    """pid runs argv0: its title and its cmdline's first word (not the '[comm]' of an argv not yet readable)."""
    info = read_process(pid) or {}
    return info.get("title") == argv0 and info.get("cmdline", "").split(" ")[0] == argv0


class Procs:
    """Spawns test processes, reaps them, and kills (by pid) whatever a test left alive."""

    def __init__(self, fake):
        self.fake = fake
        self.pids = []

    @staticmethod
    def _reap(pid):
        def wait():
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                return              # already reaped by subprocess' own bookkeeping
        threading.Thread(target=wait, daemon=True).start()

    def spawn(self, title=None, user=None, ignore_term=False, gpus=(), body="sleep 600"):
        """A shell that becomes `body` (argv[0] = title), optionally ignoring SIGTERM, registered on `gpus`."""
        script = ('trap "" TERM; ' if ignore_term else "") + ("exec -a %s %s" % (title, body) if title else "exec " + body)
        p = subprocess.Popen(["bash", "-c", script], user=user)
        self.pids.append(p.pid)
        threading.Thread(target=p.wait, daemon=True).start()
        argv0 = title or body.split()[0]
        # comm changes before the new argv is readable (mid-execve, cmdline reads empty): wait for both.
        _wait_for(lambda: _execed(p.pid, argv0), "pid %d to exec %s" % (p.pid, argv0))
        for gpu in gpus:
            self.fake.register(gpu, 40 * GIB, p.pid)
        return p.pid

    def spawn_orphan(self, title, user, gpus=()):
        """A launcher that starts a renamed child in the background and exits: the child is re-parented."""
        out = subprocess.run(["bash", "-c", "exec -a %s sleep 600 >/dev/null 2>&1 & echo $!" % title],
                             user=user, check=True, capture_output=True, text=True).stdout
        pid = int(out.strip())
        self.pids.append(pid)
        self._reap(pid)                         # we are the subreaper: the orphan is now our child
        _wait_for(lambda: _execed(pid, title), "orphan %d to exec" % pid)
        for gpu in gpus:
            self.fake.register(gpu, 40 * GIB, pid)
        return pid

    def kill_all(self):
        for pid in self.pids:
            if _alive(pid):
                os.kill(pid, 9)


@pytest.fixture
def nvml(fake_nvml):
    import pynvml  # pylint: disable=import-outside-toplevel
    fake_nvml.use(SPEC)
    return pynvml


@pytest.fixture
def procs(fake_nvml):
    p = Procs(fake_nvml)
    yield p
    p.kill_all()


@pytest.fixture
def subreaper():
    """Make this test process the reaper of orphans (as PID 1 is in a real system), so they do not stay zombies."""
    import ctypes  # pylint: disable=import-outside-toplevel
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_child_subreaper = 36
    assert libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0) == 0
    yield
    libc.prctl(pr_set_child_subreaper, 0, 0, 0, 0)


def _opts(tmp_path, **kw):
    base = {"gpu_indices": [0, 1, 2, 3], "service_user": OURS, "term_timeout": 5, "kill_timeout": 5,
            "release_timeout": 5, "poll_interval": 0.05, "current_plan_path": str(tmp_path / "current_plan.json")}
    base.update(kw)
    return base
