"""gateway.py: when the model gateway serves a plan, which release, its command line, and bad input."""
import pathlib

import pytest
import yaml

from plan_cases import model_path, synth_facts
from ansible_collections.topolaunch.sglang.plugins.module_utils import gateway, planner

ROOT = pathlib.Path(__file__).resolve().parents[4]
DEFAULTS = yaml.safe_load((ROOT / "roles/topolaunch/defaults/main.yml").read_text())
RELEASES = DEFAULTS["topolaunch_gateway_releases"]
VERSION = DEFAULTS["topolaunch_gateway_version"]


@pytest.fixture
def field(tmp_path):
    facts = synth_facts("proxmox-8x-rtx-pro-6000-vnuma", tmp_path)
    def plan(layout="tp4dp2", **kw):
        return planner.plan(planner.PlanRequest(topology=facts, model_path=model_path("llama-3.1-70b"),
                                                layout=layout, sglang_version="0.5.23", **kw)), facts
    return plan


@pytest.mark.parametrize("mode,dp,expected", [("auto", 1, False), ("auto", 2, True), ("always", 1, True),
                                              ("never", 2, False), ("never", 1, False)])
def test_wanted(mode, dp, expected):
    assert gateway.wanted(mode, dp) is expected


def test_bad_mode_is_named():
    with pytest.raises(gateway.GatewayError, match="topolaunch_gateway: 'sometimes' is not one of auto, always"):
        gateway.wanted("sometimes", 2)


def test_the_shipped_table_pins_every_wheel_with_a_hash():
    row = gateway.release_for(RELEASES, VERSION, "0.5.23+sim", "always")
    assert row["package"] == "smg==%s" % VERSION
    assert all("==" in r and "--hash=sha256:" in r for r in row["requirements"])
    assert row["requirements"][0].startswith(row["package"] + " ")
    assert gateway.release_for(RELEASES, VERSION, "0.5.9")["version"] == VERSION


def test_no_gateway_for_the_installed_sglang_is_refused():
    table = {"1.13.0": dict(RELEASES["1.13.0"], sglang=["0.5.9"]), "2.0.0": {"package": "smg==2.0.0",
                                                                          "requirements": ["x"], "sglang": ["0.5.23"]}}
    with pytest.raises(gateway.GatewayError, match=r"^topolaunch_gateway: always, but topolaunch_gateway_releases "
                                                   r"has no gateway for SGLang 0.5.23: gateway 1.13.0 pairs with "
                                                   r"SGLang 0.5.9; gateways 2.0.0 do \(topolaunch_gateway_version\)$"):
        gateway.release_for(table, "1.13.0", "0.5.23", "always")
    with pytest.raises(gateway.GatewayError, match=r"topolaunch_gateway_version: '9.9' is not in"):
        gateway.release_for(RELEASES, "9.9", "0.5.23")


def test_serve_field_tp4dp2(field):
    plan, facts = field()
    out = gateway.serve(plan, facts, "auto", RELEASES, VERSION)
    assert [r["gpu_indices"] for r in out["replicas"]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    gw = out["gateway"]
    assert gw["unit"] == "topolaunch-gateway.service" and (gw["host"], gw["port"]) == ("127.0.0.1", 30000)
    assert gw["argv"] == ["--host", "127.0.0.1", "--port", "30000", "--worker-urls", "http://127.0.0.1:30001",
                          "http://127.0.0.1:30002", "--policy", "cache_aware", "--health-check-endpoint", "/health",
                          "--health-check-interval-secs", "10", "--prometheus-host", "127.0.0.1",
                          "--prometheus-port", "29000"]
    assert "topolaunch-sglang@1.service on GPUs 4,5,6,7 port 30002 NUMA 1" in out["reason"]
    assert "--dp-size" in plan["argv"]                       # the plan itself is left as the planner made it


def test_dp1_and_never_keep_the_single_server(field):
    plan, facts = field("tp8")
    assert gateway.serve(plan, facts, "auto", RELEASES, VERSION) is plan
    plan2, _ = field()
    assert gateway.serve(plan2, facts, "never", {}, None) is plan2     # the table is not even read
    one = gateway.serve(plan, facts, "always", RELEASES, VERSION)
    assert [r["gpu_indices"] for r in one["replicas"]] == [list(range(8))]


def test_serve_refuses_a_replica_on_the_gateway_port(field):
    plan, facts = field()
    with pytest.raises(gateway.GatewayError, match=r"topolaunch_replica_ports\[0\]: port 30000 is the gateway's"):
        gateway.serve(plan, facts, "auto", RELEASES, VERSION, replica_ports=[30000, 30001])


def test_serve_refuses_auto_without_a_matching_release(field):
    plan, facts = field()
    with pytest.raises(gateway.GatewayError, match="topolaunch_gateway: auto, but .* no gateway for SGLang 0.5.23"):
        gateway.serve(plan, facts, "auto", {"1.13.0": dict(RELEASES["1.13.0"], sglang=["0.5.9"])}, "1.13.0")


def test_argv_policy_extra_and_refusals():
    reps = [{"index": 0, "url": "http://127.0.0.1:1", "port": 1}]
    out = gateway.argv(reps, "0.0.0.0", 8000, "round_robin", 3, {"request_timeout_secs": 60, "log_json": True,
                                                                   "cors_allowed_origins": ["a", "b"],
                                                                   "disable_retries": False})
    assert out[out.index("--policy") + 1] == "round_robin"
    assert out[out.index("--request-timeout-secs") + 1] == "60"
    assert "--log-json" in out and "--disable-retries" not in out
    assert out[out.index("--cors-allowed-origins") + 1:out.index("--cors-allowed-origins") + 3] == ["a", "b"]
    for bad, match in [(dict(policy="fastest"), "topolaunch_gateway_policy: 'fastest'"),
                       (dict(health_interval=0), "topolaunch_gateway_health_interval: 0"),
                       (dict(extra={"api_key": "x"}), r"topolaunch_gateway_args.api_key: topolaunch sets it"),
                       (dict(extra={"disable-health-check": True}), "topolaunch_gateway_args.disable-health-check"),
                       (dict(extra={"log_dir": "--x"}), "topolaunch_gateway_args.log_dir: '--x' looks like a flag"),
                       (dict(extra={"log_dir": "a\rb"}), "control character"),
                       (dict(extra={"a b": 1}), "'a b' is not an option name"),
                       (dict(extra={"prometheus_port": 1}), "topolaunch_gateway_args.prometheus_port"),
                       (dict(metrics_port=8000), "topolaunch_gateway_metrics_port: 8000 is the gateway's port"),
                       (dict(metrics_port=1), "topolaunch_gateway_metrics_port: 1 is a replica's port"),
                       (dict(metrics_port="x"), "topolaunch_gateway_metrics_port: 'x' is not a port number")]:
        kw = dict(policy="cache_aware", health_interval=10, extra=None, metrics_port=29000)
        kw.update(bad)
        with pytest.raises(gateway.GatewayError, match=match):
            gateway.argv(reps, "127.0.0.1", 8000, kw["policy"], kw["health_interval"], kw["extra"],
                         kw["metrics_port"])
