"""The relaunch lock: an flock on one file (/run/topolaunch/relaunch.lock) held from a relaunch's validate to its
health check, so that the watchdog (watchdog.py, which skips while it is held) never acts on a server being
replaced, and a relaunch waits while the watchdog restarts one.

A relaunch's steps are separate module calls, so the lock is held by a small process of its own: `acquire()`
(the validate call) forks it, detached (new session, no inherited output), it takes the flock (waiting while the
watchdog holds it), writes `<pid> <starttime> <deadline>` into the file and sleeps until `seconds` passed or it is
told to end; `release()` (the health call) ends it by that pid, checked against its starttime so that a reused pid
is never signalled. A relaunch cut short leaves the lock until the deadline. The file is never removed (a process
waiting on it would lock a file no one else sees). Plain Python 3.9+ stdlib.
"""
import fcntl
import os
import select
import signal
import time

__all__ = ["acquire", "release", "holder", "RELAUNCH_LOCK"]

RELAUNCH_LOCK = "/run/topolaunch/relaunch.lock"


def _starttime(pid, proc_root="/proc"):
    try:
        with open("%s/%d/stat" % (proc_root, pid), encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def holder(path):
    """(pid, starttime, deadline) of the live process holding the lock for a relaunch, else None."""
    try:
        with open(path, encoding="utf-8") as f:
            words = f.read().split()
        pid, start, deadline = int(words[0]), words[1], float(words[2])
    except (OSError, ValueError, IndexError):
        return None
    return (pid, start, deadline) if _starttime(pid) == start else None


def release(path):
    """End the relaunch's lock holder (True when there was one)."""
    held = holder(path)
    if held is None:
        return False
    try:
        os.kill(held[0], signal.SIGTERM)
    except ProcessLookupError:
        return False
    for _attempt in range(100):
        if _starttime(held[0]) != held[1]:
            break
        time.sleep(0.02)
    return True


def _hold(path, seconds, ready_fd):
    """The holder process (never returns)."""
    try:
        os.setsid()
        if os.fork() > 0:
            os._exit(0)
        # nothing inherited stays open: a module's caller waits for its output pipes to close
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, ready_fd)
        os.closerange(ready_fd + 1, max(ready_fd + 1, os.sysconf("SC_OPEN_MAX")))
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        deadline = time.time() + seconds
        os.ftruncate(fd, 0)
        os.write(fd, ("%d %s %.3f\n" % (os.getpid(), _starttime(os.getpid()), deadline)).encode())
        os.write(ready_fd, b"held")
        os.close(ready_fd)
        while time.time() < deadline:
            time.sleep(min(5.0, max(0.0, deadline - time.time())))
    finally:
        os._exit(0)


def acquire(path, seconds, wait=120.0):
    """Hold the lock for up to `seconds` (a previous relaunch's holder is ended first); waits up to `wait` seconds
    while the watchdog holds it. Returns the holder's pid; OSError naming the file when the lock is not had."""
    release(path)
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _hold(path, seconds, write_fd)
    os.close(write_fd)
    try:
        os.waitpid(pid, 0)
        ready, _writable, _errors = select.select([read_fd], [], [], wait)
        got = os.read(read_fd, 16) if ready else b""
    finally:
        os.close(read_fd)
    held = holder(path)
    if got != b"held" or held is None:
        raise OSError("the relaunch lock %s was not had within %gs (the watchdog holds it while it restarts the "
                      "server)" % (path, wait))
    return held[0]
