"""rolling.py: an unchanged layout with dp >= 2 behind the gateway rolls, anything else replaces all and says why;
topolaunch_drain_timeout must be > 0; the smg worker API client sends the calls smg 1.13.0 answers (shapes taken
from a running smg 1.13.0) and drain is bounded."""
import io
import json
import urllib.error

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import rolling


def rep(i, gpus, numa, port=None, host="127.0.0.1"):
    port = port or 30001 + i
    return {"index": i, "host": host, "port": port, "url": "http://%s:%d" % (host, port), "gpu_indices": gpus,
            "numa_nodes": numa, "unit": "topolaunch-sglang@%d.service" % i}


TWO = [rep(0, [0, 1, 2, 3], ["0"] * 4), rep(1, [4, 5, 6, 7], ["1"] * 4)]


def test_an_unchanged_layout_behind_the_gateway_rolls():
    again = [dict(r, argv=["--mem-fraction-static", "0.8"]) for r in TWO]   # server args change, layout does not
    d = rolling.decide(TWO, again, gateway=True)
    assert d["mode"] == "rolling" and "2 replicas" in d["reason"]


@pytest.mark.parametrize("running,wanted,gateway,says", [
    (TWO, TWO, False, "no gateway"),
    ([TWO[0]], [TWO[0]], True, "dp = 1"),
    ([], TWO, True, "no replica runs yet"),
    (TWO, TWO + [rep(2, [8, 9], ["1", "1"])], True, "dp 2 -> 3"),
    (TWO, [TWO[0], rep(1, [4, 5, 6, 7], ["0"] * 4)], True, "replica 1 moves"),
    (TWO, [rep(0, [0, 1, 2, 3], ["0"] * 4, port=31000), TWO[1]], True, "replica 0 moves"),
])
def test_anything_else_replaces_every_replica_and_says_why(running, wanted, gateway, says):
    d = rolling.decide(running, wanted, gateway)
    assert d["mode"] == "all" and says in d["reason"]


@pytest.mark.parametrize("value,seconds", [(30, 30.0), ("2.5", 2.5), (" 600 ", 600.0)])
def test_drain_timeout_takes_seconds_from_strings_too(value, seconds):
    assert rolling.drain_timeout(value) == seconds


@pytest.mark.parametrize("value", [0, "0", -1, "-3", "soon", None, "nan", "inf"])
def test_a_drain_timeout_not_above_zero_is_refused_naming_the_field(value):
    with pytest.raises(rolling.RollingError) as e:
        rolling.drain_timeout(value)
    assert str(e.value).startswith("topolaunch_drain_timeout: ") and "\n" not in str(e.value)


# Answers of a running smg 1.13.0 (trimmed to the fields read).
WORKERS = {"workers": [{"id": "01a236bf-7224-700f-9161-bb9115d859bb", "url": "http://127.0.0.1:30001",
                        "is_healthy": True, "status": "ready"}], "total": 1}
GET_LOADS = {"version": "smg-1.13.0", "dp_rank_count": 2, "loads": [
    {"worker": "http://127.0.0.1:30001", "dp_rank": 0, "num_running_reqs": 3, "num_waiting_reqs": 1},
    {"worker": "http://127.0.0.1:30002", "dp_rank": 0, "num_running_reqs": 5, "num_waiting_reqs": 0}]}


class Opener:
    def __init__(self, answers):
        self.answers, self.calls = answers, []

    def __call__(self, req, timeout):
        body = json.loads(req.data) if req.data else None
        self.calls.append((req.get_method(), req.full_url, body, req.get_header("Authorization")))
        answer = self.answers[(req.get_method(), req.full_url.split("8000", 1)[1])]
        if isinstance(answer, int):
            raise urllib.error.HTTPError(req.full_url, answer, "x", {}, io.BytesIO(b"{}"))
        return io.BytesIO(json.dumps(answer).encode())


def test_remove_finds_the_worker_by_url_and_deletes_it_by_id():
    op = Opener({("GET", "/workers"): WORKERS, ("DELETE", "/workers/01a236bf-7224-700f-9161-bb9115d859bb"):
                 {"status": "accepted"}})
    gw = rolling.Gateway("http://127.0.0.1:8000/", api_key="k", opener=op)
    assert gw.remove("http://127.0.0.1:30001/") is True
    assert [c[:2] for c in op.calls] == [("GET", "http://127.0.0.1:8000/workers"),
                                         ("DELETE", "http://127.0.0.1:8000/workers/01a236bf-7224-700f-9161-"
                                                    "bb9115d859bb")]
    assert all(c[3] == "Bearer k" for c in op.calls)
    assert gw.remove("http://127.0.0.1:30009") is False                 # not in the pool: nothing deleted
    assert len(op.calls) == 3


def test_add_posts_the_url_and_present_sees_it():
    op = Opener({("POST", "/workers"): {"status": "accepted", "worker_id": "w"}, ("GET", "/workers"): WORKERS})
    gw = rolling.Gateway("http://127.0.0.1:8000", opener=op)
    gw.add("http://127.0.0.1:30001")
    assert op.calls[0][2] == {"url": "http://127.0.0.1:30001"} and op.calls[0][3] is None   # no key: no header
    assert gw.present("http://127.0.0.1:30001") and not gw.present("http://127.0.0.1:30002")


def test_a_gateway_error_is_one_line_naming_the_call():
    gw = rolling.Gateway("http://127.0.0.1:8000", opener=Opener({("POST", "/workers"): 409}))
    with pytest.raises(rolling.RollingError, match=r"^gateway POST /workers: HTTP 409$"):
        gw.add("http://127.0.0.1:30001")


def test_in_flight_sums_a_workers_ranks_from_either_answer():
    assert rolling.in_flight(GET_LOADS, "http://127.0.0.1:30001") == 4
    assert rolling.in_flight(GET_LOADS, "http://127.0.0.1:30002/") == 5
    assert rolling.in_flight(GET_LOADS, "http://127.0.0.1:30003") is None     # removed: the gateway drops it
    own = {"loads": [{"dp_rank": 0, "num_running_reqs": 2, "num_waiting_reqs": 0},
                     {"dp_rank": 1, "num_running_reqs": 0, "num_waiting_reqs": 1}]}   # SGLang's /v1/loads
    assert rolling.in_flight(own) == 3


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def wait(self, seconds):
        self.now += seconds


def test_drain_waits_for_the_last_request_and_no_longer():
    clock, answers = Clock(), iter([3, 1, 0])
    took = rolling.drain(lambda: {"loads": [{"num_running_reqs": next(answers)}]}, "http://r0", 30,
                         clock=clock, wait=clock.wait, interval=1)
    assert took == 2


def test_drain_past_the_timeout_fails_naming_the_replica_and_the_field():
    clock = Clock()
    with pytest.raises(rolling.RollingError, match=r"replica http://r0 still has 2 requests in flight after "
                                                   r"topolaunch_drain_timeout=5s"):
        rolling.drain(lambda: {"loads": [{"num_running_reqs": 2}]}, "http://r0", 5, clock=clock, wait=clock.wait,
                      interval=1)
    assert clock.now == 5


def test_the_sequence_takes_one_replica_through_every_step_before_the_next():
    seq = rolling.sequence([TWO[1], TWO[0]])
    assert seq[:6] == [(0, s) for s in rolling.STEPS] and seq[6:] == [(1, s) for s in rolling.STEPS]
    assert rolling.STEPS.index("remove") < rolling.STEPS.index("drain") < rolling.STEPS.index("cleanup")
    assert rolling.STEPS[-2:] == ("health", "add")          # back in the gateway only once healthy


def test_a_failure_names_the_replica_and_what_was_done_before_it():
    msg = rolling.failed(TWO[1], "health", "no /health answer in 600 s", [0])
    assert "replica 1 (topolaunch-sglang@1.service), step health" in msg and "before it: 0" in msg
    assert "\n" not in msg
    assert rolling.failed(TWO[0], "drain", "x", []).endswith("before it: none")


def _replica_plan(index, gpus, numa, port, unit=None):
    return {"replica": {"index": index, "unit": unit or "topolaunch-sglang@%d.service" % index, "of": 2},
            "host": "127.0.0.1", "port": port, "gpu_indices": gpus,
            "argv": ["python", "-m", "sglang.launch_server", "--host", "127.0.0.1", "--port", str(port),
                     "--numa-node"] + [str(n) for n in numa]}


def test_running_takes_the_active_replicas_layout_from_their_plans():
    plans = [_replica_plan(1, [4, 5], [1, 1], 30002), {"layout": {"name": "tp8"}},      # the single unit's: skipped
             _replica_plan(0, [0, 1], [0, 0], 30001), _replica_plan(2, [6], [1], 30003)]
    states = {"topolaunch-sglang@0.service": "active", "topolaunch-sglang@1.service": "active",
              "topolaunch-sglang@2.service": "failed"}
    got = rolling.running(plans, states)
    assert [r["index"] for r in got] == [0, 1]                                # replica 2's unit does not run
    assert got[1] == {"index": 1, "unit": "topolaunch-sglang@1.service", "host": "127.0.0.1", "port": 30002,
                      "gpu_indices": [4, 5], "numa_nodes": [1, 1]}
    wanted = [dict(r, url="http://127.0.0.1:%d" % r["port"], env={}) for r in got]
    assert rolling.decide(got, wanted, True)["mode"] == "rolling"
    moved = [dict(wanted[0]), dict(wanted[1], numa_nodes=[0, 0])]
    assert "replica 1 moves" in rolling.decide(got, moved, True)["reason"]
