"""Print, as JSON, the versions of what serves and measures: run with the SGLang venv's python (stdlib only)."""
import importlib.metadata
import json
import platform

PACKAGES = ("sglang", "torch", "sgl-kernel", "flashinfer-python", "transformers", "nvidia-nccl-cu12")

found = {"python": platform.python_version()}
for name in PACKAGES:
    try:
        found[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        found[name] = None
try:
    with open("/usr/local/cuda/version.json") as handle:
        found["cuda_toolkit"] = json.load(handle)["cuda"]["version"]
except (OSError, ValueError, KeyError):
    found["cuda_toolkit"] = None
print(json.dumps(found, sort_keys=True))
