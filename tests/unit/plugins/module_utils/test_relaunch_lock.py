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
        os.close(fd)   # the waiting holder now gets it and ends at its deadline


def test_a_stale_file_with_a_reused_pid_is_not_signalled(tmp_path):
    path = tmp_path / "relaunch.lock"
    path.write_text("%d 1 %f\n" % (os.getpid(), time.time() + 60))  # our pid, another starttime
    assert relaunch_lock.holder(str(path)) is None and relaunch_lock.release(str(path)) is False
