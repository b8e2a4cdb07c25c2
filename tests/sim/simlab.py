"""The SGLang simulator as shipped, in real processes: shared by the simulator's end-to-end tests.

`sim_site` builds the wheel and unpacks it (pure Python: unpacking is installing); `lab` is one simulated machine:
a private fake-NVML state directory, a GPU spec copied from lab/specs and model directories copied from
tests/fixtures/models. Servers listen on 127.0.0.1:33000-33999; every wait is a condition polled until a deadline.
Two `Lab`s with their own directories are two nodes of a multi-node server.
"""
import json
import os
import pathlib
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests/fixtures/models"
SPECS = ROOT / "lab/specs"
GIB = 1 << 30


def wait_for(condition, timeout, what, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError("timed out after %ss waiting for %s" % (timeout, what))


def holds_for(condition, seconds, what, interval=0.05):
    """Assert that condition stays true for `seconds` (the only way to see that something does NOT happen)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert condition(), what
        time.sleep(interval)


def free_port(low=33000, high=33999):
    for _ in range(500):
        port = random.randint(low, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port in %d-%d" % (low, high))


def port_open(port):
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def http(method, url, body=None, headers=None, timeout=30):
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    hdrs = {"Content-Type": "application/json"} if data is not None else {}
    hdrs.update(headers or {})
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def children_of(pid):
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return out


@pytest.fixture(scope="session")
def sim_wheels(tmp_path_factory):
    """Every simulator wheel as build_wheel.py makes them (one per SGLang release): {release: wheel path}."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, str(ROOT / "lab/sglang_sim/build_wheel.py"), "--out", str(out)], check=True,
                   capture_output=True, timeout=60)
    return {w.name.split("-")[1].split("+")[0]: w for w in out.glob("sglang-*+sim-py3-none-any.whl")}


def unpack(wheel, site):
    """Pure Python: unpacking the wheel is installing it."""
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    return site


@pytest.fixture(scope="session")
def sim_site(sim_wheels, tmp_path_factory):
    """The 0.5.9 simulator as shipped."""
    return unpack(sim_wheels["0.5.9"], tmp_path_factory.mktemp("site"))


@pytest.fixture(scope="session")
def sim_site_0523(sim_wheels, tmp_path_factory):
    """The 0.5.23 simulator as shipped."""
    return unpack(sim_wheels["0.5.23"], tmp_path_factory.mktemp("site0523"))


class Server:
    def __init__(self, proc, port, log, lab):
        self.proc, self.port, self.log_path, self.lab = proc, port, log, lab
        self.url = "http://127.0.0.1:%d" % port

    def log(self):
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, timeout=20):
        def ready():
            assert self.proc.poll() is None, "server exited (%s):\n%s" % (self.proc.returncode, self.log()[-3000:])
            return "The server is fired up and ready to roll!" in self.log()
        wait_for(ready, timeout, "the ready milestone")
        return self

    def wait_exit(self, timeout=20):
        wait_for(lambda: self.proc.poll() is not None, timeout, "the launcher to exit")
        return self.proc.returncode

    def get(self, path, **kw):
        return http("GET", self.url + path, **kw)

    def post(self, path, body, **kw):
        return http("POST", self.url + path, body, **kw)


class Lab:
    def __init__(self, tmp, site, spec="proxmox-8x-rtx-pro-6000-vnuma.json"):
        self.tmp, self.site = tmp, site
        tmp.mkdir(parents=True, exist_ok=True)
        self.state = tmp / "nvml"
        self.state.mkdir()
        self.spec = tmp / "spec.json"
        shutil.copy(SPECS / spec, self.spec)
        self.servers, self.helpers = [], []

    def model(self, name, **overrides):
        dest = self.tmp / "models" / name
        if not dest.exists():
            shutil.copytree(MODELS / name, dest)
        if overrides:
            cfg = json.loads((dest / "config.json").read_text())
            cfg.update(overrides)
            (dest / "config.json").write_text(json.dumps(cfg))
        return str(dest)

    def env(self, **extra):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("SGLANG_", "CUDA_", "FAKE_NVML")) and k not in ("PYTHONPATH", "API_KEY",
                                                                                     "OPENAI_API_KEY")}
        env.update({"PYTHONPATH": str(self.site), "FAKE_NVML_STATE_DIR": str(self.state),
                    "SGLANG_SIM_GPU_SPEC": str(self.spec), "SGLANG_SIM_LOAD_SECONDS": "0.2",
                    "SGLANG_SIM_CAPTURE_SECONDS": "0.05", "SGLANG_SIM_HEALTH_POLL_SECONDS": "0.05",
                    "SGLANG_SIM_DRAIN_POLL_SECONDS": "0.1"})
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def launch(self, *argv, **env):
        port = free_port()
        log = self.tmp / ("server-%d.log" % port)
        with open(log, "wb") as f:
            proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", *argv, "--port", str(port)],
                                    stdout=f, stderr=subprocess.STDOUT, env=self.env(**env), cwd=str(self.tmp))
        server = Server(proc, port, log, self)
        self.servers.append(server)
        return server

    def run(self, module, *argv, timeout=60, **env):
        return subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True,
                              env=self.env(**env), cwd=str(self.tmp), timeout=timeout)

    def registrations(self):
        """{pid: {gpu: bytes}} of live registrations in this lab's state directory."""
        out = {}
        for name in os.listdir(self.state):
            pid, _, gpu = name.partition(".")
            if pid.isdigit() and gpu.isdigit() and alive(int(pid)):
                try:
                    used = int((self.state / name).read_text().split()[0])
                except FileNotFoundError:
                    continue  # unregistered between listdir and read: the process let go of that GPU
                out.setdefault(int(pid), {})[int(gpu)] = used
        return out

    def foreign_holder(self, gpu, nbytes):
        """Another user's process holding memory on a GPU (registered with the wheel's fakegpu command)."""
        proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
        self.helpers.append(proc)
        res = self.run("sglang._sim.fakegpu", "register", str(gpu), str(nbytes), "--pid", str(proc.pid))
        assert res.returncode == 0, res.stderr
        return proc

    def cleanup(self):
        for server in self.servers:
            if server.proc.poll() is None:
                server.proc.kill()
                server.proc.wait()
        for pid in self.registrations():
            if cmdline(pid).startswith("sglang::"):
                os.kill(pid, signal.SIGKILL)
        for proc in self.helpers:
            proc.kill()
            proc.wait()


@pytest.fixture
def lab(tmp_path, sim_site):
    the_lab = Lab(tmp_path, sim_site)
    yield the_lab
    the_lab.cleanup()


