"""Rolling replacement of a DP layout's replicas behind the model gateway (issue 22 item 3).

A relaunch that keeps the layout (a restart or launch_force, a server-args change, an SGLang upgrade) and runs
dp >= 2 replicas behind the gateway replaces them one at a time: remove the replica from the gateway, drain it
(its in-flight requests finish, bounded by topolaunch_drain_timeout), clean it up, launch it, check its health, add
it back. A layout change (another replica count, or a replica on other GPUs, NUMA nodes, host or port) replaces
everything as before, and `decide` says so before anything stops. `Gateway` is a small client of smg 1.13.0's
worker API (the routes compiled into its smg_rs binary and documented in smg's docs/reference/api/admin.md):
GET /workers ({"workers": [{"id", "url", "status", "is_healthy", ...}]}), POST /workers {"url": ...} (202 with
worker_id; added in the background, listed "pending" until healthy, then "ready"), DELETE /workers/{id} (202; the
worker is listed "draining", routed no new request, for smg's drain settle time - 5 s by default - and only then
removed; a POST for its URL meanwhile is refused with 409), GET /get_loads ({"loads": [{"worker", "dp_rank",
"num_running_reqs", "num_waiting_reqs", ...}]}), shapes checked against a running smg 1.13.0. smg's drain is that
fixed settle time, not the requests in flight, so a drain polls the replica's own SGLang GET /v1/loads (same
entries, no "worker"), and adding a replica back waits for the old entry to be gone, then for the new one to be
ready. Plain Python 3.9+ stdlib.
"""
import json
import math
import time
import urllib.error
import urllib.request

__all__ = ["RollingError", "GatewayHTTPError", "LAYOUT_KEYS", "ROUTED", "DRAINING", "drain_timeout", "layout", "decide",
           "Gateway", "status", "in_flight", "replica_loads", "drain", "until", "STEPS", "sequence", "failed", "worker",
           "running"]

# What makes a replica's place in the layout: changing any of these is a layout change.
LAYOUT_KEYS = ("index", "host", "port", "gpu_indices", "numa_nodes")


class RollingError(ValueError):
    """Bad input or a failed step of a rolling relaunch: the message names the field or the replica."""


def drain_timeout(value, field="topolaunch_drain_timeout"):
    """The drain bound in seconds: a number > 0 (a string from -e key=value too)."""
    try:
        seconds = float(str(value).strip())
    except (TypeError, ValueError):
        raise RollingError("%s: %r is not a number of seconds" % (field, value)) from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise RollingError("%s: %r must be a number of seconds > 0" % (field, value))
    return seconds


def layout(replicas):
    """The layout of a list of replicas (replicas.split): per replica its index, host, port, GPUs and NUMA nodes."""
    out = []
    for r in replicas or []:
        out.append(tuple((k, json.dumps(r.get(k), sort_keys=True)) for k in LAYOUT_KEYS))
    return sorted(out)


def running(plans, states):
    """The replicas a host runs now, for `decide`: `plans` are the replica plans their units were started with (each
    replica's current_plan.json, replicas.replica_plan), `states` each unit's systemd ActiveState; a replica whose
    unit is not active does not run. Each as {index, unit, host, port, gpu_indices, numa_nodes}."""
    out = []
    for p in plans or []:
        rep = (p or {}).get("replica") or {}
        if rep.get("index") is None or (states or {}).get(rep.get("unit")) != "active":
            continue
        argv = [str(a) for a in p.get("argv") or []]
        numa = None
        if "--numa-node" in argv:
            rest = argv[argv.index("--numa-node") + 1:]
            numa = [int(n) for n in (rest[:next((i for i, a in enumerate(rest) if a.startswith("--")), len(rest))])]
        out.append({"index": int(rep["index"]), "unit": rep.get("unit"), "host": p.get("host"),
                    "port": p.get("port"), "gpu_indices": [int(g) for g in p.get("gpu_indices") or []],
                    "numa_nodes": numa})
    return sorted(out, key=lambda r: r["index"])


def decide(running, wanted, gateway):
    """How to relaunch: {"mode": "rolling" | "all", "reason": ...}. `running`: the replicas the host runs now
    (replicas.split of the running plan; empty when none run), `wanted`: those of the new plan, `gateway`: whether
    the replicas run behind the gateway. Rolling needs the gateway, dp >= 2 and the same layout."""
    n_old, n_new = len(running or []), len(wanted or [])
    if not gateway:
        return {"mode": "all", "reason": "no gateway in front of the replicas: every replica is replaced at once"}
    if n_new < 2:
        return {"mode": "all", "reason": "dp = %d: one replica cannot be replaced while another serves" % n_new}
    if n_old == 0:
        return {"mode": "all", "reason": "no replica runs yet: all %d replicas are launched" % n_new}
    if layout(running) != layout(wanted):
        if n_old != n_new:
            what = "dp %d -> %d" % (n_old, n_new)
        else:
            what = "replica %s moves: GPUs, NUMA nodes, host or port" % ", ".join(map(str, _moved(running, wanted)))
        return {"mode": "all", "reason": "the layout changes (%s): every replica is replaced at once, the endpoint "
                                         "is down until the new replicas are healthy" % what}
    return {"mode": "rolling", "reason": "the layout is unchanged: %d replicas are replaced one at a time behind "
                                         "the gateway" % n_new}


# One replica's turn in a rolling relaunch, in order; the other replicas serve meanwhile.
STEPS = ("remove", "drain", "cleanup", "launch", "health", "add")


def sequence(wanted):
    """The rolling relaunch as (replica index, step) pairs: each replica's STEPS in turn, lowest index first."""
    return [(int(r["index"]), step) for r in sorted(wanted or [], key=lambda r: int(r["index"])) for step in STEPS]


def failed(replica, step, why, done, rolled_back=True):
    """The one-line failure of a rolling relaunch stopped at `replica`'s `step`: it names the replica (unit and
    index), what failed, what became of it (a failed remove or drain stopped nothing: it still runs its old plan;
    a later step rolled it back, unless there was nothing to roll back to: `rolled_back` false, when its last good
    plan is the one that failed, as in a restart of an unchanged layout) and which replicas were replaced before it
    (`done`)."""
    what = ("it was not stopped and still runs its plan" if step in ("remove", "drain")
            else "it was rolled back to its last good plan" if rolled_back
            else "it was not rolled back and does not serve")
    return ("rolling relaunch stopped at replica %s (%s), step %s: %s; %s, replicas replaced before it: %s"
            % (replica.get("index"), replica.get("unit"), step, why, what, ", ".join(str(i) for i in done) or "none"))


def _moved(running, wanted):
    old = {int(r.get("index", -1)): layout([r]) for r in running or []}
    return [int(r.get("index", -1)) for r in wanted or [] if old.get(int(r.get("index", -1))) != layout([r])]


def in_flight(loads, url=None):
    """Requests running or waiting on worker `url`, summed over its dp ranks, from a load answer: smg 1.13.0's
    GET /get_loads ({"loads": [{"worker": url, "dp_rank", "num_running_reqs", "num_waiting_reqs", ...}]}, one entry
    per worker and rank) or SGLang's own GET /v1/loads (the same entries without "worker"; url=None). None when the
    answer holds no entry for it (the gateway no longer polls a removed worker)."""
    entries = [e for e in (loads or {}).get("loads") or [] if isinstance(e, dict)
               and (url is None or str(e.get("worker", "")).rstrip("/") == str(url).rstrip("/"))]
    if not entries:
        return None
    return sum(int(e.get("num_running_reqs") or 0) + int(e.get("num_waiting_reqs") or 0) for e in entries)


class GatewayHTTPError(RollingError):
    """An HTTP error answer of the gateway (or a replica): `code` is its status."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


# smg 1.13.0's worker statuses (GET /workers "status"): a worker is routed to only when "ready"; DELETE /workers/{id}
# turns a ready worker "draining" (no new request) for its drain settle time (smg's --drain-settle-secs, 5 s by
# default) and only then removes it, and POST /workers for a URL still listed (draining too) answers 409
# WORKER_ALREADY_EXISTS; an added worker is listed "pending" until its health check passes.
ROUTED, DRAINING = "ready", "draining"


class Gateway:
    """smg's worker API at `base` (http://host:port); `api_key` (when set) goes in the Authorization header only."""

    def __init__(self, base, api_key=None, timeout=10, opener=None, what="gateway"):
        self.base = str(base).rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.what = what
        self._open = opener or urllib.request.build_opener().open

    def _call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", "Bearer %s" % self.api_key)
        try:
            with self._open(req, timeout=self.timeout) as resp:
                text = resp.read().decode() or "{}"
                return json.loads(text)
        except urllib.error.HTTPError as e:
            raise GatewayHTTPError("%s %s %s: HTTP %s" % (self.what, method, path, e.code), e.code) from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise RollingError("%s %s %s: %s" % (self.what, method, path, getattr(e, "reason", e))) from None

    def workers(self):
        """The gateway's workers: [{..., "id", "url", "status"}] (GET /workers)."""
        answer = self._call("GET", "/workers")
        return answer.get("workers") or [] if isinstance(answer, dict) else answer or []

    def entry(self, url):
        """The gateway's worker `url` ({"id", "url", "status", ...}), None when it does not list it."""
        for w in self.workers():
            if str(w.get("url", "")).rstrip("/") == str(url).rstrip("/"):
                return w
        return None

    def worker_id(self, url):
        w = self.entry(url)
        return None if w is None else w.get("id") or w.get("worker_id")

    def remove(self, url):
        """Take worker `url` out of the pool (DELETE /workers/{id}); False when the gateway does not have it."""
        wid = self.worker_id(url)
        if wid is None:
            return False
        self._call("DELETE", "/workers/%s" % urllib.request.quote(str(wid), safe=""))
        return True

    def add(self, url):
        """Put worker `url` (back) in the pool (POST /workers); the gateway answers 202 and adds it in the
        background: wait with `routed`. With an API key the worker gets it too ("api_key" of the body): smg gives
        a worker added through its API no key of its own, and its backend detection of a replica that enforces
        the key then fails (401), so the worker is never added."""
        return self._call("POST", "/workers", dict({"url": url}, **({"api_key": self.api_key} if self.api_key else {})))

    def present(self, url):
        return self.entry(url) is not None

    def routed(self, url):
        """Whether the gateway routes requests to worker `url` now (listed with status ready)."""
        return status(self.entry(url)) == ROUTED

    def loads(self):
        """smg's load view of every worker (GET /get_loads)."""
        return self._call("GET", "/get_loads")


def status(entry):
    """A /workers entry's status (None: not listed); an entry without one counts as ready when healthy."""
    if entry is None:
        return None
    if entry.get("status"):
        return str(entry["status"]).lower()
    return ROUTED if entry.get("is_healthy", True) else "not_ready"


def replica_loads(url, timeout=10, opener=None, api_key=None):
    """A replica's own load answer (SGLang's GET /v1/loads): what `drain` polls once the gateway has let it go
    (`api_key`: the key the replicas enforce too, in the Authorization header only). A replica that refuses the
    connection (no listener: it stopped) has nothing in flight: {"loads": []}."""
    try:
        return Gateway(url, api_key=api_key, timeout=timeout, opener=opener, what="replica %s" % url)._call(
            "GET", "/v1/loads")
    except GatewayHTTPError:
        raise
    except RollingError as exc:
        if "refused" in str(exc).lower():
            return {"loads": []}
        raise


def drain(loads, url, timeout, clock=time.monotonic, wait=time.sleep, interval=0.5):
    """Wait until replica `url` (already removed from the gateway) has no request in flight, at most `timeout`
    seconds; `loads()` returns its load answer (replica_loads). Returns the seconds it took; raises naming the
    replica and topolaunch_drain_timeout when requests are still in flight at the deadline."""
    start = clock()
    while True:
        n = in_flight(loads(), None)
        if not n:
            return clock() - start
        if clock() - start >= timeout:
            raise RollingError("replica %s still has %d requests in flight after topolaunch_drain_timeout=%gs"
                               % (url, n, timeout))
        wait(interval)


def until(condition, seconds, clock=time.monotonic, wait=time.sleep, interval=0.5):
    """Poll `condition()` until it is true (returns it) or `seconds` have passed (returns its last value)."""
    start = clock()
    while True:
        got = condition()
        if got or clock() - start >= seconds:
            return got
        wait(interval)


def worker(gw, url, state, drain_seconds=120.0, check_mode=False, loads=None, clock=time.monotonic, wait=time.sleep,
           interval=0.5):
    """One replica's gateway step of a rolling relaunch (module sglang_gateway_worker), each wait bounded by
    `drain_seconds` (topolaunch_drain_timeout). state "absent": take worker `url` out of gateway `gw` (a Gateway):
    DELETE it, wait until the gateway no longer routes to it (smg lists it "draining", then not at all), then until
    the replica's own /v1/loads shows nothing in flight. "present": wait until the gateway has finished removing the
    old worker (a POST for a URL still listed draining is refused with 409), add it, and wait until the gateway
    routes to it (status ready). Returns {changed, drained_s}."""
    if state not in ("absent", "present"):
        raise RollingError("state: %r is not absent or present" % (state,))
    seconds = drain_timeout(drain_seconds)
    now = status(gw.entry(url))
    timed = {"clock": clock, "wait": wait, "interval": interval}
    if state == "absent":
        changed = now not in (None, DRAINING)
        if check_mode:
            return {"changed": changed, "drained_s": 0.0}
        if changed:
            gw.remove(url)
        seen = {}

        def out():
            seen["status"] = status(gw.entry(url))
            return seen["status"] in (None, DRAINING)

        if not until(out, seconds, **timed):
            raise RollingError("replica %s: the gateway still lists it %s %gs after it was removed "
                               "(topolaunch_drain_timeout)" % (url, seen["status"], seconds))
        loads = loads or (lambda: replica_loads(url, timeout=gw.timeout, opener=gw._open,  # pylint: disable=protected-access
                                                api_key=gw.api_key))
        return {"changed": changed, "drained_s": drain(loads, url, seconds, **timed)}
    changed = now in (None, DRAINING)
    if check_mode:
        return {"changed": changed, "drained_s": 0.0}
    seen = {"posted": False}

    def routed():
        seen["status"] = status(gw.entry(url))
        if seen["status"] is None and not seen["posted"]:
            try:
                gw.add(url)
                seen["posted"] = True
            except GatewayHTTPError as exc:
                if exc.code != 409:          # 409: listed again meanwhile (still draining): poll on
                    raise
        return seen["status"] == ROUTED

    if not until(routed, seconds, **timed):
        raise RollingError("replica %s: the gateway does not route to it %gs after it was added back (%s; "
                           "topolaunch_drain_timeout)" % (url, seconds, "it lists it %s" % seen["status"]
                                                          if seen["status"] else "it does not list it: the "
                                                          "gateway's journal says why its add failed"))
    return {"changed": changed, "drained_s": 0.0}
