"""rolling.py: an unchanged layout with dp >= 2 behind the gateway rolls, anything else replaces all and says why;
topolaunch_drain_timeout must be > 0; the smg worker API client sends the calls smg 1.13.0 answers (shapes taken
from a running smg 1.13.0) and drain is bounded."""
import io

import pytest
from gateway_cases import GW, R0, R1, Clock, Smg

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


def test_remove_finds_the_worker_by_url_and_deletes_it_by_id():
    smg = Smg(workers=[R0])
    gw = rolling.Gateway(GW + "/", api_key="k", opener=smg)
    assert gw.remove(R0 + "/") is True
    assert [c[:2] for c in smg.calls] == [("GET", GW + "/workers"), ("DELETE", GW + "/workers/id-0")]
    assert all(c[3] == "Bearer k" for c in smg.calls)
    assert gw.remove("http://127.0.0.1:30009") is False                 # not in the pool: nothing deleted
    assert len(smg.calls) == 3


def test_add_posts_the_url_and_the_gateway_routes_to_it_once_ready():
    smg = Smg(workers=[], pending=1)
    gw = rolling.Gateway(GW, opener=smg)
    gw.add(R0)
    assert smg.calls[0][2] == {"url": R0} and smg.calls[0][3] is None   # no key: no header
    assert gw.present(R0) and not gw.routed(R0)                         # pending until its health check passes
    assert gw.routed(R0) and not gw.present(R1)
    keyed = Smg(workers=[])
    rolling.Gateway(GW, api_key="k", opener=keyed).add(R1)
    # smg gives a worker added through its API no key unless the body names it; the replicas enforce it
    assert keyed.calls[0][2] == {"url": R1, "api_key": "k"} and keyed.calls[0][3] == "Bearer k"


def test_a_gateway_error_is_one_line_naming_the_call():
    gw = rolling.Gateway(GW, opener=Smg(workers=[R0]))
    with pytest.raises(rolling.GatewayHTTPError, match=r"^gateway POST /workers: HTTP 409$") as e:
        gw.add(R0)                                                      # smg: WORKER_ALREADY_EXISTS
    assert e.value.code == 409


def test_absent_waits_until_the_gateway_stops_routing_then_drains_the_replica():
    smg, clock = Smg(workers=[R0, R1], inflight=[2, 0]), Clock()
    got = rolling.worker(rolling.Gateway(GW, opener=smg), R0, "absent", 30, clock=clock, wait=clock.wait,
                         interval=1)
    assert got == {"changed": True, "drained_s": 1.0} and smg.status(R0) == "draining"
    assert [c[1] for c in smg.calls].count(R0 + "/v1/loads") == 2
    again = rolling.worker(rolling.Gateway(GW, opener=smg), R0, "absent", 30, clock=clock, wait=clock.wait)
    assert again["changed"] is False and not [c for c in smg.calls if c[0] == "DELETE"][1:]


def test_a_stopped_replica_has_nothing_in_flight():
    smg, clock = Smg(workers=[], replica_down=True), Clock()
    assert rolling.worker(rolling.Gateway(GW, opener=smg), R0, "absent", 30, clock=clock,
                          wait=clock.wait)["changed"] is False


def test_present_waits_for_the_draining_entry_to_go_then_adds_it_and_waits_until_it_is_routed():
    # The bug of the first rolling relaunch: smg still listed the replica "draining" (its 5 s drain settle) when it
    # was added back, so "present" said it was there, and smg then dropped it: one healthy worker for good.
    smg, clock = Smg(workers=[R0, R1], settle=3, pending=2), Clock()
    gw = rolling.Gateway(GW, opener=smg)
    gw.remove(R0)
    got = rolling.worker(gw, R0, "present", 30, clock=clock, wait=clock.wait, interval=1)
    assert got["changed"] is True and smg.status(R0) == "ready"
    assert [c[0] for c in smg.calls].count("POST") == 1
    assert rolling.worker(gw, R0, "present", 30, clock=clock, wait=clock.wait)["changed"] is False


def test_a_worker_the_gateway_never_routes_to_fails_naming_it_and_the_field():
    smg, clock = Smg(workers=[], pending=1000), Clock()
    with pytest.raises(rolling.RollingError, match=r"^replica %s: the gateway does not route to it 5s after it "
                                                   r"was added back \(it lists it pending; "
                                                   r"topolaunch_drain_timeout\)$" % R0):
        rolling.worker(rolling.Gateway(GW, opener=smg), R0, "present", 5, clock=clock, wait=clock.wait, interval=1)
    assert clock.now == 5


def test_an_add_the_gateway_drops_is_posted_once_and_fails_saying_so():
    class Drops(Smg):                               # smg's add job failed in the background (e.g. a 401 detecting it)
        def __call__(self, req, timeout):
            answer = super().__call__(req, timeout)
            self.entries = [e for e in self.entries if e["status"] != "pending"]
            return answer

    smg, clock = Drops(workers=[]), Clock()
    with pytest.raises(rolling.RollingError, match=r"it does not list it: the gateway's journal says why"):
        rolling.worker(rolling.Gateway(GW, opener=smg), R0, "present", 5, clock=clock, wait=clock.wait, interval=1)
    assert [c[0] for c in smg.calls].count("POST") == 1


def test_a_worker_still_routed_after_its_removal_fails_naming_it():
    class Stuck(Smg):                               # a gateway that accepts the DELETE and keeps routing
        def __call__(self, req, timeout):
            if req.get_method() == "DELETE":
                return io.BytesIO(b"{}")
            return super().__call__(req, timeout)

    clock = Clock()
    with pytest.raises(rolling.RollingError, match=r"the gateway still lists it ready 3s after it was removed"):
        rolling.worker(rolling.Gateway(GW, opener=Stuck()), R0, "absent", 3, clock=clock, wait=clock.wait)


def test_in_flight_sums_a_workers_ranks_from_either_answer():
    loads = rolling.Gateway(GW, opener=Smg()).loads()                  # smg's GET /get_loads
    assert rolling.in_flight(loads, R0) == 4
    assert rolling.in_flight(loads, R1 + "/") == 5
    assert rolling.in_flight(loads, "http://127.0.0.1:30003") is None     # removed: the gateway drops it
    own = {"loads": [{"dp_rank": 0, "num_running_reqs": 2, "num_waiting_reqs": 0},
                     {"dp_rank": 1, "num_running_reqs": 0, "num_waiting_reqs": 1}]}   # SGLang's /v1/loads
    assert rolling.in_flight(own) == 3


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
    assert "rolled back to its last good plan" in msg
    # a restart of an unchanged layout: its last good plan is the one that failed, nothing was rolled back
    down = rolling.failed(TWO[1], "health", "x -- No rollback: the last known good plan is the one that failed.", [0],
                          rolled_back=False)
    assert "it was not rolled back and does not serve" in down and "rolled back to" not in down.split(";", 1)[1]
    drained = rolling.failed(TWO[0], "drain", "x", [])
    assert drained.endswith("it was not stopped and still runs its plan, replicas replaced before it: none")


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
