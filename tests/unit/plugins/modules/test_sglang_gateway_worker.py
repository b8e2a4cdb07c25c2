"""Module sglang_gateway_worker: main() against a scripted gateway and replica - remove and drain, add back,
idempotence, check mode, one-line failures naming the replica, the API key never in its output."""
import functools
import io
import json
import urllib.error

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import rolling
from ansible_collections.topolaunch.sglang.plugins.modules import sglang_gateway_worker

GW, R0, KEY = "http://127.0.0.1:8000", "http://127.0.0.1:30001", "sk-secret-key"


class Smg:
    """A gateway's worker API and a replica's /v1/loads: `inflight` answers, one per poll of the replica."""

    def __init__(self, workers=(R0,), inflight=(0,)):
        self.workers, self.inflight, self.calls = list(workers), list(inflight), []

    def __call__(self, req, timeout):
        method, url = req.get_method(), req.full_url
        self.calls.append((method, url, req.get_header("Authorization")))
        if url == GW + "/workers" and method == "GET":
            answer = {"workers": [{"id": "id-%d" % i, "url": u} for i, u in enumerate(self.workers)]}
        elif url.startswith(GW + "/workers/") and method == "DELETE":
            self.workers.pop(int(url.rsplit("-", 1)[1]))
            answer = {"status": "accepted"}
        elif url == GW + "/workers" and method == "POST":
            self.workers.append(json.loads(req.data)["url"])
            answer = {"status": "accepted", "worker_id": "w"}
        elif url == R0 + "/v1/loads":
            n = self.inflight.pop(0) if len(self.inflight) > 1 else self.inflight[0]
            answer = {"loads": [{"dp_rank": 0, "num_running_reqs": n, "num_waiting_reqs": 0}]}
        else:
            raise urllib.error.HTTPError(url, 404, "x", {}, io.BytesIO(b"{}"))
        return io.BytesIO(json.dumps(answer).encode())


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def wait(self, seconds):
        self.now += seconds


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
    assert rc == 0 and res["changed"] is True and smg.workers == []
    assert [c[1] for c in smg.calls].count(R0 + "/v1/loads") == 3          # polled until nothing was in flight
    assert all(c[2] == "Bearer " + KEY for c in smg.calls) and KEY not in out      # the replica's too
    rc, res, _ = module(smg, state="absent")
    assert rc == 0 and res["changed"] is False                              # already out: drained only


def test_present_adds_it_back_once(module):
    smg = Smg(workers=[])
    rc, res, _ = module(smg, state="present")
    assert rc == 0 and res["changed"] is True and smg.workers == [R0]
    rc, res, _ = module(smg, state="present")
    assert rc == 0 and res["changed"] is False and smg.workers == [R0]


def test_check_mode_only_reads_the_worker_list(module):
    smg = Smg()
    rc, res, _ = module(smg, check_mode=True, state="absent")
    assert rc == 0 and res["changed"] is True and smg.workers == [R0]
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
