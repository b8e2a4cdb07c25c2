#!/usr/bin/env python3
"""Register GPU memory with the lab's fake NVML, as a CUDA process would hold it on a real GPU.

Stdlib only; import it or copy the few lines of register(). Protocol (docs/DESIGN.md):
the file ``${FAKE_NVML_STATE_DIR:-/run/fake-nvml}/<pid>.<gpu index>`` holds ``<used bytes> <starttime>``,
starttime being field 22 of ``/proc/<pid>/stat``. The fake counts it only while that process lives
(same starttime, not a zombie), so memory is "freed" when the process exits, whoever cleans up the file.

    python3 fakegpu.py register GPU BYTES [--pid PID] [--state-dir DIR]
    python3 fakegpu.py unregister GPU [--pid PID] [--state-dir DIR]
"""
import argparse
import os
import sys

DEFAULT_STATE_DIR = "/run/fake-nvml"


def state_dir_of(state_dir=None):
    """The registration directory: the argument, else $FAKE_NVML_STATE_DIR, else /run/fake-nvml."""
    return str(state_dir or os.environ.get("FAKE_NVML_STATE_DIR") or DEFAULT_STATE_DIR)


def starttime(pid):
    """Field 22 of /proc/<pid>/stat (clock ticks after boot); the comm field may hold spaces."""
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
        stat = f.read()
    return int(stat[stat.rindex(")") + 2:].split()[19])


def _check(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")


def register(gpu_index, used_bytes, pid=None, state_dir=None, reported_pid=None):
    """Show `used_bytes` on GPU `gpu_index` held by `pid` (default: this process). Returns the file path.

    `reported_pid`: NVML reports the holder under this pid instead, as the driver reports a process of another
    PID namespace (a container's) by a pid this /proc may not have; the memory still lives as long as `pid`.
    Registering again replaces the amount. Written to a temporary name and renamed, so the fake never
    reads half a file."""
    pid = os.getpid() if pid is None else pid
    _check("gpu_index", gpu_index)
    _check("used_bytes", used_bytes)
    _check("pid", pid)
    if reported_pid is not None:
        _check("reported_pid", reported_pid)
    directory = state_dir_of(state_dir)
    if not os.path.isdir(directory):
        os.makedirs(directory, exist_ok=True)
        os.chmod(directory, 0o1777)
    path = os.path.join(directory, f"{pid}.{gpu_index}")
    tmp = os.path.join(directory, f".{pid}.{gpu_index}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="ascii") as f:
        f.write(f"{used_bytes} {starttime(pid)}" + (f" {reported_pid}" if reported_pid is not None else "") + "\n")
    os.replace(tmp, path)
    return path


def unregister(gpu_index, pid=None, state_dir=None):
    """Drop the registration of `pid` on `gpu_index`; True when there was one."""
    pid = os.getpid() if pid is None else pid
    _check("gpu_index", gpu_index)
    _check("pid", pid)
    try:
        os.unlink(os.path.join(state_dir_of(state_dir), f"{pid}.{gpu_index}"))
    except FileNotFoundError:
        return False
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(description="Register GPU memory with the lab's fake NVML.")
    sub = parser.add_subparsers(dest="command", required=True)
    reg = sub.add_parser("register", help="show BYTES used on GPU by PID")
    reg.add_argument("gpu", type=int)
    reg.add_argument("bytes", type=int)
    reg.add_argument("--reported-pid", type=int,
                     help="NVML reports the holder as this pid (a process of another PID namespace, as the driver does)")
    unreg = sub.add_parser("unregister", help="drop PID's registration on GPU")
    unreg.add_argument("gpu", type=int)
    for p in (reg, unreg):
        p.add_argument("--pid", type=int, help="process holding the memory (default: the parent shell)")
        p.add_argument("--state-dir", help=f"registration directory (default $FAKE_NVML_STATE_DIR or {DEFAULT_STATE_DIR})")
    args = parser.parse_args(argv)
    # From a shell, the process that "holds" the memory is the caller, not this short-lived python.
    pid = args.pid if args.pid is not None else os.getppid()
    try:
        if args.command == "register":
            print(register(args.gpu, args.bytes, pid=pid, state_dir=args.state_dir, reported_pid=args.reported_pid))
        elif not unregister(args.gpu, pid=pid, state_dir=args.state_dir):
            print(f"no registration of pid {pid} on GPU {args.gpu}", file=sys.stderr)
            return 1
    except (OSError, ValueError) as e:
        print(f"fakegpu: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
