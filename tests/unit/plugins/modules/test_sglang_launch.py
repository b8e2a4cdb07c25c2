"""Module sglang_launch: main() against a scripted systemd - started then idempotent, check mode, the secrets never in
its output, a missing service user refused before anything."""
import functools
import json

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import launch as launch_mod
from ansible_collections.topolaunch.sglang.plugins.modules import sglang_launch
from launch_cases import API_KEY, OWNER, UNIT, host, opts, Systemd  # noqa: F401  pylint: disable=unused-import  (fixtures)


@pytest.fixture
def launch_module(run_module, monkeypatch):
    """sglang_launch's main() against a scripted systemd: launch_module(args, sd, check_mode) -> (rc, result)."""

    def run(args, sd, check_mode=False):
        monkeypatch.setattr(sglang_launch, "launch", functools.partial(sglang_launch.launch, run=sd.run, owner=OWNER))
        monkeypatch.setitem(launch_mod.DEFAULTS, "port_probe", False)     # no real port looked at
        monkeypatch.setitem(launch_mod.DEFAULTS, "proc_root", args["state_dir"] + "/no-proc")
        return run_module(sglang_launch, args, check_mode)[:2]

    return run


def module_args(tmp, **kw):
    o = opts(tmp, **kw)
    del o["enabled"], o["proc_root"], o["port_probe"]      # not module options (launch_module sets them)
    return o


def test_module_started_then_idempotent(host, launch_module):
    sd = Systemd(host)
    rc, out = launch_module(module_args(host), sd)
    assert rc == 0 and out["changed"] is True and out["actions"] == ["daemon-reload", "reset-failed", "restart"]
    rc, out = launch_module(module_args(host, state="checked"), sd)
    assert rc == 0 and out["changed"] is False and out["reason"] == "the same plan already runs"
    rc, out = launch_module(module_args(host), sd)
    assert rc == 0 and out["changed"] is False


def test_module_check_mode(host, launch_module):
    sd = Systemd(host)
    rc, out = launch_module(module_args(host), sd, check_mode=True)
    assert rc == 0 and out["changed"] is True and not (host / "etc").exists()


def test_module_never_shows_the_secrets(host, launch_module):
    """Neither the env content nor the secrets in it (SGLang logs its api_key) reach the module's output."""
    sd = Systemd(host, restart=(1, "Job for %s failed." % UNIT))
    rc, out = launch_module(module_args(host), sd)
    text = json.dumps(out)
    assert rc == 1 and "Job for %s failed." % UNIT in out["msg"] and "server_args=ServerArgs(api_key=" in out["msg"]
    assert API_KEY not in text and "s3cr3t" not in text
    assert out["invocation"]["module_args"]["env_content"] == "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"


def test_module_fails_before_anything_with_a_missing_user(host, launch_module):
    sd = Systemd(host)
    rc, out = launch_module(module_args(host, service_user="no-such-user-tl"), sd)
    assert rc == 1 and out["msg"].startswith("Cannot launch: the service user 'no-such-user-tl' does not exist")
    assert not (host / "etc").exists() and sd.verbs() == []


def test_module_stops_and_cleans_in_the_start_call_through_gpu_cleanups_logic(host, launch_module, monkeypatch):
    """cleanup: gpu_cleanup's options; the unit, state directory and service user are the call's own, the unit is
    stopped; NVML comes from the tools venv (import_nvml)."""
    calls = []
    monkeypatch.setattr(sglang_launch, "import_nvml", lambda: "nvml")
    monkeypatch.setattr(sglang_launch, "cleanup", lambda options, nvml, check_mode=False: (
        calls.append((options, nvml, check_mode)) or {"changed": True, "summary": "stopped 2 processes"}))
    sd = Systemd(host)
    rc, out = launch_module(module_args(host, cleanup={"gpu_indices": [0, 1], "ports": [30000]}), sd)
    assert rc == 0 and out["cleanup"]["summary"] == "stopped 2 processes"
    options, nvml, check_mode = calls[0]
    assert (nvml, check_mode, options["gpu_indices"], options["ports"], options["stop_unit"]) == (
        "nvml", False, [0, 1], [30000], True)
    assert options["unit_name"] == UNIT and options["state_dir"] == str(host / "state")
    rc, out = launch_module(module_args(host, state="checked", cleanup={"gpu_indices": [0]}), sd)
    assert rc == 0 and len(calls) == 1 and "cleanup" not in out           # validate never stops anything


def test_module_without_nvml_fails_at_cleanup_before_anything(host, launch_module, monkeypatch):
    def missing():
        raise sglang_launch.TopologyError("nvidia-ml-py (import name pynvml) is not importable by /usr/bin/python3")
    monkeypatch.setattr(sglang_launch, "import_nvml", missing)
    sd = Systemd(host)
    rc, out = launch_module(module_args(host, cleanup={"gpu_indices": [0]}), sd)
    assert rc == 1 and out["stage"] == "cleanup" and "pynvml" in out["msg"] and sd.verbs() == []


def test_validate_takes_the_relaunch_lock_and_a_failed_validate_releases_it(host, launch_module, tmp_path,
                                                                            monkeypatch):
    from ansible_collections.topolaunch.sglang.plugins.module_utils import relaunch_lock
    lock = str(tmp_path / "run" / "relaunch.lock")
    sd = Systemd(host)
    rc, out = launch_module(module_args(host, state="checked", relaunch_lock={"path": lock, "seconds": 60}), sd)
    try:
        assert rc == 0 and relaunch_lock.holder(lock) is not None   # held for the health step to release
        # named as "<pid> <starttime>": the health call that ends it says the same, and the relaunch skips its release
        assert out["relaunch_lock_holder"] == relaunch_lock.holder_id(relaunch_lock.holder(lock))
        assert out["relaunch_lock_holder"].split()[0] == str(relaunch_lock.holder(lock).pid)
    finally:
        relaunch_lock.release(lock)
    rc, out = launch_module(module_args(host, state="checked", relaunch_lock={"path": lock, "seconds": 60}), sd,
                            check_mode=True)
    assert rc == 0 and relaunch_lock.holder(lock) is None           # check mode takes nothing
    assert out["relaunch_lock_holder"] == ""

    # a failed validate releases it at once (nothing changes on the host, nothing to protect)
    holder_seen = []
    real_launch = sglang_launch.launch

    def refuse(*args, **kwargs):
        holder_seen.append(relaunch_lock.holder(lock))
        raise sglang_launch.LaunchError("the plan: refused")
    monkeypatch.setattr(sglang_launch, "launch", refuse)
    monkeypatch.setattr(functools, "partial", lambda *a, **k: refuse)
    rc, out = launch_module(module_args(host, state="checked", relaunch_lock={"path": lock, "seconds": 60}), sd)
    assert rc == 1 and out["msg"] == "the plan: refused" and holder_seen[0] is not None
    assert relaunch_lock.holder(lock) is None
    assert real_launch is not refuse
