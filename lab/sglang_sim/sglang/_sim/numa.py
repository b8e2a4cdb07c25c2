"""How a scheduler is started bound to its NUMA node: SGLang's numa_utils.configure_subprocess, run for real.

Both releases start a bound scheduler through a script `exec numactl ARGS <python> "$@"` written to
/tmp/sglang_temp_file_<time>_<random>.sh, put in as multiprocessing's spawn executable
(59:sglang/srt/utils/numa_utils.py:16-38, 523:sglang/srt/utils/numa_utils.py:28-93); the simulator starts the
scheduler through the same script, so the real `numactl` on the lab host binds it (or, missing, fails it):

- 0.5.9 (59:numa_utils.py:16-27): ARGS `--cpunodebind=N --membind=N`, unchecked: a numactl that is missing or
  refuses kills the scheduler at its start (`exec: numactl: not found`, exit 127; "Rank 0 scheduler is dead").
- 0.5.23 (523:numa_utils.py:28-93, 214-374): ARGS from the node's CPUs within the launcher's affinity
  (`--cpunodebind=N --membind=N` when that is all of them, else `--physcpubind=LIST --membind=N`; no CPU in
  common: _handle_numa_bind_failure), memory args dropped when libnuma says the memory policy is not permitted,
  then a dry run `numactl ARGS true`, relaxing --membind to --preferred, then to CPUs only, with its warnings;
  nothing that runs: `numactl could not apply NUMA binding for node N (...): <stderr>; skipping NUMA binding for
  GPU G.` A failure is a warning and the scheduler runs unbound, or a RuntimeError in the launcher with
  SGLANG_CRASH_ON_NUMA_BIND_FAILURE (523:environ.py:1723, default false).

The lab host has this machine's CPUs and one memory node, not the spec's. The node's CPUs (what libnuma's
numa_node_to_cpus reads from sysfs on the real machine) come from the spec: the cpu_affinity of its GPUs on that
node, which lab/lab.py folds onto the host's CPUs when the spec names CPUs the host lacks. What numactl gets is
the release's ARGS translated to the host, the same binding on the machine the spec describes: `--cpunodebind=N`
becomes `--physcpubind=<the spec node's CPUs>` (the host's node N, if it has one, is other CPUs), and a memory
argument for a node the host has no memory on (/sys/devices/system/node/has_memory) is left out (the host cannot
bind memory there; the simulator says so once). Health sees what the process got, in /proc.
"""
import ctypes
import logging
import multiprocessing.spawn
import os
import random
import subprocess
import time

from sglang._sim import release

logger = logging.getLogger("sglang.srt.utils.numa_utils")
SYS_NODES = "/sys/devices/system/node"


class NumaBindError(RuntimeError):
    """_handle_numa_bind_failure's RuntimeError (printed as RuntimeError)."""


NumaBindError.__name__ = NumaBindError.__qualname__ = "RuntimeError"
NumaBindError.__module__ = "builtins"


def parse_cpulist(text):
    cpus = set()
    for part in filter(None, (text or "").strip().split(",")):
        a, _sep, b = part.partition("-")
        cpus.update(range(int(a), int(b or a) + 1))
    return cpus


def cpulist(cpus):
    return ",".join(str(c) for c in sorted(cpus))


def libnuma():
    """get_libnuma: libnuma.so(.1) when it loads and numa_available() >= 0, else None."""
    for name in ("libnuma.so", "libnuma.so.1"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        return lib if lib.numa_available() >= 0 else None
    return None


def node_cpus(spec, node):
    """_node_cpus: the node's CPUs (from the spec, see the module's docstring); empty without libnuma."""
    if libnuma() is None:
        return set()
    cpus = set()
    for gpu in spec.data.get("gpus", []):
        if gpu.get("numa_node") == node:
            cpus |= parse_cpulist(gpu.get("cpu_affinity"))
    return cpus


def can_set_mempolicy():
    """_can_set_mempolicy: libnuma's get_mempolicy(2) answers."""
    lib = libnuma()
    if lib is None:
        return False
    mode = ctypes.c_int()
    try:
        return lib.get_mempolicy(ctypes.byref(mode), None, ctypes.c_ulong(0), None, ctypes.c_ulong(0)) == 0
    except (AttributeError, OSError):
        return False


def crash_on_failure():
    return os.environ.get("SGLANG_CRASH_ON_NUMA_BIND_FAILURE", "false").strip().lower() in ("1", "true", "yes", "y")


def handle_failure(node, allowed=None, gpu=None, reason=None):
    """_handle_numa_bind_failure: warn, or raise with SGLANG_CRASH_ON_NUMA_BIND_FAILURE."""
    if reason is None:
        gpu_str = " for GPU %d" % gpu if gpu is not None else ""
        reason = ("NUMA node %d has no CPU cores allowed by the current affinity %s, skipping NUMA binding%s."
                  % (node, sorted(allowed), gpu_str))
    logger.warning(reason)
    if crash_on_failure():
        raise NumaBindError(reason)


class Binder:
    def __init__(self, spec):
        self.spec = spec
        self.told = set()

    # ------------------------------------------------------------------ the lab host
    def host_memory_nodes(self):
        try:
            with open(os.path.join(SYS_NODES, "has_memory"), encoding="ascii") as f:
                return parse_cpulist(f.read())
        except OSError:
            return {0}

    def to_host(self, args, node):
        """The release's numactl ARGS as the lab host runs them (see the module's docstring)."""
        out = []
        for word in args.split():
            key, _sep, value = word.partition("=")
            if key == "--cpunodebind":      # the spec's node, not the host's node of that number
                cpus = node_cpus(self.spec, int(value)) & os.sched_getaffinity(0)
                word = "--physcpubind=%s" % cpulist(cpus) if cpus else word
            elif key in ("--membind", "--preferred") and int(value) not in self.host_memory_nodes():
                if node not in self.told:
                    self.told.add(node)
                    logger.info("simulator: NUMA: the lab host has no memory on node %s: numactl binds the CPUs "
                                "only (%s left out)", value, word)
                continue
            out.append(word)
        return " ".join(out)

    def probe(self, args, node):
        """One dry run `numactl ARGS true` (translated): (ok, stderr)."""
        try:
            proc = subprocess.run(["numactl", *self.to_host(args, node).split(), "true"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, timeout=10, check=False)
            return proc.returncode == 0, proc.stderr.decode("utf-8", errors="replace").strip()
        except (OSError, subprocess.SubprocessError) as err:
            return False, str(err)

    # ------------------------------------------------------------------ the release
    def args_0_5_23(self, node, gpu):
        """_numactl_cpu_mem_args, the memory policy check and _probe_numactl_args: the args to run, or None."""
        cpus = node_cpus(self.spec, node)
        if not cpus:
            args = "--cpunodebind=%d --membind=%d" % (node, node)
        else:
            allowed = os.sched_getaffinity(0)
            target = cpus & allowed
            if not target:
                handle_failure(node, allowed, gpu)
                return None
            args = ("--cpunodebind=%d --membind=%d" % (node, node) if target == cpus
                    else "--physcpubind=%s --membind=%d" % (cpulist(target), node))
        if not can_set_mempolicy():
            args = " ".join(w for w in args.split() if not w.startswith("--membind"))
            logger.info("NUMA memory policy not permitted; binding CPUs only to NUMA node %d. If using docker, "
                        "--cap-add SYS_NICE also binds host memory.", node)
        ok, last_err = self.probe(args, node)
        if ok:
            return args
        suffix = (lambda err: ": %s" % err if err else "")
        if "--membind=" in args:
            preferred = args.replace("--membind=", "--preferred=")
            if self.probe(preferred, node)[0]:
                logger.warning("numactl rejected hard memory binding (%r)%s; falling back to soft preferred policy "
                               "(%r).", args, suffix(last_err), preferred)
                return preferred
        cpu_only = " ".join(w for w in args.split() if not w.startswith("--membind"))
        if cpu_only and cpu_only != args:
            ok, cpu_err = self.probe(cpu_only, node)
            if ok:
                logger.warning("numactl rejected memory binding (%r)%s; falling back to CPU-only binding (%r).",
                               args, suffix(last_err), cpu_only)
                return cpu_only
            last_err = cpu_err
        handle_failure(node, reason="numactl could not apply NUMA binding for node %d (e.g. set_mempolicy/"
                                    "sched_setaffinity blocked by seccomp, or cpuset rejects the policy)%s; skipping "
                                    "NUMA binding for GPU %d." % (node, suffix(last_err), gpu))
        return None

    def executable(self, node, gpu):
        """configure_subprocess: the spawn executable for the scheduler of CUDA device `gpu` bound to `node` (a
        /tmp script running numactl), or None to start it unbound."""
        if release.at_least("0.5.23"):
            args = self.args_0_5_23(node, gpu)
            if args is None:
                return None
        else:
            args = "--cpunodebind=%d --membind=%d" % (node, node)
        old = os.fsdecode(multiprocessing.spawn.get_executable())
        host_args = self.to_host(args, node)
        script = '#!/bin/sh\nexec numactl %s %s "$@"' % (host_args, old)
        path = "/tmp/sglang_temp_file_%s_%d.sh" % (time.time(), random.randrange(0, 10000000))
        with open(path, "w", encoding="utf-8") as f:
            f.write(script)
        os.chmod(path, 0o777)
        msg = "mp.set_executable %s -> %s (script=%r, logical_gpu_id=%d)" % (old, path, script, gpu)
        (logger.debug if release.at_least("0.5.23") else logger.info)(msg)
        if host_args != args:
            logger.info("simulator: NUMA: the release's `numactl %s` runs on the lab host as `numactl %s`", args,
                        host_args)
        return path     # 0.5.9 does not look for numactl: without it the script's exec fails, the scheduler dies
