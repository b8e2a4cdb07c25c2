"""Replicas on several hosts (issue 22 item 4): the planner places whole replicas on each node of topolaunch_nodes
(replica_nodes) and ranks them with its replica model beside one server across the nodes; the served plan says
which replica is on which host (GPUs, port, NUMA node); each host runs its own replicas and the gateway runs on one;
bad input is one line naming the field."""
import pathlib

import pytest
import yaml

from plan_cases import model_path, synth_facts
from ansible_collections.topolaunch.sglang.plugins.filter.gateway import (
    gateway_here, gateway_host_problem, replica_servers, stale_units, watched_servers)
from ansible_collections.topolaunch.sglang.plugins.module_utils import gateway, planner

ROOT = pathlib.Path(__file__).resolve().parents[4]
DEFAULTS = yaml.safe_load((ROOT / "roles/topolaunch/defaults/main.yml").read_text())
VNUMA = "proxmox-8x-rtx-pro-6000-vnuma"
GLM5 = model_path("glm-5-nvfp4")
LLAMA70 = model_path("llama-3.1-70b")


@pytest.fixture(name="two")
def fixture_two(tmp_path):
    return [synth_facts(VNUMA, tmp_path / "n0"), synth_facts(VNUMA, tmp_path / "n1")]


def servers(*addresses):
    return [{"host": "127.0.0.1", "port": 30000 + k, "address": a} for k, a in enumerate(addresses)]


def request(two, rank=0, **fields):
    base = dict(node_topologies=two, nnodes=2, node_rank=rank, dist_init_addr="10.0.0.1:50000", model_path=GLM5,
                sglang_version="0.5.23", replica_nodes=True, node_servers=servers("10.0.0.1", "10.0.0.2"),
                api_key_set=True)
    base.update(fields)
    return planner.PlanRequest(**base)


def serve(plan, facts, **kw):
    return gateway.serve(plan, facts, "auto", DEFAULTS["topolaunch_gateway_releases"],
                         DEFAULTS["topolaunch_gateway_version"], **kw)


def test_replicas_are_candidates_on_several_nodes_only_when_the_gateway_serves_them(two):
    across = {c["name"]: c for c in planner.plan(request(two))["candidates"]}
    # tp8dp2: one whole TP8 replica on each node; nothing of a replica crosses the network
    assert across["tp8dp2"]["valid"], across["tp8dp2"]["reasons"]
    assert across["tp8dp2"]["network"] == "1 replica on each of 2 nodes: only the gateway's hop crosses the network"
    # ranked by the same replica model as one server across the nodes: two replicas out-serve tp8pp2 here
    assert across["tp8dp2"]["estimate"]["tokens_per_s"] > across["tp8pp2"]["estimate"]["tokens_per_s"]
    # without the gateway (replica_nodes false) a DP layout over nodes is what SGLang refuses
    alone = {c["name"] for c in planner.plan(request(two, replica_nodes=False))["candidates"]}
    assert "tp8dp2" not in alone and "tp8pp2" in alone
    with pytest.raises(planner.PlanError) as exc:
        planner.plan(request(two, replica_nodes=False, layout="tp8dp2"))
    assert "dp 2 across 2 nodes: SGLang supports multi-node data parallel only with DP attention" in str(exc.value.reasons)


def test_the_plan_says_which_replica_is_on_which_host(two, tmp_path):
    facts = synth_facts(VNUMA, tmp_path / "n1b")
    plans = [planner.plan(request(two, rank=r, layout="tp8dp2")) for r in (0, 1)]
    served = [serve(p, two[r]) for r, p in enumerate(plans)]
    where = [[(r["index"], r["node_rank"], r["host"], r["port"], r["gpu_indices"], r["numa_nodes"], r["argv"])
              for r in s["replicas"]] for s in served]
    assert where[0] == where[1]       # every host knows every replica alike (the gateway's worker list)
    reps = served[1]["replicas"]
    assert [(r["index"], r["node_rank"], r["host"], r["port"], r["gpu_indices"], r["numa_nodes"]) for r in reps] == [
        (0, 0, "10.0.0.1", 30001, list(range(8)), [0, 0, 0, 0, 1, 1, 1, 1]),
        (1, 1, "10.0.0.2", 30002, list(range(8)), [0, 0, 0, 0, 1, 1, 1, 1])]
    assert "--nnodes" not in reps[1]["argv"] and "--dp-size" not in reps[1]["argv"]
    assert reps[1]["argv"][-13:-8] == ["--host", "10.0.0.2", "--port", "30002", "--numa-node"]
    # one gateway, on node 0's host and port, routing to both hosts
    gw = served[1]["gateway"]
    assert (gw["node_rank"], gw["host"], gw["port"]) == (0, "127.0.0.1", 30000)
    urls = gw["argv"][gw["argv"].index("--worker-urls") + 1:gw["argv"].index("--policy")]
    assert urls == ["http://10.0.0.1:30001", "http://10.0.0.2:30002"]
    assert "2 replicas behind the model gateway (cache_aware) on 2 nodes" in served[0]["reason"]
    assert "topolaunch-sglang@1.service (node 1, 10.0.0.2) on GPUs 0,1,2,3,4,5,6,7 port 30002" in served[0]["reason"]
    assert plans[0]["layout"]["nnodes"] == 1 and plans[0]["layout"]["replica_nodes"] == 2
    assert plans[0]["cluster_fingerprint"] and "per_node" not in plans[0]
    # the gateway on node 1 (topolaunch_gateway_host): its host and port
    moved = serve(planner.plan(request(two, rank=1, layout="tp8dp2", gateway_node=1)), facts)
    assert (moved["gateway"]["node_rank"], moved["gateway"]["port"]) == (1, 30001)


def test_two_replicas_on_each_of_two_nodes(two):
    plan = planner.plan(request(two, rank=1, layout="tp4dp4", model_path=LLAMA70))
    reps = serve(plan, two[1])["replicas"]
    assert [(r["node_rank"], r["gpu_indices"], r["numa_nodes"]) for r in reps] == [
        (0, [0, 1, 2, 3], [0] * 4), (0, [4, 5, 6, 7], [1] * 4), (1, [0, 1, 2, 3], [0] * 4), (1, [4, 5, 6, 7], [1] * 4)]
    assert [r["port"] for r in reps] == [30001, 30002, 30003, 30004]


def test_each_host_runs_its_own_replicas_and_one_runs_the_gateway(two):
    served = [serve(planner.plan(request(two, rank=r, layout="tp8dp2")), two[r]) for r in (0, 1)]
    mine = [replica_servers(s, "/var/lib/topolaunch", "/etc/topolaunch/sglang.env") for s in served]
    assert [[r["unit"] for r in m] for m in mine] == [["topolaunch-sglang@0.service"], ["topolaunch-sglang@1.service"]]
    assert mine[1][0]["plan"]["host"] == "10.0.0.2" and mine[1][0]["state_dir"] == "/var/lib/topolaunch/replica-1"
    assert [gateway_here(s) for s in served] == [True, False]
    assert [w["unit"] for w in watched_servers(served[1], "topolaunch-sglang.service", "/s", "/e.env")] == [
        "topolaunch-sglang@1.service"]
    on_host = ["topolaunch-sglang.service", "topolaunch-sglang@0.service", "topolaunch-sglang@1.service",
               "topolaunch-gateway.service"]
    single = "topolaunch-sglang.service"
    # node 1: the single unit, replica 0 (node 0's) and a gateway left over are the other shape's
    assert stale_units(on_host, served[1], single) == [{"unit": "topolaunch-gateway.service", "index": None},
                                                       {"unit": single, "index": None},
                                                       {"unit": "topolaunch-sglang@0.service", "index": 0}]
    assert stale_units(on_host, served[0], single) == [{"unit": single, "index": None},
                                                       {"unit": "topolaunch-sglang@1.service", "index": 1}]


def test_replicas_the_network_reaches_follow_the_exposure_rule(two):
    # no API key: node 1's replicas on 10.0.0.2 would serve anyone on that network; loopback ones would not
    plan = planner.plan(request(two, api_key_set=False, node_servers=servers("127.0.0.1", "127.0.0.1"),
                                layout="tp8dp2"))
    assert plan["layout"]["name"] == "tp8dp2"
    with pytest.raises(planner.PlanError) as exc:
        planner.plan(request(two, api_key_set=False, node_servers=servers("127.0.0.1", "10.0.0.2"), layout="tp8dp2"))
    assert exc.value.reasons == [
        "layout tp8dp2: node 1's replicas listen on 10.0.0.2 (topolaunch_replica_address), where the gateway reaches "
        "them, without an API key: set topolaunch_api_key (ansible-vault), or topolaunch_listen_without_api_key: "
        "true to serve everyone who reaches that address"]
    # auto: that layout is refused, one server across the nodes is planned instead
    auto = planner.plan(request(two, api_key_set=False, node_servers=servers("127.0.0.1", "10.0.0.2")))
    assert auto["layout"]["dp"] == 1 and "per_node" in auto
    # the inventory's opt-in: a warning instead
    opted = planner.plan(request(two, api_key_set=False, listen_without_api_key=True, layout="tp8dp2",
                                 node_servers=servers("127.0.0.1", "10.0.0.2")))
    assert any("node 1's replicas listen on 10.0.0.2 without an API key" in w for w in opted["warnings"])


@pytest.mark.parametrize("fields, words", [
    ({"gateway_node": 2}, "gateway_node"),
    ({"replica_nodes": "yes"}, "replica_nodes must be true or false, got 'yes'"),
    ({"node_servers": [{"host": "127.0.0.1", "port": 30000, "address": "a b"},
                       {"host": "127.0.0.1", "port": 30001}]},
     "node_servers[0].address (topolaunch_replica_address) must be a host name or address, got 'a b'"),
])
def test_bad_input_is_one_line_naming_the_field(two, fields, words):
    with pytest.raises(planner.PlanError) as exc:
        planner.plan(request(two, layout="tp8dp2", **fields))
    assert any(words in r for r in exc.value.reasons), exc.value.reasons
    assert all("\n" not in r for r in exc.value.reasons)


@pytest.mark.parametrize("name, nodes, problem", [
    ("", ["node0", "node1"], ""),
    ("node1", ["node0", "node1"], ""),
    ("node7", ["node0", "node1"], "topolaunch_gateway_host: 'node7' is not a host of the sglang_servers group "
                                  "(node0, node1, node2)"),
    ("node2", ["node0", "node1"], "topolaunch_gateway_host: 'node2' is not one of topolaunch_nodes (node0, node1), "
                                  "the hosts the replicas run on"),
    ("node1", [], "topolaunch_gateway_host: 'node1' is not this host (node0): with topolaunch_nodes unset the "
                  "replicas and the gateway run on one host"),
    ("node0", [], ""),
])
def test_the_gateway_host_must_be_one_of_the_servers(name, nodes, problem):
    assert gateway_host_problem(name, nodes, ["node0", "node1", "node2"], "node0") == problem
