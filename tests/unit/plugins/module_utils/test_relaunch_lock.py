"""relaunch_lock.py: a detached holder keeps the flock across module calls; release ends it by its checked pid;
the watchdog's try_lock sees it held; a deadline ends it."""
import fcntl
import os
import time

from ansible_collections.topolaunch.sglang.plugins.module_utils import relaunch_lock, watchdog


def test_acquire_holds_across_calls_and_release_ends_it(tmp_path):
    path = str(tmp_path / "run" / "relaunch.lock")
    pid = relaunch_lock.acquire(path, 60)
    try:
        assert relaunch_lock.holder(path)[0] == pid
        assert watchdog.try_lock(path) is None          # the watchdog skips
        again = relaunch_lock.acquire(path, 60)         # a rollback's validate: the old holder ends, a new one holds
        assert again != pid and relaunch_lock.holder(path)[0] == again
    finally:
        assert relaunch_lock.release(path) is True
    fd = watchdog.try_lock(path)
    assert fd is not None
    os.close(fd)
    assert relaunch_lock.release(path) is False       # nothing held: nothing to end


def test_the_deadline_ends_a_relaunch_cut_short(tmp_path):
    path = str(tmp_path / "relaunch.lock")
    relaunch_lock.acquire(path, 0.5)
    deadline = time.monotonic() + 10
    while relaunch_lock.holder(path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert relaunch_lock.holder(path) is None


def test_acquire_waits_for_the_watchdog_and_says_so(tmp_path):
    path = str(tmp_path / "relaunch.lock")
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        try:
            relaunch_lock.acquire(path, 5, wait=0.5)
        except OSError as err:
            assert "was not had within 0.5s" in str(err)
        else:
            raise AssertionError("acquired a lock the watchdog holds")
    finally:
        os.close(fd)
    time.sleep(0.3)
    assert relaunch_lock.holder(path) is None        # the process that waited was ended: it never takes it later


def test_a_stale_file_with_a_reused_pid_is_not_signalled(tmp_path):
    path = tmp_path / "relaunch.lock"
    path.write_text("%d 1 %f\n" % (os.getpid(), time.time() + 60))  # our pid, another starttime
    assert relaunch_lock.holder(str(path)) is None and relaunch_lock.release(str(path)) is False


def test_another_run_waits_then_fails_naming_the_holder_and_the_first_run_keeps_it(tmp_path):
    """Issue 25 item 6: two deploys at once. The second run's validate ended the first run's holder and took the
    lock; now it waits, then fails naming the holder (pid, since, the run), and the first run's lock stays, released
    only by its own health check."""
    path = str(tmp_path / "relaunch.lock")
    first = relaunch_lock.acquire(path, 60, owner="play Relaunch by ops@ctl (run 1)")
    try:
        started = time.monotonic()
        try:
            relaunch_lock.acquire(path, 60, wait=0.5, owner="play Relaunch by ops@ctl (run 2)")
        except OSError as err:
            text = str(err)
        else:
            raise AssertionError("a second run took the first run's lock")
        assert time.monotonic() - started < 5
        assert "was not had within 0.5s: another run holds it (pid %d since " % first in text, text
        assert "UTC, for play Relaunch by ops@ctl (run 1)): wait until it ends" in text and "kill %d" % first in text
        assert relaunch_lock.holder(path).pid == first
        assert relaunch_lock.release(path, "play Relaunch by ops@ctl (run 2)") is False   # not its lock
        assert relaunch_lock.holder(path).pid == first
        again = relaunch_lock.acquire(path, 60, owner="play Relaunch by ops@ctl (run 1)")   # its own rollback
        assert again != first and relaunch_lock.holder(path).owner == "play Relaunch by ops@ctl (run 1)"
    finally:
        assert relaunch_lock.release(path, "play Relaunch by ops@ctl (run 1)") is True
    assert relaunch_lock.holder(path) is None
