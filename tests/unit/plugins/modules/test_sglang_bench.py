"""library/sglang_bench.py: the documentation of the action plugin sglang_bench (no module code runs on hosts). It
documents exactly the options the action plugin validates (type, default, choices, required), its examples pass
that validation, and the old name bench_record is routed to it."""
import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.topolaunch.sglang.plugins.action import sglang_bench as action
from ansible_collections.topolaunch.sglang.plugins.modules import sglang_bench as docs
import paths

RUNTIME = paths.ROOT / "collections" / "ansible_collections" / "topolaunch" / "sglang" / "meta" / "runtime.yml"


def shape(options):
    return {k: (v.get("type", "str"), v.get("default"), v.get("choices"), bool(v.get("required")),
                v.get("elements")) for k, v in options.items()}


def test_the_documentation_is_the_action_plugins_argument_spec():
    assert shape(yaml.safe_load(docs.DOCUMENTATION)["options"]) == shape(action.ARGUMENT_SPEC)


def test_each_state_that_needs_an_option_documents_it_for_that_state():
    options = yaml.safe_load(docs.DOCUMENTATION)["options"]
    for state, needed in action.REQUIRED.items():
        assert state in options["state"]["choices"]
        for key in needed:
            assert key in options, (state, key)


SAMPLE = {"dict": {"model_name": "glm-5-nvfp4", "topology_fingerprint": "a1b2c3d4e5f6", "layout": {"name": "tp8"}},
          "str": "x", "path": "/tmp/results"}


@pytest.mark.parametrize("example", yaml.safe_load(docs.EXAMPLES), ids=lambda e: e["name"])
def test_every_example_passes_the_action_plugins_validation(example):
    """Each example's arguments, a templated value standing in as a sample of its type, are valid and complete."""
    args = {k: SAMPLE[action.ARGUMENT_SPEC[k].get("type", "str")] if isinstance(v, str) and "{{" in v else v
            for k, v in example["topolaunch.sglang.sglang_bench"].items()}
    validated = ArgumentSpecValidator(action.ARGUMENT_SPEC).validate(args)
    assert validated.error_messages == []
    p = validated.validated_parameters
    assert [k for k in action.REQUIRED[p["state"]] if not p[k]] == []
    assert p["state"] not in action.FILED or action.file_under(p) == []      # filed under a model and fingerprint


def test_the_return_values_parse_and_the_old_name_is_routed_here():
    assert {"measured_run", "run_id", "files", "points"} <= set(yaml.safe_load(docs.RETURN))
    routing = yaml.safe_load(RUNTIME.read_text())["plugin_routing"]
    assert routing["modules"]["bench_record"]["redirect"] == "topolaunch.sglang.sglang_bench"
    assert routing["action"]["bench_record"]["redirect"] == "topolaunch.sglang.sglang_bench"
