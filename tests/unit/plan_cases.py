"""Shared inputs for the planner tests: topology facts through the real reader, model fixtures, field args."""
import copy
import json
import pathlib

from ansible_collections.topolaunch.sglang.plugins.module_utils import topology
from ansible_collections.topolaunch.sglang.plugins.plugin_utils.topology_replay import Replay
from topology_cases import load_spec, make_sysfs, synthesize

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "fixtures" / "models"
MODEL_NAMES = sorted(p.name for p in MODELS.iterdir() if p.is_dir())

# The field launch (reference topology.md): backends as the field used them, snake_case ServerArgs keys.
FIELD_ARGS = {
    "mem_fraction_static": 0.92,
    "max_running_requests": 1024,
    "attention_backend": "flashinfer",
    "fp8_gemm_backend": "cutlass",
    "nsa_prefill_backend": "trtllm",
    "nsa_decode_backend": "trtllm",
    "moe_runner_backend": "flashinfer_cutlass",
}


def model_path(name):
    return str(MODELS / name)


def model_input(name, **overrides):
    """{config, total_size, name} of a fixture model, config keys overridden."""
    config = json.loads((MODELS / name / "config.json").read_text())
    index = json.loads((MODELS / name / "model.safetensors.index.json").read_text())
    config.update(overrides)
    return {"config": config, "total_size": index["metadata"]["total_size"], "name": name}


def synth_facts(spec, tmp_path):
    """Facts from the real topology reader over NVML answers synthesised from a spec (no C fake needed)."""
    if isinstance(spec, str):
        spec = load_spec(spec)
    return topology.read_topology(Replay(synthesize(spec)), make_sysfs(tmp_path, spec))


def fake_facts(fake_nvml, spec, tmp_path):
    """Facts through the lab's fake libnvidia-ml.so.1 and the real nvidia-ml-py."""
    import pynvml

    spec = fake_nvml.use(spec, init=False)
    return topology.read_topology(pynvml, make_sysfs(tmp_path, spec))


def subset_spec(name, keep):
    """A spec with only the GPUs `keep` (in that order), as a box with fewer GPUs would enumerate them."""
    spec = copy.deepcopy(load_spec(name))
    spec["name"] = "%s-%d" % (spec["name"], len(keep))
    spec["gpus"] = [spec["gpus"][i] for i in keep]
    spec["pcie_topology"] = [[spec["pcie_topology"][a][b] for b in keep] for a in keep]
    return spec


FIELD_ARGS_0_5_23 = dict({k: v for k, v in FIELD_ARGS.items() if not k.startswith("nsa_")},
                         dsa_prefill_backend="trtllm", dsa_decode_backend="trtllm")
