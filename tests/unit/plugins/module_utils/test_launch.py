"""launch.py: preconditions, the replace decision, file writes and modes, systemctl sequencing,
check mode, idempotence, a failed start.

systemctl and journalctl are a scripted fake (`Systemd`); files go to a tmp dir, owned by the user running the tests.
"""
import json
import os
import pwd
import shutil
import stat

import pytest
from ansible.plugins.filter.core import to_nice_json

from ansible_collections.topolaunch.sglang.plugins.module_utils import launch as launch_mod
from ansible_collections.topolaunch.sglang.plugins.module_utils import system as system_mod
from ansible_collections.topolaunch.sglang.plugins.module_utils.launch import LaunchError, decide, env_values, launch, plan_text
from ansible_collections.topolaunch.sglang.plugins.module_utils.launch import rollback_facts
from launch_cases import API_KEY, ENV, HF_TOKEN, ME, OWNER, UNIT, host, opts, plan, Systemd  # noqa: F401  pylint: disable=unused-import  (fixtures)


def call(tmp, sd, check_mode=False, **kw):
    return launch(opts(tmp, **kw), check_mode=check_mode, run=sd.run, owner=OWNER)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def started_host(host):
    """The host after a first start of plan tp8; returns the fake systemd."""
    sd = Systemd(host)
    call(host, sd)
    sd.calls.clear()
    return sd


# -------------------------------------------------------------------------------------------- preconditions

@pytest.mark.parametrize("state", ["checked", "started"])
@pytest.mark.parametrize("breakage, words", [
    ("no_python", "the SGLang python '{tmp}/venv/bin/python' (sglang_version 0.5.9) does not exist"),
    ("python_not_executable", "the SGLang python '{tmp}/venv/bin/python' (sglang_version 0.5.9) is not executable"),
    ("no_model_config", "the model directory '{tmp}/m' (plan model_path) has no config.json"),
    ("no_user", "the service user 'no-such-user-tl' does not exist: the sglang role creates it (--tags provision)"),
    ("bad_running_plan", "Cannot read the plan the unit runs now, {tmp}/state/current_plan.json: "),
    ("running_plan_not_object", "The plan the unit runs now, {tmp}/state/current_plan.json, is not a JSON object"),
])
def test_preconditions_fail_by_name_and_change_nothing(host, state, breakage, words):
    kw = {}
    if breakage == "no_python":
        (host / "venv" / "bin" / "python").unlink()
    elif breakage == "python_not_executable":
        (host / "venv" / "bin" / "python").chmod(0o644)
    elif breakage == "no_model_config":
        (host / "m" / "config.json").unlink()
    elif breakage == "no_user":
        kw["service_user"] = "no-such-user-tl"
    else:
        (host / "state").mkdir()
        (host / "state" / "current_plan.json").write_text("{not json" if breakage == "bad_running_plan" else "[1]")
    before = sorted(p.relative_to(host) for p in host.rglob("*"))
    sd = Systemd(host)
    with pytest.raises(LaunchError) as exc:
        call(host, sd, state=state, **kw)
    msg = str(exc.value)
    assert words.format(tmp=host) in msg
    assert msg.endswith("nothing was stopped.")
    assert sorted(p.relative_to(host) for p in host.rglob("*")) == before
    assert sd.verbs() == []


def test_relative_model_path_is_not_checked(host):
    """A Hugging Face id (not a local path) is left to SGLang."""
    sd = Systemd(host)
    res = call(host, sd, state="checked", plan=plan(model_path="zai-org/GLM-5"))
    assert res["replace"] is True


def test_bad_state_and_empty_plan_fail_by_name(host):
    with pytest.raises(LaunchError, match="state 'running': must be checked or started"):
        call(host, Systemd(host), state="running")
    with pytest.raises(LaunchError, match="^No plan to launch: the plan stage did not run in this play"):
        call(host, Systemd(host), plan={})


# ------------------------------------------------------------------------------------------------- decision

def test_decide_reasons_in_the_roles_words():
    p = plan()
    assert decide(p, p, ["layout", "argv"], "active", False, False, False) == []
    assert decide(p, {}, ["layout"], "failed", True, True, True) == [
        "forced (--tags given or launch_force)", "the unit is not active", "the plan changed (none -> tp8)",
        "the unit file changed", "the env file changed"]
    other = plan("tp4pp2", argv=["--model-path", "/m", "--tp-size", "4", "--pp-size", "2"])
    assert decide(other, p, ["layout", "argv"], "active", False, False, False) == [
        "the plan changed (tp8 -> tp4pp2: --pp-size 2 added; --tp-size 8 -> 4)"]
    assert decide(p, p, ["argv"], "active", False, False, False, True) == ["the server's config file changed"]


@pytest.mark.parametrize("change, words", [
    # The same layout: what changed is named, never "(tp8 -> tp8)" alone.
    ({"argv": ["--model-path", "/m", "--tp-size", "8", "--mem-fraction-static", "0.92"]},
     "tp8 -> tp8: --mem-fraction-static 0.92 added"),
    ({"argv": ["--model-path", "/m", "--tp-size", "8", "--enable-metrics"]}, "tp8 -> tp8: --enable-metrics added"),
    ({"argv": ["--model-path", "/m"]}, "tp8 -> tp8: --tp-size removed"),
    ({"env": {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "NCCL_P2P_LEVEL": "SYS"}},
     "tp8 -> tp8: env NCCL_P2P_LEVEL=SYS added"),
    ({"port": 30001}, "tp8 -> tp8: port 30000 -> 30001"),
    ({"layout": {"name": "tp8", "tp": 8, "pp": 1, "dp": 1, "ep": 2, "nnodes": 1}}, '"ep": 1'),
])
def test_a_changed_plan_says_what_changed(change, words):
    reasons = decide(plan(**change), plan(), constants_server_keys(), "active", False, False, False)
    assert reasons and reasons[0].startswith("the plan changed (") and words in reasons[0], reasons


def test_many_changes_are_cut_short():
    new = plan(argv=["--model-path", "/m"] + ["--flag-%d" % i for i in range(9)])
    words = decide(new, plan(), ["argv"], "active", False, False, False)[0]
    assert words.count(" added") == 4 and words.endswith("6 more)"), words


def constants_server_keys():
    return list(launch_mod.SERVER_KEYS)


def test_first_check_on_a_fresh_host(host):
    res = call(host, Systemd(host), state="checked")
    assert res["replace"] is True and res["changed"] is False
    assert res["reasons"] == ["the unit is not active", "the plan changed (none -> tp8)", "the unit file changed",
                              "the env file changed"]
    assert res["reason"] == ", ".join(res["reasons"])
    assert res["unit_state"] == {"LoadState": "not-found", "ActiveState": "inactive", "SubState": "dead",
                                 "UnitFileState": ""}
    assert res["written"] == [] and res["actions"] == []


def test_same_plan_running_is_left_alone(host):
    sd = started_host(host)
    res = call(host, sd, state="checked")
    assert res["replace"] is False and res["reasons"] == [] and res["reason"] == "the same plan already runs"
    res = call(host, sd)
    assert res["changed"] is False and res["written"] == [] and res["actions"] == []
    assert sd.verbs() == []


def test_plan_compared_on_server_keys_only_and_key_order_free(host):
    sd = started_host(host)
    p = plan(model_path=str(host / "m"), reason="other words", warnings=["x"])
    reordered = dict(reversed(list(p.items())))
    reordered["env"] = dict(reversed(list(p["env"].items())))
    res = call(host, sd, state="checked", plan=reordered)
    assert res["reasons"] == []
    res = call(host, sd, state="checked", plan=dict(p, port=30001))
    assert res["reasons"] == ["the plan changed (tp8 -> tp8: port 30000 -> 30001)"]
    res = call(host, sd, state="checked", plan=dict(p, layout={"name": "tp4pp2"}))
    assert res["reasons"] == ["the plan changed (tp8 -> tp4pp2)"]
    # With port outside server_keys the same change is no reason.
    res = call(host, sd, state="checked", plan=dict(p, port=30001), server_keys=["layout", "argv"])
    assert res["reasons"] == []


@pytest.mark.parametrize("change, reason", [
    ("unit_content", "the unit file changed"), ("env_content", "the env file changed"),
    ("env_mode", "the env file changed"), ("unit_mode", "the unit file changed"),
    ("force", "forced (--tags given or launch_force)"), ("inactive", "the unit is not active"),
    ("failed", "the unit is not active"),
])
def test_each_reason(host, change, reason):
    sd = started_host(host)
    kw = {}
    if change == "unit_content":
        kw["unit_content"] = "[Service]\nExecStart=/y\n"
    elif change == "env_content":
        kw["env_content"] = ENV + "X=\"1\"\n"
    elif change == "env_mode":
        os.chmod(host / "etc" / "sglang.env", 0o640)
    elif change == "unit_mode":
        os.chmod(host / "systemd" / UNIT, 0o664)
    elif change == "force":
        kw["force"] = True
    else:
        sd.props["ActiveState"] = change
    res = call(host, sd, state="checked", **kw)
    assert res["reasons"] == [reason] and res["replace"] is True and res["reason"] == reason


# -------------------------------------------------------------------------------------------- files, modes

def test_plan_text_is_what_to_nice_json_wrote():
    p = plan(memory={"fits": True, "usable_bytes": 1.5e11}, served_model_name="glm-5 \u00e9")
    assert plan_text(p) == to_nice_json(p) + "\n"


def test_first_start_writes_files_with_their_modes(host, monkeypatch):
    created = []
    real_mkstemp = system_mod.tempfile.mkstemp

    def mkstemp(**kw):
        fd, path = real_mkstemp(**kw)
        created.append((os.path.basename(path), mode(path)))
        return fd, path

    monkeypatch.setattr(system_mod.tempfile, "mkstemp", mkstemp)
    res = call(host, Systemd(host))
    env, unit, cur = host / "etc" / "sglang.env", host / "systemd" / UNIT, host / "state" / "current_plan.json"
    assert res["written"] == [str(host / "etc"), str(host / "state"), str(env), str(unit), str(cur)]
    assert mode(env) == 0o600 and mode(unit) == 0o644 and mode(cur) == 0o644
    assert mode(host / "etc") == 0o755 and mode(host / "state") == 0o755
    assert env.read_text() == ENV and unit.read_text() == "[Service]\nExecStart=/x\n"
    assert json.loads(cur.read_text()) == plan(model_path=str(host / "m"))
    # Every file starts its life 0600 (mkstemp), the env file with its secrets included.
    assert [m for _, m in created] == [0o600, 0o600, 0o600] and created[0][0].startswith(".sglang.env.")
    assert sorted(p.name for p in (host / "etc").iterdir()) == ["sglang.env"]       # no temp file left


def test_loose_env_file_is_rewritten_0600(host):
    sd = started_host(host)
    os.chmod(host / "etc" / "sglang.env", 0o644)
    res = call(host, sd)
    assert res["written"] == [str(host / "etc" / "sglang.env")]
    assert mode(host / "etc" / "sglang.env") == 0o600


def test_env_values_are_the_secrets():
    assert env_values(ENV, ["HF_TOKEN", "TOPOLAUNCH_API_KEY"]) == [HF_TOKEN, API_KEY]
    assert env_values('HF_TOKEN=""\nA="b"\n', ["HF_TOKEN"]) == []


# ----------------------------------------------------------------------------------------------- systemctl

def test_first_start_sequence(host):
    sd = Systemd(host)
    res = call(host, sd)
    assert sd.verbs() == ["daemon-reload", "reset-failed", "enable", "restart"]
    assert res["actions"] == sd.verbs() and res["changed"] is True and res["replace"] is True
    assert sd.props["ActiveState"] == "active" and sd.props["UnitFileState"] == "enabled"


def test_second_start_changes_nothing(host):
    sd = started_host(host)
    res = call(host, sd)
    assert res["changed"] is False and res["written"] == [] and res["actions"] == [] and sd.verbs() == []


def test_forced_restart_of_a_running_server(host):
    sd = started_host(host)
    res = call(host, sd, force=True)
    assert sd.verbs() == ["reset-failed", "restart"] and res["changed"] is True and res["written"] == []


def test_new_layout_reloads_and_restarts(host):
    sd = started_host(host)
    res = call(host, sd, plan=plan("tp4pp2", model_path=str(host / "m")), unit_content="[Service]\nExecStart=/y\n")
    assert res["reasons"] == ["the plan changed (tp8 -> tp4pp2)", "the unit file changed"]
    assert sd.verbs() == ["daemon-reload", "reset-failed", "restart"]
    assert json.loads((host / "state" / "current_plan.json").read_text())["layout"]["name"] == "tp4pp2"


def test_start_limit_spent_is_cleared_before_the_start(host):
    """A crash-looping server leaves the unit failed with its start limit spent: reset-failed first, then start."""
    sd = started_host(host)
    sd.props.update(ActiveState="failed", SubState="failed")
    res = call(host, sd)
    assert res["reasons"] == ["the unit is not active"]
    assert sd.verbs() == ["reset-failed", "restart"] and res["changed"] is True


def test_reset_failed_of_an_unloaded_unit_is_no_error(host):
    sd = started_host(host)
    sd.props["ActiveState"] = "inactive"
    sd.fail["reset-failed"] = (1, "Failed to reset failed state of unit %s: Unit %s not loaded." % (UNIT, UNIT))
    res = call(host, sd)
    assert sd.verbs() == ["reset-failed", "restart"] and res["actions"] == ["reset-failed", "restart"]


def test_reset_failed_other_error_fails(host):
    sd = started_host(host)
    sd.fail["reset-failed"] = (1, "Access denied")
    with pytest.raises(LaunchError, match="systemctl reset-failed %s failed \\(rc 1\\): Access denied" % UNIT):
        call(host, sd, force=True)


def test_enabled_follows_the_option(host):
    sd = started_host(host)
    res = call(host, sd, enabled=False)
    assert sd.verbs() == ["disable"] and res["changed"] is True
    sd.calls.clear()
    res = call(host, sd, enabled=None)
    assert sd.verbs() == [] and res["changed"] is False


def test_daemon_reload_when_systemd_asks_for_it(host):
    sd = started_host(host)
    sd.props["NeedDaemonReload"] = "yes"
    res = call(host, sd)
    assert sd.verbs() == ["daemon-reload"] and res["changed"] is True and res["replace"] is False


def test_failed_start_names_systemctls_message_and_the_log(host):
    sd = Systemd(host, restart=(1, "Job for %s failed because the control process exited with error code." % UNIT))
    with pytest.raises(LaunchError) as exc:
        call(host, sd)
    msg = str(exc.value)
    assert msg.startswith("systemctl restart %s failed (rc 1): Job for %s failed because" % (UNIT, UNIT))
    assert "Last log lines of %s (journalctl -u %s):\nLoad weight begin\n" % (UNIT, UNIT) in msg and "boom" in msg
    assert exc.value.result["actions"] == ["daemon-reload", "reset-failed", "enable", "restart (failed)"]
    assert exc.value.result["changed"] is True and str(host / "systemd" / UNIT) in exc.value.result["written"]


# ---------------------------------------------------------------------------------------------- check mode

def test_check_mode_changes_nothing(host):
    sd = Systemd(host)
    res = call(host, sd, check_mode=True)
    assert res["changed"] is True and res["replace"] is True
    assert res["written"][-3:] == [str(host / "etc" / "sglang.env"), str(host / "systemd" / UNIT),
                                   str(host / "state" / "current_plan.json")]
    assert res["actions"] == ["daemon-reload", "enable", "restart"]
    assert sd.verbs() == []
    assert not (host / "etc").exists() and not (host / "state").exists() and list((host / "systemd").iterdir()) == []


def test_check_mode_on_a_running_server(host):
    sd = started_host(host)
    res = call(host, sd, check_mode=True, force=True)
    assert res["actions"] == ["reset-failed", "restart"] and sd.verbs() == []
    assert sd.props["ActiveState"] == "active"


# -------------------------------------------------------------------------------------------- module main()


# ------------------------------------------------------------------------------- validate: the plan itself

@pytest.mark.parametrize("change, words", [
    ({"argv": []}, "argv [] is not a non-empty list of strings"),
    ({"argv": ["--host", "a\nb"]}, "argv[1] 'a\\nb' contains a control character ('\\n')"),
    ({"argv": ["--host", "a\rb"]}, "argv[1] 'a\\rb' contains a control character ('\\r')"),
    ({"served_model_name": "glm\r"}, "served_model_name 'glm\\r' contains a control character"),
    ({"host": "127.0.0.1\x1b"}, "host '127.0.0.1\\x1b' contains a control character"),
    ({"argv": ["--model-path", "/m\u2028"]}, "argv[1] '/m\\u2028' contains a control character"),
    ({"env": {"X": "a\x00b"}}, "env.X 'a\\x00b' contains a control character"),
    ({"layout": {"name": "tp8\x85", "tp": 8}}, "layout.name 'tp8\\x85' contains a control character"),
    ({"gpu_indices": [0, 0]}, "gpu_indices [0, 0] are not distinct GPU indices"),
    ({"gpu_indices": [0, True]}, "gpu_indices [0, True] are not distinct GPU indices"),
    ({"cuda_visible_devices": "1,0,2,3,4,5,6,7"}, "cuda_visible_devices '1,0,2,3,4,5,6,7' is not gpu_indices"),
    ({"env": {"BAD NAME": "1"}}, "env name 'BAD NAME' is not a variable name"),
    ({"env": {"X": "a\nb"}}, "env.X 'a\\nb' contains a control character"),
    ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, "env CUDA_VISIBLE_DEVICES '0' is not cuda_visible_devices"),
    ({"port": 0}, "port 0 is not a port number (1-65535)"),
    ({"port": "30000"}, "port '30000' is not a port number"),
    ({"topology_fingerprint": "xyz"}, "topology_fingerprint 'xyz' is not 12 hex digits"),
    ({"sglang_version": ""}, "sglang_version '' is not a version"),
    ({"layout": {"tp": 8}}, "layout {'tp': 8} has no name"),
])
@pytest.mark.parametrize("state", ["checked", "started"])
def test_an_unusable_plan_fails_before_anything(host, change, words, state):
    sd = Systemd(host)
    with pytest.raises(LaunchError) as exc:
        call(host, sd, state=state, plan=plan(model_path=str(host / "m"), **change))
    msg = str(exc.value)
    assert msg.startswith("Cannot launch: the plan: ") and words in msg, msg
    assert msg.endswith("Re-run the plan stage; nothing was stopped.")
    assert sd.calls == [] and not (host / "state").exists()


def test_every_problem_is_named_at_once(host):
    with pytest.raises(LaunchError) as exc:
        call(host, Systemd(host), plan=plan(model_path=str(host / "m"), port=0, argv=[]))
    assert "argv [] is not" in str(exc.value) and "port 0 is not" in str(exc.value)


def test_a_plan_for_other_gpus_fails(host):
    with pytest.raises(LaunchError, match="the plan was made for topology a1b2c3d4e5f6 but this host reads "
                                           "0123456789ab"):
        call(host, Systemd(host), state="checked", topology_fingerprint="0123456789ab")
    with pytest.raises(LaunchError, match=r"the plan uses GPUs \[0, 1, 2, 3, 4, 5, 6, 7\] but this host has 4"):
        call(host, Systemd(host), state="checked", gpu_count=4)
    assert call(host, Systemd(host), state="checked", topology_fingerprint="a1b2c3d4e5f6", gpu_count=8)["replace"]


@pytest.mark.parametrize("state", ["checked", "started"])
def test_a_plan_that_binds_numa_nodes_without_numactl_is_refused_before_anything(host, tmp_path, monkeypatch, state):
    """Issue 25 item 8: without numactl on the service's PATH a plan with --numa-node fails at its start (0.5.9; 0.5.23
    with SGLANG_CRASH_ON_NUMA_BIND_FAILURE), after cleanup had stopped the running server: validate refuses it."""
    tools = tmp_path / "bin"
    tools.mkdir()
    monkeypatch.setattr(launch_mod, "SERVICE_PATH", str(tools))
    binding = plan(model_path=str(host / "m"),
                   numa_bind={"nodes": [0, 0, 1, 1], "node_cpus": {"0": "0-3", "1": "4-7"}, "bind": "numactl"})
    sd = Systemd(host)
    with pytest.raises(LaunchError) as exc:
        call(host, sd, state=state, plan=binding)
    assert str(exc.value) == (
        "Cannot launch: the plan binds its schedulers to NUMA nodes 0,1 (--numa-node), which SGLang does through "
        "numactl, and numactl is not on the service's PATH (%s): the sglang role installs it (sglang_numactl_package, "
        "--tags provision); nothing was stopped." % tools)
    assert sd.calls == []
    numactl = tools / "numactl"
    numactl.write_text("#!/bin/sh\n")
    numactl.chmod(0o755)
    assert call(host, Systemd(host), state="checked", plan=binding)["replace"]     # found: the launch goes on


def test_an_env_file_line_broken_by_a_value_fails(host):
    with pytest.raises(LaunchError, match=r'env file line 2 \(B"\) is not NAME="value"'):
        call(host, Systemd(host), state="checked", env_content='A="1\nB"\n')


@pytest.mark.parametrize("field, content, words", [
    ("env_content", 'A="1"\nSGLANG_SIM_X="a\rb"\n', "env file line 2 (SGLANG_SIM_X) contains a control character ('\\r')"),
    ("env_content", 'HF_TOKEN="hf_x\x07"\n', "env file line 1 (HF_TOKEN) contains a control character ('\\x07')"),
    ("unit_content", "[Unit]\nDescription=SGLang glm\x0b\n[Service]\nExecStart=/x\n",
     "unit file line 2 (Description) contains a control character ('\\x0b')"),
    ("unit_content", "[Service]\nExecStart=/x\r\n", "unit file line 2 (ExecStart) contains a control character ('\\r')"),
    ("config_content", 'api-key: "sk-v3ry-s3cr3t\x1f"\n', "server config file line 1 (api-key) contains a control character"),
    ("config_content", "api-key: sk-v3ry-s3cr3t\n", 'server config file line 1 (api-key) is not key: "value"'),
    # issue 25 item 3: keys SGLang cannot read (it puts the value after --api-key in argv; it reads the file in the
    # locale's encoding): refused naming topolaunch_api_key before cleanup could stop the working server
    ("config_content", 'api-key: "--host=0.0.0.0"\n', "server config file line 1 (api-key, from topolaunch_api_key): "
     "the value begins with '-', which SGLang's argument parser takes for a flag"),
    ("config_content", 'api-key: "-k3y"\n', "(api-key, from topolaunch_api_key): the value begins with '-'"),
    ("config_content", 'api-key: "s\u00e9cr\u00e8t"\n', "(api-key, from topolaunch_api_key): the value has 2 "
     "character(s) outside printable ASCII"),
])
@pytest.mark.parametrize("state", ["checked", "started"])
def test_a_control_character_in_a_rendered_file_fails_before_anything(host, field, content, words, state):
    """Whatever reaches the unit, the env file or the server's config - a value of launch_extra_env, a path, a
    secret - is refused with its line and key before anything changes; a secret's value is never quoted."""
    sd = Systemd(host)
    with pytest.raises(LaunchError) as exc:
        call(host, sd, state=state, **{field: content})
    msg = str(exc.value)
    assert msg.startswith("Cannot launch: ") and words in msg and msg.endswith("nothing was stopped."), msg
    assert "s3cr3t" not in msg and "hf_x" not in msg and "0.0.0.0" not in msg and "k3y" not in msg
    assert sd.calls == [] and not (host / "state").exists() and not (host / "etc").exists()


def test_a_unit_systemd_refuses_fails_before_anything(host):
    """systemd-analyze verify runs on a temporary copy of the rendered unit, under the unit's own name; what it says
    about our unit fails the call before anything is written or stopped."""
    seen = {}

    class Refusing(Systemd):
        def run(self, argv):
            if argv[0] == "systemd-analyze":
                seen["argv"] = argv
                with open(argv[2], encoding="utf-8") as f:
                    seen["content"] = f.read()
                return 1, "", ("%s:12: Failed to resolve unit specifiers in '%%Zx': Invalid slot\n"
                               "%s: Unit configuration has fatal error, unit will not be started.\n") % (argv[2], UNIT)
            return super().run(argv)

    sd = Refusing(host, load="loaded", active="active")
    with pytest.raises(LaunchError) as exc:
        call(host, sd, unit_content="[Service]\nExecStart=/x %Zx\n")
    msg = str(exc.value)
    assert msg.startswith("Cannot launch: systemd-analyze verify refuses the rendered unit: %s:12: Failed to resolve "
                          "unit specifiers" % UNIT) and "fatal error" in msg and msg.endswith("nothing was stopped.")
    assert seen["argv"][:2] == ["systemd-analyze", "verify"] and os.path.basename(seen["argv"][2]) == UNIT
    assert seen["content"] == "[Service]\nExecStart=/x %Zx\n" and not os.path.exists(seen["argv"][2])
    assert sd.verbs() == [] and not (host / "state").exists()


def test_a_setting_systemd_would_ignore_also_fails(host):
    class Warning(Systemd):
        def run(self, argv):
            if argv[0] == "systemd-analyze":
                return 0, "", "%s:27: Failed to parse kill mode specification, ignoring: bogus\n" % argv[2]
            return super().run(argv)

    with pytest.raises(LaunchError, match=r"verify refuses the rendered unit: %s:27: Failed to parse kill mode" % UNIT):
        call(host, Warning(host), state="checked")


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="needs systemd-analyze")
def test_verify_unit_with_the_real_systemd_analyze(tmp_path):
    exe = tmp_path / "python"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    good = "[Service]\nExecStart=%s -m sglang.launch_server\n" % exe
    assert launch_mod.verify_unit(UNIT, good) == []
    bad = launch_mod.verify_unit(UNIT, good.replace("ExecStart=", "ExecStart=%Z"))
    assert bad and bad[0].startswith(UNIT + ":2: Failed to resolve unit specifiers"), bad
    assert launch_mod.verify_unit(UNIT, good + "KillMode=bogus\n")[0].startswith(UNIT + ":3: ")


def test_the_api_key_goes_to_a_config_file_of_the_service_user(host):
    """The server's config (SGLang --config) holds the API key: 0600, owned by the service user; removed when the
    key goes; a changed config replaces the server."""
    sd = Systemd(host)
    config = host / "state" / launch_mod.SERVER_CONFIG
    res = call(host, sd, config_content='api-key: "%s"\n' % API_KEY)
    assert str(config) in res["written"] and config.read_text() == 'api-key: "%s"\n' % API_KEY
    assert mode(config) == 0o600 and (os.stat(config).st_uid, os.stat(config).st_gid) == \
        (pwd.getpwnam(ME).pw_uid, pwd.getpwnam(ME).pw_gid)
    res = call(host, sd, config_content='api-key: "%s"\n' % API_KEY)
    assert res["replace"] is False and res["written"] == []
    res = call(host, sd, config_content='api-key: "other"\n')
    assert res["replace"] and "the server's config file changed" in res["reasons"]
    res = call(host, sd, config_content="")
    assert not config.exists() and str(config) in res["written"] and "the server's config file changed" in res["reasons"]
    assert call(host, sd, config_content="")["written"] == []


def test_config_values_are_the_secrets():
    assert launch_mod.config_values('# managed\napi-key: "a\\"b"\nx: "y"\nbroken: z\n') == ['a"b', "y"]


def test_python_defaults_to_the_venv_of_the_plans_version(host):
    venv = host / "venvs" / "0.5.9" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text("#!/bin/sh\n")
    (venv / "python").chmod(0o755)
    assert call(host, Systemd(host), state="checked", python=None, venv_root=str(host / "venvs"))["replace"]
    with pytest.raises(LaunchError, match="the SGLang python '%s' " % (host / "nowhere" / "0.5.9" / "bin" / "python")):
        call(host, Systemd(host), state="checked", python=None, venv_root=str(host / "nowhere"))


def test_both_states_return_the_plan_and_their_stage(host):
    sd = Systemd(host)
    res = call(host, sd, state="checked")
    assert res["plan"] == plan(model_path=str(host / "m")) and res["stage"] == "validate"
    res = call(host, sd)
    assert res["plan"] == plan(model_path=str(host / "m")) and res["stage"] == "launch"


def test_a_kept_server_keeps_its_recorded_plan(host):
    """The same server with a new explanation (reason, estimate, source) is left alone and its record too: a
    second run changes nothing."""
    sd = started_host(host)
    recorded = (host / "state" / "current_plan.json").read_text()
    res = call(host, sd, plan=plan(model_path=str(host / "m"), reason="measured results decide", source="measured"))
    assert res["replace"] is False and res["changed"] is False and res["written"] == [] and sd.verbs() == []
    assert (host / "state" / "current_plan.json").read_text() == recorded


# ------------------------------------------------------------------------------------- the installed version

def record_version(host, content):
    (host / "etc").mkdir(exist_ok=True)
    (host / "etc" / "sglang_version.json").write_text(content)


@pytest.mark.parametrize("state", ["checked", "started"])
def test_a_plan_for_another_sglang_version_than_the_installed_one_is_refused(host, state):
    """The sglang role records the installed, current version; a plan for another one never stops the server."""
    record_version(host, json.dumps({"sglang_version": "0.5.23", "package_version": "0.5.23+sim",
                                     "venv": "/opt/sglang/venvs/0.5.23"}))
    sd = Systemd(host)
    with pytest.raises(LaunchError) as exc:
        call(host, sd, state=state)
    assert str(exc.value) == (
        "Cannot launch: the plan is for SGLang 0.5.9 but this host has SGLang 0.5.23 installed and current (%s). "
        "Install 0.5.9 first (topolaunch_sglang_version: 0.5.9, then --tags provision,relaunch), or plan again for "
        "0.5.23 (--tags relaunch); nothing was stopped." % (host / "etc" / "sglang_version.json"))
    assert sd.calls == [] and not (host / "state").exists()


def test_the_installed_version_is_compared_as_a_release(host):
    """A local label (the lab's 0.5.9+sim) is its release; no record (a host provisioned before it) is no check."""
    assert call(host, Systemd(host), state="checked")["replace"]
    record_version(host, '{"sglang_version": "0.5.9"}')
    assert call(host, Systemd(host), state="checked", plan=plan(model_path=str(host / "m"),
                                                                 sglang_version="0.5.9+sim"))["replace"]


@pytest.mark.parametrize("content, words", [
    ("{not json", "Cannot read the installed SGLang version, {rec}: "),
    ('{"sglang_version": ""}', "The installed SGLang version record {rec} has no sglang_version."),
    ("[1]", "The installed SGLang version record {rec} has no sglang_version."),
])
def test_an_unreadable_version_record_fails_naming_it(host, content, words):
    record_version(host, content)
    with pytest.raises(LaunchError) as exc:
        call(host, Systemd(host), state="checked")
    assert words.format(rec=host / "etc" / "sglang_version.json") in str(exc.value)
    assert str(exc.value).endswith("Run the provision stage (--tags provision), which writes it again; nothing was "
                                   "stopped.")


def test_a_start_validated_in_this_relaunch_is_not_validated_again(host):
    """validated: the relaunch's validate step checked these very inputs (state checked): the start trusts it and runs
    no check again (systemd-analyze verify, the files on the host); the checked state always checks."""
    (host / "venv" / "bin" / "python").unlink()          # validate() would refuse now
    with pytest.raises(LaunchError, match="the SGLang python .* does not exist"):
        call(host, Systemd(host), state="checked", validated=True)
    with pytest.raises(LaunchError, match="the SGLang python .* does not exist"):
        call(host, Systemd(host))
    sd = Systemd(host)
    res = call(host, sd, validated=True)
    assert res["replace"] is True and sd.verbs() == ["daemon-reload", "reset-failed", "enable", "restart"]
    assert not any(c[0] == "systemd-analyze" for c in sd.calls)
    with pytest.raises(LaunchError, match="the service user 'no-such-user-tl' does not exist"):
        call(host, Systemd(host), validated=True, service_user="no-such-user-tl")


def test_a_replaced_server_is_stopped_and_cleaned_in_the_same_call_before_anything_is_written(host):
    """clean (the module's cleanup option): called when the server is replaced, before the files are written and the
    unit restarted, with the call's check mode; its result is `cleanup`. A kept server is not stopped."""
    seen = []

    def clean(check_mode):
        seen.append((check_mode, (host / "etc" / "sglang.env").exists()))
        return {"changed": True, "summary": "stopped topolaunch-sglang.service"}

    sd = Systemd(host)
    res = launch(opts(host), run=sd.run, owner=OWNER, clean=clean)
    assert seen == [(False, False)] and res["cleanup"]["summary"] == "stopped topolaunch-sglang.service"
    assert res["actions"][-1] == "restart" and res["changed"] is True
    seen.clear()
    res = launch(opts(host), run=sd.run, owner=OWNER, clean=clean)          # the same plan runs: kept
    assert seen == [] and "cleanup" not in res and res["replace"] is False
    res = launch(opts(host, force=True), check_mode=True, run=sd.run, owner=OWNER, clean=clean)
    assert seen == [(True, True)] and res["replace"] is True


def test_validate_says_when_a_kept_server_needs_no_launch_call(host):
    """enabled_as_wanted: the unit's boot start is as asked; with replace false, the launch has nothing to do."""
    sd = started_host(host)                                   # running tp8, enabled
    res = call(host, sd, state="checked", enabled=True)
    assert (res["replace"], res["enabled_as_wanted"]) == (False, True)
    assert call(host, sd, state="checked", enabled=False)["enabled_as_wanted"] is False
    assert call(host, sd, state="checked", enabled=None)["enabled_as_wanted"] is True


def test_a_port_held_out_of_this_hosts_view_fails_validate_before_anything_is_stopped(host):
    """Issue 29: a socket on the plan's port that no process of this /proc holds (a container sharing the network):
    validate refuses, naming the port, and nothing is stopped (no systemctl verb runs)."""
    proc = host / "proc"
    (proc / "net").mkdir(parents=True)
    (proc / "net" / "tcp").write_text(
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 0100007F:%04X 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1\n"
        % plan()["port"])
    sd = Systemd(host, load="loaded", active="active")
    with pytest.raises(LaunchError) as exc:
        call(host, sd, state="checked", proc_root=str(proc))
    assert "port %d: something listens on it that no process this host's /proc shows holds" % plan()["port"] \
        in str(exc.value) and str(exc.value).endswith("plan another port (topolaunch_port); nothing was stopped.")
    assert not [v for v in sd.verbs() if v in ("stop", "restart", "kill")]


def test_a_failed_launch_call_carries_what_the_rollback_needs(host):
    """Issue 29: the relaunch rolls back after a failed cleanup or start too, as after a failed health check; the
    failure says which plan to go back to, whether it differs, and whether the old server was stopped at all."""
    state = host / "state"
    state.mkdir(exist_ok=True)
    good = plan("tp4pp2")
    (state / "last_good_plan.json").write_text(json.dumps(good))
    failed = plan("tp8")
    stopped = rollback_facts(str(state), failed, {"unit": {"stopped": True}, "stopped": []})    # the cleanup's
    assert stopped == {"plan": failed, "last_good_plan": good, "last_good_differs": True, "server_stopped": True}
    assert rollback_facts(str(state), failed, {"actions": ["daemon-reload", "restart (failed)"]})["server_stopped"]
    assert rollback_facts(str(state), failed, {"cleanup": {"stopped": [{"pid": 7}]}})["server_stopped"]
    refused = rollback_facts(str(state), good, {"unit": {"stopped": False}, "stopped": []})    # refused a foreigner
    assert refused["server_stopped"] is False and refused["last_good_differs"] is False
    (state / "last_good_plan.json").unlink()
    assert rollback_facts(str(state), failed, {})["last_good_plan"] == {}


class _Fs:
    """os.statvfs's answer for a file system with `free` bytes (4 KiB blocks)."""

    def __init__(self, free, fsid=7):
        self.f_bavail, self.f_frsize, self.f_fsid = free // 4096, 4096, fsid


def test_a_full_disk_is_refused_in_validate_before_anything_is_stopped(host, monkeypatch):
    """Issue 25 item 5: ENOSPC writing the unit was a bare OSError traceback, after cleanup had stopped the working
    server. Validate now checks room for every file the launch writes, naming the directories."""
    o = dict(opts(host, state="checked"), config_content="")
    short = launch_mod.space_problems(dict(launch_mod.DEFAULTS, **o), statvfs=lambda _p: _Fs(4096))
    assert len(short) == 1 and short[0].endswith("4096 bytes free, the launch needs %d"
                                                  % (launch_mod.SPACE_MARGIN + 2 * sum(
                                                      len(c.encode()) for c in (ENV, o["unit_content"],
                                                                                plan_text(o["plan"])))))
    assert str(host / "state") in short[0] and str(host / "systemd") in short[0]
    assert launch_mod.space_problems(dict(launch_mod.DEFAULTS, **o), statvfs=lambda _p: _Fs(1 << 30)) == []
    monkeypatch.setattr(launch_mod.os, "statvfs", lambda _p: _Fs(4096))
    sd = Systemd(host)
    with pytest.raises(LaunchError) as exc:
        call(host, sd, state="checked")
    assert "bytes free, the launch needs" in str(exc.value) and str(exc.value).endswith("nothing was stopped.")
    assert sd.calls == []


def test_a_write_that_fails_is_one_line_naming_the_file(host, monkeypatch):
    def full(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(launch_mod, "write_atomic", full)
    with pytest.raises(LaunchError) as exc:
        call(host, Systemd(host))
    assert str(exc.value) == "Writing %s failed: No space left on device" % (host / "etc" / "sglang.env")
    assert exc.value.result["written"] == [str(host / "etc"), str(host / "state")]


@pytest.mark.parametrize("content, words", [("{not json", "cannot be read"), ("[1, 2]", "is not a JSON object")])
def test_a_corrupt_last_good_plan_is_named_not_read_as_none(tmp_path, content, words):
    """Issue 25 item 16: a corrupt last_good_plan.json read as "no last known good plan"."""
    from ansible_collections.topolaunch.sglang.plugins.filter.relaunch import rollback_refusal
    (tmp_path / "last_good_plan.json").write_text(content)
    facts = rollback_facts(str(tmp_path), {"layout": {"name": "tp8"}}, {"actions": ["restart (failed)"]})
    assert facts["last_good_plan"] == {} and facts["server_stopped"] is True
    why = rollback_refusal(facts)
    assert why.startswith("the last known good plan %s %s" % (tmp_path / "last_good_plan.json", words)), why
    (tmp_path / "last_good_plan.json").unlink()
    assert rollback_refusal(rollback_facts(str(tmp_path), {}, {"actions": ["restart"]})) == "there is no last known good plan"


@pytest.mark.parametrize("state", ["checked", "started"])
def test_root_as_the_service_user_is_refused_before_anything_changes(host, state):
    """Issue 25 item 13: validate refuses uid 0 unless topolaunch_force_service_user."""
    before = sorted(p.relative_to(host) for p in host.rglob("*"))
    sd = Systemd(host)
    with pytest.raises(LaunchError, match=r"the service user 'root' \(topolaunch_service_user\) has uid 0 \(root\)"):
        call(host, sd, state=state, service_user="root", force_service_user=False)
    assert sorted(p.relative_to(host) for p in host.rglob("*")) == before and sd.verbs() == []


def test_a_config_key_the_plans_release_lacks_is_refused_naming_its_variable(host):
    """SGLang 0.5.9 has no --watermark-config: the server would exit 2 at argument parsing after cleanup."""
    sd = Systemd(host)
    with pytest.raises(LaunchError) as exc:
        call(host, sd, state="checked", config_content='watermark-config: "{\\"key\\": \\"s3cr3t\\"}"\n')
    msg = str(exc.value)
    assert ("server config file line 1 (watermark-config, from topolaunch_watermark_config): SGLang 0.5.9 has no "
            "--watermark-config") in msg and "s3cr3t" not in msg
    res = call(host, sd, state="checked", plan=plan(model_path=str(host / "m"), sglang_version="0.5.23"),
               config_content='watermark-config: "{\\"key\\": \\"s3cr3t\\"}"\n',
               sglang_version_file=str(host / "none.json"))
    assert res["replace"] is True


def test_validate_lists_our_units_of_the_other_shape_in_the_same_call(host):
    """The relaunch stops the other shape's units (stale_units) from the names the validate call lists: the single
    unit, replica instances, the gateway, links too (a unit enabled by a link), nothing else of the directory."""
    sd = Systemd(host)
    units = host / "systemd"
    for name in ("topolaunch-sglang@0.service", "topolaunch-sglang@1.service", "topolaunch-gateway.service",
                 "ssh.service", "topolaunch-sglang@.service.d"):
        (units / name).write_text("[Service]\n")
    (units / "topolaunch-sglang@2.service").symlink_to(units / "topolaunch-sglang@1.service")
    patterns = [UNIT, "topolaunch-sglang@*.service", "topolaunch-gateway.service"]
    res = call(host, sd, state="checked", list_units=patterns)
    assert res["units_present"] == ["topolaunch-gateway.service", "topolaunch-sglang@0.service",
                                    "topolaunch-sglang@1.service", "topolaunch-sglang@2.service"]
    assert "units_present" not in call(host, sd, state="checked")            # not asked: not listed
    assert launch_mod.units_present(str(host / "nowhere"), patterns) == []
