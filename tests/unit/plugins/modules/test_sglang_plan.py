"""Module sglang_plan: a plan from a model directory, check mode, every reason on failure, a tune's selection, the
release the host records as installed."""
import json
import math

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import plan_perf
from ansible_collections.topolaunch.sglang.plugins.modules import sglang_plan
from plan_cases import FIELD_ARGS, model_path, synth_facts
from topology_cases import make_sysfs


@pytest.fixture(scope="module")
def vnuma(tmp_path_factory):
    return synth_facts("proxmox-8x-rtx-pro-6000-vnuma", tmp_path_factory.mktemp("vnuma"))


@pytest.mark.parametrize("check_mode", [False, True])
def test_module_plans_the_field_launch(vnuma, run_module, check_mode):
    code, out, _ = run_module(sglang_plan, {"topology": vnuma, "model_path": model_path("glm-5-nvfp4"), "layout": "tp4pp2",
                            "server_args": FIELD_ARGS, "served_model_name": "glm-5-nvfp4"}, check_mode)
    assert code == 0 and out["changed"] is False
    plan = out["plan"]
    assert plan["layout"]["name"] == "tp4pp2" and plan["cuda_visible_devices"] == "0,1,2,3,4,5,6,7"
    assert plan["argv"][plan["argv"].index("--pp-size") + 1] == "2"
    assert any(line.startswith("launch: CUDA_DEVICE_ORDER=PCI_BUS_ID") for line in out["report"])
    assert "candidates:" in out["report"]
    # One plan shape: the candidates table is beside the plan, not inside it.
    assert "candidates" not in plan and out["stage"] == "plan"
    assert "tp4pp2" in [c["name"] for c in out["candidates"] if c["valid"]]


def test_module_takes_a_layout_mapping_and_a_python(vnuma, run_module):
    code, out, _ = run_module(sglang_plan, {"topology": vnuma, "model_path": model_path("llama-3.1-70b"),
                            "layout": {"tp": 2, "dp": 4}, "sglang_python": "/venv/bin/python"})
    assert code == 0 and out["plan"]["layout"]["name"] == "tp2dp4"
    assert any("/venv/bin/python -m sglang.launch_server" in line for line in out["report"])


def test_module_fails_with_every_reason(vnuma, run_module):
    code, out, _ = run_module(sglang_plan, {"topology": vnuma, "model_path": model_path("glm-5-nvfp4"), "layout": "tp3pp2",
                            "server_args": {"attention_backend": "flashinf", "tp_size": 2}, "gpus": [0, 1, 2, 3, 4, 5]})
    assert code == 1 and out["failed"] is True
    text = "\n".join(out["reasons"])
    assert "'flashinf' is not a choice of --attention-backend" in text
    assert "server_args.tp_size is set by the planner" in text
    assert "attention heads 64 are not divisible by tp 3" in text
    assert out["msg"].startswith("sglang_plan: %d problem(s): " % len(out["reasons"]))
    assert out["candidates"][0].split()[:2] == ["layout", "valid"]  # the table is there to show
    assert any(line.split()[0] == "tp3pp2" and " no " in line for line in out["candidates"][1:])


def test_module_reads_the_preflight_record_and_the_nccl_topology_file_on_the_host(vnuma, run_module, tmp_path):
    base = {"topology": vnuma, "model_path": model_path("glm-5-nvfp4"), "layout": "tp8",
            "preflight_record": str(tmp_path / "preflight.json"), "nccl_topo_file": str(tmp_path / "nccl_topo.xml")}
    code, out, _ = run_module(sglang_plan, base)          # neither file there: table figures, no NCCL_TOPO_FILE
    assert code == 0 and out["plan"]["link_figures"]["source"] == "tables" and "NCCL_TOPO_FILE" not in out["plan"]["env"]
    record = {"fingerprint": vnuma["fingerprint"], "created": "2026-12-01T10:00:00Z", "ok": True,
              "plan_fixes": {"env": {"NCCL_P2P_DISABLE": "1"}, "server_args": {"disable_custom_all_reduce": True}},
              "figures": {"p2p_disabled": True, "pairs": [{"src": 0, "dst": 1, "gbps": 11.0, "status": "ok"}],
                          "groups": [{"gpus": list(range(8)), "busbw_gbps": 6.5, "latency_us": 200.0, "status": "ok"}]}}
    (tmp_path / "preflight.json").write_text(json.dumps(record))
    (tmp_path / "nccl_topo.xml").write_text('<system version="1" name="topolaunch-%s">\n</system>\n' % vnuma["fingerprint"])
    code, out, _ = run_module(sglang_plan, base)
    plan = out["plan"]
    assert plan["link_figures"] == {"source": "preflight", "created": "2026-12-01T10:00:00Z", "cross_socket_p2p": False}
    assert plan["env"]["NCCL_P2P_DISABLE"] == "1" and "--disable-custom-all-reduce" in plan["argv"]
    assert plan["env"]["NCCL_TOPO_FILE"] == str(tmp_path / "nccl_topo.xml")
    # a file written for another topology is not taken; an unreadable record fails naming it
    (tmp_path / "nccl_topo.xml").write_text('<system version="1" name="topolaunch-000000000000">\n</system>\n')
    (tmp_path / "preflight.json").write_text("{not json")
    code, out, _ = run_module(sglang_plan, base)
    assert code == 1 and out["msg"].startswith("sglang_plan: preflight_record %s is unreadable" % (tmp_path / "preflight.json"))
    (tmp_path / "preflight.json").unlink()
    code, out, _ = run_module(sglang_plan, base)
    assert code == 0 and "NCCL_TOPO_FILE" not in out["plan"]["env"]


@pytest.mark.parametrize("check_mode", [False, True])
def test_module_reads_the_topology_when_not_given(fake_nvml, tmp_path, run_module, check_mode):
    spec = fake_nvml.use("proxmox-8x-rtx-pro-6000-vnuma", init=False)
    code, out, _ = run_module(sglang_plan, {"model_path": model_path("glm-5-nvfp4"), "layout": "tp8",
                            "sysfs_root": make_sysfs(tmp_path, spec)}, check_mode)
    assert code == 0, out
    facts = out["ansible_facts"]["gpu_topology"]
    assert facts["gpu_count"] == 8 and facts["islands"]["numa"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert out["plan"]["topology_fingerprint"] == facts["fingerprint"]


def test_module_given_a_topology_returns_no_facts(vnuma, run_module):
    code, out, _ = run_module(sglang_plan, {"topology": vnuma, "model_path": model_path("glm-5-nvfp4"), "layout": "tp8"})
    assert code == 0 and out["ansible_facts"] == {}


def test_module_without_topology_or_nvml_says_why(fake_nvml, tmp_path, run_module, monkeypatch):
    fake_nvml.use("proxmox-8x-rtx-pro-6000-vnuma", init=False)
    monkeypatch.setenv("FAKE_NVML_SPEC", str(tmp_path / "missing.json"))   # the fake: driver not loaded
    code, out, _ = run_module(sglang_plan, {"model_path": model_path("glm-5-nvfp4")})
    assert code == 1 and out["msg"].startswith("sglang_plan: reading the GPU topology: ")
    assert "kernel driver not loaded" in out["msg"]


def test_module_reads_a_model_given_directly(vnuma, run_module):
    config = json.loads((open(model_path("llama-2-7b") + "/config.json")).read())
    code, out, _ = run_module(sglang_plan, {"topology": vnuma, "model_path": "/srv/models/llama",
                            "model": {"config": config, "total_size": 13476839424}, "layout": "tp1dp8"})
    assert code == 0 and out["plan"]["model_name"] == "llama"
    assert out["plan"]["argv"][:2] == ["--model-path", "/srv/models/llama"]


def test_module_plans_a_tune(vnuma, run_module):
    # layout tune: the plan as auto, requested_layout tune, and which layouts to measure, in the report too
    code, out, _ = run_module(sglang_plan, {"topology": vnuma, "model_path": model_path("glm-5-nvfp4"), "layout": "tune",
                                            "workload": {"input_len": 64, "output_len": 16, "concurrency": 4},
                                            "tune_max": 2})
    assert code == 0 and out["plan"]["requested_layout"] == "tune"
    assert out["tune"]["measure"] == ["tp4pp2", "tp8"] and out["tune"]["max"] == 2
    assert out["plan"]["layout"]["name"] == "tp4pp2" and "fit" not in out   # nothing measured: no fit
    error = "%.0f%%" % (100 * (math.exp(plan_perf.MODEL_ERROR) - 1))
    assert any(line.startswith("tune: the model's error is %s; measuring tp4pp2, tp8" % error) for line in out["report"])
    code, out, _ = run_module(sglang_plan, {"topology": vnuma, "model_path": model_path("glm-5-nvfp4"), "layout": "tune",
                                            "tune_max": 0})
    assert code == 1 and "tune_max (topolaunch_tune_max) must be a positive integer, got 0" in out["msg"]


def test_module_plans_a_tune_with_backends_and_refuses_one_the_release_lacks(vnuma, run_module):
    base = {"topology": vnuma, "model_path": model_path("glm-5-nvfp4"), "layout": "tune", "tune_max": 2,
            "tune_layouts": ["tp8ep8"], "workload": {"input_len": 64, "output_len": 16, "concurrency": 4}}
    code, out, _ = run_module(sglang_plan, dict(base, tune_backends={"moe_runner_backend": ["cutlass"]}))
    assert code == 0 and out["tune"]["measure"] == ["tp8ep8", "tp8ep8+moe_runner_backend.cutlass"]
    code, out, _ = run_module(sglang_plan, dict(base, tune_backends={"moe_runner_backend": ["b12x"]}))
    assert code == 1 and "\n" not in out["msg"]
    assert out["msg"].startswith("sglang_plan: 1 problem(s): topolaunch_tune_backends.moe_runner_backend: b12x is "
                                 "not a --moe-runner-backend of SGLang")
    code, out, _ = run_module(sglang_plan, {"topology": vnuma, "model_path": model_path("glm-5-nvfp4"),
                                            "layout": "tp8ep8", "backends": {"moe_runner_backend": "cutlass"}})
    assert code == 0 and out["plan"]["backends"] == {"moe_runner_backend": "cutlass"}


def test_module_plans_for_the_release_the_host_records_as_installed(vnuma, run_module, tmp_path):
    """--tags relaunch without provision: the host's record (read in the plan's own call) decides the version and
    the venv; no record or an unreadable one leaves sglang_version (validate refuses the unreadable one)."""
    record = tmp_path / "sglang_version.json"
    base = {"topology": vnuma, "model_path": model_path("glm-5-nvfp4"), "layout": "tp8", "sglang_version": "0.5.9",
            "sglang_python": "/opt/sglang/venvs/0.5.9/bin/python", "installed_version_file": str(record)}
    record.write_text(json.dumps({"sglang_version": "0.5.23+sim", "package_version": "0.5.23+sim",
                                  "venv": "/opt/sglang/venvs/0.5.23"}))
    code, out, _ = run_module(sglang_plan, base)
    assert code == 0 and out["plan"]["sglang_version"] == "0.5.23"
    assert any("/opt/sglang/venvs/0.5.23/bin/python -m sglang.launch_server" in line for line in out["report"])
    for content in (None, "{not json"):
        if content is None:
            record.unlink()
        else:
            record.write_text(content)
        code, out, _ = run_module(sglang_plan, base)
        assert code == 0 and out["plan"]["sglang_version"] == "0.5.9"


@pytest.mark.parametrize("args, words", [
    ({"host": ["127.0.0.1"]}, "host (topolaunch_host) must be one address (a non-empty string), got ['127.0.0.1']"),
    ({"port": True}, "port (topolaunch_port) must be an integer, got True"),
])
def test_module_hands_host_and_port_to_the_planner_unconverted(vnuma, run_module, args, words):
    """Issue 25 item 9: type str made a list host "['127.0.0.1']", type int let true through as port 1."""
    code, out, _ = run_module(sglang_plan, dict({"topology": vnuma, "model_path": model_path("glm-5-nvfp4"),
                                                 "layout": "tp8"}, **args))
    assert code == 1 and any(words in r for r in out["reasons"]), out
