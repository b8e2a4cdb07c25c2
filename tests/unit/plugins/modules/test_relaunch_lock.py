"""library/relaunch_lock.py: a run's relaunch lock released however its relaunch ended (a cleanup that refused left
it held for an hour, and the next run waited, then failed); another run's lock stays; check mode ends nothing."""
from ansible_collections.topolaunch.sglang.plugins.module_utils import relaunch_lock
from ansible_collections.topolaunch.sglang.plugins.modules import relaunch_lock as module


def test_releases_only_its_own_runs_lock(run_module, tmp_path):
    path = str(tmp_path / "relaunch.lock")
    pid = relaunch_lock.acquire(path, 60, owner="run A")
    try:
        code, result, _ = run_module(module, {"path": path, "owner": "run B"})
        assert code == 0 and result["changed"] is False and relaunch_lock.holder(path).pid == pid
        code, result, _ = run_module(module, {"path": path, "owner": "run A"}, check_mode=True)
        assert code == 0 and result["changed"] is True and relaunch_lock.holder(path).pid == pid
        code, result, _ = run_module(module, {"path": path, "owner": "run A"})
        assert code == 0 and result == dict(result, changed=True, released=True)
        assert relaunch_lock.holder(path) is None
        code, result, _ = run_module(module, {"path": path, "owner": "run A"})
        assert code == 0 and result["changed"] is False                     # nothing held: no change
    finally:
        relaunch_lock.release(path)
