"""A scripted smg 1.13.0 worker API and replica /v1/loads for the rolling relaunch's unit tests
(tests/unit/plugins/module_utils/test_rolling.py, tests/unit/plugins/modules/test_sglang_gateway_worker.py): an
urllib opener (rolling.Gateway(..., opener=...)) that answers as a running smg 1.13.0 does, shapes trimmed to the
fields read. DELETE /workers/{id} lists the worker "draining" for `settle` more GET /workers (smg's drain settle
time), then drops it; POST /workers for a URL still listed answers 409 WORKER_ALREADY_EXISTS; an added worker is
listed "pending" for `pending` GET /workers, then "ready"."""
import io
import json
import urllib.error

GW, R0, R1 = "http://127.0.0.1:8000", "http://127.0.0.1:30001", "http://127.0.0.1:30002"


def http_error(url, code):
    return urllib.error.HTTPError(url, code, "x", {}, io.BytesIO(b"{}"))


class Smg:
    """The gateway at GW with `workers` (URLs, ready) and each replica's /v1/loads: `inflight` answers, one per
    poll (the last one repeats). `calls`: (method, url, json body, Authorization header)."""

    def __init__(self, workers=(R0,), inflight=(0,), settle=2, pending=1, replica_down=False):
        self.entries = [{"id": "id-%d" % i, "url": u, "status": "ready", "is_healthy": True}
                        for i, u in enumerate(workers)]
        self.inflight, self.settle, self.pending, self.replica_down = list(inflight), settle, pending, replica_down
        self.calls, self.ids = [], len(self.entries)

    def status(self, url):
        return next((e["status"] for e in self.entries if e["url"] == url), None)

    def _list(self):
        out = [dict(e) for e in self.entries]
        for e in list(self.entries):
            e["_polls"] = e.get("_polls", 0) + 1
            if e["status"] == "draining" and e["_polls"] > self.settle:
                self.entries.remove(e)
            elif e["status"] == "pending" and e["_polls"] > self.pending:
                e.update(status="ready", is_healthy=True)
        return {"workers": [{k: v for k, v in e.items() if not k.startswith("_")} for e in out],
                "total": len(out)}

    def __call__(self, req, timeout):
        method, url = req.get_method(), req.full_url
        body = json.loads(req.data) if req.data else None
        self.calls.append((method, url, body, req.get_header("Authorization")))
        if url == GW + "/workers" and method == "GET":
            answer = self._list()
        elif url.startswith(GW + "/workers/") and method == "DELETE":
            e = next(e for e in self.entries if e["id"] == url.rsplit("/", 1)[1])
            e.update(status="draining", is_healthy=False, _polls=0)
            answer = {"status": "accepted", "worker_id": e["id"]}
        elif url == GW + "/workers" and method == "POST":
            if self.status(body["url"]) is not None:
                raise http_error(url, 409)
            self.entries.append({"id": "id-%d" % self.ids, "url": body["url"], "status": "pending",
                                 "is_healthy": False, "_polls": 0})
            self.ids += 1
            answer = {"status": "accepted", "worker_id": "id-%d" % (self.ids - 1), "url": body["url"]}
        elif url.endswith("/v1/loads") and not url.startswith(GW):
            if self.replica_down:
                raise urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
            n = self.inflight.pop(0) if len(self.inflight) > 1 else self.inflight[0]
            answer = {"loads": [{"dp_rank": 0, "num_running_reqs": n, "num_waiting_reqs": 0}]}
        elif url == GW + "/get_loads":
            answer = {"version": "smg-1.13.0", "dp_rank_count": 2, "loads": [
                {"worker": R0, "dp_rank": 0, "num_running_reqs": 3, "num_waiting_reqs": 1},
                {"worker": R1, "dp_rank": 0, "num_running_reqs": 5, "num_waiting_reqs": 0}]}
        else:
            raise http_error(url, 404)
        return io.BytesIO(json.dumps(answer).encode())


class Clock:
    """A monotonic clock that `wait` advances: the tests never sleep."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def wait(self, seconds):
        self.now += seconds
