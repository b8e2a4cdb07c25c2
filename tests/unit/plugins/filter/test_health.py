"""filter_plugins/health.py: the answer probe's settings checked before anything changes - one line naming the field,
'' when they are fine (the rule is health.py probe_settings, which sglang_health applies too)."""
import pytest

from ansible_collections.topolaunch.sglang.plugins.filter.health import FilterModule, answer_probe_problem


@pytest.mark.parametrize("value", ["auto", "on", "off", True, False, None, {}, {"max_tokens": 16},
                                   {"prompt": "The capital of France is", "expect": "Paris"}])
def test_good_settings_have_no_problem(value):
    assert answer_probe_problem(value) == ""


@pytest.mark.parametrize("value, problem", [
    ({"prompt": "The capital of France is"}, "health_answer_probe.expect: missing: a probe with a prompt needs the "
                                             "text its answer must contain"),
    ({"expect": "Paris"}, "health_answer_probe.prompt: missing"),
    ("sometimes", "health_answer_probe: 'sometimes' is not auto, on, off"),
    ({"max_tokens": -1}, "health_answer_probe.max_tokens: -1 is not a number of tokens"),
])
def test_a_bad_setting_is_named(value, problem):
    assert answer_probe_problem(value).startswith(problem)


def test_the_field_name_is_the_callers_and_the_filter_is_registered():
    assert answer_probe_problem({"expect": "x"}, "probe").startswith("probe.prompt: missing")
    assert FilterModule().filters() == {"answer_probe_problem": answer_probe_problem}
