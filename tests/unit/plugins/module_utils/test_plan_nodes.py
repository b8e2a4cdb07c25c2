"""plan_nodes: one server across nodes - SGLang's ranks per node and their titles, nodes that must agree, where a
layout crosses the network; and how planner.plan() uses it (refusals, warnings, per-node listen addresses)."""
import copy

import pytest

from plan_cases import model_path, synth_facts
from topology_cases import load_spec
from ansible_collections.topolaunch.sglang.plugins.module_utils import plan_nodes, planner

VNUMA = "proxmox-8x-rtx-pro-6000-vnuma"
GLM5 = model_path("glm-5-nvfp4")


@pytest.fixture
def two(tmp_path):
    return [synth_facts(VNUMA, tmp_path / "n0"), synth_facts(VNUMA, tmp_path / "n1")]


def request(nodes, **fields):
    base = dict(node_topologies=nodes, nnodes=len(nodes), dist_init_addr="10.0.0.1:50000", model_path=GLM5)
    base.update(fields)
    return planner.PlanRequest(**base)


@pytest.mark.parametrize("tp, pp, ep, nnodes, rank, titles", [
    # TP8 x PP2 on two nodes: stage 0 on node 0, stage 1 on node 1 (SGLang 0.5.9 _launch_scheduler_processes)
    (8, 2, 1, 2, 0, ["sglang::scheduler_PP0_TP%d" % t for t in range(8)]),
    (8, 2, 1, 2, 1, ["sglang::scheduler_PP1_TP%d" % t for t in range(8)]),
    # TP16 on two nodes: TP ranks 8-15 on node 1; no PP part with pp 1
    (16, 1, 1, 2, 1, ["sglang::scheduler_TP%d" % t for t in range(8, 16)]),
    # TP4 x PP4: two stages per node
    (4, 4, 1, 2, 1, ["sglang::scheduler_PP%d_TP%d" % (p, t) for p in (2, 3) for t in range(4)]),
    # EP: moe_ep_rank = tp_rank // (tp / ep)
    (8, 2, 2, 2, 0, ["sglang::scheduler_PP0_TP%d_EP%d" % (t, t // 4) for t in range(8)]),
    # no TP part with tp 1
    (1, 2, 1, 2, 1, ["sglang::scheduler_PP1"]),
])
def test_scheduler_titles_follow_sglangs_mapping(tp, pp, ep, nnodes, rank, titles):
    assert plan_nodes.scheduler_titles(tp, pp, ep, nnodes, rank) == titles


def test_crossings_say_where_the_network_is_crossed():
    assert plan_nodes.crossings(8, 2, 1) == []
    short = [s for s, _ in plan_nodes.crossings(8, 2, 2)]
    assert short == ["PP 0>1", "TP inside nodes"]
    sentences = [t for _, t in plan_nodes.crossings(4, 4, 2)]
    assert sentences[0].startswith("PP stage 1 -> 2 crosses the network from node 0 to node 1")
    assert len(sentences) == 2          # stages 0>1 and 2>3 stay inside a node
    tp16 = plan_nodes.crossings(16, 1, 2)
    assert tp16[0][0] == "TP over 2 nodes" and "(nodes 0-1, 8 GPUs on each)" in tp16[0][1]
    four = [s for s, _ in plan_nodes.crossings(8, 2, 4)]    # each stage's TP group over 2 nodes, stage 0>1 between pairs
    assert four == ["TP over 2 nodes", "PP 0>1"]
    assert "from nodes 0-1 to nodes 2-3" in plan_nodes.crossings(8, 2, 4)[1][1]


def test_identical_nodes_pass(two):
    assert plan_nodes.check_nodes(two) == ([], [])


def test_nodes_that_differ_in_gpu_model_count_or_driver_branch_are_refused(tmp_path, two):
    h100 = synth_facts("hgx-8x-h100-nvswitch", tmp_path / "h100")
    reasons, _ = plan_nodes.check_nodes([two[0], h100])
    assert len(reasons) == 1 and reasons[0].startswith("node 1 differs from node 0 in GPU model")
    assert "NVIDIA H100" in reasons[0] and "RTX PRO 6000" in reasons[0]

    spec = copy.deepcopy(load_spec(VNUMA))
    spec["driver_version"] = "570.172.08"
    older = synth_facts(spec, tmp_path / "570")
    reasons, _ = plan_nodes.check_nodes([two[0], older])
    assert reasons == ["node 1 differs from node 0 in driver branch (driver branch: node 0 580, node 1 570): "
                       + plan_nodes.SAME_NEEDED]

    spec = copy.deepcopy(load_spec("4x-rtx-pro-6000"))
    four = synth_facts(spec, tmp_path / "four")
    reasons, _ = plan_nodes.check_nodes([two[0], four])
    assert "GPU count" in reasons[0] and "node 0 8, node 1 4" in reasons[0]

    # the planner refuses before it plans anything, naming the node
    with pytest.raises(planner.PlanError) as exc:
        planner.plan(request([two[0], older], layout="tp8pp2"))
    assert any(r.startswith("node 1 differs from node 0 in driver branch") for r in exc.value.reasons)


def test_other_fingerprint_differences_are_warnings_that_list_them(tmp_path, two):
    naive = synth_facts("proxmox-8x-rtx-pro-6000-naive", tmp_path / "naive")
    reasons, warnings = plan_nodes.check_nodes([two[0], naive])
    assert reasons == [] and len(warnings) == 1
    assert warnings[0].startswith("node 1's topology differs from node 0's (fingerprints %s, %s) in: "
                                  % (two[0]["fingerprint"], naive["fingerprint"]))
    assert "NUMA islands" in warnings[0] and "P2P matrices" in warnings[0] and "GPU memory" not in warnings[0]
    plan = planner.plan(request([two[0], naive], layout="tp8pp2"))
    assert warnings[0] in plan["warnings"]


def test_tp_stays_inside_a_node_unless_allowed(two):
    with pytest.raises(planner.PlanError) as exc:
        planner.plan(request(two, layout="tp16"))
    assert exc.value.reasons == ["layout tp16: " + plan_nodes.cross_node_tp_reason(16, 1, 2)]
    assert "topolaunch_allow_cross_node_tp: true" in exc.value.reasons[0]
    auto = planner.plan(request(two))
    assert not any(c["valid"] for c in auto["candidates"] if c["tp"] == 16)
    assert auto["layout"]["tp"] <= 8
    allowed = planner.plan(request(two, layout="tp16", allow_cross_node_tp=True))
    assert allowed["layout"]["name"] == "tp16"
    assert any(w.startswith("across nodes: each TP group of 16 spans 2 nodes") for w in allowed["warnings"])


def test_the_plan_says_where_its_layout_crosses_the_network(two):
    plan = planner.plan(request(two, layout="tp4pp4"))
    crossing = [w for w in plan["warnings"] if w.startswith("across nodes: ")]
    assert crossing == ["across nodes: " + t for _, t in plan_nodes.crossings(4, 4, 2)]
    table = "\n".join(planner.candidate_table(plan["candidates"]))
    assert "network: PP 1>2; TP inside nodes" in table
    assert next(c for c in plan["candidates"] if c["name"] == "tp8pp2")["network"] == "PP 0>1; TP inside nodes"
    one = planner.plan(planner.PlanRequest(topology=two[0], model_path=GLM5, layout="tp8"))
    assert "network" not in one["candidates"][0] and not any(w.startswith("across nodes") for w in one["warnings"])


def test_every_node_of_one_plan_listens_where_the_inventory_says(two):
    servers = [{"host": "127.0.0.1", "port": 30200}, {"host": "0.0.0.0", "port": 30201}]
    plans = [planner.plan(request(two, layout="tp8pp2", node_rank=r, node_servers=servers)) for r in (0, 1)]
    assert plans[0]["per_node"] == plans[1]["per_node"]          # one plan, whichever node made it
    for rank, plan in enumerate(plans):
        argv = plan["argv"]
        assert (argv[argv.index("--host") + 1], argv[argv.index("--port") + 1]) == (
            servers[rank]["host"], str(servers[rank]["port"]))
        assert (plan["host"], plan["port"]) == (servers[rank]["host"], servers[rank]["port"])
        assert plan["per_node"][rank]["processes"] == plan_nodes.scheduler_titles(8, 2, 1, 2, rank)
    # default: the request's host and port on every node
    plan = planner.plan(request(two, layout="tp8pp2", port=31000))
    assert [n["port"] for n in plan["per_node"]] == [31000, 31000]


@pytest.mark.parametrize("servers, words", [
    ([{"host": "h", "port": 1}], "node_servers must list one {host, port} per node (2)"),
    ([{"host": "h", "port": 1}, {"host": "", "port": 2}], "node_servers[1].host must be a non-empty string"),
    ([{"host": "h", "port": 1}, {"host": "h", "port": 70000}], "node_servers[1].port must be a port number"),
    ([{"host": "h", "port": 1}, {"host": "-x", "port": 2}], "node_servers[1].host: '-x' looks like a flag"),
])
def test_bad_node_servers_are_refused(two, servers, words):
    with pytest.raises(planner.PlanError) as exc:
        planner.plan(request(two, layout="tp8pp2", node_servers=servers))
    assert any(words in r for r in exc.value.reasons), exc.value.reasons


def test_measurements_of_a_server_across_nodes_count_only_under_its_cluster_fingerprint(two):
    cluster = planner.plan(request(two, layout="tp8pp2"))["cluster_fingerprint"]
    workload = {"input_len": 1024, "output_len": 1024, "concurrency": 128}

    def record(fingerprint, layout):
        return dict(workload, model="glm-5-nvfp4", topology_fingerprint=fingerprint, layout=layout,
                    max_concurrency=128, output_throughput=9999.0)

    # a one-node measurement under node 0's own fingerprint says nothing about the server across nodes
    plan = planner.plan(request(two, measured=[record(two[0]["fingerprint"], "tp4pp4")]))
    assert plan["source"] == "model"
    plan = planner.plan(request(two, measured=[record(cluster, "tp4pp4")]))
    assert (plan["source"], plan["layout"]["name"]) == ("measured", "tp4pp4")
