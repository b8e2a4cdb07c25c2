"""Every lab spec (read through the fake NVML and the real reader) x every model fixture: plans that hold up."""
import pytest

from plan_cases import MODEL_NAMES, fake_facts, model_path
from ansible_collections.topolaunch.sglang.plugins.module_utils import planner
from ansible_collections.topolaunch.sglang.plugins.module_utils.plan_args import FLAG_TABLES
from topology_cases import all_specs
from flag_cases import build_parser

FLAGS = FLAG_TABLES["0.5.9"]
PARSER = build_parser(FLAGS)


def check_plan(plan, facts):
    layout = plan["layout"]
    tp, pp, dp = layout["tp"], layout["pp"], layout["dp"]
    used = plan["gpu_indices"]
    present = {g["index"] for g in facts["gpus"]}
    assert len(used) == tp * pp * dp == len(set(used)) and set(used) <= present
    assert plan["cuda_visible_devices"] == ",".join(map(str, used)) == plan["env"]["CUDA_VISIBLE_DEVICES"]
    assert plan["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    # SGLang's device mapping: replica d, stage k, TP rank r -> position d*tp*pp + k*tp + r
    groups = [used[i:i + tp] for i in range(0, len(used), tp)]
    assert groups == plan["tp_groups"]
    for stage in plan["pp_layer_partition"]:
        k = stage["stage"]
        assert stage["gpus"] == [g for d in range(dp) for g in groups[d * pp + k]]
    layers = [n for s in plan["pp_layer_partition"] for n in range(s["first_layer"], s["last_layer"] + 1)]
    assert layers == list(range(len(layers))) and len(plan["pp_layer_partition"]) == pp
    # canonical flags only, and SGLang 0.5.9's own argparse accepts the argv
    flags = [w for w in plan["argv"] if w.startswith("--")]
    assert all(f in FLAGS for f in flags), flags
    ns = PARSER.parse_args(plan["argv"])
    assert (ns.tensor_parallel_size, ns.pipeline_parallel_size, ns.data_parallel_size) == (tp, pp, dp)
    assert plan["memory"]["fits"] and plan["memory"]["kv_room_bytes"] >= plan["memory"]["kv_reserve_bytes"]
    # a TP group that fits in one NUMA node stays in one
    numa = {g["index"]: g["numa_node"] for g in facts["gpus"]}
    islands = facts["islands"]["numa"]
    if islands and all(numa[g] is not None for g in used):
        smallest = min(len(i) for i in islands)
        if tp <= smallest and smallest % tp == 0:
            for group in groups:
                assert len({numa[g] for g in group}) == 1, (plan["layout"], groups)


@pytest.mark.parametrize("model", MODEL_NAMES)
@pytest.mark.parametrize("spec", all_specs())
def test_specs_by_models(fake_nvml, tmp_path, spec, model):
    facts = fake_facts(fake_nvml, spec, tmp_path)
    try:
        plan = planner.plan(planner.PlanRequest(topology=facts, model_path=model_path(model)))
    except planner.PlanError as exc:
        # nothing fits: every candidate says why
        assert exc.reasons[-1].startswith("no valid layout for %d GPUs" % facts["gpu_count"])
        candidates = exc.partial["candidates"]
        assert candidates and all(not c["valid"] and c["reasons"] for c in candidates)
        return
    check_plan(plan, facts)
    valid = [c for c in plan["candidates"] if c["valid"]]
    assert plan["layout"]["name"] == valid[0]["name"]
    assert all(c["score"] is not None and 0 < c["score"] <= 1 and c["source"] == "model" for c in valid)
    assert all(c["reasons"] for c in plan["candidates"] if not c["valid"])
    assert all(c["tp"] * c["pp"] * c["dp"] == facts["gpu_count"] for c in plan["candidates"])
    # every valid candidate is honoured when asked for explicitly, and plans as well as auto does
    for c in valid:
        explicit = planner.plan(planner.PlanRequest(topology=facts, model_path=model_path(model), layout=c["name"]))
        assert explicit["layout"]["name"] == c["name"]
        check_plan(explicit, facts)
