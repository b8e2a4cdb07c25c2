"""plugin_utils/topology_replay.py: every nvml* call recorded (answers, NVML errors, handles, ctypes structures and
arrays, pynvml's objects) and replayed with the same API; overrides; a call the recording lacks is named."""
import ctypes
import json

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import topology
from ansible_collections.topolaunch.sglang.plugins.plugin_utils.topology_replay import (Handle, Recorder, Replay,
                                                                                       ReplayNVMLError)
from topology_cases import make_sysfs


class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class Process:
    def __init__(self, pid):
        self.pid, self.usedGpuMemory, self._private = pid, 1 << 30, "not recorded"


class FakeNvml:
    """A pynvml-like module: two GPUs, one NVML error, one value of every recorded kind."""

    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__(value)
            self.value = value

    VERSION = "not an nvml call"

    def nvmlDeviceGetHandleByIndex(self, index):
        return object()                                 # opaque, as pynvml's handles are

    def nvmlDeviceGetName(self, handle):
        return b"NVIDIA Fake"

    def nvmlDeviceGetMemoryInfo(self, handle):
        return Memory(80, 1)

    def nvmlDeviceGetCpuAffinity(self, handle, words):
        return (ctypes.c_ulong * words)(15, 0)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [Process(4242)]

    def nvmlDeviceGetNumaNodeId(self, handle):
        raise self.NVMLError(3)

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        return 40


def test_a_recording_replays_every_answer_and_error():
    nvml = Recorder(FakeNvml())
    assert nvml.VERSION == "not an nvml call"           # passed through, not recorded
    h0, h1 = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(1)
    nvml.nvmlDeviceGetName(h0)
    nvml.nvmlDeviceGetMemoryInfo(h1)
    nvml.nvmlDeviceGetCpuAffinity(h0, 2)
    nvml.nvmlDeviceGetComputeRunningProcesses(h0)
    nvml.nvmlDeviceGetTopologyCommonAncestor(h0, h1)
    with pytest.raises(FakeNvml.NVMLError):
        nvml.nvmlDeviceGetNumaNodeId(h1)
    recording = json.loads(json.dumps(nvml.recording({"machine": "fake"})))   # JSON-friendly
    assert recording["meta"] == {"machine": "fake"}

    replay = Replay(recording)
    assert replay.nvmlDeviceGetName(Handle(0)) == "NVIDIA Fake"
    memory = replay.nvmlDeviceGetMemoryInfo(Handle(1))
    assert (memory.total, memory.used) == (80, 1)
    assert replay.nvmlDeviceGetCpuAffinity(Handle(0), 2) == [15, 0]
    (proc,) = replay.nvmlDeviceGetComputeRunningProcesses(Handle(0))
    assert (proc.pid, proc.usedGpuMemory) == (4242, 1 << 30) and not hasattr(proc, "_private")
    assert replay.nvmlDeviceGetTopologyCommonAncestor(Handle(0), Handle(1)) == 40
    with pytest.raises(ReplayNVMLError) as exc:
        replay.nvmlDeviceGetNumaNodeId(Handle(1))
    assert exc.value.value == 3
    assert replay.asked[-1] == '["nvmlDeviceGetNumaNodeId", {"handle": 1}]'


def test_overrides_and_unknown_calls():
    replay = Replay({"calls": [{"call": ["nvmlDeviceGetCount"], "result": 2}]},
                    overrides={("nvmlDeviceGetCount",): 8, ("nvmlDeviceGetName", Handle(0)): ReplayNVMLError(15)})
    assert replay.nvmlDeviceGetCount() == 8
    with pytest.raises(ReplayNVMLError):
        replay.nvmlDeviceGetName(Handle(0))
    with pytest.raises(LookupError, match='the recording has no answer for \\["nvmlDeviceGetName", {"handle": 1}\\]'):
        replay.nvmlDeviceGetName(Handle(1))
    with pytest.raises(AttributeError):
        replay.something_else  # pylint: disable=pointless-statement


def test_an_answer_of_an_unknown_type_is_refused():
    class Odd:
        __slots__ = ()

    class Nvml(FakeNvml):
        def nvmlDeviceGetOdd(self):
            return Odd()

    with pytest.raises(TypeError, match="cannot record NVML answer of type Odd"):
        Recorder(Nvml()).nvmlDeviceGetOdd()


def test_the_topology_read_through_the_fake_nvml_replays_to_the_same_facts(fake_nvml, tmp_path):
    """Record the real reader over the C fake and real nvidia-ml-py; the replay reads the very same facts."""
    import pynvml  # pylint: disable=import-outside-toplevel

    spec = fake_nvml.use("proxmox-8x-rtx-pro-6000-vnuma", init=False)
    sysfs = make_sysfs(tmp_path, spec)
    recorder = Recorder(pynvml)
    live = topology.read_topology(recorder, sysfs)
    replayed = topology.read_topology(Replay(json.loads(json.dumps(recorder.recording()))), sysfs)
    for facts in (live, replayed):
        facts.pop("query_seconds", None)
    assert replayed == live and live["fingerprint"] == topology.read_topology(pynvml, sysfs)["fingerprint"]
