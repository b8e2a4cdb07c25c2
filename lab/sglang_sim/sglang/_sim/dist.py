"""Multi-node (`--nnodes > 1`): torch.distributed's TCP rendezvous and the collectives that follow it.

What real SGLang 0.5.9 does: every scheduler rank calls `init_distributed_environment` (model_runner.py
init_torch_distributed) -> `torch.distributed.init_process_group(backend="nccl",
init_method="tcp://<--dist-init-addr>", world_size=tp*pp, rank=tp*pp_rank + tp_rank, timeout=--dist-timeout)`.
Without --dist-init-addr the method is tcp://127.0.0.1:<nccl port of this node>. The tcp:// method creates a
TCPStore (torch 2.9.1, the version SGLang 0.5.9 pins): global rank 0 hosts it, listening on every local address
at that port; every rank connects as a client, retrying until the timeout, and adds itself to a counter; rank 0
waits until world_size clients joined. With no --dist-timeout the timeout is torch's NCCL default, 10 minutes.
Then the ranks build gloo CPU groups (SGLang gives them a 2 h timeout) and NCCL groups, and all-reduce their
free memory (the "unbalanced" check) and later the memory left after loading; while serving, the scheduler
loops exchange data with their peers every iteration. A peer that dies is noticed at the next collective:
gloo raises "Connection closed by peer".

Here: the same rendezvous over real TCP with torch's texts; rank 0 hosts it, and each rank keeps its connection
to rank 0 as its simulated collective link: a barrier after loading and one after CUDA graph capture (every rank
of every node must get there, so nodes become ready together and a hung node holds the others), heartbeats, and
a closed connection raising gloo's error at the next collective (at once while serving). The exchange carries
each rank's node, GPU and free memory and each node's GPU spec, so that rank 0 reports the whole cluster to the
launcher for the performance model.

Texts: torch 2.9.1's libtorch_cpu (TCPStore.cpp, socket.cpp), gloo's tcp transport (pair.cc) for a lost peer.
The `file:line` in c10d log lines is not 2.9.1's: socket.cpp:1023 and TCPStore.cpp:318 come from a public torch 2.x
log, the others are placeholders. Addresses in them are numeric (torch looks the host name up).
"""
import errno
import json
import logging
import os
import socket
import sys
import threading
import time
import urllib.parse

logger = logging.getLogger("sglang.srt.model_executor.model_runner")

DEFAULT_TIMEOUT = 600  # torch's default_pg_nccl_timeout (10 minutes), used when --dist-timeout is not given
GLOO_TIMEOUT = 7200  # SGLang's GroupCoordinator: gloo CPU groups get timedelta(seconds=120 * 60)
HEARTBEAT = 2.0  # seconds between the simulated link's keep-alive messages
# keys a client waits on while gloo sets up its group; the real names are internal (this text is the simulator's)
INIT_KEYS = "/default_pg/init/"
CLOSED = "Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?"
MODEL_KEYS = ("world_size", "nnodes", "tp", "pp", "model")


class DistError(RuntimeError):
    """torch.distributed.DistError (what the traceback shows)."""


class DistNetworkError(DistError):
    """torch.distributed.DistNetworkError."""


class DistStoreError(DistError):
    """torch.distributed.DistStoreError."""


for _cls in (DistError, DistNetworkError, DistStoreError):
    _cls.__module__ = "torch.distributed"


def c10d_log(level, where, message):
    """A line as torch's C++ logger writes it: `[E1201 14:18:00.707733876 socket.cpp:1023] [c10d] ...`."""
    now = time.time_ns()
    t = time.localtime(now // 1_000_000_000)
    sys.stderr.write("[%s%s %s.%09d %s] [c10d] %s\n" % (level, time.strftime("%m%d", t), time.strftime("%H:%M:%S", t),
                                                        now % 1_000_000_000, where, message))
    sys.stderr.flush()


def gloo_closed(peer):
    return "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer %s" % peer


def gloo_timeout(seconds):
    return ("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting %dms for recv "
            "operation to complete" % (seconds * 1000))


def init_method(dist_init_addr, nccl_port):
    """model_runner: tcp://<dist_init_addr>, else tcp://127.0.0.1:<nccl_port>."""
    return "tcp://%s" % dist_init_addr if dist_init_addr else "tcp://127.0.0.1:%d" % nccl_port


def parse_init_method(url):
    """(host, port) as torch's _tcp_rendezvous_handler reads a tcp:// URL; ValueError with torch's text."""
    result = urllib.parse.urlparse(url)
    port = result.port  # urllib raises ValueError("Port could not be cast to integer value as ...") itself
    if port is None:
        raise ValueError("Error initializing torch.distributed using tcp:// rendezvous: port number missing")
    if not 0 <= port < 2 ** 16:
        raise ValueError("port must have value from 0 to 65535 but was %d." % port)
    return result.hostname, port


def bracket(host, port):
    if host.startswith("::ffff:") and "." in host:  # an IPv4 peer seen by a dual-stack socket
        host = host[len("::ffff:"):]
    return "[%s]:%d" % (host, port)


class Conn:
    """One TCP connection carrying JSON lines; send() is safe from several threads."""

    def __init__(self, sock):
        self.sock = sock
        self.lock = threading.Lock()
        self.rfile = sock.makefile("rb")
        try:
            host, port = sock.getpeername()[:2]
            self.peer = bracket(host, port)
        except OSError:
            self.peer = "[unknown]:0"

    def send(self, obj):
        data = (json.dumps(obj) + "\n").encode()
        with self.lock:
            self.sock.sendall(data)

    def recv(self):
        """The next message, or None when the peer closed the connection."""
        line = self.rfile.readline()
        return json.loads(line) if line else None


class Link:
    """What both ends share: a condition, the lost-peer error, heartbeats."""

    def __init__(self, cfg):
        self.world = cfg["world_size"]
        self.timeout = cfg["timeout"]
        self.cond = threading.Condition()
        self.lost = None  # the error a collective raises once a peer is gone
        self.stopping = False  # 0.5.23: rank 0 broadcast a ShutdownReq; the scheduler loop ends
        self.silence = max(GLOO_TIMEOUT, self.timeout + 60)

    def conns(self):
        raise NotImplementedError

    def start_heartbeat(self):
        def beat():
            while True:
                time.sleep(HEARTBEAT)
                for conn in self.conns():
                    try:
                        conn.send({"op": "hb"})
                    except OSError:
                        pass  # the reader of that connection reports it
        threading.Thread(target=beat, name="dist-heartbeat", daemon=True).start()

    def read_loop(self, conn, on_message, on_lost):
        """Read conn until it closes or stays silent past the collective timeout; on_lost(message) then."""
        conn.sock.settimeout(self.silence)
        try:
            while True:
                msg = conn.recv()
                if msg is None:
                    on_lost(None)
                    return
                on_message(msg)
        except (socket.timeout, TimeoutError):
            on_lost(gloo_timeout(self.silence))
        except (OSError, ValueError):
            on_lost(None)

    def wait_for(self, ready, deadline, on_timeout):
        """Under self.cond: wait until ready() or a lost peer (raises it) or the deadline (raises on_timeout())."""
        while not ready():
            if self.lost:
                raise RuntimeError(self.lost)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise on_timeout()
            self.cond.wait(min(remaining, 1.0))

    def serve_forever(self):
        """Serving: the scheduler loops exchange every iteration; a lost peer raises at once, a ShutdownReq ends the
        loop."""
        with self.cond:
            while not self.lost and not self.stopping:
                self.cond.wait()
            if not self.stopping:
                raise RuntimeError(self.lost)

    def stop(self):
        """This rank's scheduler loop got a ShutdownReq (0.5.23)."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()


class StoreServer(Link):
    """Global rank 0: hosts the TCPStore and the other end of every rank's link."""

    def __init__(self, cfg, me):
        super().__init__(cfg)
        self.joined = {0: me}  # rank -> its join message
        self.links = {}  # rank -> Conn
        self.arrived = {}  # barrier name -> ranks there
        self.warned = set()
        self.started = time.monotonic()
        self.sock = self._listen(cfg["port"])
        threading.Thread(target=self._accept, name="tcpstore-server", daemon=True).start()

    @staticmethod
    def _listen(port):
        """Listen on every local address at port (as the TCPStore server does); torch's text when that fails."""
        last = None
        for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
            try:
                sock = socket.socket(family, socket.SOCK_STREAM)
            except OSError as err:
                last = err
                continue
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # libuv sets it on its TCP binds
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                sock.bind((address, port))
                sock.listen(128)
                return sock
            except OSError as err:
                sock.close()
                last = err
                if err.errno == errno.EADDRINUSE:
                    break
        code = last.errno or 0
        raise DistNetworkError(
            "The server socket has failed to listen on any local network address. port: %d, useIpv6: false, "
            "code: %d, name: %s, message: %s" % (port, -code, errno.errorcode.get(code, "UNKNOWN"),
                                                 os.strerror(code).lower()))

    def conns(self):
        with self.cond:
            return list(self.links.values())

    def _accept(self):
        while True:
            try:
                sock, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._client, args=(Conn(sock),), name="tcpstore-client", daemon=True).start()

    def _mismatch(self, msg):
        mine = self.joined[0]
        rank = msg.get("rank")
        if not isinstance(rank, int) or not 0 <= rank < self.world:
            return "rank %r is outside this job's world of %d ranks" % (rank, self.world)
        if rank in self.joined:
            return "rank %d has joined already (two nodes with the same --node-rank?)" % rank
        diff = ["%s=%r (this job: %r)" % (k, msg.get(k), mine.get(k)) for k in MODEL_KEYS if msg.get(k) != mine.get(k)]
        return ", ".join(diff) if diff else None

    def _client(self, conn):
        try:
            conn.sock.settimeout(self.silence)
            msg = conn.recv()
        except (OSError, ValueError):
            return
        if not msg or msg.get("op") != "join":
            return
        with self.cond:
            problem = self._mismatch(msg)
            if problem:
                node = msg.get("node_rank")
                if node not in self.warned:
                    self.warned.add(node)
                    # Not an SGLang/torch message: real torch does not compare jobs; ranks of different jobs
                    # never complete a rendezvous together, and it times out. The simulator does the same.
                    logger.warning("simulator: node %s rank %s joined the rendezvous with %s: real torch does not "
                                   "check this and the rendezvous does not complete; it is not counted",
                                   node, msg.get("rank"), problem)
                rank = None
            else:
                rank = msg["rank"]
                self.joined[rank] = msg
                self.links[rank] = conn
                self.cond.notify_all()

        def on_message(m):
            if rank is not None and m.get("op") == "barrier":
                with self.cond:
                    self.arrived.setdefault(m["name"], set()).add(rank)
                    self.cond.notify_all()

        def on_lost(message):
            if rank is None:
                return
            with self.cond:
                if self.lost is None:
                    self.lost = message or gloo_closed(conn.peer)
                self.cond.notify_all()

        self.read_loop(conn, on_message, on_lost)

    def wait_joined(self):
        """TCPStore::waitForWorkers: until world_size clients joined; torch's text after the timeout."""
        # torch compares whole elapsed seconds with the timeout: it fails once floor(elapsed) > timeout
        deadline = self.started + self.timeout + 1

        def timed_out():
            elapsed = int(time.monotonic() - self.started)
            return DistStoreError("Timed out after %d seconds waiting for clients. %d/%d clients joined."
                                  % (elapsed, len(self.joined), self.world))

        with self.cond:
            while len(self.joined) < self.world:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise timed_out()
                self.cond.wait(remaining)
            if self.lost:  # a rank that joined and died before the first collective
                raise RuntimeError(self.lost)
            links = dict(self.links)
            go = {"op": "go", "min_avail": min(j["avail"] for j in self.joined.values())}
        for conn in links.values():
            try:
                conn.send(go)
            except OSError:
                pass
        self.start_heartbeat()
        return go["min_avail"]

    def barrier(self, name):
        others = set(range(1, self.world))
        with self.cond:
            self.wait_for(lambda: others <= self.arrived.get(name, set()), time.monotonic() + GLOO_TIMEOUT,
                          lambda: RuntimeError(gloo_timeout(GLOO_TIMEOUT)))
            links = list(self.links.values())
        for conn in links:
            try:
                conn.send({"op": "release", "name": name})
            except OSError:
                pass

    def stop(self):
        """Rank 0 passes the ShutdownReq on to every rank (0.5.23 broadcasts it across the TP ranks)."""
        for conn in self.conns():
            try:
                conn.send({"op": "shutdown"})
            except OSError:
                pass
        super().stop()

    def cluster(self):
        """Per global rank [node, gpu], and each node's GPU spec: what the launcher's performance model needs."""
        world = [[self.joined[r]["node_rank"], self.joined[r]["gpu"]] for r in range(self.world)]
        specs = {str(j["node_rank"]): j["spec"] for j in self.joined.values() if j.get("spec") is not None}
        return {"world": world, "specs": specs}


class StoreClient(Link):
    """Every other rank: a TCPStore client, then one end of the link to rank 0."""

    def __init__(self, cfg, me, never_join=False):
        super().__init__(cfg)
        self.host, self.port = cfg["host"], cfg["port"]
        self.conn = None
        self.go = None
        self.store_closed = False  # the store connection closed before the rendezvous completed
        self.released = set()
        if never_join:
            logger.info("simulator: SGLANG_SIM_FAULT=never_join: this rank's connection attempts to %s never arrive "
                        "(as with packets dropped by a firewall)", bracket(self.host, self.port))
            time.sleep(self.timeout)  # the fault itself: connect() polls until the deadline, nothing answers
            self._timed_out()
        self.conn = self._connect()
        self.conn.send(me)
        threading.Thread(target=self.read_loop, args=(self.conn, self._on_message, self._on_lost),
                         name="tcpstore-client", daemon=True).start()

    def conns(self):
        return [self.conn] if self.conn else []

    def _timed_out(self):
        msg = ("The client socket has timed out after %dms while trying to connect to (%s, %d)."
               % (self.timeout * 1000, self.host, self.port))
        c10d_log("E", "socket.cpp:1023", msg)
        c10d_log("E", "TCPStore.cpp:318", "TCP client failed to connect/validate to host %s:%d - timed out (try=0, "
                 "timeout=%dms): %s" % (self.host, self.port, self.timeout * 1000, msg))
        raise DistNetworkError(msg)

    def _connect(self):
        """SocketConnectOp: retry while nothing listens (quietly) or the host cannot be reached (warnings)."""
        deadline = time.monotonic() + self.timeout
        delay, attempt = 0.05, 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._timed_out()
            errors = []
            try:
                infos = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
            except socket.gaierror as err:  # warned and retried
                c10d_log("W", "socket.cpp:463", "The network addresses of (%s, %d) cannot be retrieved (gai error: "
                         "%d - %s)." % (self.host, self.port, err.errno, err.strerror))
                infos = []
            for family, kind, proto, _, address in infos:
                sock = socket.socket(family, kind, proto)
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                try:
                    sock.connect(address)
                    sock.settimeout(None)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    return Conn(sock)
                except (ConnectionRefusedError, ConnectionResetError):
                    pass  # not listening yet: retried without a word (C10D_TRACE)
                except (socket.timeout, TimeoutError):
                    sock.close()
                    self._timed_out()
                except OSError as err:
                    where = ("[%s]:%d" if family == socket.AF_INET6 else "%s:%d") % address[:2]
                    errors.append("The client socket has failed to connect to %s (errno: %d - %s)."
                                  % (where, err.errno or 0, err.strerror or err))
                    c10d_log("W", "socket.cpp:767", errors[-1])
                sock.close()
            if errors:
                msg = "The client socket has failed to connect to any network address of (%s, %d)." % (
                    self.host, self.port)
                c10d_log("E", "socket.cpp:864", msg)
                c10d_log("W", "TCPStore.cpp:343", "TCP client failed to connect/validate to host %s:%d - retrying "
                         "(try=%d, timeout=%dms, delay=%dms): %s %s" % (self.host, self.port, attempt,
                                                                        self.timeout * 1000, delay * 1000, msg,
                                                                        " ".join(errors)))
                attempt += 1
            if time.monotonic() + delay >= deadline:
                time.sleep(max(deadline - time.monotonic(), 0))
                self._timed_out()
            time.sleep(delay)  # ExponentialBackoffWithJitter, capped here at 1 s
            delay = min(delay * 2, 1.0)

    def _on_message(self, msg):
        op = msg.get("op")
        with self.cond:
            if op == "go":
                self.go = msg
            elif op == "release":
                self.released.add(msg["name"])
            elif op == "shutdown":
                self.stopping = True
            self.cond.notify_all()

    def _on_lost(self, message):
        with self.cond:
            if self.lost is None:
                # before the rendezvous completed the store connection fails; afterwards the gloo link does
                self.lost = message or (gloo_closed(self.conn.peer) if self.go else None)
                self.store_closed = self.go is None and message is None
            self.cond.notify_all()

    def wait_joined(self):
        """After connecting, a client goes on to build SGLang's gloo CPU group, which waits on the store for every
        peer's address with that group's timeout (2 h): in practice until rank 0 completes or gives up."""
        def done():
            if self.store_closed:
                raise DistNetworkError(CLOSED)
            return self.go is not None

        with self.cond:
            self.wait_for(done, time.monotonic() + GLOO_TIMEOUT, lambda: DistStoreError(
                "wait timeout after %dms, keys: %s" % (GLOO_TIMEOUT * 1000, INIT_KEYS)))
        self.start_heartbeat()
        return self.go["min_avail"]

    def barrier(self, name):
        try:
            self.conn.send({"op": "barrier", "name": name})
        except OSError:
            raise RuntimeError(gloo_closed(self.conn.peer)) from None
        with self.cond:
            self.wait_for(lambda: name in self.released, time.monotonic() + GLOO_TIMEOUT,
                          lambda: RuntimeError(gloo_timeout(GLOO_TIMEOUT)))


def init_process_group(cfg, me, never_join=False):
    """The rank's side of init_process_group; returns (link, min free memory over the world)."""
    assert cfg["timeout"] > 0, "timeout must be positive"  # init_distributed_environment's assert
    host, port = parse_init_method(cfg["init_method"])
    cfg = dict(cfg, host=host, port=port)
    if cfg["rank"] == 0:
        link = StoreServer(cfg, me)
    else:
        link = StoreClient(cfg, me, never_join=never_join)
    return link, link.wait_joined()
