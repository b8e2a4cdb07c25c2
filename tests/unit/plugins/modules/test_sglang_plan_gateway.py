"""Module sglang_plan with the model gateway: the plan says which replica is where; bad input fails the plan with
one line naming the field, before any host changes."""
import pathlib

import pytest
import yaml

from ansible_collections.topolaunch.sglang.plugins.modules import sglang_plan
from plan_cases import model_path, synth_facts

ROOT = pathlib.Path(__file__).resolve().parents[4]
DEFAULTS = yaml.safe_load((ROOT / "roles/topolaunch/defaults/main.yml").read_text())
GATEWAY = {"gateway_releases": DEFAULTS["topolaunch_gateway_releases"],
           "gateway_version": DEFAULTS["topolaunch_gateway_version"]}


@pytest.fixture(scope="module")
def vnuma(tmp_path_factory):
    return synth_facts("proxmox-8x-rtx-pro-6000-vnuma", tmp_path_factory.mktemp("vnuma"))


def args(vnuma, **kw):
    out = {"topology": vnuma, "model_path": model_path("llama-3.1-70b"), "layout": "tp4dp2",
           "sglang_version": "0.5.23", "gateway": "auto"}
    out.update(GATEWAY)
    out.update(kw)
    return out


@pytest.mark.parametrize("check_mode", [False, True])
def test_tp4dp2_is_two_replicas_behind_the_gateway(vnuma, run_module, check_mode):
    code, out, _ = run_module(sglang_plan, args(vnuma), check_mode)
    assert code == 0, out
    plan = out["plan"]
    reps = plan["replicas"]
    assert [(r["unit"], r["gpu_indices"], r["numa_nodes"], r["port"]) for r in reps] == [
        ("topolaunch-sglang@0.service", [0, 1, 2, 3], [0, 0, 0, 0], 30001),
        ("topolaunch-sglang@1.service", [4, 5, 6, 7], [1, 1, 1, 1], 30002)]
    gw = plan["gateway"]
    assert (gw["unit"], gw["port"], gw["version"], gw["policy"]) == ("topolaunch-gateway.service", 30000, "1.13.0",
                                                                     "cache_aware")
    assert gw["argv"][gw["argv"].index("--worker-urls") + 1:][:2] == ["http://127.0.0.1:30001",
                                                                     "http://127.0.0.1:30002"]


def test_never_and_dp1_keep_the_plan_as_before(vnuma, run_module):
    for kw in ({"gateway": "never"}, {"layout": "tp8"}):
        code, out, _ = run_module(sglang_plan, args(vnuma, **kw))
        assert code == 0 and "replicas" not in out["plan"] and "gateway" not in out["plan"]


@pytest.mark.parametrize("kw,msg", [
    ({"replica_ports": [30000, 30005]},
     "sglang_plan: topolaunch_replica_ports[0]: port 30000 is the gateway's port (topolaunch_port): the gateway "
     "listens there, each replica needs a port of its own"),
    ({"gateway": "always", "gateway_releases": {"1.13.0": dict(DEFAULTS["topolaunch_gateway_releases"]["1.13.0"],
                                                             sglang=["0.5.9"])}},
     "sglang_plan: topolaunch_gateway: always, but topolaunch_gateway_releases has no gateway for SGLang 0.5.23: "
     "gateway 1.13.0 pairs with SGLang 0.5.9"),
    ({"gateway": "maybe"}, "sglang_plan: topolaunch_gateway: 'maybe' is not one of auto, always, never"),
])
def test_bad_input_is_one_line_naming_the_field(vnuma, run_module, kw, msg):
    code, out, _ = run_module(sglang_plan, args(vnuma, **kw))
    assert code == 1 and out["msg"] == msg and "\n" not in out["msg"]
