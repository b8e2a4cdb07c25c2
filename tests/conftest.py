"""Shared test fixtures: the lab's fake NVML, loaded in-process under the real nvidia-ml-py (product tests in
tests/unit and the lab's own tests in tests/sim use it). The project's code is imported as the collection
topolaunch.sglang (`ansible_collections.topolaunch.sglang.plugins...`): `make setup` puts collections/ on the path.

`fake_nvml` builds lab/fakenvml into build/fakenvml (make is a no-op when up to date), loads
libnvidia-ml.so.1 from there with RTLD_GLOBAL before pynvml opens it by soname (so pynvml gets
the fake), points the fake at a spec and a per-test registration directory, and shuts NVML
down after the test.

    def test_x(fake_nvml):
        fake_nvml.use("proxmox-8x-rtx-pro-6000-vnuma")   # name in lab/specs, a path, or a dict
        pid = fake_nvml.register(0, 4 << 30)               # this process holds 4 GiB on GPU 0
        ...pynvml calls...
"""
import ctypes
import importlib.util
import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The tests read ansible-playbook's whole output (every task's ok/skipping/changed line, failures as results): Ansible's
# default stdout callback, not the brief one ansible.cfg sets for people (callback_plugins/brief.py). A test of the
# brief output itself removes this from its command's environment (tests/lab/test_lifecycle.py: the line budget).
os.environ.setdefault("ANSIBLE_STDOUT_CALLBACK", "ansible.builtin.default")
FAKENVML_SRC = ROOT / "lab" / "fakenvml"
FAKENVML_BUILD = ROOT / "build" / "fakenvml"
SPECS_DIR = ROOT / "lab" / "specs"


def _load_fakegpu():
    spec = importlib.util.spec_from_file_location("fakegpu", FAKENVML_SRC / "fakegpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fakegpu = _load_fakegpu()


@pytest.fixture(scope="session")
def fake_nvml_build():
    """Build the fake (no-op when up to date) and load it as libnvidia-ml.so.1; returns the build dir."""
    proc = subprocess.run(["make", "-s", "-C", str(FAKENVML_SRC), f"OUT={FAKENVML_BUILD}"],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        pytest.fail(f"building the fake NVML failed (make -C {FAKENVML_SRC}):\n{proc.stdout}{proc.stderr}")
    # Loaded first, by path and globally: pynvml's CDLL("libnvidia-ml.so.1") then finds this object by soname.
    ctypes.CDLL(str(FAKENVML_BUILD / "libnvidia-ml.so.1"), mode=ctypes.RTLD_GLOBAL)
    return FAKENVML_BUILD


class FakeNvml:
    """Drives the fake NVML for one test. Attributes: build_dir, lib_path, smi_path, state_dir,
    spec_path and spec (the dict last passed to use(), None if it was not valid JSON)."""

    specs_dir = SPECS_DIR

    def __init__(self, build_dir, tmp_path, monkeypatch):
        self.build_dir = build_dir
        self.lib_path = build_dir / "libnvidia-ml.so.1"
        self.smi_path = build_dir / "nvidia-smi"
        self._tmp = tmp_path
        self._monkeypatch = monkeypatch
        self.state_dir = tmp_path / "fake-nvml-state"
        self.state_dir.mkdir()
        self.state_dir.chmod(0o1777)
        monkeypatch.setenv("FAKE_NVML_STATE_DIR", str(self.state_dir))
        self.spec_path = None
        self.spec = None
        self._spec_count = 0

    def spec_file(self, spec):
        """Path of a spec given as a name in lab/specs ("h200x2-vm-real"), a path, or a dict (written out)."""
        if isinstance(spec, dict):
            self._spec_count += 1
            path = self._tmp / f"spec-{self._spec_count}.json"
            path.write_text(json.dumps(spec, indent=1))
            return path
        spec = str(spec)
        named = SPECS_DIR / (spec if spec.endswith(".json") else spec + ".json")
        if "/" not in spec and named.is_file():
            return named
        path = pathlib.Path(spec)
        if not path.is_file():
            raise FileNotFoundError(f"no spec {spec!r}: not in {SPECS_DIR} and not a file")
        return path

    def use(self, spec, init=True):
        """Point FAKE_NVML_SPEC at `spec` and (by default) call pynvml.nvmlInit(); returns the spec dict."""
        import pynvml

        self.spec_path = self.spec_file(spec)
        self._monkeypatch.setenv("FAKE_NVML_SPEC", str(self.spec_path))
        try:
            self.spec = json.loads(self.spec_path.read_text())
        except ValueError:
            self.spec = None
        if init:
            pynvml.nvmlInit()
        return self.spec

    def register(self, gpu_index, used_bytes, pid=None, reported_pid=None):
        """Register `used_bytes` on GPU `gpu_index` for `pid` (default: this test process); returns the pid.
        `reported_pid`: NVML reports it under that pid (a process of another PID namespace)."""
        pid = os.getpid() if pid is None else pid
        fakegpu.register(gpu_index, used_bytes, pid=pid, state_dir=self.state_dir, reported_pid=reported_pid)
        return pid

    def unregister(self, gpu_index, pid=None):
        return fakegpu.unregister(gpu_index, pid=pid, state_dir=self.state_dir)

    @property
    def env(self):
        """Environment for a subprocess that should see the same fake GPUs (python + pynvml, nvidia-smi)."""
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(self.build_dir), env.get("LD_LIBRARY_PATH")]))
        env["FAKE_NVML_STATE_DIR"] = str(self.state_dir)
        if self.spec_path is not None:
            env["FAKE_NVML_SPEC"] = str(self.spec_path)
        return env

    def shutdown(self):
        """Undo every nvmlInit still open (the test's and the code's under test)."""
        import pynvml

        for _ in range(1000):
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError_Uninitialized:
                return
        raise AssertionError("nvmlShutdown still succeeding after 1000 calls: init/shutdown leak")


@pytest.fixture
def fake_nvml(fake_nvml_build, tmp_path, monkeypatch):
    helper = FakeNvml(fake_nvml_build, tmp_path, monkeypatch)
    yield helper
    helper.shutdown()
