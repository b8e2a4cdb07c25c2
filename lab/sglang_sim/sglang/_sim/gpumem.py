"""GPU memory through the fake NVML's registration files (docs/DESIGN.md, "Fake NVML").

Writing goes through the lab's fakegpu module (bundled into the wheel). Reading what other processes hold
follows the same protocol: a file `<pid>.<gpu>` counts while that pid lives with the recorded start time.
"""
import os

from sglang._sim import resources

GIB = 1 << 30


def _fakegpu():
    return resources.load("fakegpu")


def register(gpu_index, nbytes):
    return _fakegpu().register(gpu_index, int(nbytes))


def unregister(gpu_index):
    return _fakegpu().unregister(gpu_index)


def _live(pid, start):
    try:
        with open("/proc/%d/stat" % pid, encoding="ascii", errors="replace") as f:
            stat = f.read()
    except OSError:
        return False
    fields = stat[stat.rindex(")") + 2:].split()
    return fields[0] != "Z" and int(fields[19]) == start


def held_by_others(gpu_index, exclude_pids=()):
    """Bytes that live processes other than exclude_pids have registered on NVML GPU gpu_index."""
    directory = _fakegpu().state_dir_of()
    total = 0
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return 0
    for name in names:
        pid_text, _, gpu_text = name.partition(".")
        if not (pid_text.isdigit() and gpu_text.isdigit()) or int(gpu_text) != gpu_index:
            continue
        pid = int(pid_text)
        if pid in exclude_pids:
            continue
        try:
            with open(os.path.join(directory, name), encoding="ascii") as f:
                used, start = f.read().split()[:2]
        except (OSError, ValueError):
            continue  # being replaced, or not a registration
        if _live(pid, int(start)):
            total += int(used)
    return total
