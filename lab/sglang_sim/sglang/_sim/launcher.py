"""`python -m sglang.launch_server`: the launcher process of the simulated server.

Order of events, as in SGLang 0.5.9: parse and check the arguments (argparse errors exit 2, ServerArgs
assertions raise), read the model config, start one scheduler process per (dp, pp, tp) rank and the
detokenizer, wait until every scheduler reports ready (the HTTP port stays closed meanwhile), open the port,
warm up, log "The server is fired up and ready to roll!". A failing scheduler sends SIGQUIT: the launcher
kills its process tree and itself (SIGKILL), as SGLang's launch-phase SIGQUIT handler does. SIGTERM while
serving drains: /health answers 503, in-flight requests finish (checked every SGLANG_SIM_DRAIN_POLL_SECONDS,
5 s as SGLang), then the tree is killed, the launcher last (SIGKILL, as kill_process_tree does).

Several nodes (--nnodes N, --node-rank R, --dist-init-addr HOST:PORT, --dist-timeout S): each node starts the
scheduler ranks SGLang maps to it (node_ranks), which meet at torch's TCP rendezvous (dist.py). Node 0 runs the
detokenizer and the API server as above, opening its port once every node's ranks are ready. A node with
node_rank >= 1 runs no detokenizer and no API: once its ranks are ready it starts SGLang's dummy health check
server on --host/--port and waits for its ranks to end. It has no SIGTERM handler (SIGTERM ends it; its ranks
die with it); its ranks end when they lose node 0 (the launch-phase SIGQUIT handler then kills the node).
"""
import http.client
import json
import logging
import math
import os
import re
import shutil
import socket
import signal
import subprocess
import sys
import threading
import time

import sglang
from sglang._sim import dist, flags, gpumem, hardware, logutil, metrics, modelcfg, numa, perf, release, server, validate
from sglang._sim.engine import Engine

logger = logging.getLogger("sglang.srt.entrypoints.engine")
GIB = 1 << 30
MIB = 1 << 20
FAULTS = ("crash_during_load", "hang_during_load", "never_join", "ignore_sigterm", "orphan_schedulers",
          "die_after_requests", "hang_after_requests", "garbage_output")
LOAD_FAULTS = ("crash_during_load", "hang_during_load", "never_join")
SCHEDULER_EXIT_TIMEOUT_SECS = 15  # 0.5.23 _SCHEDULER_EXIT_TIMEOUT_SECS (523:sglang/srt/managers/tokenizer_manager.py:456)


class SimConfigError(Exception):
    """A lab knob (SGLANG_SIM_*) has a bad value."""


def env_float(name, default, minimum=0.0, positive=False):
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SimConfigError("%s=%r is not a number" % (name, raw)) from None
    if not math.isfinite(value) or value < minimum or (positive and value <= 0):
        raise SimConfigError("%s=%r must be %s %s" % (name, raw, ">" if positive else ">=", minimum))
    return value


def parse_faults(raw, layout=None):
    """{fault: argument} from SGLANG_SIM_FAULT ("ignore_sigterm", "die_after_requests:5", comma-separated).

    An item `fault@LAYOUT` ("crash_during_load@tp4pp2") applies only to a server of that layout name (the lab's way
    to fail one candidate of several); `layout` is this server's name, None to keep every item."""
    faults = {}
    for item in filter(None, (part.strip() for part in (raw or "").split(","))):
        spec, at, only = item.partition("@")
        if at:
            check_layout_name(only.strip(), lambda why, item=item: SimConfigError(
                "SGLANG_SIM_FAULT: bad item %r: %s" % (item, why)))
        name, _, arg = spec.strip().partition(":")
        if name not in FAULTS:
            raise SimConfigError("SGLANG_SIM_FAULT: unknown fault %r (known: %s)" % (name, ", ".join(FAULTS)))
        if name == "die_after_requests":
            if not arg.isdigit() or int(arg) < 1:
                raise SimConfigError("SGLANG_SIM_FAULT: die_after_requests needs a positive count, as in "
                                     "die_after_requests:5, got %r" % item)
            value = int(arg)
        elif name == "hang_after_requests":
            if not arg.isdigit():
                raise SimConfigError("SGLANG_SIM_FAULT: hang_after_requests needs a count >= 0, as in "
                                     "hang_after_requests:5 (0: from the start), got %r" % item)
            value = int(arg)
        elif arg:
            raise SimConfigError("SGLANG_SIM_FAULT: fault %r takes no argument, got %r" % (name, item))
        else:
            value = True
        if not at or layout is None or only.strip() == layout:
            faults[name] = value
    return faults


LAYOUT_NAME_RE = re.compile(r"^tp(\d+)(?:pp(\d+))?(?:dp(\d+))?(?:ep(\d+))?$")


def check_layout_name(name, bad):
    """Raise bad(why) unless name is a layout name as the simulator computes it from the server's arguments."""
    match = LAYOUT_NAME_RE.match(name)
    sizes = [int(g) if g else 1 for g in match.groups()] if match else None
    if not sizes or sizes[0] < 1 or perf.layout_name(*sizes) != name:
        raise bad("%r is not a layout name (tp{tp}, then pp{pp}, dp{dp}, ep{ep} where > 1: tp8, tp4pp2, "
                  "tp2pp2ep2, tp4dp2)" % name)


def parse_layout_speed(raw):
    """{layout name: factor} from SGLANG_SIM_LAYOUT_SPEED ("tp4pp2=1.6,tp8=0.7"); SimConfigError naming the item."""
    speeds = {}
    for item in filter(None, (part.strip() for part in (raw or "").split(","))):
        def bad(why):
            return SimConfigError("SGLANG_SIM_LAYOUT_SPEED: bad item %r: %s" % (item, why))
        name, sep, value = (part.strip() for part in item.partition("="))
        if not sep:
            raise bad("expected LAYOUT=FACTOR, as tp4pp2=1.6")
        check_layout_name(name, bad)
        try:
            factor = float(value)
        except ValueError:
            factor = float("nan")
        if not math.isfinite(factor) or factor <= 0:
            raise bad("the factor %r is not a positive number" % value)
        if name in speeds:
            raise bad("layout %s is named twice" % name)
        speeds[name] = factor
    return speeds


def parse_backend_speed(raw):
    """[(flag, value, factor)] from SGLANG_SIM_BACKEND_SPEED ("moe_runner_backend:cutlass=1.5"): a factor on the
    simulated throughput of a server whose backend flag (launch_server's flag in snake case) has that value; the
    value must be one of the release's own choices of the flag. SimConfigError naming the item."""
    found, table = [], flags.table()
    for item in filter(None, (part.strip() for part in (raw or "").split(","))):
        def bad(why):
            return SimConfigError("SGLANG_SIM_BACKEND_SPEED: bad item %r: %s" % (item, why))
        key, sep, value = (part.strip() for part in item.partition("="))
        name, colon, backend = (part.strip() for part in key.partition(":"))
        if not sep or not colon or not name or not backend:
            raise bad("expected FLAG:VALUE=FACTOR, as moe_runner_backend:cutlass=1.5")
        entry = table.get("--" + name.replace("_", "-"))
        if entry is None or not entry.get("choices"):
            raise bad("%s is no flag with choices of SGLang %s" % (name, release.version()))
        if backend not in entry["choices"]:
            raise bad("%s is not one of the choices of --%s (%s)" % (backend, name.replace("_", "-"),
                                                                    ", ".join(map(str, entry["choices"]))))
        try:
            factor = float(value)
        except ValueError:
            factor = float("nan")
        if not math.isfinite(factor) or factor <= 0:
            raise bad("the factor %r is not a positive number" % value)
        if any(f == entry["dest"] and v == backend for f, v, _ in found):
            raise bad("%s:%s is named twice" % (name, backend))
        found.append((entry["dest"], backend, factor))
    return found


def backend_factor(args, speeds):
    """The product of the SGLANG_SIM_BACKEND_SPEED factors whose flag has that value in these server args."""
    factor = 1.0
    for dest, backend, value in speeds:
        if getattr(args, dest, None) == backend:
            factor *= value
    return factor


def node_ranks(args):
    """[(pp_rank, tp_rank, gpu ordinal)] of the schedulers this node starts (dp_size 1).

    engine._launch_scheduler_processes: pp_size_per_node = max(pp // nnodes, 1), nnodes_per_pp_rank =
    max(nnodes // pp, 1); node r runs pp ranks pp_size_per_node * (r // nnodes_per_pp_rank) + [0, pp_size_per_node)
    and tp ranks tp_size_per_node * (r % nnodes_per_pp_rank) + [0, tp_size_per_node), tp_size_per_node =
    tp // nnodes_per_pp_rank, on GPU base_gpu_id + (pp_rank % pp_size_per_node) * tp_size_per_node
    + (tp_rank % tp_size_per_node) * gpu_id_step.
    """
    tp, pp, nnodes, node = args.tp_size, args.pp_size, args.nnodes, args.node_rank
    pp_per_node = max(pp // nnodes, 1)
    nnodes_per_pp_rank = max(nnodes // pp, 1)
    tp_per_node = tp // nnodes_per_pp_rank
    first_pp = pp_per_node * (node // nnodes_per_pp_rank)
    first_tp = tp_per_node * (node % nnodes_per_pp_rank)
    return [(s, t, args.base_gpu_id + (s % pp_per_node) * tp_per_node + (t % tp_per_node) * args.gpu_id_step)
            for s in range(first_pp, first_pp + pp_per_node) for t in range(first_tp, first_tp + tp_per_node)]


def moe_ep_rank(tp_rank, tp_size, ep_size, moe_dp_size=1):
    """_launch_scheduler_processes: tp_rank % (tp // moe_dp) // (tp // moe_dp // ep): TP8 EP2 gives EP0 to
    TP0-3 and EP1 to TP4-7."""
    moe_tp = tp_size // moe_dp_size
    return tp_rank % moe_tp // (moe_tp // ep_size)


def free_port():
    """sglang.srt.utils.get_free_port: a port the kernel gives to a socket bound to port 0."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


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


def startup_time(per_rank, tokenizer_e2e):
    """0.5.23 build_engine_startup_time: the slowest rank's durations (523:sglang/srt/observability/
    startup_time.py:27-69)."""
    result = {"load_weight": 0.0, "kv_cache_allocation": 0.0, "scheduler_e2e": 0.0, "cuda_graph": {}}
    for times in filter(None, per_rank):
        for key in ("load_weight", "kv_cache_allocation", "scheduler_e2e"):
            result[key] = max(result[key], times[key])
        for phase, seconds in times["cuda_graph"].items():
            result["cuda_graph"][phase] = max(result["cuda_graph"].get(phase, 0.0), seconds)
    result["tokenizer_e2e"] = tokenizer_e2e
    return result


class Launcher:
    def __init__(self, argv):
        self.argv = argv
        self.children = []  # (plan, Popen, status read fd)
        self.state = None
        self.httpd = None
        self.shutting_down = False

    # ------------------------------------------------------------------ setup
    def prepare(self):
        self.started = time.perf_counter()
        self.args = args = flags.prepare_server_args(self.argv)
        logutil.configure(args.log_level)
        self.faults = parse_faults(os.environ.get("SGLANG_SIM_FAULT"),
                                   perf.layout_name(args.tp_size, args.pp_size, args.dp_size, args.ep_size))
        if "ignore_sigterm" in self.faults:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self.load_seconds = env_float("SGLANG_SIM_LOAD_SECONDS", 3.0)
        # CUDA-graph capture: each captured batch size (token count) costs this much, as a real capture does one
        # forward per size; SGLANG_SIM_CAPTURE_SECONDS, when set, is the whole capture instead (split by sizes)
        self.capture_seconds = env_float("SGLANG_SIM_CAPTURE_SECONDS", None)
        self.capture_seconds_per_size = env_float("SGLANG_SIM_CAPTURE_SECONDS_PER_SIZE", 0.01)
        self.time_scale = env_float("SGLANG_SIM_TIME_SCALE", 0.1)
        self.drain_poll = env_float("SGLANG_SIM_DRAIN_POLL_SECONDS", 5.0, minimum=0.01)
        self.layout_speed = parse_layout_speed(os.environ.get("SGLANG_SIM_LAYOUT_SPEED"))
        self.backend_speed = parse_backend_speed(os.environ.get("SGLANG_SIM_BACKEND_SPEED"))
        # speculative decoding's accept length (tokens a request gains per verify step) on this lab "model"
        self.accept_length = env_float("SGLANG_SIM_ACCEPT_LENGTH", 2.5, minimum=1.0)
        self.network = perf.Network(env_float("SGLANG_SIM_NET_GBPS", perf.NET_GBPS, positive=True),
                                    env_float("SGLANG_SIM_NET_LATENCY_US", perf.NET_LATENCY_US))
        logger.info(logutil.simulated_banner())
        self.spec = hardware.load_spec()
        self.binder = numa.Binder(self.spec)
        self.visible = hardware.visible_devices(self.spec)
        gpu_mib = self.spec.gpus[self.visible[0]].memory_total / MIB if self.visible else 0
        self.model = modelcfg.load(args.model_path)  # SGLang reads the model's config while resolving its args
        args.post_init(gpu_mib, mla=self.model.is_mla, architecture=self.model.architecture)
        args.check()
        if args.nnodes > 1 and args.dp_size > 1:
            raise SimConfigError("multi-node data parallel attention (--nnodes %d --dp-size %d) is not simulated"
                                 % (args.nnodes, args.dp_size))
        if not 0 <= args.node_rank < args.nnodes:
            # SGLang 0.5.9 does not check this; its ranks would claim places outside the world
            raise SimConfigError("--node-rank %d must be in [0, --nnodes %d)" % (args.node_rank, args.nnodes))
        logger.info("server_args=%s", args.for_logging())

    def plan_ranks(self):
        args, model, spec = self.args, self.model, self.spec
        tp, pp = args.tp_size, args.pp_size
        dp_attention = args.dp_attention()
        replicas = 1 if dp_attention else args.dp_size
        attn_tp = tp // (args.get("attn_dp_size") or args.dp_size) if dp_attention else tp
        partition = os.environ.get("SGLANG_PP_LAYER_PARTITION")
        construction = validate.construction_error(model, tp, pp, attn_tp, partition)
        try:
            self.stages = validate.pp_layer_split(model.layers, pp, partition)
        except ValueError:
            self.stages = validate.pp_layer_split(model.layers, pp)
        kv_bytes = validate.kv_dtype_bytes(args.kv_cache_dtype)
        weights = model.total_size // (tp * pp)
        graphs = [{"phase": phase, "backend": backend, "sizes": sizes,
                   "bytes": validate.graph_bytes(phase, sizes, model.is_mla)} for phase, backend, sizes in args.graphs()]
        if replicas > 1:  # the simulator's stand-in for the DP controller: replica d on the next tp*pp GPUs
            placed = [(d, s, t, args.base_gpu_id + d * tp * pp + s * tp + t * args.gpu_id_step)
                      for d in range(replicas) for s in range(pp) for t in range(tp)]
        else:
            placed = [(0, s, t, ordinal) for s, t, ordinal in node_ranks(args)]
        ranks, told = [], set()
        for d, s, t, ordinal in placed:
            nvml = self.visible[ordinal] if ordinal < len(self.visible) else None
            node, why = self.numa_binding(ordinal, nvml) if nvml is not None else (None, "no GPU")
            if node is not None:
                logger.info("simulator: NUMA: the scheduler on GPU %d starts through numactl bound to node %d (node "
                            "from %s)", ordinal, node, why)
            elif release.at_least("0.5.23") and why not in told and why in ("numactl is not installed",
                                                                             "the GPU's NVML memory affinity is empty"):
                told.add(why)  # SGLang says this at debug level only; the lab says it once
                logger.info("simulator: NUMA: no automatic binding (SGLANG_AUTO_NUMA_BIND) for the scheduler on GPU "
                            "%d: %s", ordinal, why)
            ranks.append({"d": d, "s": s, "t": t, "ordinal": ordinal, "gpu": nvml, "numa_node": node})
        avail = {}
        for r in ranks:
            if r["gpu"] is not None and r["gpu"] not in avail:
                g = spec.gpus[r["gpu"]]
                avail[r["gpu"]] = g.memory_total - g.memory_reserved - gpumem.held_by_others(r["gpu"])
        world_avail = [avail[r["gpu"]] for r in ranks if r["gpu"] is not None] or [0]
        dist_cfg = self.dist_config() if args.nnodes > 1 else None
        plans = []
        for i, r in enumerate(ranks):
            dp_rank = r["d"] if replicas > 1 else None
            ep_rank = moe_ep_rank(r["t"], tp, args.ep_size, args.get("moe_dp_size") or 1)
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
            mem["graphs"] = graphs
            tokens = mem["plan"]["max_total_num_tokens"]
            plans.append({
                "kind": "scheduler", "rank": i, "title": title, "log_prefix": prefix,
                "dp_rank": r["d"], "pp_rank": r["s"], "tp_rank": r["t"], "cuda_ordinal": r["ordinal"],
                "gpu": r["gpu"], "n_visible": len(self.visible), "memory": mem, "numa_node": r["numa_node"],
                "construction_error": construction, "model_type": model.architecture,
                "dist": dist_cfg and dict(dist_cfg, rank=tp * r["s"] + r["t"],
                                          spec=self.spec.data if i == 0 else None),
                "dtype": "torch.bfloat16", "kv_dtype": validate.kv_dtype_name(args.kv_cache_dtype),
                "mla": model.is_mla, "quant": self.quant_log_str(), "sched": {
                    "chunked_prefill_size": args.chunked_prefill_size,
                    "max_prefill_tokens": args.max_prefill_tokens,
                    # divided by the attention-DP size only: a plain --dp-size replica gets the whole value
                    "max_running_requests": validate.max_running_requests(
                        tokens, self.context_len(), args.max_running_requests,
                        (args.get("attn_dp_size") or args.dp_size) if dp_attention else 1),
                    "context_len": self.context_len()},
            })
        return plans

    def numa_binding(self, ordinal, nvml_index):
        """(node, where from) for the scheduler on CUDA device `ordinal`, or (None, why not): numa_utils.
        configure_subprocess with SGLANG_NUMA_BIND_V2 (default true), which starts the scheduler through a script
        running `numactl --cpunodebind=N --membind=N` (numa.py runs it for real). 0.5.9 binds only with --numa-node
        (59:sglang/srt/utils/numa_utils.py:16-27); 0.5.23 also binds automatically (SGLANG_AUTO_NUMA_BIND, default
        true) on a NUMA host with numactl installed, to the GPU's NVML memory affinity
        (523:sglang/srt/utils/numa_utils.py:128-155, 377-445). The lab host's own sysfs is this machine's, so
        "a NUMA host" is read from the spec: some GPU's memory affinity is node 1 or above."""
        nodes = self.args.numa_node
        if nodes is not None:
            return nodes[ordinal], "--numa-node"  # an IndexError for a list shorter than the GPUs, as in SGLang
        if not release.at_least("0.5.23"):
            return None, "no --numa-node"
        if os.environ.get("SGLANG_AUTO_NUMA_BIND", "true").lower() not in ("1", "true", "yes", "y"):
            return None, "SGLANG_AUTO_NUMA_BIND is off"
        if max((g.numa_node for g in self.spec.gpus), default=-1) < 1:
            return None, "one NUMA node (no /sys/devices/system/node/node1)"
        v2 = os.environ.get("SGLANG_NUMA_BIND_V2", "true").lower() in ("1", "true", "yes", "y")
        if v2 and not shutil.which("numactl"):
            return None, "numactl is not installed"
        node = -1 if "memory_affinity" in self.spec.not_supported else self.spec.gpus[nvml_index].numa_node
        if node < 0:
            return None, "the GPU's NVML memory affinity is empty"
        return node, "NVML memory affinity"

    def dist_config(self):
        """What each rank's init_process_group gets (model_runner.init_torch_distributed)."""
        args, model = self.args, self.model
        nccl_port = args.nccl_port or free_port()  # PortArgs.init_new
        return {"init_method": dist.init_method(args.dist_init_addr, nccl_port),
                "timeout": dist.DEFAULT_TIMEOUT if args.dist_timeout is None else args.dist_timeout,
                "world_size": args.tp_size * args.pp_size, "node_rank": args.node_rank, "nnodes": args.nnodes,
                "tp": args.tp_size, "pp": args.pp_size,
                "model": "%s, %d layers, %d bytes of weights" % (model.architecture, model.layers, model.total_size)}

    def quant_log_str(self):
        """0.5.23's `quant=...` part of the weight-load line: ModelConfig.get_quantization_config_log_str over
        config.json's quantization_config, ModelOpt's quant_algo naming the method (523:sglang/srt/configs/
        model_config.py:1727-1741, 1838-1869, 1899-1919). None without one."""
        try:
            with open(os.path.join(self.args.model_path, "config.json")) as f:
                quant = dict(json.load(f).get("quantization_config") or {})
        except (OSError, ValueError, TypeError):
            return None
        if not quant:
            return None
        algo = str(quant.get("quant_algo") or "")
        if quant.get("quant_method", "modelopt") == "modelopt" and algo:
            if "FP4" in algo:
                quant["quant_method"] = "modelopt_fp4"
            elif algo == "FP8":
                quant["quant_method"] = "modelopt_fp8"
        text = "quant=%s" % quant.get("quant_method", "quantized")
        for key in ("bits", "quant_algo", "fmt", "requantization_method"):
            if key in quant:
                text += ", %s=%s" % (key, quant[key])
        return text

    def context_len(self):
        return self.args.context_length or self.model.context_len

    # ------------------------------------------------------------------ processes
    def spawn(self, plan):
        plan.update({"parent_pid": os.getpid(), "orphan": "orphan_schedulers" in self.faults and
                     plan["kind"] == "scheduler", "ignore_sigterm": "ignore_sigterm" in self.faults,
                     "fault": next((f for f in LOAD_FAULTS if f in self.faults), None),
                     "load_seconds": self.load_seconds, "capture_seconds": self.capture_seconds,
                     "capture_seconds_per_size": self.capture_seconds_per_size,
                     "log_level": self.args.log_level})
        read_fd, write_fd = os.pipe()
        env = dict(os.environ, PYTHONEXECUTABLE=sys.executable)
        package_root = os.path.dirname(os.path.dirname(os.path.abspath(sglang.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))
        # a scheduler bound to a NUMA node starts through SGLang's numactl script (numa.py), else the interpreter
        executable = sys.executable
        if plan["kind"] == "scheduler" and plan.get("numa_node") is not None:
            executable = self.binder.executable(plan["numa_node"], plan["cuda_ordinal"]) or sys.executable
        # argv[0] is the title (what ps shows when setproctitle is not installed; the child sets it anyway)
        proc = subprocess.Popen([plan["title"], "-m", "sglang._sim.rank", str(write_fd)], executable=executable,
                                stdin=subprocess.PIPE, pass_fds=(write_fd,), env=env)
        os.close(write_fd)
        # stdin stays open: the plan is its first line, requests (0.5.23's ShutdownReq) follow
        proc.stdin.write(json.dumps(plan).encode() + b"\n")
        proc.stdin.flush()
        self.children.append((plan, proc, read_fd))

    def request(self, plan, proc, message):
        try:
            proc.stdin.write(json.dumps(message).encode() + b"\n")
            proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass  # that child is gone already

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
        # SGLang's handler is an asyncio loop signal handler, called without arguments: signum=None, frame=None
        # (59:sglang/srt/managers/tokenizer_manager.py:1459, 523:tokenizer_manager.py:2457)
        logger.error("SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
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
                             "graph": round(sum(g["bytes"] for g in first["memory"]["graphs"]) / GIB, 2)},
        }
        specs, gpus = self.spec, [p["gpu"] for p in plans]
        cluster = infos[0].get("cluster")  # several nodes: every rank's (node, GPU) and each node's spec
        if cluster:
            specs = {int(node): hardware.Spec("node %s" % node, data) for node, data in cluster["specs"].items()}
            specs[0] = self.spec
            gpus = [tuple(where) for where in cluster["world"]]
        layout = perf.Layout(args.tp_size, args.pp_size, 1 if args.dp_attention() else args.dp_size,
                             gpus, self.stages, overlap=not args.disable_overlap_schedule,
                             kv_dtype_bytes=validate.kv_dtype_bytes(args.kv_cache_dtype))
        name = perf.layout_name(args.tp_size, args.pp_size, args.dp_size, args.ep_size)
        speed = self.layout_speed.get(name, 1.0)
        if speed != 1.0:
            logger.info("simulator: SGLANG_SIM_LAYOUT_SPEED: layout %s runs at %g times the performance model's "
                        "throughput", name, speed)
        backend = backend_factor(args, self.backend_speed)
        if backend != 1.0:
            logger.info("simulator: SGLANG_SIM_BACKEND_SPEED: its backends run at %g times the performance model's "
                        "throughput", backend)
            speed *= backend
        model_perf = perf.PerfModel(self.model, specs, layout, speed=speed, network=self.network)
        replicas = layout.dp
        engine = Engine(model_perf, self.time_scale, infos[0]["max_running_requests"] * replicas,
                        scheduler_info["max_total_num_tokens"] * replicas)
        spec = args.speculative()
        if spec:
            model_perf.speculative = (spec[0], spec[1], max(1, self.model.nextn_layers))
            # drafts from a checkpoint without its MTP layer are never accepted (SGLang loads an empty layer)
            engine.tokens_per_step = min(float(spec[1]), self.accept_length) if self.model.draft_weights else 1.0
            logger.info("simulator: speculative decoding %s, %d steps, %d draft tokens, accept length %.2f%s",
                        args.speculative_algorithm, spec[0], spec[1], engine.tokens_per_step,
                        "" if self.model.draft_weights else " (the checkpoint has no MTP weights)")
        self.state = st = server.State(args, self.model, engine, scheduler_info,
                                       dict(model_perf.describe(), layout=name), self.time_scale)
        st.startup_time = startup_time([i.get("startup_time") for i in infos], time.perf_counter() - self.started)
        if args.enable_metrics:
            pids = {id(plan): proc.pid for plan, proc, _ in self.children}
            st.recorder = engine.recorder = metrics.Recorder(args, [{
                "tp_rank": p["tp_rank"], "pp_rank": p["pp_rank"], "dp_rank": p["dp_rank"] if replicas > 1 else None,
                "moe_ep_rank": moe_ep_rank(p["tp_rank"], args.tp_size, args.ep_size, args.get("moe_dp_size") or 1),
                "pid": pids.get(id(p), os.getpid())} for p in plans], scheduler_info["max_total_num_tokens"] * replicas)
        if "die_after_requests" in self.faults or "hang_after_requests" in self.faults:
            st.after_generation = self.after_requests
        if self.faults.get("hang_after_requests") == 0:
            self.hang(0)
        if "garbage_output" in self.faults:
            st.answers.garbage = True
            logger.warning("simulator: SGLANG_SIM_FAULT=garbage_output: this server answers every prompt with "
                           "filler words (as one whose KV cache dtype or kernel garbles output)")
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
        # 0.5.23 after a drain: the stop hook ended uvicorn, which runs its shutdown (523:http_server.py:3001-3004)
        self.httpd.server_close()
        logutil.uvicorn("Shutting down")
        logutil.uvicorn("Waiting for application shutdown.")
        logutil.uvicorn("Application shutdown complete.")
        logutil.uvicorn("Finished server process [%d]" % os.getpid())
        return 0

    def serve_worker(self):
        """_launch_subprocesses on node_rank >= 1: no tokenizer, detokenizer or API server. Wait until the
        schedulers are ready, start the dummy health check server on --host/--port, then wait for them to end."""
        self.wait_ready()
        if release.at_least("0.5.23"):
            # Non-zero ranks cannot drain on their own: SIGTERM only logs; rank 0's ShutdownReq broadcast stops
            # the schedulers (523:sglang/srt/entrypoints/engine.py:1259-1273)
            signal.signal(signal.SIGTERM, self.on_sigterm_worker)
        server.start_dummy_health_server(self.args.host, self.args.port, self.args.enable_metrics)
        for _, proc, _ in self.children:
            proc.wait()
            logger.error("Scheduler or DataParallelController %d terminated with %s", proc.pid, proc.returncode)
        if release.at_least("0.5.23"):
            return 0  # launch_server returns once the schedulers exited (523:http_server.py:3163-3165)
        # SGLang 0.5.9 goes on to launch_server's uvicorn.run with no tokenizer manager; the simulator ends here
        return 1

    def on_sigterm_worker(self, signum, frame):
        logger.warning("SIGTERM received on node_rank %d; waiting for the rank-0 ShutdownReq broadcast to stop the "
                       "schedulers.", self.args.node_rank)

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
        if release.at_least("0.5.23"):
            self.freeze_gc(host)
        logger.info("The server is fired up and ready to roll!")

    def freeze_gc(self, host):
        """0.5.23 _freeze_gc_after_server_warmup: POST /freeze_gc with the admin key, else the API key; a failure
        is only a warning (523:sglang/srt/entrypoints/http_server.py:2535-2553)."""
        key = self.args.admin_api_key or self.args.api_key
        headers = {server.INTERNAL_HEADER: "warmup"}
        if key:
            headers["Authorization"] = "Bearer %s" % key
        try:
            conn = http.client.HTTPConnection(host, self.args.port, timeout=10)
            conn.request("POST", "/freeze_gc", headers=headers)
            resp = conn.getresponse()
            resp.read()
            if resp.status >= 400:
                raise OSError("%d Client Error for url: %s/freeze_gc" % (resp.status, self.url()))
        except OSError:
            logger.warning("post-warmup freeze_gc failed", exc_info=True)

    def on_sigterm(self, signum, frame):
        # loop.add_signal_handler calls SGLang's handler without arguments (59:tokenizer_manager.py:1457, 2500-2503;
        # 523:tokenizer_manager.py:2455, 4066-4070)
        logging.getLogger("sglang.srt.managers.tokenizer_manager").warning(
            "SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
        self.state.draining = True

    def sigterm_watchdog(self):
        """TokenizerManager.sigterm_watchdog: notice the flag, drain, then end. 0.5.9 kills the tree and the
        launcher (SIGKILL). 0.5.23 sends the schedulers a ShutdownReq, waits up to 15 s for them to release their
        memory and exit, kills the rest of the tree and stops the HTTP server: the launcher exits 0
        (523:sglang/srt/managers/tokenizer_manager.py:456, 3508-3571)."""
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
        if not release.at_least("0.5.23"):
            self.die()
        schedulers = [(plan, proc) for plan, proc, _ in self.children if plan["kind"] == "scheduler"]
        for plan, proc in schedulers:
            self.request(plan, proc, {"op": "shutdown"})
        deadline = time.monotonic() + SCHEDULER_EXIT_TIMEOUT_SECS
        alive = [proc for plan, proc in schedulers if not plan.get("orphan")]  # orphans are no longer our children
        while time.monotonic() < deadline and any(proc.poll() is None for proc in alive):
            time.sleep(0.1)
        stragglers = [proc.pid for proc in alive if proc.poll() is None]
        if stragglers:
            tm_logger.warning("Schedulers still alive %ds after ShutdownReq, killing them before they released: %s",
                              SCHEDULER_EXIT_TIMEOUT_SECS, stragglers)
        self.kill_tree()
        self.httpd.shutdown()

    def watch_children(self):
        """A scheduler or the detokenizer that dies while serving leaves the engine without output."""
        while True:
            for plan, proc, _ in self.children:
                if not plan.get("orphan") and proc.poll() is not None:
                    self.state.engine.stall()
                    return
            time.sleep(0.2)

    def after_requests(self, count):
        """A user generation request was answered (the count-th): the faults that wait for a count."""
        if "hang_after_requests" in self.faults and count >= self.faults["hang_after_requests"]:
            self.hang(count)
        if "die_after_requests" in self.faults:
            self.maybe_die(count)

    def hang(self, count):
        """SGLANG_SIM_FAULT=hang_after_requests:N: the scheduler stops producing output while every process lives
        and the port stays open (a collective that never returns): generation requests wait forever, /health and
        /health_generate answer 503 after SGLANG_HEALTH_CHECK_TIMEOUT; with N = 0 the warmup hangs, the ready line
        never comes and /health answers 503 (starting), at every start."""
        if self.state.engine.stalled:
            return
        logger.error("simulated fault SGLANG_SIM_FAULT=hang_after_requests:%d: %d generation requests answered, "
                     "the scheduler hangs now (processes alive, port open)", self.faults["hang_after_requests"], count)
        self.state.engine.stall()

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
        if launcher.args.node_rank >= 1:
            return launcher.serve_worker()
        launcher.spawn({"kind": "detokenizer", "title": "sglang::detokenizer", "log_prefix": "", "gpu": None})
        infos = launcher.wait_ready()
        return launcher.serve(infos, plans)
    finally:
        launcher.kill_tree()
