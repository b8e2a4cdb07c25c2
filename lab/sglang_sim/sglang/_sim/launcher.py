"""`python -m sglang.launch_server`: the launcher process of the simulated server.

Order of events, as in SGLang 0.5.9: parse and check the arguments (argparse errors exit 2, ServerArgs
assertions raise), read the model config, start one scheduler process per (dp, pp, tp) rank and the
detokenizer, wait until every scheduler reports ready (the HTTP port stays closed meanwhile), open the port,
warm up, log "The server is fired up and ready to roll!". A failing scheduler sends SIGQUIT: the launcher
kills its process tree and itself (SIGKILL), as SGLang's launch-phase SIGQUIT handler does. SIGTERM while
serving drains: /health answers 503, in-flight requests finish (checked every SGLANG_SIM_DRAIN_POLL_SECONDS,
5 s as SGLang), then the tree is killed, the launcher last (SIGKILL, as kill_process_tree does).
"""
import http.client
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import sglang
from sglang._sim import flags, gpumem, hardware, logutil, modelcfg, perf, server, validate
from sglang._sim.engine import Engine

logger = logging.getLogger("sglang.srt.entrypoints.engine")
GIB = 1 << 30
MIB = 1 << 20
FAULTS = ("crash_during_load", "hang_during_load", "ignore_sigterm", "orphan_schedulers", "die_after_requests")


class SimConfigError(Exception):
    """A lab knob (SGLANG_SIM_*) has a bad value."""


def env_float(name, default, minimum=0.0):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SimConfigError("%s=%r is not a number" % (name, raw)) from None
    if value < minimum:
        raise SimConfigError("%s=%r must be >= %s" % (name, raw, minimum))
    return value


def parse_faults(raw):
    """{fault: argument} from SGLANG_SIM_FAULT ("ignore_sigterm", "die_after_requests:5", comma-separated)."""
    faults = {}
    for item in filter(None, (part.strip() for part in (raw or "").split(","))):
        name, _, arg = item.partition(":")
        if name not in FAULTS:
            raise SimConfigError("SGLANG_SIM_FAULT: unknown fault %r (known: %s)" % (name, ", ".join(FAULTS)))
        if name == "die_after_requests":
            if not arg.isdigit() or int(arg) < 1:
                raise SimConfigError("SGLANG_SIM_FAULT: die_after_requests needs a positive count, as in "
                                     "die_after_requests:5, got %r" % item)
            faults[name] = int(arg)
        elif arg:
            raise SimConfigError("SGLANG_SIM_FAULT: fault %r takes no argument, got %r" % (name, item))
        else:
            faults[name] = True
    return faults


def scheduler_title(dp_rank, pp_rank, tp_rank, ep_rank, args):
    """run_scheduler_process's prefix: DP/PP/TP/EP parts only where that size is > 1."""
    prefix = ""
    if dp_rank is not None:
        prefix += " DP%d" % dp_rank
    if args.pp_size > 1:
        prefix += " PP%d" % pp_rank
    if args.tp_size > 1:
        prefix += " TP%d" % tp_rank
    if args.ep_size > 1:
        prefix += " EP%d" % ep_rank
    return "sglang::scheduler" + prefix.replace(" ", "_"), prefix


class Launcher:
    def __init__(self, argv):
        self.argv = argv
        self.children = []  # (plan, Popen, status read fd)
        self.state = None
        self.httpd = None
        self.shutting_down = False

    # ------------------------------------------------------------------ setup
    def prepare(self):
        parser = flags.build_parser()
        self.args = args = flags.ServerArgs(parser.parse_args(self.argv))
        logutil.configure(args.log_level)
        self.faults = parse_faults(os.environ.get("SGLANG_SIM_FAULT"))
        if "ignore_sigterm" in self.faults:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self.load_seconds = env_float("SGLANG_SIM_LOAD_SECONDS", 3.0)
        self.capture_seconds = env_float("SGLANG_SIM_CAPTURE_SECONDS", 1.0)
        self.time_scale = env_float("SGLANG_SIM_TIME_SCALE", 0.1)
        self.drain_poll = env_float("SGLANG_SIM_DRAIN_POLL_SECONDS", 5.0, minimum=0.01)
        logger.info(logutil.SIMULATED_BANNER)
        self.spec = hardware.load_spec()
        self.visible = hardware.visible_devices(self.spec)
        gpu_mib = self.spec.gpus[self.visible[0]].memory_total / MIB if self.visible else 0
        args.post_init(gpu_mib)
        args.check()
        if args.nnodes > 1:
            raise NotImplementedError("the lab's SGLang simulator runs single-node servers only (nnodes=%d)"
                                      % args.nnodes)
        logger.info("server_args=%r", args)
        self.model = modelcfg.load(args.model_path)

    def plan_ranks(self):
        args, model, spec = self.args, self.model, self.spec
        tp, pp = args.tp_size, args.pp_size
        dp_attention = bool(args.enable_dp_attention)
        replicas = 1 if dp_attention else args.dp_size
        attn_tp = tp // args.dp_size if dp_attention else tp
        partition = os.environ.get("SGLANG_PP_LAYER_PARTITION")
        construction = validate.construction_error(model, tp, pp, attn_tp, partition)
        try:
            self.stages = validate.pp_layer_split(model.layers, pp, partition)
        except ValueError:
            self.stages = validate.pp_layer_split(model.layers, pp)
        kv_bytes = validate.kv_dtype_bytes(args.kv_cache_dtype)
        weights = model.total_size // (tp * pp)
        graph = 0 if args.disable_cuda_graph else validate.graph_bytes(args.cuda_graph_max_bs)
        ranks = []
        for d in range(replicas):
            for s in range(pp):
                for t in range(tp):
                    ordinal = args.base_gpu_id + d * tp * pp + s * tp + t * args.gpu_id_step
                    nvml = self.visible[ordinal] if ordinal < len(self.visible) else None
                    ranks.append({"d": d, "s": s, "t": t, "ordinal": ordinal, "gpu": nvml})
        avail = {}
        for r in ranks:
            if r["gpu"] is not None and r["gpu"] not in avail:
                g = spec.gpus[r["gpu"]]
                avail[r["gpu"]] = g.memory_total - g.memory_reserved - gpumem.held_by_others(r["gpu"])
        world_avail = [avail[r["gpu"]] for r in ranks if r["gpu"] is not None] or [0]
        plans = []
        for i, r in enumerate(ranks):
            dp_rank = r["d"] if replicas > 1 else None
            ep_rank = r["t"] % args.ep_size if args.ep_size > 1 else 0
            title, prefix = scheduler_title(dp_rank, r["s"], r["t"], ep_rank, args)
            start, end = self.stages[r["s"]]
            cell = int(model.kv_bytes_per_token_layer(attn_tp, kv_bytes) * (end - start)) or 1
            mem = {"total": 0, "plan": {"error": None, "avail_before": 0, "max_total_num_tokens": 0}}
            if r["gpu"] is not None:
                g = spec.gpus[r["gpu"]]
                others = g.memory_total - g.memory_reserved - avail[r["gpu"]]
                mem = {"total": g.memory_total,
                       "plan": validate.memory_plan(g.memory_total, g.memory_reserved, others, weights,
                                                    args.mem_fraction_static, world_avail, tp, cell,
                                                    args.max_total_tokens)}
            mem["graph"] = graph
            mem["disable_cuda_graph"] = bool(args.disable_cuda_graph)
            tokens = mem["plan"]["max_total_num_tokens"]
            plans.append({
                "kind": "scheduler", "rank": i, "title": title, "log_prefix": prefix,
                "dp_rank": r["d"], "pp_rank": r["s"], "tp_rank": r["t"], "cuda_ordinal": r["ordinal"],
                "gpu": r["gpu"], "n_visible": len(self.visible), "memory": mem,
                "construction_error": construction, "model_type": model.architecture,
                "dtype": "torch.bfloat16", "sched": {
                    "chunked_prefill_size": args.chunked_prefill_size,
                    "max_prefill_tokens": args.max_prefill_tokens,
                    "max_running_requests": validate.max_running_requests(
                        tokens, self.context_len(), args.max_running_requests, args.dp_size),
                    "context_len": self.context_len()},
            })
        return plans

    def context_len(self):
        return self.args.context_length or self.model.context_len

    # ------------------------------------------------------------------ processes
    def spawn(self, plan):
        plan.update({"parent_pid": os.getpid(), "orphan": "orphan_schedulers" in self.faults and
                     plan["kind"] == "scheduler", "ignore_sigterm": "ignore_sigterm" in self.faults,
                     "fault": next((f for f in ("crash_during_load", "hang_during_load") if f in self.faults), None),
                     "load_seconds": self.load_seconds, "capture_seconds": self.capture_seconds,
                     "log_level": self.args.log_level})
        read_fd, write_fd = os.pipe()
        env = dict(os.environ, PYTHONEXECUTABLE=sys.executable)
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(sglang.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
        # argv[0] is the title (what ps shows when setproctitle is not installed; the child sets it anyway)
        proc = subprocess.Popen([plan["title"], "-m", "sglang._sim.rank", str(write_fd)], executable=sys.executable,
                                stdin=subprocess.PIPE, pass_fds=(write_fd,), env=env)
        os.close(write_fd)
        proc.stdin.write(json.dumps(plan).encode())
        proc.stdin.close()
        self.children.append((plan, proc, read_fd))

    def kill_tree(self):
        """kill_process_tree(include_parent=False): SIGKILL every child still ours."""
        for plan, proc, _ in self.children:
            if plan.get("orphan"):
                continue  # detached: no longer in our tree (that is the bug being simulated)
            if proc.poll() is None:
                proc.kill()

    def die(self):
        """kill_process_tree(os.getpid()): children, then the launcher itself with SIGKILL."""
        self.kill_tree()
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    def on_sigquit_launch(self, signum, frame):
        logger.error("Received sigquit from a child process. It usually means the child failed.")
        self.die()

    def on_sigquit_running(self, signum, frame):
        logger.error("SIGQUIT received. signum=%r, frame=%r. It usually means one child failed.", signum, frame)
        self.die()

    def wait_ready(self):
        infos = []
        for i, (plan, proc, fd) in enumerate(self.children):
            if plan["kind"] != "scheduler":
                continue
            line = b""
            while not line.endswith(b"\n"):
                data = os.read(fd, 4096)
                if not data:
                    break
                line += data
            if not line:
                logger.error("Rank %d scheduler is dead. Please check if there are relevant logs.", i)
                proc.wait()
                logger.error("Exit code: %s", proc.returncode)
                raise EOFError
            data = json.loads(line)
            if data["status"] != "ready":
                raise RuntimeError("Initialization failed. Please see the error messages above.")
            infos.append(data)
        return infos

    # ------------------------------------------------------------------ serving
    def serve(self, infos, plans):
        args = self.args
        first = plans[0]
        mem = first["memory"]["plan"]
        scheduler_info = {
            "status": "ready",
            "max_total_num_tokens": min(i["max_total_num_tokens"] for i in infos),
            "max_req_input_len": infos[0]["max_req_input_len"],
            "memory_usage": {"weight": round(mem["weights"] / GIB, 2), "kvcache": round(mem["kv_bytes"] / GIB, 2),
                             "token_capacity": min(i["max_total_num_tokens"] for i in infos),
                             "graph": round(first["memory"]["graph"] / GIB, 2)},
        }
        layout = perf.Layout(args.tp_size, args.pp_size, 1 if args.enable_dp_attention else args.dp_size,
                             [p["gpu"] for p in plans], self.stages, overlap=not args.disable_overlap_schedule,
                             kv_dtype_bytes=validate.kv_dtype_bytes(args.kv_cache_dtype))
        model_perf = perf.PerfModel(self.model, self.spec, layout)
        replicas = layout.dp
        engine = Engine(model_perf, self.time_scale, infos[0]["max_running_requests"] * replicas,
                        scheduler_info["max_total_num_tokens"] * replicas)
        self.state = st = server.State(args, self.model, engine, scheduler_info, model_perf.describe(),
                                       self.time_scale)
        if "die_after_requests" in self.faults:
            st.after_generation = self.maybe_die
        try:
            self.httpd = server.HTTPServer(args.host, args.port, st)
        except OSError as err:
            logutil.uvicorn("[Errno %s] error while attempting to bind on address (%r, %d): %s"
                            % (err.errno, args.host, args.port, (err.strerror or str(err)).lower()), "ERROR")
            self.kill_tree()
            return 1
        engine.start()
        logutil.uvicorn("Started server process [%d]" % os.getpid())
        logutil.uvicorn("Waiting for application startup.")
        logutil.uvicorn("Application startup complete.")
        logutil.uvicorn("Uvicorn running on %s (Press CTRL+C to quit)" % self.url())
        signal.signal(signal.SIGQUIT, self.on_sigquit_running)
        if "ignore_sigterm" not in self.faults:
            signal.signal(signal.SIGTERM, self.on_sigterm)
        threading.Thread(target=self.watch_children, name="child-monitor", daemon=True).start()
        threading.Thread(target=self.sigterm_watchdog, name="sigterm-watchdog", daemon=True).start()
        threading.Thread(target=self.warmup, name="warmup", daemon=True).start()
        self.httpd.serve_forever(poll_interval=0.2)
        return 0

    def url(self):
        host = self.args.host
        return "http://%s:%d" % ("[%s]" % host if ":" in host else host, self.args.port)

    def warmup(self):
        st = self.state
        if self.args.skip_server_warmup:
            st.status = "up"
            logger.info("The server is fired up and ready to roll!")
            return
        headers = {server.INTERNAL_HEADER: "warmup", "Content-Type": "application/json"}
        if self.args.api_key:
            headers["Authorization"] = "Bearer %s" % self.args.api_key
        host = "127.0.0.1" if self.args.host in ("0.0.0.0", "") else ("::1" if self.args.host == "::" else
                                                                      self.args.host)
        try:
            conn = http.client.HTTPConnection(host, self.args.port, timeout=600)
            conn.request("GET", "/model_info", headers=headers)
            conn.getresponse().read()
            body = {"text": "The capital city of France is", "sampling_params": {"temperature": 0,
                                                                                  "max_new_tokens": 8}}
            conn.request("POST", "/generate", body=json.dumps(body), headers=headers)
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                raise RuntimeError("warmup /generate answered %d" % resp.status)
        except (OSError, RuntimeError) as err:
            logger.error("Initialization failed. warmup error: %s", err)
            self.die()
        st.status = "up"
        logger.info("The server is fired up and ready to roll!")

    def on_sigterm(self, signum, frame):
        logging.getLogger("sglang.srt.managers.tokenizer_manager").warning(
            "SIGTERM received. signum=%r frame=%r. Draining requests and shutting down...", signum, frame)
        self.state.draining = True

    def sigterm_watchdog(self):
        """TokenizerManager.sigterm_watchdog: notice the flag, drain, kill the tree and the launcher."""
        st = self.state
        while not st.draining:
            time.sleep(self.drain_poll)
        tm_logger = logging.getLogger("sglang.srt.managers.tokenizer_manager")
        while True:
            remaining = st.engine.in_flight()
            tm_logger.info("Gracefully exiting... Remaining number of requests %d. Remaining requests "
                           "remaining_rids=%r.", len(remaining), remaining)
            if not remaining:
                break
            time.sleep(self.drain_poll)
        self.die()

    def watch_children(self):
        """A scheduler or the detokenizer that dies while serving leaves the engine without output."""
        while True:
            for plan, proc, _ in self.children:
                if not plan.get("orphan") and proc.poll() is not None:
                    self.state.engine.stall()
                    return
            time.sleep(0.2)

    def maybe_die(self, count):
        limit = self.faults["die_after_requests"]
        if count >= limit:
            logger.error("simulated fault SGLANG_SIM_FAULT=die_after_requests:%d: %d generation requests answered, "
                         "the server dies now", limit, count)
            self.die()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    logutil.configure()
    launcher = Launcher(argv)
    try:
        launcher.prepare()
    except SimConfigError as err:
        logger.error("simulator: %s", err)
        return 1
    plans = launcher.plan_ranks()
    signal.signal(signal.SIGQUIT, launcher.on_sigquit_launch)
    try:
        for plan in plans:
            launcher.spawn(plan)
        launcher.spawn({"kind": "detokenizer", "title": "sglang::detokenizer", "log_prefix": "", "gpu": None})
        infos = launcher.wait_ready()
        return launcher.serve(infos, plans)
    finally:
        launcher.kill_tree()
