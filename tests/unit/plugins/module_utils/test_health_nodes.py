"""health_nodes and sglang_health on a server across nodes: a worker node is followed to SGLang's health check server
line and asked /health only; every node's scheduler processes (read from a scripted /proc) must be the plan's ranks;
with record=false nothing is recorded until mode record, and every result says what a rollback would go back to."""
import json

import pytest
from ansible_collections.topolaunch.sglang.plugins.module_utils import health, health_nodes, plan_nodes
from health_cases import LOG, ME, Clock, Unit, active

UNIT = "topolaunch-sglang.service"
WORKER_LOG = LOG[:5] + ["[2026-11-30 01:07:12] Dummy health check server started in background thread at "
                        "127.0.0.1:30201"]


def node_plan(rank):
    per_node = [{"node_rank": r, "port": 30200 + r, "host": "127.0.0.1",
                 "processes": plan_nodes.scheduler_titles(8, 2, 1, 2, r)} for r in (0, 1)]
    return {"layout": {"name": "tp8pp2", "tp": 8, "pp": 2, "dp": 1, "ep": 1, "nnodes": 2}, "node_rank": rank,
            "host": "127.0.0.1", "port": 30200 + rank, "model_path": "/srv/models/glm-5-nvfp4",
            "served_model_name": "glm-5-nvfp4", "gpu_indices": list(range(8)), "argv": ["--tp-size", "8"],
            "per_node": per_node}


class FakeProc:
    """A /proc with processes: (title, in our unit?, state)."""

    def __init__(self, root):
        self.root = root
        self.next = 100

    def add(self, title, ours=True, state="S"):
        pid = self.next
        self.next += 1
        d = self.root / str(pid)
        d.mkdir(parents=True)
        (d / "stat").write_text("%d (python3) %s %s\n" % (pid, state, " ".join(["0"] * 19 + ["4242"])))
        (d / "status").write_text("Name:\tpython3\nUid:\t999\t999\t999\t999\n")
        (d / "cmdline").write_bytes(title.encode() + b"\0")
        (d / "comm").write_text("python3\n")
        (d / "cgroup").write_text("0::/system.slice/%s\n" % (UNIT if ours else "other.service"))
        return pid


@pytest.fixture
def proc(tmp_path):
    return FakeProc(tmp_path / "proc")


@pytest.fixture
def state(tmp_path):
    def write(plan):
        (tmp_path / "current_plan.json").write_text(json.dumps(plan, indent=4, sort_keys=True) + "\n")
        return tmp_path
    return write


class Http:
    def __init__(self):
        self.calls = []

    def __call__(self, method, url, body=None, headers=None, timeout=60.0):
        self.calls.append(url)
        return (200, "") if url.endswith("/health") else (404, '{"detail":"Not Found"}')


def _check(state_dir, steps, proc, http, **kw):
    clock = Clock()
    kw.setdefault("verify_server", True)
    return health.check(UNIT, str(state_dir / "current_plan.json"), str(state_dir / "last_good_plan.json"),
                        run=Unit(steps).run, http=http, clock=clock, sleep=clock.sleep, owner=ME,
                        proc_root=str(proc.root), **kw)


@pytest.fixture
def ports_open(monkeypatch):
    monkeypatch.setattr(health, "port_open", lambda host, port, timeout=1.0: port in (30200, 30201))


def test_a_worker_is_ready_at_sglangs_health_check_server_line():
    plan = node_plan(1)
    assert health_nodes.is_worker(plan) and not health_nodes.is_worker(node_plan(0))
    assert not health_nodes.is_worker({"layout": {"nnodes": 1}, "node_rank": 0})
    base = health.milestones("0.5.9")
    keys = health_nodes.milestones(plan, base)
    assert keys[-1] == ("ready", health_nodes.WORKER_READY) and keys[:-1] == base[:-1]
    assert health.milestone(WORKER_LOG, table=keys) == "ready"
    assert health.milestone(LOG, table=keys) == "capture_cuda_graph_end"     # node 0's ready line is not a worker's


def test_worker_verified_by_health_only_and_its_ranks(state, proc, ports_open):
    for title in plan_nodes.scheduler_titles(8, 2, 1, 2, 1):
        proc.add(title)
    proc.add("sglang::scheduler_PP0_TP0", ours=False)                  # another unit's: not counted
    proc.add("/usr/bin/python3 -m sglang.launch_server")                # the launcher itself
    http = Http()
    res = _check(state(node_plan(1)), [(active(), WORKER_LOG)], proc, http)
    assert res["state"] == "ready" and res["verified"] is True and res["worker"] is True
    assert http.calls == ["http://127.0.0.1:30201/health"]
    assert res["last_good_changed"] is True


def test_a_node_missing_a_rank_or_running_another_fails_naming_them(state, proc, ports_open):
    titles = plan_nodes.scheduler_titles(8, 2, 1, 2, 0)
    for title in titles[:7]:
        proc.add(title)
    proc.add("sglang::scheduler_PP0_TP9")
    proc.add(titles[7], state="Z")                                       # a zombie is not a rank
    with pytest.raises(health.HealthError) as exc:
        _check(state(node_plan(0)), [(active(), LOG)], proc, FullServer())
    assert str(exc.value).startswith("node 0 runs 7 of its 8 rank processes in topolaunch-sglang.service: missing "
                                     "sglang::scheduler_PP0_TP7; not in the plan sglang::scheduler_PP0_TP9")
    assert exc.value.result["state"] == "ranks" and exc.value.result["plan"]["node_rank"] == 0


class FullServer(Http):
    """Node 0: the API."""

    def __call__(self, method, url, body=None, headers=None, timeout=60.0):
        self.calls.append(url)
        if url.endswith("/model_info"):
            return 200, json.dumps({"model_path": "/srv/models/glm-5-nvfp4"})
        if url.endswith("/generate"):
            return 200, json.dumps({"text": " Paris", "meta_info": {"completion_tokens": 8}})
        return 200, ""


def test_without_record_nothing_is_written_until_mode_record(state, proc, ports_open, tmp_path):
    for title in plan_nodes.scheduler_titles(8, 2, 1, 2, 0):
        proc.add(title)
    old = dict(node_plan(0), layout={"name": "tp4pp4", "tp": 4, "pp": 4, "nnodes": 2})
    (tmp_path / "last_good_plan.json").write_text(json.dumps(old))
    state_dir = state(node_plan(0))
    res = _check(state_dir, [(active(), LOG)], proc, FullServer(), record=False)
    assert res["verified"] is True and res["last_good_changed"] is False
    assert res["last_good_plan"] == old and res["last_good_differs"] is True
    waiting = _check(state_dir, [(active(), LOG[:2])], proc, FullServer(), record=False, chunk_s=0)
    assert waiting["state"] == "progress" and waiting["last_good_plan"] == old      # every chunk says it
    assert json.loads((tmp_path / "last_good_plan.json").read_text()) == old
    recorded = _check(state_dir, [], proc, FullServer(), mode="record", check_mode=True)
    assert recorded["last_good_changed"] is True and json.loads((tmp_path / "last_good_plan.json").read_text()) == old
    recorded = _check(state_dir, [], proc, FullServer(), mode="record")
    assert recorded == {"state": "recorded", "plan": node_plan(0), "last_good_changed": True}
    assert (tmp_path / "last_good_plan.json").read_text() == (tmp_path / "current_plan.json").read_text()
    assert _check(state_dir, [], proc, FullServer(), mode="record")["last_good_changed"] is False


def test_a_one_node_plan_is_not_asked_for_ranks(state, proc, ports_open):
    plan = dict(node_plan(0), layout={"name": "tp8", "tp": 8, "pp": 1, "nnodes": 1})
    plan.pop("per_node")
    res = _check(state(plan), [(active(), LOG)], proc, FullServer())     # no scheduler process in the fake /proc
    assert res["verified"] is True and "worker" not in res
