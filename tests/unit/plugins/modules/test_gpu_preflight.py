"""library/gpu_preflight.py main(): check mode plans only, a run measures (lab stand-in) and writes the record,
the same fingerprint reuses it, bad input fails naming the value before anything runs."""
import json
import sys

import pytest

from ansible_collections.topolaunch.sglang.plugins.modules import gpu_preflight
import paths

ROOT = paths.ROOT
STANDIN = str(ROOT / "lab" / "preflight" / "worker_standin.py")
SPECS = ROOT / "lab" / "specs"


def args(tmp_path, spec="proxmox-8x-rtx-pro-6000-vnuma", **extra):
    base = {"python": sys.executable, "worker": STANDIN, "gpus": list(range(8)), "fingerprint": "0123456789ab",
            "record_path": str(tmp_path / "var" / "preflight.json"), "step_timeout": 5,
            "environment": {"FAKE_NVML_SPEC": str(SPECS / (spec + ".json"))}}
    base.update(extra)
    return base


def test_check_mode_plans_and_runs_nothing(tmp_path, run_module):
    code, out = run_module(gpu_preflight, args(tmp_path, worker="/nowhere/worker.py", python="/nowhere/python"), True)[:2]
    assert code == 0 and out["changed"] is True and out["measured"] is False and out["record"] is None
    assert "check mode: would measure (8 GPUs, 7 groups)" in out["reason"]
    assert [s["name"] for s in out["steps"]] == ["p2p", "allreduce"]
    assert out["steps"][0]["argv"][:4] == ["/nowhere/python", "/nowhere/worker.py", "p2p", "--env"]
    assert not (tmp_path / "var").exists()


def test_measures_writes_and_then_reuses_the_record(tmp_path, run_module):
    code, out = run_module(gpu_preflight, args(tmp_path))[:2]
    assert code == 0 and out["changed"] is True and out["measured"] is True
    assert out["ok"] is True and out["findings"] == [] and out["plan_fixes"] == {"env": {}, "server_args": {}}
    assert list(out["figures"]["allreduce_by_size"]) == ["2", "4", "8"]
    assert any(line.startswith("Unidirectional P2P=Enabled Bandwidth Matrix") for line in out["report"])
    path = tmp_path / "var" / "preflight.json"
    saved = json.loads(path.read_text())
    assert saved["fingerprint"] == "0123456789ab" and path.stat().st_mode & 0o777 == 0o644
    assert saved["pairs"] == out["record"]["pairs"]
    code, again = run_module(gpu_preflight, args(tmp_path, worker="/nowhere/worker.py"))[:2]       # nothing runs
    assert code == 0 and again["changed"] is False and again["measured"] is False
    assert again["reason"] == "record for 0123456789ab at %s" % path and again["figures"] == out["figures"]
    code, check = run_module(gpu_preflight, args(tmp_path), True)[:2]
    assert check["changed"] is False and check["record"]["fingerprint"] == "0123456789ab"
    code, forced = run_module(gpu_preflight, args(tmp_path, force=True))[:2]
    assert forced["measured"] is True and forced["changed"] is True and forced["reason"].endswith("; measured again (force)")
    code, other = run_module(gpu_preflight, args(tmp_path, fingerprint="ba9876543210"))[:2]
    assert other["measured"] is True and "is for topology 0123456789ab, this is ba9876543210" in other["reason"]


def test_the_hanging_pair_box_returns_the_fix(tmp_path, run_module):
    code, out = run_module(gpu_preflight, args(tmp_path, spec="proxmox-8x-rtx-pro-6000-p2p-hang", step_timeout=1))[:2]
    assert code == 0 and out["ok"] is True
    assert [f["id"] for f in out["findings"]] == ["preflight-p2p-hang", "preflight-p2p-disabled-by-plan"]
    assert out["plan_fixes"] == {"env": {"NCCL_P2P_DISABLE": "1"}, "server_args": {"disable_custom_all_reduce": True}}
    assert out["seconds"] < 1 + 5


def test_a_worker_that_cannot_run_keeps_no_record(tmp_path, run_module):
    code, out = run_module(gpu_preflight, args(tmp_path, spec="hgx-8x-h100-nvswitch"))[:2]     # no links section
    assert code == 0 and out["ok"] is False and out["changed"] is False
    assert out["findings"][0]["id"] == "preflight-worker-failed" and "has no links section" in out["findings"][0]["message"]
    assert not (tmp_path / "var" / "preflight.json").exists()


@pytest.mark.parametrize("change,message", [
    ({"groups": [[0, 9]]}, "groups[0]: GPU 9 is not in gpus"),
    ({"gpus": []}, "gpus: [] is not a non-empty list"),
    ({"step_timeout": 0}, "step_timeout: 0.0 must be a positive number"),
    ({"fingerprint": ""}, "fingerprint: empty"),
    ({"environment": {"NCCL_DEBUG": 3}}, "environment.NCCL_DEBUG: 3 must be a string"),
    ({"python": "/nowhere/python"}, "python: /nowhere/python does not exist: the SGLang venv's python"),
])
def test_bad_input_fails_naming_the_value(tmp_path, run_module, change, message):
    code, out = run_module(gpu_preflight, args(tmp_path, **change))[:2]
    assert code == 1 and out["failed"] is True and message in out["msg"]
    assert not (tmp_path / "var").exists()


def test_an_unreadable_record_is_measured_again(tmp_path, run_module):
    path = tmp_path / "var" / "preflight.json"
    path.parent.mkdir()
    path.write_text("{not json")
    code, out = run_module(gpu_preflight, args(tmp_path))[:2]
    assert out["measured"] is True and "is unreadable" in out["reason"]
    assert json.loads(path.read_text())["fingerprint"] == "0123456789ab"


def test_documentation_matches_the_argument_spec(monkeypatch):
    import yaml

    class Spec(Exception):
        pass

    def capture(argument_spec, supports_check_mode):
        assert supports_check_mode is True
        raise Spec(argument_spec)

    monkeypatch.setattr(gpu_preflight, "AnsibleModule", capture)
    with pytest.raises(Spec) as spec:
        gpu_preflight.main()
    spec = spec.value.args[0]
    options = yaml.safe_load(gpu_preflight.DOCUMENTATION)["options"]
    keys = ("type", "default", "required", "elements", "choices")
    assert {k: tuple(v.get(x) for x in keys) for k, v in options.items()} == {
        k: tuple(v.get(x) for x in keys) for k, v in spec.items()}
    assert yaml.safe_load(gpu_preflight.EXAMPLES)[0]["gpu_preflight"]["fingerprint"]
    assert {"measured", "record", "findings", "plan_fixes", "figures", "ok", "report", "steps"} <= set(
        yaml.safe_load(gpu_preflight.RETURN))


def test_the_naive_vm_gets_an_nccl_topology_file_from_the_measured_groups(tmp_path, run_module, fake_nvml):
    from plan_cases import fake_facts
    from topology_cases import load_spec
    from ansible_collections.topolaunch.sglang.plugins.module_utils import nccl_topo

    facts = fake_facts(fake_nvml, load_spec("proxmox-8x-rtx-pro-6000-naive"), tmp_path / "sysfs")
    topo = tmp_path / "etc" / "nccl_topo.xml"
    naive = args(tmp_path, spec="proxmox-8x-rtx-pro-6000-naive", facts=facts, fingerprint=facts["fingerprint"],
                 nccl_topo_path=str(topo))
    code, out = run_module(gpu_preflight, naive)[:2]
    assert code == 0 and out["changed"] is True and out["ok"] is True
    # no peer access anywhere: unavailable P2P, not 56 slow pairs
    assert [f["id"] for f in out["findings"]] == ["preflight-p2p-unavailable"]
    decision = out["nccl_topo"]
    assert decision["needed"] and decision["source"] == "measured" and decision["groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert decision["env"] == {"NCCL_TOPO_FILE": str(topo)} and decision["changed"] is True
    assert topo.stat().st_mode & 0o777 == 0o644 and nccl_topo.written_for(str(topo), facts["fingerprint"])
    assert not nccl_topo.written_for(str(topo), "000000000000")
    assert out["report"][-1].startswith("NCCL topology file %s: written (the guest's PCI tree is flat" % topo)
    # the record is reused; the file is already as it should be
    code, again = run_module(gpu_preflight, naive)[:2]
    assert again["measured"] is False and again["changed"] is False and "up to date" in again["report"][-1]
    # check mode with the file gone: would write it, writes nothing
    topo.unlink()
    code, check = run_module(gpu_preflight, naive, True)[:2]
    assert check["changed"] is True and check["nccl_topo"]["changed"] is True and not topo.exists()


def test_an_nccl_topology_file_no_longer_needed_is_removed_if_ours(tmp_path, run_module, fake_nvml):
    from plan_cases import fake_facts
    from topology_cases import load_spec

    facts = fake_facts(fake_nvml, load_spec("proxmox-8x-rtx-pro-6000-vnuma"), tmp_path / "sysfs")
    topo = tmp_path / "nccl_topo.xml"
    topo.write_text('<system version="1" name="topolaunch-0123456789ab">\n</system>\n')
    field = args(tmp_path, facts=facts, fingerprint=facts["fingerprint"], nccl_topo_path=str(topo))
    code, out = run_module(gpu_preflight, field)[:2]
    assert out["nccl_topo"]["needed"] is False and out["nccl_topo"]["changed"] is True and not topo.exists()
    assert "removed (NCCL reads the grouping itself" in out["report"][-1]
    topo.write_text('<system version="1" name="someone-else">\n</system>\n')
    code, out = run_module(gpu_preflight, field)[:2]
    assert out["nccl_topo"]["changed"] is False and topo.exists() and "not needed" in out["report"][-1]
    # the field box is healthy and has a group across the sockets: measured once more with NCCL_P2P_LEVEL=SYS; the
    # stand-in answers the same with it (the lab cannot show NCCL's P2P levels), so it proves nothing
    cross = out["figures"]["cross_socket_p2p"]
    assert [g["gpus"] for g in cross["groups"]] == [list(range(8))] and cross["proven"] is False


def test_gpus_in_use_are_never_measured(tmp_path, run_module, monkeypatch):
    import os

    warnings = []
    monkeypatch.setattr(gpu_preflight.AnsibleModule, "warn", lambda self, text: warnings.append(text))
    mine = [{"gpu": 3, "pid": os.getpid()}, {"gpu": 9, "pid": 1}]          # GPU 9 is not measured: not named
    code, out = run_module(gpu_preflight, args(tmp_path, gpu_processes=mine))[:2]
    assert code == 0 and out["measured"] is False and out["record"] is None and out["changed"] is False
    assert out["in_use"] == "pid %d (%s) on GPU 3" % (os.getpid(), open("/proc/self/comm").read().strip())
    assert len(warnings) == 1 and warnings[0].startswith(
        "preflight skipped: no record for topology 0123456789ab and the GPUs are in use (pid %d" % os.getpid())
    assert not (tmp_path / "var").exists()
    code, out = run_module(gpu_preflight, args(tmp_path, gpu_processes=mine, force=True))[:2]
    assert code == 1 and "the GPUs to measure are in use (pid %d" % os.getpid() in out["msg"]
    # free GPUs: measured; then in use again: the record is there and is returned, nothing measured, no warning
    assert run_module(gpu_preflight, args(tmp_path))[1]["measured"] is True
    code, out = run_module(gpu_preflight, args(tmp_path, gpu_processes=mine, worker="/nowhere/worker.py"))[:2]
    assert out["measured"] is False and out["record"]["fingerprint"] == "0123456789ab" and len(warnings) == 1
