"""module_utils/topolaunch/constants.py: the shared names (their agreement with the role topolaunch and the doc
fragment is in plugins/doc_fragments/test_common.py), the venv python of a version, state files, a plan's server."""
from ansible_collections.topolaunch.sglang.plugins.module_utils import constants


def test_sglang_python_and_state_files():
    assert constants.sglang_python("0.5.9") == "/opt/sglang/venvs/0.5.9/bin/python"
    assert constants.sglang_python("0.5.23", "/srv/venvs") == "/srv/venvs/0.5.23/bin/python"
    assert constants.state_file("/var/lib/x", constants.CURRENT_PLAN) == "/var/lib/x/current_plan.json"
    assert constants.state_file(None, constants.LAST_GOOD_PLAN) == "/var/lib/topolaunch/last_good_plan.json"


def test_server_view_is_the_server_keys_in_any_order():
    plan = {"layout": {"name": "tp8", "tp": 8}, "argv": ["--tp-size", "8"], "port": 30000, "reason": "auto",
            "estimate": {"tokens_per_s": 1.0}, "source": "heuristic"}
    same = dict(reversed(list(plan.items())), reason="measured results decide", source="measured", estimate=None)
    assert constants.server_view(same) == constants.server_view(plan)
    assert constants.server_view(dict(plan, port=30001)) != constants.server_view(plan)
    assert constants.server_view({}) == constants.server_view(None) == "{}"
    assert constants.server_view(plan, ["port"]) == '{"port": 30000}'
