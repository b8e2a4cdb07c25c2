#!/usr/bin/env python3
"""Extract the SGLang facts the planner's model uses from a wheel's source, without importing sglang.

What one version does when the server args leave it to SGLang, read with ``ast`` from the functions that do it
(the same wheels as tools/sglang_flags.py, its ``WHEELS``):

    MEMORY          the GPU-memory capacity table (chunked_prefill_size and the decode CUDA graph's max batch size
                    per memory bracket, split by tp) and the reserve mem_fraction_static is computed from
                    (0.5.9 server_args.ServerArgs._handle_gpu_memory_settings; 0.5.23
                    arg_groups/memory_hook.py handle_gpu_memory_settings and reserve_for_graph_mb)
    CUDA_GRAPH      the server-arg names of the decode graph's max batch size, its batch sizes and its off switch
                    (0.5.23 renamed cuda_graph_max_bs to cuda_graph_max_bs_decode: arg_groups/cuda_graph_hook.py;
                    its per-phase backend args, None in 0.5.9),
                    the captured batch sizes (the normal, non-speculative list) and whether a defaulted max batch
                    size is capped at max_running_requests
    RUNNING         the cap on running requests of one scheduler: the request pool estimate, the KV-token share,
                    and what divides the server arg (0.5.23 mem_cache/kv_cache_configurator.resolve_max_num_reqs;
                    0.5.9 model_runner_kv_cache_mixin.init_memory_pool and model_runner)
    PP              what pp_size > 1 turns on (disable_overlap_schedule) and which server args it refuses in
                    ordinary serving (0.5.9 server_args.check_server_args; 0.5.23 arg_groups/overrides.py and
                    arg_groups/validation_hook.py check_pipeline_parallel_compat)
    SPARSE_ATTENTION_BACKENDS   the DSA (NSA) backend fields (0.5.9 nsa_*, 0.5.23 dsa_*)
    SPECULATIVE     how the release runs EAGLE-family speculative decoding (NEXTN = MTP): the algorithm NEXTN is an
                    alias of, the architectures whose checkpoint carries its own draft (MTP) layers (the draft
                    model path defaults to the model), the max_running_requests it sets when unset, the default
                    (num_steps, eagle_topk, num_draft_tokens), the environment switch of the overlapped "spec v2"
                    worker where the release has one (0.5.9 SGLANG_ENABLE_SPEC_V2; 0.5.23 always runs v2) and the
                    algorithms PP allows with the switch that allows them (0.5.9 none: check_server_args; 0.5.23
                    single-layer EAGLE with SGLANG_ENABLE_PP_SPEC, else only on a disaggregated prefill node:
                    check_pipeline_parallel_compat) (0.5.9 server_args._handle_speculative_decoding; 0.5.23
                    arg_groups/speculative_hook.py _handle_eagle_family)
    LOADER          the default loader's multi-threaded weight read: the server arg its switch is given in
                    (model_loader_extra_config, JSON), the switch's key and its default (0.5.9 off, 0.5.23 on), the
                    thread-count key and DEFAULT_NUM_THREADS, and the keys the loader accepts
                    (model_loader/loader.py DefaultModelLoader._get_weights_iterator)
    BACKENDS        the backend choices a tune may measure (tune_backends.py): per kind (moe_runner_backend,
                    attention_backend, fp4_gemm_backend, fp8_gemm_backend: the flag's name in snake case) the
                    flag, its ServerArgs field (0.5.23 calls --fp8-gemm-backend's fp8_gemm_runner_backend), its
                    default and its choices, read from launch_server's argument definitions (tools/sglang_flags.py's
                    extract_flags); a kind the release has no flag for is None
    NUMA            how --numa-node binds each scheduler process (utils/numa_utils.py configure_subprocess: the
                    spawn executable becomes a script running `numactl ARGS python`), the arguments it starts
                    from, whether it dry-runs numactl first (0.5.23 _probe_numactl_args: a failed bind is then a
                    warning and the scheduler runs unbound), and the environment variable that makes a failed bind
                    fatal (0.5.23 SGLANG_CRASH_ON_NUMA_BIND_FAILURE, raised by _handle_numa_bind_failure; None in
                    0.5.9, where a bind numactl refuses, or a missing numactl, kills the scheduler at its start)

Every fact is found by the shape of the code that computes it (an ``if gpu_mem < N * 1024`` chain, an
``reserved_mem += max(x, M) * K`` line, ...); a shape that is not found stops the tool naming the fact and the
file, so a new release that moves the code is noticed rather than guessed.

Usage:
    tools/sglang_facts.py --all             # every supported version (wheels cached in build/wheels)
    tools/sglang_facts.py --all --check     # exit 1 if a committed table differs from its wheel
    tools/sglang_facts.py --wheel W [--out FILE]
"""
import argparse
import ast
import importlib.util
import pathlib
import sys
import zipfile

import pyliteral  # tools/ is the script's directory (and on pytest's path)

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _flags_tool():
    spec = importlib.util.spec_from_file_location("sglang_flags_tool", ROOT / "tools" / "sglang_flags.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FLAGS_TOOL = _flags_tool()


PYLITERAL = pyliteral
WHEELS = FLAGS_TOOL.WHEELS


class FactError(Exception):
    pass


class Wheel:
    def __init__(self, path):
        self.path = pathlib.Path(path)
        self.zip = zipfile.ZipFile(str(path))
        self.names = set(self.zip.namelist())
        self._trees = {}

    def version(self):
        for name in self.names:
            if name.endswith(".dist-info/METADATA"):
                for line in self.zip.read(name).decode("utf-8").splitlines():
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
        raise FactError("%s has no dist-info METADATA Version" % self.path.name)

    def tree(self, name):
        if name not in self._trees:
            self._trees[name] = ast.parse(self.zip.read(name).decode("utf-8")) if name in self.names else None
        return self._trees[name]

    def function(self, candidates, fact):
        """(file, FunctionDef) of the first (file, function name) present."""
        for file, func in candidates:
            tree = self.tree(file)
            if tree is None:
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == func:
                    return file, node
        raise FactError("%s: none of %s found (for %s)" % (
            self.path.name, ", ".join("%s:%s" % c for c in candidates), fact))


# ------------------------------------------------------------------------------------------------ ast helpers


def _const(node):
    """A number from a literal or a constant product/sum/quotient (20 * 1024, 1.5 * 1024); else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        v = _const(node.operand)
        return -v if v is not None else None
    if isinstance(node, ast.BinOp):
        a, b = _const(node.left), _const(node.right)
        if a is None or b is None:
            return None
        ops = {ast.Mult: lambda: a * b, ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Div: lambda: a / b,
               ast.FloorDiv: lambda: a // b}
        fn = ops.get(type(node.op))
        return fn() if fn else None
    return None


def _name(node):
    """The last name of a Name/Attribute (self.cuda_graph_max_bs -> cuda_graph_max_bs)."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _names_in(node):
    return {_name(n) for n in ast.walk(node) if isinstance(n, (ast.Attribute, ast.Name))}


def _compare(node, op):
    """(left name, constant) of `x <op> constant`."""
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], op):
        return _name(node.left), _const(node.comparators[0])
    return None, None


def _assigned(stmts, names):
    """{name: constant} assigned in stmts (self.x = C, cfg.x.max_bs = C, declare_resolution(..., x=C))."""
    out = {}
    for stmt in stmts:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and _name(node.targets[0]) in names:
                value = node.value.value if isinstance(node.value, ast.Constant) and isinstance(
                    node.value.value, bool) else _const(node.value)
                if value is not None:
                    out.setdefault(_name(node.targets[0]), value)
            if isinstance(node, ast.Call) and _name(node.func) == "declare_resolution":
                for kw in node.keywords:
                    if kw.arg in names and _const(kw.value) is not None:
                        out.setdefault(kw.arg, _const(kw.value))
    return out


def _aug_adds(func, target):
    """Every `target += expr` in func, in source order."""
    return [n.value for n in ast.walk(func) if isinstance(n, ast.AugAssign) and _name(n.target) == target
            and isinstance(n.op, ast.Add)]


# ------------------------------------------------------------------------------------------------ MEMORY

MEMORY_FUNCS = [("sglang/srt/arg_groups/memory_hook.py", "handle_gpu_memory_settings"),
                ("sglang/srt/server_args.py", "_handle_gpu_memory_settings")]
GRAPH_RESERVE_FUNCS = [("sglang/srt/arg_groups/memory_hook.py", "reserve_for_graph_mb")]
CHUNK = "chunked_prefill_size"
MAX_BS = ("cuda_graph_max_bs", "max_bs")


def _bracket_max_bs(stmts):
    """(max_bs, small_tp_below, small_tp_max_bs) of one bracket: a plain assignment, or `if tp_size < K: a else: b`."""
    for stmt in stmts:
        for node in ast.walk(stmt):
            if isinstance(node, ast.If):
                name, k = _compare(node.test, ast.Lt)
                if name == "tp_size" and k is not None:
                    small, large = _assigned(node.body, MAX_BS), _assigned(node.orelse, MAX_BS)
                    if small and large:
                        return list(large.values())[0], k, list(small.values())[0]
    plain = _assigned(stmts, MAX_BS)
    if plain:
        return list(plain.values())[0], None, None
    return None, None, None


def memory_facts(wheel):
    file, func = wheel.function(MEMORY_FUNCS, "MEMORY")
    chain = None
    for node in ast.walk(func):
        if isinstance(node, ast.If) and _compare(node.test, ast.Lt)[0] == "gpu_mem":
            chain = node
            break
    if chain is None:
        raise FactError("%s:%s has no `if gpu_mem < N` chain (MEMORY capacity)" % (file, func.name))
    brackets, node = [], chain
    while True:
        below = _compare(node.test, ast.Lt)[1] if isinstance(node, ast.If) else None
        body = node.body if isinstance(node, ast.If) else node
        chunk = _assigned(body, (CHUNK,)).get(CHUNK)
        max_bs, tp_below, small = _bracket_max_bs(body)
        if chunk is None or max_bs is None:
            raise FactError("%s:%s: a memory bracket (below %s MiB) without %s and a max batch size"
                            % (file, func.name, below, CHUNK))
        brackets.append({"below_mib": below, "chunked_prefill_size": chunk, "cuda_graph_max_bs": max_bs,
                         "small_tp_below": tp_below, "small_tp_cuda_graph_max_bs": small})
        if not isinstance(node, ast.If):
            break
        if len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If):
            node = node.orelse[0]
        else:
            node = node.orelse
    reserve = {"base_mib": None, "activation_min_tokens": None, "activation_mib_per_token": None,
               "graph_mib_per_bs": None, "parallel_mib_per_gpu": None, "floor_mib": None, "floor_above_mib": None,
               "prefill_graph_mib_per_size": None, "prefill_graph_mla_mib": None}
    # base: `reserved_mem = C` in the block that also adds the activations (`reserved_mem += max(x, M) * K`)
    for block in [n for n in ast.walk(func) if isinstance(getattr(n, "body", None), list)]:
        for stmts in (block.body, getattr(block, "orelse", [])):
            base = [s for s in stmts if isinstance(s, ast.Assign) and _name(s.targets[0]) == "reserved_mem"
                    and _const(s.value) is not None]
            if base and any(_activation(v, func) for s in stmts for v in _aug_adds(s, "reserved_mem")):
                reserve["base_mib"] = _const(base[-1].value)
    graph_funcs = [func]
    try:
        graph_funcs.append(wheel.function(GRAPH_RESERVE_FUNCS, "MEMORY graph reserve")[1])
    except FactError:
        pass
    for value in _aug_adds(func, "reserved_mem"):
        act = _activation(value, func)
        if act and reserve["activation_min_tokens"] is None:
            reserve["activation_min_tokens"], reserve["activation_mib_per_token"] = act
        if {"tp_size", "pp_size"} <= _names_in(value) and reserve["parallel_mib_per_gpu"] is None:
            reserve["parallel_mib_per_gpu"] = _product_factor(value, ("tp_size", "pp_size"))
    reserve["graph_reserve_when_disabled"] = True
    for g in graph_funcs:
        for node in ast.walk(g):   # 0.5.23 reserves for the decode graph only when its backend is not disabled
            if isinstance(node, ast.If) and "DISABLED" in _names_in(node.test) \
                    and any("decode" in str(n) for n in _names_in(node.test)) \
                    and any(_name(getattr(v, "left", None)) in MAX_BS for s in node.body
                            for v in _aug_adds(s, "reserved_mem")):
                reserve["graph_reserve_when_disabled"] = False
        for value in _aug_adds(g, "reserved_mem"):
            names = _names_in(value)
            if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mult) and _name(value.left) in MAX_BS \
                    and _const(value.right) is not None and reserve["graph_mib_per_bs"] is None:
                reserve["graph_mib_per_bs"] = _const(value.right)
            if isinstance(value, ast.BinOp) and isinstance(value.left, ast.Call) and _name(value.left.func) == "len" \
                    and _const(value.right) is not None and reserve["prefill_graph_mib_per_size"] is None:
                reserve["prefill_graph_mib_per_size"] = _const(value.right)
            if _const(value) is not None and not names and reserve["prefill_graph_mla_mib"] is None \
                    and g is not func:
                reserve["prefill_graph_mla_mib"] = _const(value)
    for node in ast.walk(func):
        if isinstance(node, ast.If):
            parts = node.test.values if isinstance(node.test, ast.BoolOp) else [node.test]
            above = [_compare(p, ast.Gt) for p in parts]
            above = [c for n, c in above if n == "gpu_mem" and c is not None]
            for s in node.body:
                if above and isinstance(s, ast.Assign) and _name(s.targets[0]) == "reserved_mem" \
                        and isinstance(s.value, ast.Call) and _name(s.value.func) == "max":
                    reserve["floor_mib"] = _const(s.value.args[1])
                    reserve["floor_above_mib"] = above[0]
    missing = [k for k in ("base_mib", "activation_min_tokens", "graph_mib_per_bs", "parallel_mib_per_gpu",
                           "floor_mib") if reserve[k] is None]
    if missing:
        raise FactError("%s:%s: reserve terms not found: %s" % (file, func.name, ", ".join(missing)))
    speculative = {}
    for node in ast.walk(func):
        if isinstance(node, ast.If) and "speculative_algorithm" in _names_in(node.test):
            _speculative(node, speculative)
    return {"source": "%s:%s" % (file, func.name), "brackets": brackets, "reserve": reserve,
            "speculative_reserve_mib": speculative}


def _activation(value, func=None):
    """(M, K) of `max(chunked_prefill_size, M) * K`, or of `tokens * K` where `tokens = max(chunked_prefill_size, M)`
    in func."""
    if func is not None and isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mult) \
            and isinstance(value.left, ast.Name) and _const(value.right) is not None:
        for node in ast.walk(func):
            if isinstance(node, ast.Assign) and _name(node.targets[0]) == value.left.id \
                    and isinstance(node.value, ast.Call) and _name(node.value.func) == "max" \
                    and CHUNK in _names_in(node.value.args[0]) and _const(node.value.args[1]):
                return _const(node.value.args[1]), _const(value.right)
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mult) and isinstance(value.left, ast.Call) \
            and _name(value.left.func) == "max" and len(value.left.args) == 2 and _const(value.left.args[1]) \
            and _const(value.right) is not None:
        return _const(value.left.args[1]), _const(value.right)
    return None


def _product_factor(value, names):
    """The constant factor of an expression in `names` (tp_size * pp_size / 8 * 1024 -> 128.0)."""
    def ev(n):
        if _name(n) in names and isinstance(n, (ast.Attribute, ast.Name)):
            return 1.0
        if isinstance(n, ast.BinOp):
            a, b = ev(n.left), ev(n.right)
            return {ast.Mult: a * b, ast.Div: a / b, ast.Add: a + b, ast.Sub: a - b}[type(n.op)]
        c = _const(n)
        if c is None:
            raise FactError("cannot evaluate %s" % ast.dump(n))
        return float(c)
    return ev(value)


def _speculative(node, out):
    """`if algo == "X": += a` / `elif algo != "Y": += b` -> {"X": a, "*": b, "except": ["Y"]}."""
    while isinstance(node, ast.If):
        eq, ne = _str_compare(node.test, ast.Eq), _str_compare(node.test, ast.NotEq)
        adds = [_const(v) for s in node.body for v in _aug_adds(s, "reserved_mem")]
        adds = [a for a in adds if a is not None]
        if adds and eq:
            out[eq] = adds[0]
        elif adds and ne:
            out["*"] = adds[0]
            out["except"] = [ne]
        node = node.orelse[0] if len(node.orelse) == 1 else None


def _str_compare(node, op):
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], op) \
            and isinstance(node.comparators[0], ast.Constant) and isinstance(node.comparators[0].value, str):
        return node.comparators[0].value
    return None


# ------------------------------------------------------------------------------------------------ CUDA_GRAPH

CAPTURE_FUNCS = [("sglang/srt/arg_groups/cuda_graph_hook.py", "generate_decode_cuda_graph_batch_sizes"),
                 ("sglang/srt/server_args.py", "_generate_cuda_graph_batch_sizes")]
FOLD_FUNCS = [("sglang/srt/arg_groups/cuda_graph_hook.py", "parse_cuda_graph_config")]
PREFILL_CAPTURE_FUNCS = [("sglang/srt/arg_groups/cuda_graph_hook.py", "generate_prefill_cuda_graph_batch_sizes")]
PREFILL_DEFAULT_FUNCS = [("sglang/srt/model_executor/cuda_graph_config.py", "default_prefill_backend")]


def _capture_list(expr, where):
    """{explicit, ranges} of `[a, b] + list(range(x, y, s)) + ...`; a range stop of None runs to the max size
    (range(x, max_bs + 1, s))."""
    explicit, ranges, terms = [], [], []

    def flat(n):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add):
            flat(n.left)
            flat(n.right)
        else:
            terms.append(n)
    flat(expr)
    for t in terms:
        if isinstance(t, ast.List):
            explicit.extend(_const(e) for e in t.elts)
        elif isinstance(t, ast.Call) and _name(t.func) == "list" and isinstance(t.args[0], ast.Call) \
                and _name(t.args[0].func) == "range":
            a, b, c = t.args[0].args
            ranges.append([_const(a), _const(b), _const(c)])
        else:
            raise FactError("%s: a capture-size term that is no list or range" % where)
    return {"explicit": explicit, "ranges": ranges}


def prefill_graph_facts(wheel):
    """0.5.23's prefill CUDA graph: on by default on CUDA (default_prefill_backend), its captured token counts up
    to chunked_prefill_size (handle_gpu_memory_settings), each reserving MiB (reserve_for_graph_mb). 0.5.9 has only
    the opt-in piecewise graph (enable_piecewise_cuda_graph, off by default): not on."""
    try:
        file, func = wheel.function(PREFILL_DEFAULT_FUNCS, "prefill graph default")
    except FactError:
        return {"default_on": False, "capture_sizes": None}
    ret = next(n for n in ast.walk(func) if isinstance(n, ast.Return))
    on = isinstance(ret.value, ast.IfExp) and _name(ret.value.body) != "DISABLED" and \
        _name(ret.value.test.func if isinstance(ret.value.test, ast.Call) else ret.value.test) == "is_cuda"
    cfile, cfunc = wheel.function(PREFILL_CAPTURE_FUNCS, "prefill graph sizes")
    expr = next(s.value for s in cfunc.body if isinstance(s, ast.Assign))
    return {"default_on": on, "capture_sizes": _capture_list(expr, "%s:%s" % (cfile, cfunc.name))}


def cuda_graph_facts(wheel, memory_func):
    file, func = wheel.function(CAPTURE_FUNCS, "CUDA_GRAPH batch sizes")
    normal = None
    for node in ast.walk(func):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) \
                and _name(node.test.left) == "speculative_algorithm" and isinstance(node.test.ops[0], ast.Is):
            normal = node.body
    if normal is None:
        raise FactError("%s:%s: no `if speculative_algorithm is None` branch (CUDA_GRAPH)" % (file, func.name))
    expr = next(s.value for s in normal if isinstance(s, ast.Assign))
    capture = _capture_list(expr, "%s:%s" % (file, func.name))
    appends_max = any(isinstance(n, ast.Call) and _name(n.func) == "append" for n in ast.walk(func))
    names = {"max_bs": None, "bs": None, "disable": [], "backend": None}
    prefill_names = {"disable": [], "backend": None}
    try:
        fold_file, fold = wheel.function(FOLD_FUNCS, "CUDA_GRAPH names")
    except FactError:
        fold = None
    if fold is not None:   # 0.5.23: per-phase fields folded into cuda_graph_config[decode]
        for node in ast.walk(fold):
            if isinstance(node, ast.If):
                for call in [c for s in node.body for c in ast.walk(s) if isinstance(c, ast.Call)
                             and _name(c.func) == "_set" and len(c.args) == 3]:
                    phase, key = _name(call.args[0]), call.args[1]
                    if phase not in ("DECODE", "PREFILL") or not isinstance(key, ast.Constant):
                        continue
                    field = _name(node.test.left) if isinstance(node.test, ast.Compare) else _name(node.test)
                    into = names if phase == "DECODE" else prefill_names
                    if key.value in ("max_bs", "bs") and phase == "DECODE" and _name(call.args[2]) == field:
                        names[key.value] = field
                    elif key.value == "backend" and _name(call.args[2]) == "DISABLED" and field not in into["disable"]:
                        into["disable"].append(field)
                    elif key.value == "backend" and _name(call.args[2]) == field:
                        into["backend"] = field
    else:   # 0.5.9: ServerArgs fields of their own
        names["max_bs"] = next(iter(_assigned(memory_func.body, ("cuda_graph_max_bs",))), None)
        for node in ast.walk(memory_func):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                    and _name(node.value.func) == func.name:
                names["bs"] = _name(node.targets[0])
        names["disable"] = ["disable_cuda_graph"] if _field_declared(wheel, "disable_cuda_graph") else []
    if not names["max_bs"] or not names["bs"] or not names["disable"]:
        raise FactError("%s: CUDA graph server-arg names not all found: %s" % (wheel.path.name, names))
    capped = False
    for node in ast.walk(memory_func):
        if isinstance(node, ast.Compare) and any(_name(c) == "max_running_requests" for c in node.comparators) \
                and isinstance(node.ops[0], ast.Gt):
            capped = True
    return {"source": "%s:%s" % (file, func.name), "max_bs_arg": names["max_bs"], "bs_arg": names["bs"],
            "disable_args": names["disable"], "capture_bs": dict(capture, appends_max_bs=appends_max),
            "backend_arg": names["backend"],
            "prefill": dict(prefill_graph_facts(wheel), disable_args=prefill_names["disable"],
                            backend_arg=prefill_names["backend"]),
            "max_bs_capped_by_max_running_requests": capped}


def _field_declared(wheel, field):
    tree = wheel.tree("sglang/srt/server_args.py")
    return any(isinstance(n, ast.AnnAssign) and _name(n.target) == field for n in ast.walk(tree))


# ------------------------------------------------------------------------------------------------ RUNNING

RUNNING_FUNCS = [("sglang/srt/mem_cache/kv_cache_configurator.py", "resolve_max_num_reqs"),
                 ("sglang/srt/model_executor/model_runner_kv_cache_mixin.py", "init_memory_pool")]


def running_facts(wheel):
    file, func = wheel.function(RUNNING_FUNCS, "RUNNING")
    per_context = low = high = divisor = None
    # names that hold the server arg (0.5.23: max_num_reqs = get_schedule().max_running_requests)
    request_vars = {_name(n.targets[0]) for n in ast.walk(func) if isinstance(n, ast.Assign)
                    and _name(n.value) == "max_running_requests"}
    for node in ast.walk(func):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and isinstance(node.left, ast.BinOp) \
                and isinstance(node.left.op, ast.Div) and _name(node.left.right) == "context_len":
            per_context = _const(node.right)
        if isinstance(node, ast.Call) and _name(node.func) in ("min", "max") and len(node.args) == 2:
            inner = node.args[0]
            if isinstance(inner, ast.Call) and _name(inner.func) in ("min", "max") and _name(inner.func) != \
                    _name(node.func) and _const(node.args[1]) is not None and _const(inner.args[1]) is not None:
                bounds = {_name(node.func): _const(node.args[1]), _name(inner.func): _const(inner.args[1])}
                low, high = bounds["max"], bounds["min"]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv) \
                and (_name(node.left) == "max_running_requests" or _name(node.left) in request_vars):
            divisor = divisor or _name(node.right)
    kv_share = None
    runner_file = "sglang/srt/model_executor/model_runner.py"
    for f in (func,) + ((wheel.tree(runner_file),) if wheel.tree(runner_file) else ()):
        for node in ast.walk(f):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv) \
                    and _name(node.left) in ("token_capacity", "max_total_num_tokens") and _const(node.right):
                kv_share = kv_share or _const(node.right)
    # does the half-the-tokens cap bind a server arg too? 0.5.9 model_runner: `tokens // 2 if
    # server_args.max_running_requests is None else max_running_requests // dp_size` (no); 0.5.23 (yes)
    arg_capped = True
    for f in (func,) + ((wheel.tree(runner_file),) if wheel.tree(runner_file) else ()):
        for node in ast.walk(f):
            if isinstance(node, ast.IfExp) and isinstance(node.test, ast.Compare) \
                    and _name(node.test.left) == "max_running_requests" and isinstance(node.test.ops[0], ast.Is) \
                    and any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.FloorDiv) and _const(n.right) == kv_share
                            for n in ast.walk(node.body)):
                arg_capped = False
    # 0.5.9 divides by ModelRunner.dp_size, which is dp_size only with --enable-dp-attention (else 1)
    attention_only = divisor == "attn_dp_size"
    if divisor == "dp_size":
        for node in ast.walk(wheel.tree(runner_file)):
            if isinstance(node, ast.Assign) and _name(node.targets[0]) == "dp_size" and isinstance(node.value, ast.IfExp) \
                    and _name(node.value.test) == "enable_dp_attention" and _const(node.value.orelse) == 1:
                attention_only = True
    if None in (per_context, low, high, divisor, kv_share) or not attention_only:
        raise FactError("%s:%s: RUNNING not all found (pool %s..%s x %s per context, divisor %s, kv share %s, "
                        "attention DP only %s)" % (file, func.name, low, high, per_context, divisor, kv_share,
                                                   attention_only))
    return {"source": "%s:%s" % (file, func.name), "pool_per_context_len": per_context, "pool_min": low,
            "pool_max": high, "kv_tokens_divisor": kv_share, "server_arg_capped_by_kv_tokens": arg_capped,
            "server_arg_divided_by": "attention_dp_size"}


# ------------------------------------------------------------------------------------------------ PP

PP_SET_FUNCS = [("sglang/srt/arg_groups/overrides.py", "_pipeline_parallel_overlap_disable"),
                ("sglang/srt/server_args.py", "_handle_pipeline_parallelism")]
PP_CHECK_FUNCS = [("sglang/srt/arg_groups/validation_hook.py", "check_pipeline_parallel_compat"),
                  ("sglang/srt/server_args.py", "check_server_args")]


PP_GRAPH_FILE = "sglang/srt/arg_groups/cuda_graph_hook.py"


def _pp_block_test(test):
    return _compare(test, ast.Gt) == ("pp_size", 1)


def _pp_block(node):
    return isinstance(node, ast.If) and _pp_block_test(node.test)


def pp_facts(wheel):
    sets = {}
    for file, name in PP_SET_FUNCS:
        try:
            func = wheel.function([(file, name)], "PP")[1]
        except FactError:
            continue
        for node in ast.walk(func):
            if _pp_block(node):
                sets.update(_assigned(node.body, ("disable_overlap_schedule",)))
                for s in node.body:
                    if isinstance(s, ast.Return) and isinstance(s.value, ast.Dict):
                        sets.update({k.value: v.value for k, v in zip(s.value.keys, s.value.values)})
    # 0.5.23 turns the (default-on) breakable prefill CUDA graph off under PP (cuda_graph_hook.py)
    hook = wheel.tree(PP_GRAPH_FILE)
    for node in ast.walk(hook) if hook else ():
        if isinstance(node, ast.If) and isinstance(node.test, ast.BoolOp) and any(_pp_block_test(v) for v in node.test.values) \
                and {"prefill", "BREAKABLE"} <= _names_in(node.test):
            for call in (c for s in node.body for c in ast.walk(s) if isinstance(c, ast.Call) and _name(c.func) == "with_phase"):
                if _name(call.args[1]) == "PREFILL" and any(kw.arg == "backend" and _name(kw.value) == "DISABLED"
                                                            for kw in call.keywords):
                    sets["cuda_graph_backend_prefill"] = "disabled"
    file, func = wheel.function(PP_CHECK_FUNCS, "PP checks")
    blocks = [n.body for n in ast.walk(func) if _pp_block(n)] if func.name == "check_server_args" else [func.body]
    refuses = []

    def visit(stmts, guarded):
        for s in stmts:
            if isinstance(s, ast.Assert):
                parts = s.test.values if isinstance(s.test, ast.BoolOp) else [s.test]
                for p in parts:
                    if isinstance(p, ast.UnaryOp) and isinstance(p.op, ast.Not):
                        refuses.append(_name(p.operand))
                    elif isinstance(p, ast.Compare) and isinstance(p.ops[0], ast.Is):
                        refuses.append(_name(p.left))
                    elif guarded and _str_compare(p, ast.Eq) and _name(p.left) == "disaggregation_mode":
                        refuses.append(guarded)   # allowed only on a prefill node of a disaggregated deployment
            elif isinstance(s, ast.If):
                if "envs" in _names_in(s.test):   # an opt-in environment switch: its default (off) path
                    visit(s.orelse, guarded)
                    continue
                field = next((n for n in ("speculative_algorithm",) if n in _names_in(s.test)), guarded)
                visit(s.body, field)
                visit(s.orelse, guarded)
    for stmts in blocks:
        visit(stmts, None)
    refuses = sorted({r for r in refuses if r})
    if "disable_overlap_schedule" not in sets or not refuses:
        raise FactError("%s: PP facts not found (sets %s, refuses %s)" % (wheel.path.name, sets, refuses))
    return {"source": "%s:%s" % (file, func.name), "sets": sets, "refuses": refuses}


SPEC_FUNCS = [("sglang/srt/arg_groups/speculative_hook.py", "_handle_eagle_family"),
              ("sglang/srt/server_args.py", "_handle_speculative_decoding")]
SPEC_ALIAS_FUNCS = [("sglang/srt/arg_groups/speculative_hook.py", "_resolve_speculative_algorithm_alias"),
                    ("sglang/srt/server_args.py", "_handle_speculative_decoding")]
SPEC_PARAMS_FUNCS = [("sglang/srt/arg_groups/speculative_hook.py", "_auto_choose_speculative_params"),
                     ("sglang/srt/server_args.py", "auto_choose_speculative_params")]


def _str_list(node):
    if isinstance(node, (ast.List, ast.Tuple)) and node.elts and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return [e.value for e in node.elts]
    return None


def speculative_facts(wheel):
    """EAGLE-family speculative decoding: `if speculative_algorithm == "NEXTN"` ... EAGLE (the alias), the first
    `if model_arch in [...]` whose body defaults speculative_draft_model_path (the architectures that carry their
    own MTP layers), max_running_requests = C where unset, the environment switch the handler reads (envs.X.get()
    that turns the overlap schedule on: spec v2), the last `return (s, k, n)` of the parameter chooser, and which
    algorithms PP allows (check_pipeline_parallel_compat's `algorithm.upper() == "X"` assert; none where PP's check
    refuses speculative_algorithm outright)."""
    file, func = wheel.function(SPEC_FUNCS, "SPECULATIVE")
    archs = None
    for node in ast.walk(func):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and isinstance(node.test.ops[0], ast.In) \
                and _name(node.test.left) == "model_arch" and "speculative_draft_model_path" in _names_in(node):
            archs = _str_list(node.test.comparators[0])
            break
    running = _assigned([func], ("max_running_requests",)).get("max_running_requests")
    env = None
    for node in ast.walk(func):
        if isinstance(node, ast.If) and "envs" in _names_in(node.test) and "disable_overlap_schedule" in _names_in(node):
            env = next((a.attr for a in ast.walk(node.test) if isinstance(a, ast.Attribute)
                        and a.attr.startswith("SGLANG_")), None)
    alias_file, alias_func = wheel.function(SPEC_ALIAS_FUNCS, "SPECULATIVE alias")
    alias = None
    for node in ast.walk(alias_func):
        if isinstance(node, ast.If) and "NEXTN" in {c.value for c in ast.walk(node.test) if isinstance(c, ast.Constant)}:
            for sub in ast.walk(node):
                value = sub.value if isinstance(sub, (ast.Return, ast.Assign)) else None
                if isinstance(value, ast.Constant) and value.value == "EAGLE":
                    alias = "EAGLE"
            break
    params_file, params_func = wheel.function(SPEC_PARAMS_FUNCS, "SPECULATIVE params")
    returns = [n.value for n in ast.walk(params_func) if isinstance(n, ast.Return) and isinstance(n.value, ast.Tuple)]
    default = [_const(e) for e in returns[-1].elts] if returns else None
    # PP: refused in ordinary serving by default (PP refuses speculative_algorithm); 0.5.23 lets single-layer EAGLE
    # run under PP behind an environment switch (`if envs.X.get():` inside the `.upper() == "EAGLE"` branch)
    pp_file, pp_func = wheel.function(PP_CHECK_FUNCS, "SPECULATIVE pp")
    pp_algorithms, pp_env = [], None
    for node in ast.walk(pp_func):
        if isinstance(node, ast.If) and any(
                isinstance(c, ast.Compare) and isinstance(c.ops[0], ast.Eq) and isinstance(c.left, ast.Call)
                and _name(c.left.func) == "upper" for c in ast.walk(node)):
            for c in ast.walk(node):
                if isinstance(c, ast.Compare) and isinstance(c.ops[0], ast.Eq) and isinstance(c.left, ast.Call) \
                        and _name(c.left.func) == "upper" and _name(c.left.func.value) == "speculative_algorithm":
                    pp_algorithms.append(c.comparators[0].value)
            pp_env = next((a.attr for sub in ast.walk(node) if isinstance(sub, ast.If) and "envs" in _names_in(sub.test)
                           for a in ast.walk(sub.test) if isinstance(a, ast.Attribute) and a.attr.startswith("SGLANG_")),
                          None)
    if pp_env is None:
        pp_algorithms = []
    if not archs or running is None or alias is None or not default or None in default:
        raise FactError("%s: %s: SPECULATIVE facts not found (architectures %s, max_running_requests %s, alias %s, "
                        "params %s)" % (wheel.path.name, file, archs, running, alias, default))
    return {"source": "%s:%s" % (file, func.name), "nextn_alias": alias, "self_draft_architectures": archs,
            "max_running_requests": running, "spec_v2_env": env, "default_params": default,
            "pp_algorithms": sorted(set(pp_algorithms)), "pp_env": pp_env}


def sparse_attention_backends(wheel):
    """The DSA backend fields: ServerArgs fields named <nsa|dsa>_<prefill|decode>_backend."""
    found = set()
    for name in wheel.names:
        if name.startswith("sglang/srt/") and (name.endswith("server_args.py") or "/arg_groups/fields/" in name):
            for node in ast.walk(wheel.tree(name)):
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                    parts = node.target.id.split("_")
                    if len(parts) == 3 and parts[0] in ("nsa", "dsa") and parts[1] in ("prefill", "decode") \
                            and parts[2] == "backend":
                        found.add(node.target.id)
    if not found:
        raise FactError("%s: no nsa/dsa prefill/decode backend fields" % wheel.path.name)
    return sorted(found)


# ------------------------------------------------------------------------------------------------ LOADER

LOADER_FILE, LOADER_CLASS = "sglang/srt/model_loader/loader.py", "DefaultModelLoader"


def _get_calls(func, receiver):
    """{key: default node} of the `<receiver>.get("key", default)` calls in func."""
    out = {}
    for node in ast.walk(func):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and _name(node.func.value) == receiver and node.args and isinstance(node.args[0], ast.Constant) \
                and len(node.args) == 2:
            out.setdefault(node.args[0].value, node.args[1])
    return out


def loader_facts(wheel):
    """The default loader's multi-threaded read: `use_multithread = extra_config.get("enable_multithread_load",
    D)` and `extra_config.get("num_threads", self.DEFAULT_NUM_THREADS)` in _get_weights_iterator, the class's
    DEFAULT_NUM_THREADS, the `allowed_keys = {...}` set; extra_config is load_config.model_loader_extra_config."""
    where = "%s:%s._get_weights_iterator" % (LOADER_FILE, LOADER_CLASS)
    tree = wheel.tree(LOADER_FILE)
    cls = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == LOADER_CLASS), None) \
        if tree is not None else None
    func = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_get_weights_iterator"),
                None) if cls is not None else None
    if func is None:
        raise FactError("%s: no %s (for LOADER)" % (wheel.path.name, where))
    switch = next((t.id for n in ast.walk(func) if isinstance(n, ast.Assign) for t in n.targets
                   if isinstance(t, ast.Name) and t.id == "use_multithread"), None)
    calls = _get_calls(func, "extra_config")
    on = calls.get("enable_multithread_load")
    threads = calls.get("num_threads")
    if switch is None or not (isinstance(on, ast.Constant) and isinstance(on.value, bool)) or threads is None:
        raise FactError("%s: %s has no use_multithread = extra_config.get(\"enable_multithread_load\", bool) and "
                        "extra_config.get(\"num_threads\", ...) (for LOADER)" % (wheel.path.name, where))
    count = next((_const(n.value) for n in cls.body if isinstance(n, ast.Assign)
                  and any(_name(t) == "DEFAULT_NUM_THREADS" for t in n.targets)), None)
    allowed = None
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(_name(t) == "allowed_keys" for t in node.targets) \
                and isinstance(node.value, ast.Set):
            allowed = sorted(e.value for e in node.value.elts if isinstance(e, ast.Constant))
            break
    source = "".join(ast.get_source_segment(wheel.zip.read(LOADER_FILE).decode("utf-8"), n) or ""
                     for n in ast.walk(func) if isinstance(n, ast.Attribute) and n.attr == "model_loader_extra_config")
    if count is None or not allowed or "enable_multithread_load" not in allowed or not source:
        raise FactError("%s: %s: no DEFAULT_NUM_THREADS, allowed_keys or model_loader_extra_config (for LOADER)"
                        % (wheel.path.name, where))
    return {"source": where, "arg": "model_loader_extra_config", "switch": "enable_multithread_load",
            "default_on": on.value, "threads_key": "num_threads", "default_threads": count, "allowed_keys": allowed}


# ------------------------------------------------------------------------------------------------ BACKENDS

BACKEND_KINDS = ("moe_runner_backend", "attention_backend", "fp4_gemm_backend", "fp8_gemm_backend")


def backend_facts(wheel):
    """{kind: {flag, field, default, choices} or None}: the backend flags of launch_server with their choices."""
    _, flags = FLAGS_TOOL.extract_flags(str(wheel.path))
    out = {}
    for kind in BACKEND_KINDS:
        flag = "--" + kind.replace("_", "-")
        entry = flags.get(flag)
        if entry is not None and not entry.get("choices"):
            raise FactError("%s: %s has no choices (for BACKENDS)" % (wheel.path.name, flag))
        out[kind] = None if entry is None else {"flag": flag, "field": entry.get("field") or entry["dest"],
                                                "default": entry.get("default"), "choices": list(entry["choices"])}
    if not any(out.values()):
        raise FactError("%s: none of %s (for BACKENDS)" % (wheel.path.name, ", ".join(BACKEND_KINDS)))
    return out


# ------------------------------------------------------------------------------------------------ NUMA

NUMA_FILE = "sglang/srt/utils/numa_utils.py"


def _env_attrs(node):
    """Names X of every `envs.X` read under `node`."""
    return [n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id == "envs"]


def numa_facts(wheel):
    file, func = wheel.function([(NUMA_FILE, "configure_subprocess")], "NUMA")
    tree = wheel.tree(file)
    funcs = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    maker = funcs.get("_create_numactl_executable")
    script = [c for c in ast.walk(maker) if isinstance(c, ast.Constant) and isinstance(c.value, str)
              and "exec numactl" in c.value] if maker else []
    if not script:
        raise FactError("%s: %s: no _create_numactl_executable writing `exec numactl` (for NUMA)"
                        % (wheel.path.name, file))
    args = sorted({"".join(v.value if isinstance(v, ast.Constant) else "{%s}" % ast.unparse(v.value)
                           for v in j.values) for j in ast.walk(tree) if isinstance(j, ast.JoinedStr)
                   and j.values and isinstance(j.values[0], ast.Constant)
                   and j.values[0].value.startswith("--cpunodebind=")})
    if not args:
        raise FactError("%s: %s: no --cpunodebind= arguments (for NUMA)" % (wheel.path.name, file))
    handler = funcs.get("_handle_numa_bind_failure")
    crash = [a for a in _env_attrs(handler) if "CRASH" in a] if handler else []
    return {"source": "%s:configure_subprocess" % file, "bind": "numactl", "args": args[0],
            "probe": "_probe_numactl_args" in funcs, "crash_env": crash[0] if crash else None}


# ------------------------------------------------------------------------------------------------ table


def extract_facts(path):
    wheel = Wheel(path)
    memory = memory_facts(wheel)
    memory_func = wheel.function(MEMORY_FUNCS, "MEMORY")[1]
    return {"VERSION": wheel.version(), "WHEEL": wheel.path.name, "MEMORY": memory,
            "CUDA_GRAPH": cuda_graph_facts(wheel, memory_func), "RUNNING": running_facts(wheel),
            "PP": pp_facts(wheel), "SPARSE_ATTENTION_BACKENDS": sparse_attention_backends(wheel),
            "LOADER": loader_facts(wheel), "BACKENDS": backend_facts(wheel),
            "SPECULATIVE": speculative_facts(wheel), "NUMA": numa_facts(wheel)}


def render(facts):
    out = ['"""SGLang %s facts the planner uses, extracted from %s by tools/sglang_facts.py. Do not edit.'
           % (facts["VERSION"], facts["WHEEL"]), "",
           "Regenerate: tools/sglang_facts.py --all. tools/sglang_facts.py describes every key; each table names the",
           "source function it was read from.", '"""', ""]
    for key in ("VERSION", "MEMORY", "CUDA_GRAPH", "RUNNING", "PP", "SPARSE_ATTENTION_BACKENDS", "LOADER",
                "BACKENDS", "SPECULATIVE", "NUMA"):
        out.append(PYLITERAL.literal(key, facts[key], sort_dicts=False))
        out.append("")
    return "\n".join(out)


def table_path(version):
    return ROOT / "module_utils" / "topolaunch" / ("sglang_facts_%s.py" % version.replace(".", "_"))


def write_or_check(wheel_path, out, check, version=None):
    text = render(extract_facts(wheel_path))
    out = pathlib.Path(out) if out else table_path(version or extract_facts(wheel_path)["VERSION"])
    if check:
        same = out.is_file() and out.read_text(encoding="utf-8") == text
        print("%s: %s" % (out.name, "up to date" if same else "DIFFERS from its wheel"))
        return 0 if same else 1
    out.write_text(text, encoding="utf-8")
    print("wrote %s" % out)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--all", action="store_true", help="every supported version (tools/sglang_flags.py WHEELS)")
    parser.add_argument("--wheel", help="a wheel you have")
    parser.add_argument("--out", help="with --wheel: the file to write")
    parser.add_argument("--check", action="store_true", help="compare with the committed tables instead")
    parser.add_argument("--wheel-dir", default=str(FLAGS_TOOL.WHEEL_DIR))
    args = parser.parse_args(argv)
    if bool(args.all) == bool(args.wheel):
        parser.error("give one of --all, --wheel")
    try:
        if args.wheel:
            return write_or_check(args.wheel, args.out, args.check)
        rc = 0
        for version in sorted(WHEELS):
            rc |= write_or_check(FLAGS_TOOL.download_wheel(version, pathlib.Path(args.wheel_dir)), None, args.check,
                                 version)
        return rc
    except FactError as exc:
        print("sglang_facts: %s" % exc, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
