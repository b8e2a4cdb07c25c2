"""numa_bind: the plan's record of --numa-node (with the release's crash switch), which GPU each scheduler title
runs, and the health check of each scheduler's binding against a /proc built from recorded files
(tests/fixtures/proc/numa: /proc/<pid>/status and numa_maps of a process bound by set_mempolicy(MPOL_BIND, node 0)
and sched_setaffinity({1}), and of an unbound one, recorded on a 2-CPU Debian 12 machine)."""
import json

import pytest
from ansible_collections.topolaunch.sglang.plugins.module_utils import (health, numa_bind, planner,
                                                                         sglang_facts_0_5_9, sglang_facts_0_5_23)
from paths import FIXTURES
from plan_cases import FIELD_ARGS, FIELD_ARGS_0_5_23, model_path, synth_facts

UNIT = "topolaunch-sglang.service"

RECORDED = FIXTURES / "proc" / "numa"
GPUS = [{"index": i, "numa_node": i // 4, "cpu_affinity": "0" if i < 4 else "1"} for i in range(8)]


def test_the_release_facts_say_how_each_release_binds():
    """Read from the wheels (tools/sglang_facts.py NUMA): both bind through numactl; only 0.5.23 dry-runs it and
    has the switch that makes a failed bind fatal."""
    assert sglang_facts_0_5_23.NUMA["crash_env"] == "SGLANG_CRASH_ON_NUMA_BIND_FAILURE"
    assert sglang_facts_0_5_23.NUMA["probe"] is True
    assert sglang_facts_0_5_9.NUMA["crash_env"] is None and sglang_facts_0_5_9.NUMA["probe"] is False
    assert sglang_facts_0_5_9.NUMA["args"] == "--cpunodebind={numa_node} --membind={numa_node}"


@pytest.mark.parametrize("facts, env", [(sglang_facts_0_5_23.NUMA, {"SGLANG_CRASH_ON_NUMA_BIND_FAILURE": "1"}),
                                        (sglang_facts_0_5_9.NUMA, {})])
def test_the_plan_records_the_nodes_their_cpus_and_the_crash_switch(facts, env):
    record, extra = numa_bind.plan_record(["--tp-size", "8", "--numa-node"] + "0 0 0 0 1 1 1 1".split(), GPUS, facts)
    assert record["nodes"] == [0, 0, 0, 0, 1, 1, 1, 1] and record["node_cpus"] == {"0": "0", "1": "1"}
    assert extra == env and record["crash_env"] == (facts["crash_env"])
    assert numa_bind.plan_record(["--tp-size", "8"], GPUS, facts) == (None, {})


def test_node_cpus_are_the_union_of_the_nodes_gpus_affinity():
    gpus = [{"numa_node": 0, "cpu_affinity": "0-31"}, {"numa_node": 0, "cpu_affinity": "64-95"},
            {"numa_node": 1, "cpu_affinity": "32-63"}, {"numa_node": None, "cpu_affinity": "0-127"},
            {"numa_node": 2, "cpu_affinity": ""}]
    assert numa_bind.node_cpus(gpus) == {"0": "0-31,64-95", "1": "32-63"}


@pytest.mark.parametrize("title, layout, argv, gpu", [
    ("sglang::scheduler", {"tp": 1}, [], 0),
    ("sglang::scheduler_TP5", {"tp": 8}, [], 5),
    ("sglang::scheduler_PP1_TP2", {"tp": 4, "pp": 2}, [], 6),
    ("sglang::scheduler_DP1_TP3", {"tp": 4, "dp": 2}, [], 7),                       # replica 1 on GPUs 4-7
    ("sglang::scheduler_DP1_TP5_EP5", {"tp": 8, "dp": 2, "ep": 8}, ["--enable-dp-attention"], 5),
    ("sglang::scheduler_PP1_TP3", {"tp": 4, "pp": 2, "nnodes": 2}, [], 3),           # node 1 runs PP1 on its 0-3
])
def test_each_scheduler_title_names_its_cuda_device(title, layout, argv, gpu):
    assert numa_bind.scheduler_gpu(title, {"layout": layout, "argv": argv}) == gpu


class FakeProc:
    """A /proc of processes in the unit (the files read_process and numa_bind read)."""

    def __init__(self, root):
        self.root = root
        self.next = 100

    def add(self, title):
        pid = self.next
        self.next += 1
        d = self.root / str(pid)
        d.mkdir(parents=True)
        (d / "stat").write_text("%d (python3) S %s\n" % (pid, " ".join(["0"] * 19 + ["4242"])))
        (d / "cmdline").write_bytes(title.encode() + b"\0")
        (d / "comm").write_text("python3\n")
        (d / "cgroup").write_text("0::/system.slice/%s\n" % UNIT)
        return pid


def bound_proc(tmp_path, procs):
    """A /proc of the unit's launcher (pid 100, CPUs 0-1) and schedulers [(title, recorded name, cpus, node)]: the
    recorded status and numa_maps with the CPUs and bound node put in."""
    proc = FakeProc(tmp_path / "proc")
    launcher = proc.add("python3 -m sglang.launch_server")
    (proc.root / str(launcher) / "status").write_text((RECORDED / "free.status").read_text())
    pids = []
    for title, name, cpus, node in procs:
        pid = proc.add(title)
        status = (RECORDED / ("%s.status" % name)).read_text().replace("PPid:\t17059", "PPid:\t%d" % launcher)
        if cpus is not None:
            status = "\n".join("Cpus_allowed_list:\t%s" % cpus if line.startswith("Cpus_allowed_list:") else line
                               for line in status.splitlines())
        (proc.root / str(pid) / "status").write_text(status)
        maps = (RECORDED / ("%s.numa_maps" % name)).read_text()
        (proc.root / str(pid) / "numa_maps").write_text(maps.replace("bind:0", "bind:%d" % node))
        pids.append((pid, title))
    return proc.root, pids


def sysfs(tmp_path, has_memory="0-1"):
    d = tmp_path / "sys" / "devices" / "system" / "node"
    d.mkdir(parents=True)
    (d / "has_memory").write_text(has_memory + "\n")
    return tmp_path / "sys"


PLAN = {"layout": {"tp": 2}, "argv": ["--tp-size", "2", "--numa-node", "0", "1"],
        "numa_bind": {"nodes": [0, 1], "node_cpus": {"0": "0", "1": "1"}}}


def test_schedulers_bound_as_planned_pass_with_one_line_each(tmp_path):
    root, pids = bound_proc(tmp_path, [("sglang::scheduler_TP0", "bound", "0", 0),
                                       ("sglang::scheduler_TP1", "bound", "1", 1)])
    lines, problems = numa_bind.check(PLAN, pids, root, sysfs(tmp_path))
    assert problems == []
    assert lines == ["sglang::scheduler_TP0 (pid 101, CUDA device 0) runs on CPUs 0 with memory policy bind:0: bound "
                     "to NUMA node 0 as planned",
                     "sglang::scheduler_TP1 (pid 102, CUDA device 1) runs on CPUs 1 with memory policy bind:1: bound "
                     "to NUMA node 1 as planned"]


def test_an_unbound_scheduler_fails_naming_what_it_has_and_what_the_plan_wants(tmp_path):
    """The recorded unbound process (numactl missing: 0.5.23 warned and started it unbound)."""
    root, pids = bound_proc(tmp_path, [("sglang::scheduler_TP0", "bound", "0", 0),
                                       ("sglang::scheduler_TP1", "free", None, 1)])
    lines, problems = numa_bind.check(PLAN, pids, root, sysfs(tmp_path))
    assert len(lines) == 1 and problems == [
        "sglang::scheduler_TP1 (pid 102, CUDA device 1) runs on CPUs 0-1 with memory policy default; the plan's "
        "--numa-node 1 wants CPUs 1 and memory bound to node 1"]


def test_the_wrong_node_fails(tmp_path):
    root, pids = bound_proc(tmp_path, [("sglang::scheduler_TP0", "bound", "1", 1),
                                       ("sglang::scheduler_TP1", "bound", "1", 1)])
    _lines, problems = numa_bind.check(PLAN, pids, root, sysfs(tmp_path))
    assert problems == ["sglang::scheduler_TP0 (pid 101, CUDA device 0) runs on CPUs 1 with memory policy bind:1; "
                        "the plan's --numa-node 0 wants CPUs 0 and memory bound to node 0"]


def test_the_wanted_cpus_are_the_nodes_within_the_launchers(tmp_path):
    """SGLang 0.5.23 binds to node CPUs & sched_getaffinity: a node of CPUs 0-31 on a launcher allowed 0-1 is 0-1;
    a node wholly outside the launcher's CPUs is a failure however the scheduler runs."""
    plan = dict(PLAN, numa_bind={"nodes": [0, 1], "node_cpus": {"0": "0-31", "1": "32-63"}})
    root, pids = bound_proc(tmp_path, [("sglang::scheduler_TP0", "bound", "0-1", 0),
                                       ("sglang::scheduler_TP1", "bound", "0-1", 1)])
    lines, problems = numa_bind.check(plan, pids, root, sysfs(tmp_path))
    assert lines[0].endswith("bound to NUMA node 0 as planned")
    assert problems == ["sglang::scheduler_TP1 (pid 102, CUDA device 1) runs on CPUs 0-1 with memory policy bind:1; "
                        "the plan's --numa-node 1 wants CPUs none (node 1's CPUs 32-63 are all outside the "
                        "launcher's 0-1) and memory bound to node 1"]


def test_a_preferred_policy_passes_and_says_so(tmp_path):
    root, pids = bound_proc(tmp_path, [("sglang::scheduler_TP0", "bound", "0", 0),
                                       ("sglang::scheduler_TP1", "bound", "1", 1)])
    maps = root / str(pids[1][0]) / "numa_maps"
    maps.write_text(maps.read_text().replace("bind:1", "preferred:1"))
    lines, problems = numa_bind.check(PLAN, pids, root, sysfs(tmp_path))
    assert problems == [] and lines[1].endswith(
        "as planned; memory only preferred on node 1 (SGLang fell back from a hard bind)")


def test_memory_on_a_node_without_memory_is_reported_not_checked(tmp_path):
    """numactl cannot bind memory to a node the host has none on; SGLang 0.5.23 binds the CPUs only there."""
    root, pids = bound_proc(tmp_path, [("sglang::scheduler_TP0", "bound", "0", 0),
                                       ("sglang::scheduler_TP1", "free", "1", 1)])
    lines, problems = numa_bind.check(PLAN, pids, root, sysfs(tmp_path, has_memory="0"))
    assert problems == [] and lines[1] == (
        "sglang::scheduler_TP1 (pid 102, CUDA device 1) runs on CPUs 1 with memory policy default: bound to NUMA "
        "node 1 as planned; memory not checked: this host has no memory on node 1 (has_memory 0)")
    root2, pids2 = bound_proc(tmp_path / "b", [("sglang::scheduler_TP0", "free", "0-1", 0)])
    _lines, problems = numa_bind.check(PLAN, pids2, root2, sysfs(tmp_path / "b", has_memory="0"))
    assert problems and "wants CPUs 0 and memory bound to node 0" in problems[0]    # node 0 has memory: checked


def test_a_plan_without_numa_node_checks_nothing(tmp_path):
    assert numa_bind.check({"layout": {"tp": 2}, "argv": []}, [(1, "sglang::scheduler_TP0")]) == ([], [])


def test_health_fails_on_a_binding_other_than_the_plans_and_reports_one_that_is(tmp_path, monkeypatch):
    """health.check after verify: state numa with the problem line (a rollback follows as for any unhealthy
    server); a healthy binding is in the result as numa_bind."""
    root, pids = bound_proc(tmp_path, [("sglang::scheduler_TP0", "bound", "0", 0),
                                       ("sglang::scheduler_TP1", "free", None, 1)])
    monkeypatch.setattr(health.health_nodes, "unit_schedulers", lambda unit, proc_root, pids=False: schedulers)
    schedulers = pids
    monkeypatch.setattr(health, "wait_chunk", lambda *a, **k: {"state": "ready", "looks": 2})
    monkeypatch.setattr(health, "verify", lambda *a, **k: {"url": "http://127.0.0.1:30000"})
    plan_path = tmp_path / "current_plan.json"
    plan_path.write_text(planner_json(PLAN))
    with pytest.raises(health.HealthError) as err:
        health.check(UNIT, str(plan_path), str(tmp_path / "last_good.json"), verify_server=True, proc_root=str(root),
                     sysfs_root=str(sysfs(tmp_path)))
    assert str(err.value).startswith("The NUMA binding is not the plan's: sglang::scheduler_TP1 (pid 102, CUDA "
                                     "device 1) runs on CPUs 0-1 with memory policy default; the plan's")
    assert err.value.result["state"] == "numa" and not (tmp_path / "last_good.json").exists()
    maps = root / str(pids[1][0]) / "numa_maps"
    maps.write_text((RECORDED / "bound.numa_maps").read_text().replace("bind:0", "bind:1"))
    status = root / str(pids[1][0]) / "status"
    status.write_text(status.read_text().replace("Cpus_allowed_list:\t0-1", "Cpus_allowed_list:\t1"))
    result = health.check(UNIT, str(plan_path), str(tmp_path / "last_good.json"), verify_server=True,
                          proc_root=str(root), sysfs_root=str(sysfs(tmp_path / "s")))
    assert result["verified"] and len(result["numa_bind"]) == 2


def planner_json(plan):
    return json.dumps(dict(plan, port=30000, host="127.0.0.1", model_path="/m"))


@pytest.mark.parametrize("version, args, env", [
    ("0.5.23", FIELD_ARGS_0_5_23, {"SGLANG_CRASH_ON_NUMA_BIND_FAILURE": "1"}), ("0.5.9", FIELD_ARGS, None)])
def test_the_planner_puts_the_record_and_the_switch_in_a_plan_with_numa_node(tmp_path, version, args, env):
    """The vnuma field VM: tp8 over both nodes gets --numa-node 0 0 0 0 1 1 1 1, the record with each node's CPUs
    (NVML CPU affinity), and on 0.5.23 the variable that makes a failed bind fatal; 0.5.9 has none (its failed
    bind kills the scheduler anyway)."""
    facts = synth_facts("proxmox-8x-rtx-pro-6000-vnuma", tmp_path)
    plan = planner.plan(planner.PlanRequest(topology=facts, layout="tp8", model_path=model_path("glm-5-nvfp4"),
                                            sglang_version=version, server_args=dict(args)))
    assert plan["argv"][plan["argv"].index("--numa-node"):][:9] == ["--numa-node"] + "0 0 0 0 1 1 1 1".split()
    assert plan["numa_bind"]["nodes"] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert plan["numa_bind"]["node_cpus"] == {"0": "0-31", "1": "32-63"}
    assert plan["env"].get("SGLANG_CRASH_ON_NUMA_BIND_FAILURE") == (env or {}).get("SGLANG_CRASH_ON_NUMA_BIND_FAILURE")
