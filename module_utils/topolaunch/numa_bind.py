"""The NUMA binding of a server's scheduler processes, as the plan's `--numa-node` asks for it, and its check.

SGLang binds each scheduler (one process per GPU) to the NUMA node `--numa-node` gives for its GPU (entry i for
CUDA device i) by starting it through `numactl` (utils/numa_utils.py configure_subprocess, both releases: the
spawn executable becomes a script running `exec numactl --cpunodebind=N --membind=N python ...`). 0.5.23 dry-runs
numactl first (_probe_numactl_args): a bind that numactl refuses, or a missing numactl, is only a warning and the
scheduler runs unbound, unless SGLANG_CRASH_ON_NUMA_BIND_FAILURE is set (the release's facts, NUMA.crash_env);
0.5.9 execs it unchecked, so a missing numactl kills the scheduler at its start. The plan sets the variable where
the release has it (`crash_env`), and health checks what each scheduler got:

- CPUs: /proc/<pid>/status Cpus_allowed_list must be the node's CPUs (the topology facts: the NVML CPU affinity of
  the node's GPUs, recorded in the plan as numa_bind.node_cpus) within the CPUs the launcher may use (its own
  Cpus_allowed_list): what SGLang 0.5.23 binds to (node CPUs & sched_getaffinity), and what numactl
  --cpunodebind gives where no cpuset narrows the launcher;
- memory: the policy /proc/<pid>/numa_maps shows (the task's policy on every mapping without one of its own) must
  bind to the node (`bind:N`; 0.5.23 falls back to `preferred:N` when the kernel refuses a hard bind, and says so:
  accepted, and reported). A node this host has no memory on (/sys/devices/system/node/has_memory) cannot be
  bound to: SGLang 0.5.23 binds the CPUs only there; the memory policy is reported, not checked.

Plain Python 3.9+ stdlib; /proc through `proc_root`, sysfs through `sysfs_root`.
"""
import collections
import os
import re

from .plan_nodes import node_mapping
from .topology_render import cpulist, parse_cpulist

__all__ = ["planned", "planned_nodes", "node_cpus", "plan_record", "scheduler_gpu", "read_binding", "check"]

TITLE_PREFIX = "sglang::scheduler"
TITLE_RANKS = re.compile(r"_(DP|PP|TP|EP)(\d+)")


def planned_nodes(argv):
    """The NUMA node per CUDA device that `--numa-node` gives in `argv` ([] when it is not there)."""
    argv = [str(a) for a in argv or []]
    if "--numa-node" not in argv:
        return []
    nodes = []
    for word in argv[argv.index("--numa-node") + 1:]:
        if not re.match(r"^-?\d+$", word):
            break
        nodes.append(int(word))
    return nodes


def planned(plan):
    """True when the plan binds its schedulers (numa_bind.nodes)."""
    return bool((plan.get("numa_bind") or {}).get("nodes"))


def node_cpus(gpus):
    """{node: cpulist} from topology facts' GPUs: the union of the NVML CPU affinity of each node's GPUs."""
    out = {}
    for gpu in gpus:
        node = gpu.get("numa_node")
        if node is None or not gpu.get("cpu_affinity"):
            continue
        out.setdefault(node, set()).update(parse_cpulist(gpu["cpu_affinity"]))
    return {str(n): cpulist(c) for n, c in sorted(out.items())}


def plan_record(argv, gpus, facts):
    """The plan's `numa_bind` ({nodes, node_cpus, crash_env, bind}) and the env it adds, or (None, {}) without
    --numa-node in `argv`. `facts`: the release's NUMA facts (sglang_facts_<v>.NUMA)."""
    nodes = planned_nodes(argv)
    if not nodes:
        return None, {}
    crash = (facts or {}).get("crash_env")
    record = {"nodes": nodes, "node_cpus": node_cpus(gpus), "bind": (facts or {}).get("bind", "numactl"),
              "crash_env": crash}
    return record, ({crash: "1"} if crash else {})


def scheduler_gpu(title, plan):
    """The CUDA device a scheduler titled `title` runs on (SGLang's gpu_id: base_gpu_id 0, gpu_id_step 1): replica
    d of a plain --dp-size starts at d * tp * pp; DP attention and one replica use the TP rank over the node's
    ranks."""
    layout = plan.get("layout") or {}
    tp, pp = int(layout.get("tp") or 1), int(layout.get("pp") or 1)
    dp, nnodes = int(layout.get("dp") or 1), int(layout.get("nnodes") or 1)
    ranks = {k: int(v) for k, v in TITLE_RANKS.findall(title[len(TITLE_PREFIX):])}
    tp_local, pp_local, _nodes_per_pp = node_mapping(tp, pp, nnodes)
    dp_attention = "--enable-dp-attention" in [str(a) for a in plan.get("argv") or []]
    base = ranks.get("DP", 0) * tp * pp if dp > 1 and not dp_attention else 0
    return base + (ranks.get("PP", 0) % pp_local) * tp_local + ranks.get("TP", 0) % tp_local


def _read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _status_field(text, name):
    for line in (text or "").splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    return None


def memory_policy(numa_maps):
    """The policy most mappings in /proc/<pid>/numa_maps show (the task's own, set by numactl --membind), or None
    when it cannot be read."""
    policies = collections.Counter(line.split()[1] for line in (numa_maps or "").splitlines()
                                   if len(line.split()) > 1)
    return policies.most_common(1)[0][0] if policies else None


def read_binding(pid, proc_root="/proc"):
    """{pid, cpus, mems, policy, ppid} of a process from /proc, or None when it is gone."""
    status = _read(os.path.join(proc_root, str(pid), "status"))
    if status is None:
        return None
    ppid = _status_field(status, "PPid")
    return {"pid": pid, "cpus": _status_field(status, "Cpus_allowed_list"),
            "mems": _status_field(status, "Mems_allowed_list"),
            "policy": memory_policy(_read(os.path.join(proc_root, str(pid), "numa_maps"))),
            "ppid": int(ppid) if ppid and ppid.isdigit() else None}


def memory_nodes(sysfs_root="/sys"):
    """Nodes this host has memory on (sysfs has_memory), or None when sysfs does not say."""
    text = _read(os.path.join(sysfs_root, "devices", "system", "node", "has_memory"))
    return None if text is None else set(parse_cpulist(text.strip()))


def check(plan, schedulers, proc_root="/proc", sysfs_root="/sys"):
    """Check each scheduler's binding against the plan's numa_bind. `schedulers`: [(pid, title)] of the unit.
    Returns (lines, problems): one line per scheduler saying what it has (and that it is what the plan wants),
    and one line per mismatch naming the process, what it has and what the plan wants. ([], []) when the plan
    binds nothing."""
    if not planned(plan):
        return [], []
    record = plan["numa_bind"]
    nodes = record["nodes"]
    lines, problems = [], []
    with_memory = memory_nodes(sysfs_root)
    for pid, title in sorted(schedulers, key=lambda s: s[1]):
        gpu = scheduler_gpu(title, plan)
        if gpu >= len(nodes):
            problems.append("%s (pid %d) runs CUDA device %d, which --numa-node %s gives no node" % (
                title, pid, gpu, " ".join(map(str, nodes))))
            continue
        node = nodes[gpu]
        has = read_binding(pid, proc_root)
        if has is None:
            problems.append("%s (pid %d) is gone" % (title, pid))
            continue
        launcher = read_binding(has["ppid"], proc_root) if has["ppid"] else None
        allowed = set(parse_cpulist(launcher["cpus"])) if launcher and launcher["cpus"] else None
        wants, notes = [], []
        cpus_ok = True
        node_text = (record.get("node_cpus") or {}).get(str(node))
        if node_text:
            want = set(parse_cpulist(node_text))
            if allowed is not None:
                want &= allowed
            want_text = cpulist(want) or "none (node %d's CPUs %s are all outside the launcher's %s)" % (
                node, node_text, cpulist(allowed or []))
            cpus_ok = bool(want) and set(parse_cpulist(has["cpus"] or "")) == want
            wants.append("CPUs %s" % want_text)
        else:
            notes.append("CPUs not checked: the topology facts give none for node %d" % node)
        mem_ok = True
        if with_memory is not None and node not in with_memory:
            notes.append("memory not checked: this host has no memory on node %d (has_memory %s)" % (
                node, cpulist(with_memory) or "none"))
        else:
            mem_ok = has["policy"] in ("bind:%d" % node, "preferred:%d" % node)
            wants.append("memory bound to node %d" % node)
            if has["policy"] == "preferred:%d" % node:
                notes.append("memory only preferred on node %d (SGLang fell back from a hard bind)" % node)
        what = "%s (pid %d, CUDA device %d) runs on CPUs %s with memory policy %s" % (
            title, pid, gpu, has["cpus"] or "?", has["policy"] or "unknown")
        if cpus_ok and mem_ok:
            lines.append("%s: bound to NUMA node %d as planned%s" % (what, node,
                                                                     "; " + "; ".join(notes) if notes else ""))
        else:
            problems.append("%s; the plan's --numa-node %d wants %s" % (what, node, " and ".join(wants)))
    return lines, problems
