"""filter_plugins/gateway.py: each replica's one-server inputs, and the other shape's units a relaunch stops."""
import pathlib

import pytest
import yaml

from plan_cases import model_path, synth_facts
from ansible_collections.topolaunch.sglang.plugins.filter.gateway import (FilterModule, host_served_plan, replica_servers,
                                                                         stale_units, watched_servers)
from ansible_collections.topolaunch.sglang.plugins.module_utils import gateway, planner

ROOT = pathlib.Path(__file__).resolve().parents[4]
DEFAULTS = yaml.safe_load((ROOT / "roles/topolaunch/defaults/main.yml").read_text())


def gateway_serve(plan, facts):
    return gateway.serve(plan, facts, "auto", DEFAULTS["topolaunch_gateway_releases"],
                         DEFAULTS["topolaunch_gateway_version"])


@pytest.fixture(name="field")
def fixture_field(tmp_path):
    facts = synth_facts("proxmox-8x-rtx-pro-6000-vnuma", tmp_path)

    def plan(layout="tp4dp2"):
        return planner.plan(planner.PlanRequest(topology=facts, model_path=model_path("llama-3.1-70b"),
                                                layout=layout, sglang_version="0.5.23")), facts
    return plan


def test_served_plan_and_each_replica(field):
    plan, facts = field()
    served = gateway_serve(plan, facts)
    reps = replica_servers(served, "/var/lib/topolaunch", "/etc/topolaunch/sglang.env")
    assert [(r["unit"], r["state_dir"], r["env_file"]) for r in reps] == [
        ("topolaunch-sglang@0.service", "/var/lib/topolaunch/replica-0", "/etc/topolaunch/sglang@0.env"),
        ("topolaunch-sglang@1.service", "/var/lib/topolaunch/replica-1", "/etc/topolaunch/sglang@1.env")]
    one = reps[1]["plan"]
    assert one["gpu_indices"] == [4, 5, 6, 7] and one["port"] == 30002 and "--dp-size" not in one["argv"]
    assert one["argv"][-9:] == ["--host", "127.0.0.1", "--port", "30002", "--numa-node", "1", "1", "1", "1"]
    assert "replicas" not in one and "gateway" not in one
    assert replica_servers(plan, "/s", "/e.env") == []       # dp = 1 / gateway never: no replicas


def test_the_other_shape_is_stale(field):
    plan, facts = field()
    served = gateway_serve(plan, facts)
    on_host = ["/etc/systemd/system/topolaunch-sglang.service", "/etc/systemd/system/topolaunch-sglang@0.service",
               "/etc/systemd/system/topolaunch-sglang@3.service", "/etc/systemd/system/topolaunch-gateway.service",
               "/etc/systemd/system/topolaunch-sglang@x.service", "/etc/systemd/system/other.service"]
    single = "topolaunch-sglang.service"
    assert stale_units(on_host, served, single) == [{"unit": "topolaunch-sglang.service", "index": None},
                                                    {"unit": "topolaunch-sglang@3.service", "index": 3}]
    assert stale_units(on_host, plan, single) == [{"unit": "topolaunch-gateway.service", "index": None},
                                                  {"unit": "topolaunch-sglang@0.service", "index": 0},
                                                  {"unit": "topolaunch-sglang@3.service", "index": 3}]
    assert stale_units([], served, single) == []


def test_the_watchdog_watches_each_replica_or_the_one_server(field):
    """Issue 23 item 4: per replica when there are replicas (the watchdog read the one server's record, stale once
    the box served replicas)."""
    plan, facts = field()
    served = gateway_serve(plan, facts)
    args = ("topolaunch-sglang.service", "/var/lib/topolaunch", "/etc/topolaunch/sglang.env")
    assert watched_servers(served, *args) == [
        {"unit": "topolaunch-sglang@0.service", "current_plan": "/var/lib/topolaunch/replica-0/current_plan.json"},
        {"unit": "topolaunch-sglang@1.service", "current_plan": "/var/lib/topolaunch/replica-1/current_plan.json"}]
    one = [{"unit": "topolaunch-sglang.service", "current_plan": "/var/lib/topolaunch/current_plan.json"}]
    assert watched_servers(plan, *args) == one and watched_servers({}, *args) == one


def test_what_the_host_serves_is_rebuilt_from_its_replica_records_and_units(field):
    """A stage run alone (--tags monitoring, --tags watchdog) has no plan: the replicas the host runs come from
    their records (each replica's own plan, as the launch wrote it) and their unit files; each replica's plan
    rebuilt from it is the record, so every consumer of a served plan takes it."""
    plan, facts = field()
    served = gateway_serve(plan, facts)
    records = [r["plan"] for r in replica_servers(served, "/var/lib/topolaunch", "/etc/topolaunch/sglang.env")]
    units = ["/etc/systemd/system/topolaunch-sglang@1.service", "/etc/systemd/system/topolaunch-sglang@0.service",
             "/etc/systemd/system/topolaunch-gateway.service"]
    rebuilt = host_served_plan(list(reversed(records)), units)
    assert [(r["unit"], r["port"]) for r in rebuilt["replicas"]] == [("topolaunch-sglang@0.service", 30001),
                                                                     ("topolaunch-sglang@1.service", 30002)]
    assert rebuilt["gateway"] == {"unit": "topolaunch-gateway.service"}
    assert [r["plan"] for r in replica_servers(rebuilt, "/var/lib/topolaunch", "/e.env")] == records
    args = ("topolaunch-sglang.service", "/var/lib/topolaunch", "/etc/topolaunch/sglang.env")
    assert watched_servers(rebuilt, *args) == watched_servers(served, *args)
    # a record whose unit is gone (the box went back to one server) is not served; none at all: one server
    assert [r["unit"] for r in host_served_plan(records, units[:1])["replicas"]] == ["topolaunch-sglang@1.service"]
    assert "gateway" not in host_served_plan(records, units[:1])
    assert host_served_plan(records, ["/etc/systemd/system/topolaunch-sglang.service"]) == {}
    assert host_served_plan([], units) == {} and host_served_plan([{"port": 1}, None], units) == {}


def test_filters_are_registered():
    assert set(FilterModule().filters()) == {"replica_servers", "stale_units", "watched_servers", "host_served_plan",
                                             "gateway_here", "gateway_host_problem"}
