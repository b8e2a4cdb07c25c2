#!/usr/bin/env python3
"""Check on a real GPU machine that CUDA and Triton still work under the hardened unit's settings (run there as
root; the lab has no GPU, and the GPU machine used for this has no systemd, so each setting is reproduced by hand).

    python3 tools/gpu_hardening_check.py --out DIR

A child process sets up, step by step, what roles/launch/templates/unit.service.j2 asks systemd for, and records
whether each step took: a private mount namespace; the whole file system read-only but for a writable home
(ProtectSystem=strict + ReadWritePaths=<home>); a private /tmp (PrivateTmp=yes); /home and /root hidden
(ProtectHome=yes); umask 0077 (UMask=); an empty capability bounding set and no capabilities
(CapabilityBoundingSet=); no new privileges (NoNewPrivileges=yes, prctl); an unprivileged user (User=). Then, in
that process: a PyTorch CUDA matmul checked against the CPU, a Triton kernel compiled (JIT, cache in the home) and
run, torch.compile of a small function (inductor's cache in the home), CPU affinity and a NUMA memory policy set
(what numactl does for SGLang's NUMA binding). The same workload runs first without any setting (baseline).
Not reproduced here (systemd only): the seccomp filters behind RestrictAddressFamilies=, RestrictNamespaces=,
RestrictRealtime=, LockPersonality=, SystemCallArchitectures=, ProtectKernel*=, ProtectControlGroups=, ProtectProc=.
Writes DIR/gpu_hardening_check.json and prints it; exits 1 when the hardened run fails.
"""
import argparse
import ctypes
import json
import os
import platform
import subprocess
import sys
import tempfile
import traceback

WORKLOAD = r'''
import ctypes, json, os, time
out = {"uid": os.getuid(), "umask": oct(os.umask(0o077))}
os.umask(int(out["umask"], 8))
with open("/proc/self/status") as f:
    out["status"] = {k: v.strip() for k, v in (l.split(":", 1) for l in f) if k in ("NoNewPrivs", "CapEff", "CapBnd", "CapPrm")}
t0 = time.time()
import torch
a = torch.randn(2048, 2048, device="cuda")
b = torch.randn(2048, 2048, device="cuda")
c = (a @ b).cpu()
out["matmul_ok"] = bool(torch.allclose(c, a.cpu() @ b.cpu(), rtol=1e-2, atol=1e-1))
out["device"] = torch.cuda.get_device_name(0)
import triton, triton.language as tl
@triton.jit
def add(x, y, o, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(o + i, tl.load(x + i, mask=m) + tl.load(y + i, mask=m), mask=m)
x = torch.rand(10000, device="cuda"); y = torch.rand(10000, device="cuda"); o = torch.empty_like(x)
add[(triton.cdiv(10000, 1024),)](x, y, o, 10000, BLOCK=1024)
out["triton_ok"] = bool(torch.allclose(o, x + y))
out["triton_cache"] = os.environ.get("TRITON_CACHE_DIR")
f = torch.compile(lambda t: torch.sin(t) * 2 + 1)
out["compile_ok"] = bool(torch.allclose(f(x), torch.sin(x) * 2 + 1))
os.sched_setaffinity(0, {0})
out["affinity"] = sorted(os.sched_getaffinity(0))
libc = ctypes.CDLL(None, use_errno=True)
mask = ctypes.c_ulong(1)
rc = libc.syscall(238, 2, ctypes.byref(mask), 64)   # set_mempolicy(MPOL_BIND, node 0)
out["set_mempolicy"] = "ok" if rc == 0 else "errno %d" % ctypes.get_errno()
out["seconds"] = round(time.time() - t0, 1)
print("RESULT " + json.dumps(out))
'''

libc = ctypes.CDLL(None, use_errno=True)
PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 38, 24


def step(steps, name, fn):
    try:
        fn()
        steps[name] = "ok"
        return True
    except Exception as exc:  # pylint: disable=broad-except  # a step that cannot be reproduced is recorded
        steps[name] = "failed: %s" % exc
        return False


def sh(*argv):
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise OSError("%s: %s" % (" ".join(argv), (proc.stderr or proc.stdout).strip()))


def harden(home, steps):
    """In this (child) process: the unit's settings, as far as they go without systemd."""
    os.umask(0o077)
    steps["umask 0077"] = "ok"
    if step(steps, "private mount namespace (unshare CLONE_NEWNS)", _unshare_mounts):
        step(steps, "mounts private", lambda: sh("mount", "--make-rprivate", "/"))
        # Each top-level tree bound onto itself with its submounts (--rbind: /usr/local/nvidia and the like stay)
        # and made read-only; /dev, /proc, /sys stay as they are (ProtectSystem=strict leaves them to other options).
        for top in sorted(os.listdir("/")):
            path = "/" + top
            if top in ("dev", "proc", "sys", "tmp", "run") or os.path.islink(path) or not os.path.isdir(path):
                continue
            step(steps, "read-only %s" % path,
                 lambda t=path: (sh("mount", "--rbind", t, t), sh("mount", "-o", "remount,bind,ro", t)))
        step(steps, "home writable under the read-only tree (ReadWritePaths=)",
              lambda: (sh("mount", "--bind", home, home), sh("mount", "-o", "remount,bind,rw", home)))
        step(steps, "private /tmp (tmpfs)", lambda: sh("mount", "-t", "tmpfs", "-o", "mode=1777", "tmpfs", "/tmp"))
        for hidden in ("/home", "/root"):
            if os.path.realpath(sys.executable).startswith(hidden + "/"):
                steps["hidden %s" % hidden] = "skipped: this python lives there"
            elif os.path.isdir(hidden) and not home.startswith(hidden + "/"):
                step(steps, "hidden %s (tmpfs, ro)" % hidden,
                     lambda h=hidden: sh("mount", "-t", "tmpfs", "-o", "ro,mode=000", "tmpfs", h))
        probe = "/usr/.topolaunch-probe"
        steps["write to /usr refused"] = "no (written)" if _writes(probe) else "yes"
        steps["write to home allowed"] = "yes" if _writes(os.path.join(home, ".probe")) else "no"
    uid = 65534
    os.chown(home, uid, uid)
    for d, _dirs, files in os.walk(home):
        for name in _dirs + files:
            os.chown(os.path.join(d, name), uid, uid)

    def drop_bounding():
        for cap in range(64):
            if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:   # EINVAL: no such cap
                raise OSError("PR_CAPBSET_DROP %d: errno %d" % (cap, ctypes.get_errno()))
    step(steps, "capability bounding set emptied", drop_bounding)
    step(steps, "user nobody (setgroups, setgid, setuid)", lambda: (os.setgroups([]), os.setgid(uid), os.setuid(uid)))

    def nnp():
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError("prctl: errno %d" % ctypes.get_errno())
    step(steps, "no_new_privs", nnp)


def _unshare_mounts():
    if libc.unshare(0x00020000) != 0:                       # CLONE_NEWNS
        raise OSError("unshare: errno %d" % ctypes.get_errno())


def _writes(path):
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write("x")
        os.unlink(path)
        return True
    except OSError:
        return False


def run_workload(env):
    """The workload from a file in the home (Triton's JIT reads its kernels' source from their file)."""
    path = os.path.join(env["HOME"], "workload.py")
    if not os.path.exists(path):
        with open(path, "w", encoding="utf-8") as f:
            f.write(WORKLOAD)
        os.chmod(path, 0o644)
    proc = subprocess.run([sys.executable, path], capture_output=True, text=True, env=env, check=False,
                          timeout=400, cwd=env["HOME"])
    result = {"rc": proc.returncode, "stderr_tail": proc.stderr.strip().splitlines()[-8:]}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result.update(json.loads(line[7:]))
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    report = {"host": platform.node(), "kernel": platform.release(), "python": sys.version.split()[0],
              "devices": sorted(n for n in os.listdir("/dev") if n.startswith("nvidia")),
              "nvidia_modprobe": next((p for p in ("/usr/bin/nvidia-modprobe", "/usr/local/nvidia/bin/nvidia-modprobe")
                                       if os.path.exists(p)), None)}
    base_home = tempfile.mkdtemp(prefix="baseline-home-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
    env = dict(os.environ, HOME=base_home, TRITON_CACHE_DIR=base_home + "/.triton/cache",
               TORCHINDUCTOR_CACHE_DIR=base_home + "/.cache/torchinductor")
    report["baseline"] = run_workload(env)

    home = tempfile.mkdtemp(prefix="service-home-", dir="/var/tmp" if os.path.isdir("/var/tmp") else None)
    os.chmod(home, 0o755)
    with open(os.path.join(home, "workload.py"), "w", encoding="utf-8") as f:
        f.write(WORKLOAD)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        steps = {}
        try:
            harden(home, steps)
            env = dict(os.environ, HOME=home, TRITON_CACHE_DIR=home + "/.triton/cache",
                       TORCHINDUCTOR_CACHE_DIR=home + "/.cache/torchinductor", USER="nobody")
            result = {"steps": steps, "workload": run_workload(env)}
        except Exception as exc:  # pylint: disable=broad-except
            result = {"steps": steps, "error": traceback.format_exc().splitlines()[-6:]}
        os.write(write, json.dumps(result).encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while True:
        chunk = os.read(read, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.waitpid(pid, 0)
    report["hardened"] = json.loads(b"".join(chunks) or b"{}")
    text = json.dumps(report, indent=1, sort_keys=True)
    with open(os.path.join(args.out, "gpu_hardening_check.json"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    print(text)
    work = report["hardened"].get("workload", {})
    ok = all(work.get(k) for k in ("matmul_ok", "triton_ok", "compile_ok")) and work.get("rc") == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
