"""One SGLang server across two lab hosts (inventory/lab-multinode): deploy, layouts, a node failing, a node gone,
a tune over both nodes.

The hosts of inventory/lab-multinode (node0 ssh 2205, node1 ssh 2206, 8 simulated RTX PRO 6000 each, the field
spec; repository 18085; node 0's API on 30200, node 1's health check server on 30201; rendezvous 127.0.0.1:50200)
are booted once from the provisioned layer (tests/lab/labhosts.py: a copy of the inventory in
.lab/inventories/pytest-lab-multinode/, its settings linked, each host's lab_layer added), `ansible-playbook -i
<that copy> deploy.yml` brings the server up (tp8pp2 of GLM-5-NVFP4), and each case drives the user's command
`deploy.yml --tags relaunch`. A fault is injected on one node as in test_rollback.py: the plans the planner made
for a layout (each node's current_plan.json) with SGLANG_SIM_FAULT in node 1's env, passed as topolaunch_plan (an
extra var, read per host).

    .venv/bin/pytest -m lab tests/lab/test_multinode.py
    TL_MULTINODE_INVENTORY=DIR ...   # a copy of the inventory on other ports (its hosts must be node0 and node1)
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest
import yaml

import labhosts

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAB_PY = ROOT / "lab" / "lab.py"
INVENTORY = pathlib.Path(os.environ.get("TL_MULTINODE_INVENTORY") or ROOT / "inventory" / "lab-multinode")
SSH_KEY = ROOT / ".lab" / "ssh" / "id_ed25519"
NODES = ("node0", "node1")

LAB_MISSING = os.geteuid() != 0 or not shutil.which("systemd-nspawn") or not shutil.which("debootstrap")
pytestmark = [pytest.mark.lab, pytest.mark.skipif(LAB_MISSING, reason="needs root, systemd-nspawn and debootstrap")]


def titles(layout_pp, tp, node):
    """SGLang's scheduler titles on `node` for tpN x ppM on two nodes (M // 2 stages per node)."""
    per_node = layout_pp // 2
    return sorted("sglang::scheduler_PP%d_TP%d" % (p, t)
                  for p in range(per_node * node, per_node * (node + 1)) for t in range(tp))


class Cluster:
    def __init__(self, inventory):
        self.inventory = inventory
        hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
        self.hosts = hosts["all"]["children"]["gpu_hosts"]["children"]["sglang_servers"]["hosts"]
        assert sorted(self.hosts) == list(NODES), self.hosts

    def ssh_argv(self, node):
        return ["ssh", "-F", "/dev/null", "-i", str(SSH_KEY), "-p", str(self.hosts[node]["ansible_port"]),
                "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "LogLevel=ERROR", "root@127.0.0.1"]

    def ssh(self, node, command, check=True):
        proc = subprocess.run(self.ssh_argv(node) + [command], capture_output=True, text=True, check=False,
                              timeout=120)
        if check:
            assert proc.returncode == 0, "ssh %s %r: rc %s %s" % (node, command, proc.returncode, proc.stderr)
        return proc.stdout

    def lab(self, *args):
        proc = subprocess.run([sys.executable, str(LAB_PY), "-i", str(self.inventory), *args], capture_output=True,
                              text=True, check=False, timeout=900)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    def play(self, *args):
        """ansible-playbook deploy.yml on both nodes; returns (rc, output, seconds)."""
        env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        started = time.monotonic()
        proc = subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(self.inventory),
                               "deploy.yml", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                              check=False, timeout=900)
        return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started

    def relaunch(self, *args):
        return self.play("--tags", "relaunch", *args)

    def plan(self, node, name="current_plan.json"):
        return json.loads(self.ssh(node, "cat /var/lib/topolaunch/" + name))

    def schedulers(self, node):
        """Titles of the live scheduler processes on `node`, sorted."""
        out = self.ssh(node, "ps -eo stat=,args= | awk '$1 !~ /^Z/ && $2 ~ /^sglang::scheduler/ {print $2}'")
        return sorted(out.split())

    def health(self, node):
        port = self.hosts[node]["topolaunch_port"]
        return self.ssh(node, "curl -s -o /dev/null -w '%%{http_code}' http://127.0.0.1:%d/health || true" % port)

    def assert_serving(self, layout, pp, tp):
        """Both nodes run their part of `layout` (current and last good plan), node 0's API and node 1's health
        check server answer /health 200."""
        for rank, node in enumerate(NODES):
            plan = self.plan(node)
            assert (plan["layout"]["name"], plan["node_rank"], plan["layout"]["nnodes"]) == (layout, rank, 2)
            assert self.plan(node, "last_good_plan.json") == plan
            assert self.schedulers(node) == titles(pp, tp, rank), node
            assert self.health(node) == "200", node


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(labhosts.layered_copy(INVENTORY, "pytest-" + INVENTORY.name))
    c.lab("up")
    try:
        rc, out, _ = c.play()
        assert rc == 0, out[-6000:]
        assert "the ranks of every node are running" in out, out[-4000:]
        yield c
    finally:
        subprocess.run([sys.executable, str(LAB_PY), "-i", str(c.inventory), "down", "--purge"], capture_output=True,
                       text=True, check=False, timeout=300)


@pytest.fixture(scope="module")
def tp4pp4(cluster):
    """Each node's plan of tp4pp4 (launched once), then tp8pp2 back in place."""
    rc, out, _ = cluster.relaunch("-e", "layout=tp4pp4")
    assert rc == 0, out[-6000:]
    cluster.assert_serving("tp4pp4", 4, 4)
    plans = {node: cluster.plan(node) for node in NODES}
    rc, out, _ = cluster.relaunch("-e", "layout=tp8pp2")
    assert rc == 0, out[-6000:]
    return plans


def test_deploy_runs_one_server_over_both_nodes(cluster):
    cluster.assert_serving("tp8pp2", 2, 8)
    plans = [cluster.plan(node) for node in NODES]
    assert plans[0]["per_node"] == plans[1]["per_node"]
    assert plans[0]["cluster_fingerprint"] == plans[1]["cluster_fingerprint"]
    argv = plans[1]["argv"]
    assert argv[argv.index("--node-rank") + 1] == "1" and argv[argv.index("--nnodes") + 1] == "2"
    assert argv[argv.index("--port") + 1] == str(cluster.hosts["node1"]["topolaunch_port"])
    # the inventory's cluster interface (topolaunch_socket_ifname: lo) reaches each node's server environment
    for node in NODES:
        env = cluster.ssh(node, "cat /etc/topolaunch/sglang.env").splitlines()
        assert 'NCCL_SOCKET_IFNAME="lo"' in env and 'GLOO_SOCKET_IFNAME="lo"' in env, env
    # the bench filed its results under the cluster fingerprint (node 0 measured; deploy.yml ran it)
    fingerprint = plans[0]["cluster_fingerprint"]
    assert list((ROOT / "results").glob("*/%s/tp8pp2/*.jsonl" % fingerprint)), fingerprint


def test_second_deploy_changes_nothing_on_either_node(cluster):
    # the running server is left alone on both nodes, and its bench run is found under the cluster fingerprint
    rc, out, _ = cluster.play()
    assert rc == 0, out[-6000:]
    assert out.count("Leaving the server running: the same plan already runs") == 2, out[-6000:]
    assert "tp8pp2 is already measured at this workload" in out, out[-6000:]
    recap = [line.split() for line in out.split("PLAY RECAP", 1)[1].splitlines() if line.startswith(NODES)]
    assert sorted(r[0] for r in recap) == list(NODES) and all("changed=0" in r for r in recap), recap


def test_relaunch_switches_layouts_on_both_nodes(cluster, tp4pp4):
    cluster.assert_serving("tp8pp2", 2, 8)     # tp4pp4 ran, then tp8pp2 came back (the fixture)
    assert tp4pp4["node1"]["per_node"][1]["processes"] == titles(4, 4, 1)


@pytest.mark.parametrize("fault, words", [
    ("crash_during_load", "simulated fault SGLANG_SIM_FAULT=crash_during_load"),
    # node 1's ranks never reach node 0's rendezvous: torch's client timeout after --dist-timeout (20 s here)
    pytest.param("never_join", "The client socket has timed out after 20000ms while trying to connect to (127.0.0.1",
                 marks=pytest.mark.full),
])
def test_node1_failing_at_start_fails_fast_and_both_nodes_roll_back(cluster, tp4pp4, tmp_path, fault, words):
    before = cluster.plan("node0", "last_good_plan.json")
    for node, plan in tp4pp4.items():
        plan = json.loads(json.dumps(plan))
        if node == "node1":
            plan["env"]["SGLANG_SIM_FAULT"] = fault
        (tmp_path / ("plan-%s.json" % node)).write_text(json.dumps(plan))
    extra = {"topolaunch_plan": "{{ lookup('ansible.builtin.file', '%s/plan-' ~ inventory_hostname ~ '.json') "
                                "| from_json }}" % tmp_path}
    # a generous startup timeout: the failure must be seen when it happens, not when the timeout ends
    extra["health_startup_timeout"] = 300
    rc, out, seconds = cluster.relaunch("-e", json.dumps(extra))
    assert rc != 0
    print("%s: the failed relaunch and the rollback took %.0f s" % (fault, seconds))
    # node 1's own log lines say why
    assert words in out, out[-6000:]
    assert "Layout tp4pp4 failed its health check" in out
    assert "Rolled back to the last known good layout tp8pp2" in out, out[-6000:]
    assert seconds < 180, seconds     # plan, the failed start, the rollback (65 s and 82 s here): no wait to 300 s
    cluster.assert_serving("tp8pp2", 2, 8)
    assert cluster.plan("node0", "last_good_plan.json") == before


def test_node1_unreachable_fails_before_anything_stops(cluster):
    cluster.assert_serving("tp8pp2", 2, 8)
    plan_before = cluster.plan("node0")
    cluster.lab("stop", "node1")
    try:
        rc, out, _ = cluster.relaunch("-e", "layout=tp4pp4")
        assert rc != 0
        assert "UNREACHABLE" in out
        assert "This server runs across the nodes node0, node1" in out and "node1 is not in this run" in out, \
            out[-6000:]
        # nothing was stopped, written or launched on node 0 (its server dies by itself, node 1's ranks being gone,
        # and systemd may restart it: that is not ours to prevent)
        assert cluster.plan("node0") == plan_before
        assert "TASK [topolaunch.sglang.cleanup" not in out and "TASK [topolaunch.sglang.launch" not in out
    finally:
        cluster.lab("start", "node1")
    rc, out, _ = cluster.relaunch("-e", "layout=tp8pp2")
    assert rc == 0, out[-6000:]
    cluster.assert_serving("tp8pp2", 2, 8)


def test_a_tune_across_both_nodes_runs_the_measured_winner_and_files_it_with_its_runs(cluster, tmp_path):
    """layout: tune over the two nodes, the lab's truth against the planner (lab_sim_layout_speed: tp4pp4 three
    times faster, tp8pp2 half speed): each candidate is relaunched on both nodes and measured by node 0, the measured
    winner runs on both, and the tune's record is filed under the cluster fingerprint with the runs it measured."""
    extra = {"layout": "tune", "tune_layouts": ["tp8pp2", "tp4pp4"], "lab_sim_layout_speed": "tp4pp4=3,tp8pp2=0.5",
             "topolaunch_results_dir": str(tmp_path / "results"), "topolaunch_artifacts_dir": str(tmp_path / "artifacts")}
    rc, out, seconds = cluster.play("--tags", "topology,relaunch", "-e", json.dumps(extra))
    assert rc == 0, out[-8000:]
    print("the tune of 2 layouts over both nodes took %.0f s" % seconds)
    cluster.assert_serving("tp4pp4", 4, 4)
    plans = [cluster.plan(node) for node in NODES]
    # the plan of the run (saved on the controller) is the measured winner; the unit runs it as it was started for the
    # candidate measured last (the same server: left running)
    saved = [json.loads((tmp_path / "artifacts" / node / "plan.json").read_text()) for node in NODES]
    assert [(p["layout"]["name"], p["source"]) for p in saved] == [("tp4pp4", "measured")] * 2, saved
    fingerprint = plans[0]["cluster_fingerprint"]
    machine = tmp_path / "results" / plans[0]["model_name"] / fingerprint
    for layout in ("tp8pp2", "tp4pp4"):
        assert list((machine / layout).glob("*.jsonl")), layout
    assert len(list(machine.glob("tune-*.json"))) == 1
    assert [p.parent.name for p in (tmp_path / "results").rglob("*.json") if p.parent.parent.name != "plots"
            and p.name.startswith("tune-")] == [fingerprint]
    tune = json.loads(next(machine.glob("tune-*.json")).read_text())
    assert (tune["winner"], tune["winner_source"]) == ("tp4pp4", "measured")
    # the lab's truth back to the planner's: tp8pp2 for whatever runs after this test
    rc, out, _ = cluster.relaunch("-e", "layout=tp8pp2")
    assert rc == 0, out[-6000:]
    cluster.assert_serving("tp8pp2", 2, 8)


# Replicas on several hosts (README "Replicas on several hosts"): tp8dp2 of the same model is one whole TP8 replica
# on each node behind one gateway on node 0 (30200, node 0's port). Replica and gateway metrics ports of this file's
# own (36100-36102): the hosts share one network.
REPLICA_PORTS = (36101, 36102)
REPLICAS = ["-e", "layout=tp8dp2", "-e", json.dumps({"topolaunch_replica_ports": list(REPLICA_PORTS),
                                                     "topolaunch_gateway_metrics_port": 36100})]


def replica_requests(cluster, node, port):
    """A replica's own request counter (sglang:num_requests_total summed; none before its first request: 0)."""
    out = cluster.ssh(node, "curl -s http://127.0.0.1:%d/metrics" % port)
    return sum(float(l.rsplit(" ", 1)[1]) for l in out.splitlines() if l.startswith("sglang:num_requests_total{"))


def ask_gateway(cluster, i):
    body = json.dumps({"text": "%08x q%d" % (i * 2654435761 % 2 ** 32, i), "sampling_params": {"max_new_tokens": 4}})
    return cluster.ssh("node0", "curl -s -o /dev/null -w '%%{http_code}' -m 20 -H 'Content-Type: application/json' "
                       "-d '%s' http://127.0.0.1:%d/generate" % (body, cluster.hosts["node0"]["topolaunch_port"]))


def changed_tasks(out):
    """The tasks of a play's output that changed something, with the host: what a second run should not show."""
    found, task = [], None
    for line in out.splitlines():
        if line.startswith("TASK ["):
            task = line
        elif line.startswith("changed: [") and task:
            found.append("%s %s" % (task.rstrip(" *"), line.split("]", 1)[0] + "]"))
    return found


def test_replicas_on_both_nodes_behind_one_gateway(cluster):
    try:
        rc, out, _ = cluster.relaunch(*REPLICAS)
        assert rc == 0, out[-6000:]
        assert "2 replicas behind the model gateway (cache_aware) on 2 nodes" in out, out[-6000:]
        for index, node in enumerate(NODES):
            unit = "topolaunch-sglang@%d.service" % index
            assert cluster.ssh(node, "systemctl is-active %s" % unit).strip() == "active", node
            assert cluster.ssh(node, "ls /etc/systemd/system | grep -c 'topolaunch-sglang@' || true").strip() == "1"
            plan = cluster.plan(node, "replica-%d/current_plan.json" % index)
            assert (plan["layout"]["name"], sorted(plan["gpu_indices"]), plan["port"]) == (
                "tp8dp2", list(range(8)), REPLICA_PORTS[index]), (node, plan["gpu_indices"])
            # the multi-node server's own unit is gone (stopped, disabled, removed) on both nodes
            assert cluster.ssh(node, "systemctl is-active topolaunch-sglang.service || true").strip() != "active"
        # the gateway runs on node 0 alone and routes to both nodes' replicas
        gateway = "systemctl is-active topolaunch-gateway.service || true"
        assert [cluster.ssh(node, gateway).strip() for node in NODES] == ["active", "inactive"]
        before = [replica_requests(cluster, node, port) for node, port in zip(NODES, REPLICA_PORTS)]
        assert [ask_gateway(cluster, i) for i in range(16)] == ["200"] * 16
        grown = [replica_requests(cluster, node, port) - b for node, port, b in zip(NODES, REPLICA_PORTS, before)]
        assert all(g > 0 for g in grown), grown
        # a restart of the same plan is rolling across the hosts, one host after the other: the endpoint answers
        # a bounded client throughout, and node 1's replica leaves the gateway only once node 0's is back in it
        units = ["topolaunch-sglang@%d.service" % i for i in range(len(NODES))]
        pids = [cluster.ssh(n, "systemctl show -p MainPID --value %s" % u).strip() for n, u in zip(NODES, units)]
        with labhosts.bounded_client(cluster.ssh_argv("node0"), cluster.hosts["node0"]["topolaunch_port"]) as codes:
            rc, out, _ = cluster.relaunch(*REPLICAS, "-e", "launch_force=true")
        assert rc == 0, out[-6000:]
        assert "Rolling relaunch: the layout is unchanged: 2 replicas are replaced one at a time" in out, out[-6000:]
        assert len(codes) > 10 and set(codes) == {"200"}, codes
        after = [cluster.ssh(n, "systemctl show -p MainPID --value %s" % u).strip() for n, u in zip(NODES, units)]
        assert all(a != b for a, b in zip(after, pids)), (pids, after)
        steps = [line for line in out.splitlines() if line.startswith("TASK [")]
        back_0 = next(i for i, line in enumerate(steps) if "Put the replica back into the gateway, " + units[0] in line)
        out_1 = next(i for i, line in enumerate(steps) if "Take the replica out of the gateway and drain it, " + units[1]
                     in line)
        assert back_0 < out_1, steps
        # the bench measures them through the gateway on node 0 (filed under the cluster fingerprint); then a whole
        # deploy changes nothing on either node (the relaunches above pointed the watchdog at the replicas too)
        rc, out, _ = cluster.play("--tags", "bench", *REPLICAS)
        assert rc == 0, out[-6000:]
        fingerprint = cluster.plan("node0", "replica-0/current_plan.json")["cluster_fingerprint"]
        assert list((ROOT / "results").glob("*/%s/tp8dp2/*.jsonl" % fingerprint)), fingerprint
        rc, out, _ = cluster.play(*REPLICAS)
        assert rc == 0, out[-6000:]
        recap = [line.split() for line in out.split("PLAY RECAP", 1)[1].splitlines() if line.startswith(NODES)]
        assert sorted(r[0] for r in recap) == list(NODES) and all("changed=0" in r for r in recap), (
            recap, changed_tasks(out))
    finally:
        rc, out, _ = cluster.relaunch("-e", "layout=tp8pp2")
        assert rc == 0, out[-6000:]
    cluster.assert_serving("tp8pp2", 2, 8)
    for node in NODES:
        left = cluster.ssh(node, "ls /etc/systemd/system | grep -c 'topolaunch-sglang@\\|topolaunch-gateway' || true")
        assert left.strip() == "0", (node, left)
