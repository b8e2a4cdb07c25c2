"""replicas.py: a DP plan split into replicas (one systemd instance unit each) on the planner's placement."""
import pytest

from plan_cases import model_path, synth_facts
from ansible_collections.topolaunch.sglang.plugins.module_utils import planner, replicas

LLAMA70 = model_path("llama-3.1-70b")


def plan_on(spec, tmp_path, layout="tp4dp2", **kw):
    facts = synth_facts(spec, tmp_path)
    return planner.plan(planner.PlanRequest(topology=facts, model_path=LLAMA70, layout=layout, **kw)), facts


def test_field_spec_tp4dp2_is_one_replica_per_socket(tmp_path):
    plan, facts = plan_on("proxmox-8x-rtx-pro-6000-vnuma", tmp_path)
    reps = replicas.split(plan, facts)
    assert [r["unit"] for r in reps] == ["topolaunch-sglang@0.service", "topolaunch-sglang@1.service"]
    assert [r["gpu_indices"] for r in reps] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [r["numa_nodes"] for r in reps] == [[0, 0, 0, 0], [1, 1, 1, 1]]
    assert [r["port"] for r in reps] == [30001, 30002]
    assert [r["url"] for r in reps] == ["http://127.0.0.1:30001", "http://127.0.0.1:30002"]
    for r in reps:
        argv = r["argv"]
        assert "--dp-size" not in argv
        assert argv.count("--port") == 1 and argv[argv.index("--port") + 1] == str(r["port"])
        assert argv.count("--host") == 1 and argv[argv.index("--host") + 1] == "127.0.0.1"
        assert argv[argv.index("--numa-node"):] == ["--numa-node"] + [str(n) for n in r["numa_nodes"]]
        assert argv[argv.index("--tp-size") + 1] == "4"
        assert r["env"]["CUDA_VISIBLE_DEVICES"] == r["cuda_visible_devices"]
        assert r["warnings"] == []
    assert reps[1]["cuda_visible_devices"] == "4,5,6,7"


def test_socket_interleaved_box_keeps_each_replica_on_its_socket(tmp_path):
    plan, facts = plan_on("interleaved-8x-rtx-pro-6000", tmp_path)
    reps = replicas.split(plan, facts)
    assert [r["gpu_indices"] for r in reps] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert [r["numa_nodes"] for r in reps] == [[0, 0, 0, 0], [1, 1, 1, 1]]
    assert reps[1]["cuda_visible_devices"] == "1,3,5,7"


def test_numa_nodes_from_the_topology_when_the_plan_has_none(tmp_path):
    plan, facts = plan_on("proxmox-8x-rtx-pro-6000-vnuma", tmp_path)
    plan["argv"] = plan["argv"][:plan["argv"].index("--numa-node")]
    assert [r["numa_nodes"] for r in replicas.split(plan, facts)] == [[0, 0, 0, 0], [1, 1, 1, 1]]
    facts["gpus"][5]["numa_node"] = None                      # one unknown node: no binding for that replica
    reps = replicas.split(plan, facts)
    assert reps[0]["numa_nodes"] == [0, 0, 0, 0] and reps[1]["numa_nodes"] is None
    assert "--numa-node" not in reps[1]["argv"]


def test_a_replica_across_numa_islands_is_said(tmp_path):
    plan, facts = plan_on("proxmox-8x-rtx-pro-6000-vnuma", tmp_path)
    plan = dict(plan, tp_groups=[[0, 1, 2, 4], [3, 5, 6, 7]], gpu_indices=[0, 1, 2, 4, 3, 5, 6, 7])
    plan["argv"] = plan["argv"][:plan["argv"].index("--numa-node")]
    reps = replicas.split(plan, facts)
    assert reps[0]["warnings"] == ["replica 0 (GPUs [0, 1, 2, 4]) spans NUMA islands [[0, 1, 2, 3], [4, 5, 6, 7]]"]


def test_pp_stages_belong_to_their_replica(tmp_path):
    plan, facts = plan_on("proxmox-8x-rtx-pro-6000-vnuma", tmp_path, layout="tp2pp2dp2")
    reps = replicas.split(plan, facts)
    groups = plan["tp_groups"]
    assert [r["gpu_indices"] for r in reps] == [groups[0] + groups[1], groups[2] + groups[3]]
    assert all(r["argv"][r["argv"].index("--pp-size") + 1] == "2" for r in reps)


def test_ports_given_and_refused():
    assert replicas.replica_ports(2, 30000, [31000, 31001]) == [31000, 31001]
    with pytest.raises(replicas.ReplicaError, match=r"topolaunch_replica_ports\[1\]: port 30000 is the gateway's"):
        replicas.replica_ports(2, 30000, [31000, 30000])
    with pytest.raises(replicas.ReplicaError, match=r"topolaunch_replica_ports\[1\]: port 31000 is already replica 0"):
        replicas.replica_ports(2, 30000, [31000, 31000])
    with pytest.raises(replicas.ReplicaError, match=r"3 ports \[1, 2, 3\] for 2 replicas"):
        replicas.replica_ports(2, 30000, [1, 2, 3])
    with pytest.raises(replicas.ReplicaError, match=r"topolaunch_replica_ports\[0\]: 'x' is not a port number"):
        replicas.replica_ports(1, 30000, ["x"])
    with pytest.raises(replicas.ReplicaError, match=r"topolaunch_port: 65535 leaves no room"):
        replicas.replica_ports(1, 65535)


def test_bad_plan_and_host_are_refused(tmp_path):
    plan, facts = plan_on("proxmox-8x-rtx-pro-6000-vnuma", tmp_path)
    with pytest.raises(replicas.ReplicaError, match="topolaunch_replica_host: '--evil'"):
        replicas.split(plan, facts, host="--evil")
    with pytest.raises(replicas.ReplicaError, match="topolaunch_replica_host"):
        replicas.split(plan, facts, host="a\nb")
    with pytest.raises(replicas.ReplicaError, match="are not 2 replicas x 1 stages of 4 GPUs"):
        replicas.split(dict(plan, tp_groups=[[0, 1, 2, 3]]), facts)
    with pytest.raises(replicas.ReplicaError, match="not a templated unit name"):
        replicas.unit_name(0, "topolaunch-sglang.service")


def test_replica_plan_is_the_one_plan_shape(tmp_path):
    plan, facts = plan_on("proxmox-8x-rtx-pro-6000-vnuma", tmp_path)
    rep = replicas.split(plan, facts)[1]
    one = replicas.replica_plan(dict(plan, replicas=[rep], gateway={}), rep)
    assert one["argv"] == rep["argv"] and one["port"] == 30002 and one["gpu_indices"] == [4, 5, 6, 7]
    assert one["replica"] == {"index": 1, "unit": "topolaunch-sglang@1.service", "of": 2}
    assert "replicas" not in one and "gateway" not in one
    assert one["layout"] == plan["layout"] and one["model_path"] == plan["model_path"]
    # health checks the replica's own binding: its --numa-node, the node CPUs of the plan's record
    assert rep["numa_nodes"] == [1, 1, 1, 1]
    assert one["numa_bind"]["nodes"] == [1, 1, 1, 1]
    assert one["numa_bind"]["node_cpus"] == plan["numa_bind"]["node_cpus"] == {"0": "0-31", "1": "32-63"}
    unbound = replicas.replica_plan(dict(plan, replicas=[rep]), dict(rep, numa_nodes=None))
    assert "numa_bind" not in unbound


def test_each_replica_runs_the_shared_argv_then_its_own_host_port_and_numa_node(tmp_path):
    plan, facts = plan_on("proxmox-8x-rtx-pro-6000-vnuma", tmp_path)
    reps = replicas.split(plan, facts)
    shared = [r["argv"][:r["argv"].index("--host")] for r in reps]
    assert shared[0] == shared[1] and "--port" not in shared[0] and "--numa-node" not in shared[0]
    for r in reps:
        own = r["argv"][len(shared[0]):]
        assert own == ["--host", "127.0.0.1", "--port", str(r["port"]), "--numa-node"] + [str(r["index"])] * 4
        assert "TOPOLAUNCH_REPLICA_ARGS" not in r["env"]
    with pytest.raises(replicas.ReplicaError, match="topolaunch_replica_host"):
        replicas.split(plan, facts, host="a b")
