"""Record NVML answers on a real machine and replay them later with the same API as pynvml.

`Recorder(pynvml)` wraps the module: every `nvml*` call goes through, and its arguments and answer (or NVML
error code) are kept as JSON-friendly data. `Replay(recording)` answers the same calls from that data, so
`read_topology(Replay(...))` sees exactly what the real machine said. Device handles are recorded as
`{"handle": index}`; ctypes structures as `{"__obj__": {field: value}}`; ctypes arrays as lists.
"""
import ctypes
import json


def _encode(value, handles):
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if id(value) in handles:
        return {"handle": handles[id(value)][0]}
    if isinstance(value, (list, tuple)) or isinstance(value, ctypes.Array):
        return [_encode(v, handles) for v in value]
    if isinstance(value, ctypes.Structure):
        return {"__obj__": {f[0]: _encode(getattr(value, f[0]), handles) for f in value._fields_}}
    if hasattr(value, "__dict__"):      # pynvml's friendly objects (processes)
        return {"__obj__": {k: _encode(v, handles) for k, v in vars(value).items() if not k.startswith("_")}}
    raise TypeError("cannot record NVML answer of type %s" % type(value).__name__)


class Recorder:
    """Proxy of the pynvml module that records every nvml* call."""

    def __init__(self, nvml):
        self._nvml = nvml
        self._handles = {}     # id(handle) -> (index, handle); the handle is kept alive so ids stay unique
        self.calls = []

    def __getattr__(self, name):
        target = getattr(self._nvml, name)
        if not (name.startswith("nvml") and callable(target)):
            return target

        def call(*args):
            key = [name] + [_encode(a, self._handles) for a in args]
            try:
                result = target(*args)
            except self._nvml.NVMLError as exc:
                self.calls.append({"call": key, "error": exc.value})
                raise
            if name == "nvmlDeviceGetHandleByIndex":
                self._handles[id(result)] = (args[0], result)
            self.calls.append({"call": key, "result": _encode(result, self._handles)})
            return result
        return call

    def recording(self, meta=None):
        return {"meta": meta or {}, "calls": self.calls}


class ReplayNVMLError(Exception):
    """Stands in for pynvml.NVMLError: `value` is the NVML error code."""

    def __init__(self, value):
        super().__init__("NVML error %s" % value)
        self.value = value


class Handle:
    def __init__(self, index):
        self.index = index


class _Obj:
    def __init__(self, fields):
        self.__dict__.update(fields)


def _decode(value):
    if isinstance(value, dict) and "__obj__" in value:
        return _Obj({k: _decode(v) for k, v in value["__obj__"].items()})
    if isinstance(value, dict) and "handle" in value:
        return Handle(value["handle"])
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def _key(name, args):
    return json.dumps([name] + [{"handle": a.index} if isinstance(a, Handle) else a for a in args])


class Replay:
    """Answers nvml* calls from a recording; `overrides` maps (name, *args) keys to results or ReplayNVMLError."""

    NVMLError = ReplayNVMLError

    def __init__(self, recording, overrides=None):
        self._answers = {}
        for entry in recording["calls"]:
            self._answers.setdefault(json.dumps(entry["call"]), entry)
        self._overrides = {
            json.dumps(list(k[:1]) + [{"handle": a.index} if isinstance(a, Handle) else a for a in k[1:]]): v
            for k, v in (overrides or {}).items()}
        self.asked = []

    def __getattr__(self, name):
        if not name.startswith("nvml"):
            raise AttributeError(name)

        def call(*args):
            key = _key(name, args)
            self.asked.append(key)
            if key in self._overrides:
                answer = self._overrides[key]
                if isinstance(answer, ReplayNVMLError):
                    raise answer
                return answer
            if key not in self._answers:
                raise LookupError("the recording has no answer for %s" % key)
            entry = self._answers[key]
            if "error" in entry:
                raise ReplayNVMLError(entry["error"])
            return _decode(entry["result"])
        return call
