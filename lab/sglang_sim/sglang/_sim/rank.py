"""A simulated SGLang child process: a scheduler rank (`sglang::scheduler_PP0_TP3`) or the detokenizer.

Started by the launcher as `<title> -m sglang._sim.rank STATUS_FD` with its plan as JSON on stdin. A scheduler
walks SGLang's startup milestones, holds its GPU memory through the fake NVML, reports ready (or dies the way
SGLang's scheduler dies: "Scheduler hit an exception", SIGQUIT to the launcher), then idles until killed.
"""
import builtins
import ctypes
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback

from sglang._sim import dist, gpumem, logutil, release
from sglang._sim.validate import oom_message, unbalanced_message

logger = logging.getLogger("sglang.srt.managers.scheduler")
GIB = 1 << 30
PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


def capture_seconds(graph, graphs, plan):
    """One graph's capture time: SGLang captures one forward per batch size (token count) in its list
    (59:model_executor/cuda_graph_runner.py:488-493 `for i, bs in enumerate(capture_range)`; 0.5.23 per phase), so each
    size costs capture_seconds_per_size; a total capture_seconds given is split over the graphs by their sizes."""
    if plan.get("capture_seconds") is None:
        return plan["capture_seconds_per_size"] * len(graph["sizes"])
    sizes = sum(len(g["sizes"]) for g in graphs)
    return plan["capture_seconds"] * len(graph["sizes"]) / sizes if sizes else 0.0


class OutOfMemoryError(RuntimeError):
    """Stands for torch.OutOfMemoryError (printed under that name in tracebacks)."""


OutOfMemoryError.__module__ = "torch"


def set_title(title):
    """setproctitle when installed (as SGLang does); the launcher already put the title in argv[0]."""
    try:
        import setproctitle
    except ImportError:
        setproctitle = None
    if setproctitle is not None:
        setproctitle.setproctitle(title)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NAME, title.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass  # only the short comm name is lost


def die_with_parent(parent_pid):
    """sglang.srt.utils.kill_itself_when_parent_died: SIGKILL when the launcher dies."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


def idle():
    while True:
        signal.pause()


class Scheduler:
    def __init__(self, plan, status_fd):
        self.plan = plan
        self.status_fd = status_fd
        self.mem = plan["memory"]
        self.held = 0
        self.link = None  # the multi-node collective link (dist.py), None on one node
        self.shutdown = threading.Event()
        # 0.5.23 build_scheduler_startup_time (523:sglang/srt/observability/startup_time.py:7-24)
        self.times = {"load_weight": 0.0, "kv_cache_allocation": 0.0, "scheduler_e2e": 0.0,
                      "cuda_graph": dict.fromkeys(("prefill", "decode", "target_verify", "draft_prefill",
                                                   "draft_decode", "draft_extend"), 0.0)}

    def hold(self, nbytes):
        self.held = int(nbytes)
        gpumem.register(self.plan["gpu"], self.held)

    def avail(self):
        return (self.mem["plan"]["avail_before"] - self.held) / GIB

    def fail(self, exc_name, message):
        if exc_name == "OutOfMemoryError":
            raise OutOfMemoryError(message)
        raise getattr(builtins, exc_name)(message)

    def run(self):
        plan, mem = self.plan, self.mem
        error = mem["plan"]["error"]
        if plan["gpu"] is None:
            if plan["n_visible"] == 0:
                raise RuntimeError("No CUDA GPUs are available")
            raise RuntimeError(
                "CUDA error: invalid device ordinal\nCUDA kernel errors might be asynchronously reported at some "
                "other API call, so the stacktrace below might be incorrect.\nFor debugging consider passing "
                "CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")
        started = time.perf_counter()
        newer = release.at_least("0.5.23")
        # 59:model_executor/model_runner.py:731, 850; 523:sglang/srt/distributed/bootstrap.py:115, 190, 219-222
        logger.info("Init parallel begin." if newer else "Init torch distributed begin.")
        tic = time.perf_counter()
        self.hold(mem["plan"]["context"])
        if error and error[0] == "init":
            self.fail(error[1], error[2])
        if plan["dist"]:
            self.init_distributed()
        if newer:
            logger.info("Init parallel ends. elapsed=%.2f s", time.perf_counter() - tic)
            logger.info("Memory baseline taken. mem usage=%.2f GB", self.held / GIB)
        else:
            logger.info("Init torch distributed ends. elapsed=%.2f s, mem usage=%.2f GB",
                        time.perf_counter() - tic, self.held / GIB)
        self.times["load_weight"] = self.load_weights()
        self.collective("load")  # profile_max_num_token all-reduces the memory left after loading
        self.memory_pool()
        self.capture()
        self.collective("capture")  # graph capture runs forwards with the TP/PP groups
        if plan["tp_rank"] == 0:
            s = plan["sched"]
            logger.info(
                "max_total_num_tokens=%d, chunked_prefill_size=%s, max_prefill_tokens=%s, max_running_requests=%d, "
                "context_len=%d, available_gpu_mem=%.2f GB", mem["plan"]["max_total_num_tokens"],
                s["chunked_prefill_size"], s["max_prefill_tokens"], s["max_running_requests"], s["context_len"],
                self.avail())
        self.times["scheduler_e2e"] = time.perf_counter() - started
        ready = {"status": "ready", "max_total_num_tokens": mem["plan"]["max_total_num_tokens"],
                 "max_req_input_len": plan["sched"]["context_len"] - 5,
                 "max_running_requests": plan["sched"]["max_running_requests"], "startup_time": self.times}
        if isinstance(self.link, dist.StoreServer):
            ready["cluster"] = self.link.cluster()
        self.report(ready)

    def init_distributed(self):
        """init_process_group over tcp:// (dist.py), then the world's free memory check (all-reduced minimum)."""
        cfg = self.plan["dist"]
        avail = self.mem["plan"]["avail_before"]
        me = {"op": "join", "rank": cfg["rank"], "node_rank": cfg["node_rank"], "gpu": self.plan["gpu"],
              "avail": avail, "spec": cfg.get("spec")}
        me.update({k: cfg[k] for k in dist.MODEL_KEYS})
        self.link, world_min = dist.init_process_group(cfg, me, never_join=self.plan["fault"] == "never_join")
        if cfg["tp"] > 1 and world_min < avail * 0.9:
            self.fail("RuntimeError", unbalanced_message(world_min, avail))

    def collective(self, name):
        if self.link is not None:
            self.link.barrier(name)

    def wait(self):
        """Serving: idle until killed or, in 0.5.23, until a ShutdownReq; on several nodes, until a peer is lost
        (raised as gloo raises it) or rank 0 broadcasts the ShutdownReq."""
        if self.link is None:
            while not self.shutdown.wait(1.0):
                pass
            return
        self.link.serve_forever()

    def on_shutdown_req(self):
        """0.5.23's ShutdownReq (523:sglang/srt/managers/scheduler.py:6170-6173): the event loop ends and the
        process releases its GPU memory and exits 0 (:6367-6393). Rank 0 broadcasts it to every TP rank, other
        nodes' included (523:sglang/srt/managers/io_struct.py:2412-2415)."""
        self.shutdown.set()
        if self.link is not None:
            self.link.stop()

    def load_weights(self):
        plan, mem = self.plan, self.mem
        logger.info("Load weight begin. avail mem=%.2f GB", self.avail())
        tic = time.perf_counter()
        if plan["construction_error"]:
            self.fail(*plan["construction_error"])
        fault = plan["fault"]
        weights = mem["plan"]["weights"]
        oom_at = mem["plan"].get("oom_after_bytes")
        steps = 20
        for i in range(1, steps + 1):
            if fault == "hang_during_load" and i > steps // 3:
                idle()  # never returns: the port never opens
            if fault == "crash_during_load" and i > steps // 2 and plan["rank"] == 0:
                raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated fault "
                                   "SGLANG_SIM_FAULT=crash_during_load)")
            time.sleep(plan["load_seconds"] / steps)
            loaded = weights * i / steps
            if oom_at is not None and loaded > oom_at:
                self.hold(mem["plan"]["context"] + oom_at)
                total = mem["total"]
                free = mem["plan"]["avail_before"] - self.held
                self.fail("OutOfMemoryError", oom_message(plan["cuda_ordinal"], total, free, self.held, weights / steps))
            self.hold(mem["plan"]["context"] + loaded)
        elapsed = time.perf_counter() - tic
        if release.at_least("0.5.23"):  # the quantization instead of the dtype (523:model_runner.py:1372-1379)
            logger.info("Load weight end. elapsed=%.2f s, type=%s, %savail mem=%.2f GB, mem usage=%.2f GB.",
                        elapsed, plan["model_type"], plan["quant"] + ", " if plan["quant"] else "",
                        self.avail(), weights / GIB)
        else:  # 59:model_executor/model_runner.py:1040-1047
            logger.info("Load weight end. elapsed=%.2f s, type=%s, dtype=%s, avail mem=%.2f GB, mem usage=%.2f GB.",
                        elapsed, plan["model_type"], plan["dtype"], self.avail(), weights / GIB)
        return elapsed

    def memory_pool(self):
        mem = self.mem
        error = mem["plan"]["error"]
        if error and error[0] == "kv":
            self.fail(error[1], error[2])
        kv = mem["plan"]["kv_bytes"]
        self.hold(self.held + kv)
        # one latent cache with MLA, K and V halves otherwise (59:mem_cache/memory_pool.py:650-658); 0.5.23 names
        # the cache dtype (523:sglang/srt/mem_cache/memory_pool.py:2073-2098)
        dtype = "dtype: %s, " % self.plan["kv_dtype"] if release.at_least("0.5.23") else ""
        tokens = mem["plan"]["max_total_num_tokens"]
        if self.plan["mla"]:
            logger.info("KV Cache is allocated. %s#tokens: %d, KV size: %.2f GB", dtype, tokens, kv / GIB)
        else:
            logger.info("KV Cache is allocated. %s#tokens: %d, K size: %.2f GB, V size: %.2f GB", dtype, tokens,
                        kv / 2 / GIB, kv / 2 / GIB)
        logger.info("Memory pool end. avail mem=%.2f GB", self.avail())

    def capture(self):
        """CUDA graph capture, one graph per phase in SGLang's order (ServerArgs.graphs): 0.5.9's single graph
        (59:model_executor/model_runner.py:2146-2163), 0.5.23's prefill then decode graphs
        (523:model_executor/model_runner_components/cuda_graph_setup.py:684-700, 757-791)."""
        newer = release.at_least("0.5.23")
        graphs = self.mem["graphs"]
        for graph in graphs:
            seconds = capture_seconds(graph, graphs, self.plan)
            before = self.avail()
            tic = time.perf_counter()
            if not newer:
                logger.info("Capture cuda graph begin. This can take up to several minutes. avail mem=%.2f GB", before)
            elif graph["phase"] == "prefill":
                logger.info("Capture target prefill CUDA graph begin. backend=%s, num_tokens=%s, avail mem=%.2f GB",
                            graph["backend"], graph["sizes"], before)
            else:
                logger.info("Capture target decode CUDA graph begin. backend=%s, num_tokens_per_req=1, avail "
                            "mem=%.2f GB", graph["backend"], before)
            time.sleep(seconds)
            self.hold(self.held + graph["bytes"])
            elapsed, usage = time.perf_counter() - tic, graph["bytes"] / GIB
            self.times["cuda_graph"][graph["phase"]] = elapsed
            if not newer:
                logger.info("Capture cuda graph end. Time elapsed: %.2f s. mem usage=%.2f GB. avail mem=%.2f GB.",
                            elapsed, usage, self.avail())
            elif graph["phase"] == "prefill":
                logger.info("Capture target prefill CUDA graph end. elapsed=%.2f s, mem usage=%.2f GB, avail "
                            "mem=%.2f GB.", elapsed, usage, self.avail())
            else:
                logger.info("Capture target decode CUDA graph end. bs=%s, elapsed=%.2f s, mem usage=%.2f GB, avail "
                            "mem=%.2f GB.", graph["sizes"], elapsed, usage, self.avail())

    def report(self, message):
        os.write(self.status_fd, (json.dumps(message) + "\n").encode())


def _terminated(gpu):
    """Default SIGTERM action (die), after dropping the registration as a dying CUDA process frees memory."""
    gpumem.unregister(gpu)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def read_requests(scheduler):
    """The launcher's requests, one JSON line each on stdin (SGLang's ZMQ channel from the tokenizer manager)."""
    for line in sys.stdin:
        if json.loads(line).get("op") == "shutdown":
            scheduler.on_shutdown_req()


def main():
    status_fd = int(sys.argv[1])
    plan = json.loads(sys.stdin.readline())  # the launcher keeps stdin open: its later lines are requests
    os.environ.pop("PYTHONEXECUTABLE", None)
    if plan["orphan"]:
        # sgl-project/sglang#23627: schedulers that outlive the launcher. Detach: new session, parent = init.
        if os.fork() > 0:
            os._exit(0)
        os.setsid()
    else:
        die_with_parent(plan["parent_pid"])
    if plan["ignore_sigterm"]:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    elif plan["gpu"] is not None:
        signal.signal(signal.SIGTERM, lambda signum, frame: _terminated(plan["gpu"]))
    set_title(plan["title"])
    logutil.configure(plan["log_level"], plan["log_prefix"])
    if plan["kind"] == "detokenizer":
        idle()
    scheduler = Scheduler(plan, status_fd)
    if release.at_least("0.5.23"):
        threading.Thread(target=read_requests, args=(scheduler,), name="requests", daemon=True).start()
    try:
        scheduler.run()
        scheduler.wait()
        if plan["gpu"] is not None:  # the graceful path: resources released, then exit 0
            gpumem.unregister(plan["gpu"])
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    except Exception:  # SGLang's run_scheduler_process: log, tell the launcher, end
        logger.error("Scheduler hit an exception: %s", traceback.format_exc())
        if plan["gpu"] is not None:
            gpumem.unregister(plan["gpu"])
        try:
            os.kill(plan["parent_pid"], signal.SIGQUIT)
        except ProcessLookupError:
            pass  # the launcher is gone already
        os._exit(1)


if __name__ == "__main__":
    main()
