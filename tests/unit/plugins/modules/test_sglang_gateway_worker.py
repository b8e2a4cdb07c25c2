"""Module sglang_gateway_worker: main() against a scripted gateway and replica - remove and drain, add back,
idempotence, check mode, one-line failures naming the replica, the API key never in its output."""
import functools

import pytest
from gateway_cases import GW, R0, Clock, Smg

from ansible_collections.topolaunch.sglang.plugins.module_utils import rolling
from ansible_collections.topolaunch.sglang.plugins.modules import sglang_gateway_worker

KEY = "sk-secret-key"


@pytest.fixture
def module(run_module, monkeypatch):
    def run(smg, check_mode=False, **args):
        monkeypatch.setattr(sglang_gateway_worker, "Gateway",
                            lambda base, api_key=None, timeout=10: rolling.Gateway(base, api_key, timeout, opener=smg))
        clock = Clock()
        monkeypatch.setattr(sglang_gateway_worker, "worker",
                            functools.partial(rolling.worker, clock=clock, wait=clock.wait))
        return run_module(sglang_gateway_worker, dict({"gateway_url": GW, "url": R0}, **args), check_mode)
    return run


def test_absent_removes_the_worker_and_waits_for_its_requests(module):
    smg = Smg(inflight=[2, 1, 0])
    rc, res, out = module(smg, state="absent", api_key=KEY)
    assert rc == 0 and res["changed"] is True and smg.status(R0) == "draining"   # smg drops it after its settle
    assert [c[1] for c in smg.calls].count(R0 + "/v1/loads") == 3          # polled until nothing was in flight
    assert all(c[3] == "Bearer " + KEY for c in smg.calls) and KEY not in out      # the replica's too
    rc, res, _ = module(smg, state="absent")
    assert rc == 0 and res["changed"] is False                              # already out: drained only


def test_present_adds_it_back_once(module):
    smg = Smg(workers=[])
    rc, res, _ = module(smg, state="present")
    assert rc == 0 and res["changed"] is True and smg.status(R0) == "ready"
    rc, res, _ = module(smg, state="present")
    assert rc == 0 and res["changed"] is False and [c[0] for c in smg.calls].count("POST") == 1


def test_check_mode_only_reads_the_worker_list(module):
    smg = Smg()
    rc, res, _ = module(smg, check_mode=True, state="absent")
    assert rc == 0 and res["changed"] is True and smg.status(R0) == "ready"
    assert {c[0] for c in smg.calls} == {"GET"} and all(c[1] == GW + "/workers" for c in smg.calls)


def test_a_drain_past_its_timeout_fails_naming_the_replica_and_the_field(module):
    rc, res, _ = module(Smg(inflight=[3]), state="absent", drain_timeout=2)
    assert rc == 1 and res["url"] == R0
    assert res["msg"] == "replica %s still has 3 requests in flight after topolaunch_drain_timeout=2s" % R0


def test_a_bad_drain_timeout_or_an_unreachable_gateway_is_one_line(module):
    rc, res, _ = module(Smg(), state="absent", drain_timeout=0)
    assert rc == 1 and res["msg"] == "topolaunch_drain_timeout: 0.0 must be a number of seconds > 0"
    rc, res, _ = module(Smg(), state="absent", gateway_url="http://127.0.0.1:9")
    assert rc == 1 and res["msg"].startswith("gateway GET /workers: HTTP 404") and "\n" not in res["msg"]
