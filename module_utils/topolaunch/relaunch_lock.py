"""The relaunch lock: an flock on one file (/run/topolaunch/relaunch.lock) held from a relaunch's validate to its
health check, so that the watchdog (watchdog.py, which skips while it is held) never acts on a server being
replaced, and a relaunch waits while the watchdog restarts one.

A relaunch's steps are separate module calls, so the lock is held by a small process of its own: `acquire()`
(the validate call) forks it, detached (new session, no inherited output), it takes the flock (waiting while the
watchdog or another run holds it), writes `<pid> <starttime> <deadline> <since> <owner>` into the file and sleeps
until `seconds` passed or it is told to end; `release()` (the health call) ends it by that pid, checked against its
starttime so that a reused pid is never signalled. The owner names the run (the play, its controller, a run id):
the same run may take its own lock again (a rollback's validate), another run waits at most `wait` seconds and then
fails naming the holder (issue 25: two deploys at once interleaved, the second run's restart failing the first's
health), and a health check releases only its own run's lock. A relaunch cut short leaves the lock until the
deadline. The file is never removed (a process waiting on it would lock a file no one else sees). Plain Python
3.9+ stdlib.
"""
import collections
import fcntl
import os
import select
import signal
import time

__all__ = ["acquire", "release", "holder", "holder_id", "held_by", "describe", "RELAUNCH_LOCK"]

Holder = collections.namedtuple("Holder", "pid start deadline since owner")

RELAUNCH_LOCK = "/run/topolaunch/relaunch.lock"


def _starttime(pid, proc_root="/proc"):
    try:
        with open("%s/%d/stat" % (proc_root, pid), encoding="utf-8") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def holder(path):
    """The live process holding the lock for a relaunch (Holder: pid, starttime, deadline, since, owner), else None."""
    try:
        with open(path, encoding="utf-8") as f:
            words = f.read().split(None, 4)
        pid, start, deadline = int(words[0]), words[1], float(words[2])
        since = float(words[3]) if len(words) > 3 else None
        owner = words[4].strip() if len(words) > 4 else ""
    except (OSError, ValueError, IndexError):
        return None
    return Holder(pid, start, deadline, since, owner) if _starttime(pid) == start else None


def holder_id(held):
    """A holder as "<pid> <starttime>" ('' for None): the same process, never a later one that reused its pid."""
    return "" if held is None else "%d %s" % (held.pid, held.start)


def describe(held):
    """One line naming a holder: pid, since when (UTC), for which run."""
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(held.since)) if held.since else "?"
    owner = held.owner if held.owner not in ("", "-") else "a run that did not name itself"
    return "pid %d since %s, for %s" % (held.pid, since, owner)


def _end(held):
    try:
        os.kill(held.pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    for _attempt in range(100):
        if _starttime(held.pid) != held.start:
            break
        time.sleep(0.02)
    return True


def _owner(owner):
    """An owner as the lock file keeps it: one line, words single-spaced, "-" for none."""
    return " ".join(str(owner).split()) or "-"


def held_by(path, owner):
    """Whether a live holder of `owner`'s run holds the lock."""
    held = holder(path)
    return held is not None and held.owner == _owner(owner)


def release(path, owner=None):
    """End the relaunch's lock holder (True when there was one); with `owner`, only a holder of that run."""
    held = holder(path)
    if held is None or (owner is not None and held.owner != _owner(owner)):
        return False
    return _end(held)


def _hold(path, seconds, ready_fd, owner):
    """The holder process (never returns): says its pid, takes the flock, then says "held"."""
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
        os.write(ready_fd, ("%d\n" % os.getpid()).encode())
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
        deadline = time.time() + seconds
        os.ftruncate(fd, 0)
        line = "%d %s %.3f %.3f %s\n" % (os.getpid(), _starttime(os.getpid()), deadline, time.time(), _owner(owner))
        os.write(fd, line.encode())
        os.write(ready_fd, b"held")
        os.close(ready_fd)
        while time.time() < deadline:
            time.sleep(min(5.0, max(0.0, deadline - time.time())))
    finally:
        os._exit(0)


def _read_until(fd, want, deadline):
    data = b""
    while want not in data:
        ready, _writable, _errors = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 64) if ready else b""
        if not chunk:
            break
        data += chunk
    return data


def acquire(path, seconds, wait=120.0, owner=""):
    """Hold the lock for up to `seconds` for the run `owner`. A holder of the same run is ended first (a rollback's
    validate); another run's, or the watchdog's flock, is waited for up to `wait` seconds. Returns the holder's pid;
    OSError naming the file and the holder when the lock is not had (the waiting process is ended then: it never
    takes the lock later)."""
    owner = _owner(owner)
    release(path, owner)
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _hold(path, seconds, write_fd, owner)
    os.close(write_fd)
    deadline = time.monotonic() + wait
    try:
        os.waitpid(pid, 0)
        said = _read_until(read_fd, b"held", deadline)
    finally:
        os.close(read_fd)
    first = said.split(b"\n")[0]
    waiter = int(first) if first.isdigit() else None
    held = holder(path)
    if waiter is not None and held is not None and held.pid == waiter:
        return waiter
    if waiter is not None:
        try:
            os.kill(waiter, signal.SIGTERM)          # still waiting on the flock: it must not take it later
        except ProcessLookupError:
            pass
    raise OSError("the relaunch lock %s was not had within %gs: %s" % (
        path, wait, ("another run holds it (%s): wait until it ends, or, if that run is gone, end its holder "
                     "(kill %d)" % (describe(held), held.pid)) if held is not None
        else "the watchdog holds it while it restarts the server"))
