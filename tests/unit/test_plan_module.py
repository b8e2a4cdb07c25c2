"""library/sglang_plan.py main(): a plan from a model directory, check mode, every reason on failure."""
import json

import pytest

from ansible_collections.topolaunch.sglang.plugins.modules import sglang_plan
from ansible.module_utils.testing import patch_module_args
from plan_cases import FIELD_ARGS, model_path, synth_facts
from topology_cases import make_sysfs


def run_module(args, capsys, check_mode=False):
    if check_mode:
        args = dict(args, _ansible_check_mode=True)
    with patch_module_args(args), pytest.raises(SystemExit) as exc:
        sglang_plan.main()
    return exc.value.code, json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def vnuma(tmp_path_factory):
    return synth_facts("proxmox-8x-rtx-pro-6000-vnuma", tmp_path_factory.mktemp("vnuma"))


@pytest.mark.parametrize("check_mode", [False, True])
def test_module_plans_the_field_launch(vnuma, capsys, check_mode):
    code, out = run_module({"topology": vnuma, "model_path": model_path("glm-5-nvfp4"), "layout": "tp4pp2",
                            "server_args": FIELD_ARGS, "served_model_name": "glm-5-nvfp4"}, capsys, check_mode)
    assert code == 0 and out["changed"] is False
    plan = out["plan"]
    assert plan["layout"]["name"] == "tp4pp2" and plan["cuda_visible_devices"] == "0,1,2,3,4,5,6,7"
    assert plan["argv"][plan["argv"].index("--pp-size") + 1] == "2"
    assert any(line.startswith("launch: CUDA_DEVICE_ORDER=PCI_BUS_ID") for line in out["report"])
    assert "candidates:" in out["report"]
    # One plan shape: the candidates table is beside the plan, not inside it.
    assert "candidates" not in plan and out["stage"] == "plan"
    assert "tp4pp2" in [c["name"] for c in out["candidates"] if c["valid"]]


def test_module_takes_a_layout_mapping_and_a_python(vnuma, capsys):
    code, out = run_module({"topology": vnuma, "model_path": model_path("llama-3.1-70b"),
                            "layout": {"tp": 2, "dp": 4}, "sglang_python": "/venv/bin/python"}, capsys)
    assert code == 0 and out["plan"]["layout"]["name"] == "tp2dp4"
    assert any("/venv/bin/python -m sglang.launch_server" in line for line in out["report"])


def test_module_fails_with_every_reason(vnuma, capsys):
    code, out = run_module({"topology": vnuma, "model_path": model_path("glm-5-nvfp4"), "layout": "tp3pp2",
                            "server_args": {"attention_backend": "flashinf", "tp_size": 2}, "gpus": [0, 1, 2, 3, 4, 5]},
                           capsys)
    assert code == 1 and out["failed"] is True
    text = "\n".join(out["reasons"])
    assert "'flashinf' is not a choice of --attention-backend" in text
    assert "server_args.tp_size is set by the planner" in text
    assert "attention heads 64 are not divisible by tp 3" in text
    assert out["msg"].startswith("sglang_plan: %d problem(s): " % len(out["reasons"]))
    assert out["candidates"][0].split()[:2] == ["layout", "valid"]  # the table is there to show
    assert any(line.split()[0] == "tp3pp2" and " no " in line for line in out["candidates"][1:])


@pytest.mark.parametrize("check_mode", [False, True])
def test_module_reads_the_topology_when_not_given(fake_nvml, tmp_path, capsys, check_mode):
    spec = fake_nvml.use("proxmox-8x-rtx-pro-6000-vnuma", init=False)
    code, out = run_module({"model_path": model_path("glm-5-nvfp4"), "layout": "tp8",
                            "sysfs_root": make_sysfs(tmp_path, spec)}, capsys, check_mode)
    assert code == 0, out
    facts = out["ansible_facts"]["gpu_topology"]
    assert facts["gpu_count"] == 8 and facts["islands"]["numa"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert out["plan"]["topology_fingerprint"] == facts["fingerprint"]


def test_module_given_a_topology_returns_no_facts(vnuma, capsys):
    code, out = run_module({"topology": vnuma, "model_path": model_path("glm-5-nvfp4"), "layout": "tp8"}, capsys)
    assert code == 0 and out["ansible_facts"] == {}


def test_module_without_topology_or_nvml_says_why(fake_nvml, tmp_path, capsys, monkeypatch):
    fake_nvml.use("proxmox-8x-rtx-pro-6000-vnuma", init=False)
    monkeypatch.setenv("FAKE_NVML_SPEC", str(tmp_path / "missing.json"))   # the fake: driver not loaded
    code, out = run_module({"model_path": model_path("glm-5-nvfp4")}, capsys)
    assert code == 1 and out["msg"].startswith("sglang_plan: reading the GPU topology: ")
    assert "kernel driver not loaded" in out["msg"]


def test_module_reads_a_model_given_directly(vnuma, capsys):
    config = json.loads((open(model_path("llama-2-7b") + "/config.json")).read())
    code, out = run_module({"topology": vnuma, "model_path": "/srv/models/llama",
                            "model": {"config": config, "total_size": 13476839424}, "layout": "tp1dp8"}, capsys)
    assert code == 0 and out["plan"]["model_name"] == "llama"
    assert out["plan"]["argv"][:2] == ["--model-path", "/srv/models/llama"]
