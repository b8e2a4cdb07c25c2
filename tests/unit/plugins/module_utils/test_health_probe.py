"""health.py, the answer probe: its settings (auto, on, off, a mapping; one-line errors naming the field), instruct
or base as SGLang decides (a chat template), the question asked greedily through the endpoint that fits, the
answer checked, and a wrong answer failing health with the number and what came back (shortened, escaped).
HTTP is scripted; the last tests ask the real simulator, as a correct model and under its fault garbage_output.
"""
import json
import os
import random

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils.health import (
    PROBE_MAX_TOKENS, HealthError, answer_probe, chat_template_source, check, probe_settings, verify)
from health_cases import GENERATED, LOG, ME, Clock, Unit, active, ready_on_30000  # noqa: F401  pylint: disable=unused-import  (fixtures)
from simlab import Lab, sim_site, sim_wheels  # noqa: F401  pylint: disable=unused-import

NUMBER = str(random.Random(7).randrange(10 ** 7, 10 ** 8))
DEFAULTS = {"mode": "auto", "prompt": "", "expect": "", "endpoint": "auto", "max_tokens": PROBE_MAX_TOKENS}


def rng():
    return random.Random(7)          # draws NUMBER


def chat(content, finish="stop", tokens=5, reasoning=None):
    return {"id": "x", "object": "chat.completion", "model": "glm-5-nvfp4", "usage": {"completion_tokens": tokens},
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content,
                                                 "reasoning_content": reasoning},
                         "finish_reason": finish, "matched_stop": 154820 if finish == "stop" else None}]}


class Server:
    """Scripted HTTP: per path one (status, body) answer."""

    def __init__(self, **answers):
        self.answers = {"/health": (200, ""), "/model_info": (200, {"model_path": "glm-5-nvfp4"}),
                        "/generate": (200, GENERATED)}
        self.answers.update({"/" + k.replace("_", "/"): v for k, v in answers.items()})
        self.calls = []

    def __call__(self, method, url, body=None, headers=None, timeout=60.0):
        path = url.split(":30000", 1)[1]
        self.calls.append({"method": method, "path": path, "body": body, "headers": dict(headers or {})})
        status, data = self.answers[path]
        return status, data if isinstance(data, str) else json.dumps(data)

    def paths(self):
        return [c["path"] for c in self.calls]


@pytest.fixture
def instruct(tmp_path):
    """A plan whose model directory has a chat template in tokenizer_config.json (an instruct model)."""
    model = tmp_path / "glm-5-nvfp4"
    model.mkdir()
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    return {"host": "127.0.0.1", "port": 30000, "model_path": str(model), "served_model_name": "glm-5-nvfp4",
            "argv": ["--model-path", str(model)]}


@pytest.fixture
def base(tmp_path):
    model = tmp_path / "llama-2-7b"
    model.mkdir()
    (model / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
    return {"host": "127.0.0.1", "port": 30000, "model_path": str(model), "served_model_name": "llama-2-7b",
            "argv": ["--model-path", str(model)]}


# ------------------------------------------------------------------------------------------ settings
@pytest.mark.parametrize("value, expected", [
    (None, DEFAULTS), ("", DEFAULTS), ("auto", DEFAULTS), ("AUTO ", DEFAULTS),
    ("on", dict(DEFAULTS, mode="on")), (True, dict(DEFAULTS, mode="on")), ("yes", dict(DEFAULTS, mode="on")),
    ("off", dict(DEFAULTS, mode="off")), (False, dict(DEFAULTS, mode="off")), ("false", dict(DEFAULTS, mode="off")),
    ({}, DEFAULTS), ({"max_tokens": 16}, dict(DEFAULTS, max_tokens=16)),
    ({"max_tokens": "16"}, dict(DEFAULTS, max_tokens=16)),
    ({"prompt": "The capital of France is", "expect": "Paris"},
     dict(DEFAULTS, mode="on", prompt="The capital of France is", expect="Paris")),
    ({"prompt": "Say {number}", "expect": "{number}", "mode": "auto", "endpoint": "generate"},
     dict(DEFAULTS, prompt="Say {number}", expect="{number}", endpoint="generate")),
    (dict(DEFAULTS, mode="off"), dict(DEFAULTS, mode="off")),         # its own output reads the same
])
def test_settings(value, expected):
    assert probe_settings(value) == expected


@pytest.mark.parametrize("value, message", [
    ({"prompt": "The capital of France is"}, "health_answer_probe.expect: missing: a probe with a prompt needs the "
                                             "text its answer must contain"),
    ({"prompt": "The capital of France is", "expect": "  "}, "health_answer_probe.expect: missing"),
    ({"expect": "Paris"}, "health_answer_probe.prompt: missing: expect 'Paris' needs the prompt it is the answer to"),
    ({"promt": "x", "expect": "y"}, "health_answer_probe.promt: unknown key (the keys are mode, prompt, expect, "
                                    "endpoint, max_tokens)"),
    ("sometimes", "health_answer_probe: 'sometimes' is not auto, on, off (true, false) or a mapping {prompt, expect}"),
    (3, "health_answer_probe: 3 is not auto, on, off"),
    ({"mode": "always"}, "health_answer_probe.mode: 'always' is not auto, on, off"),
    ({"endpoint": "completions"}, "health_answer_probe.endpoint: 'completions' is not one of auto, chat, generate"),
    ({"max_tokens": 0}, "health_answer_probe.max_tokens: 0 is not a number of tokens from 1 to 4096"),
    ({"max_tokens": True}, "health_answer_probe.max_tokens: True is not"),
    ({"max_tokens": 5000}, "health_answer_probe.max_tokens: 5000 is not"),
    ({"prompt": ["a"], "expect": "b"}, "health_answer_probe.prompt: ['a'] is not a text"),
])
def test_bad_settings_are_one_line_naming_the_field(value, message):
    with pytest.raises(ValueError) as err:
        probe_settings(value, "health_answer_probe")
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


# ------------------------------------------------------------------------------------------ instruct or base
def test_a_chat_template_makes_an_instruct_model(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    plan = {"model_path": str(model), "argv": ["--model-path", str(model)]}
    assert chat_template_source(plan) is None                                        # nothing there: base
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": ""}))
    assert chat_template_source(plan) is None                                        # an empty one is none
    (model / "chat_templates").mkdir()
    (model / "chat_templates" / "tool_use.jinja").write_text("{{ x }}")
    assert chat_template_source(plan) == str(model / "chat_templates")
    (model / "chat_template.jinja").write_text("{{ messages }}")
    assert chat_template_source(plan) == str(model / "chat_template.jinja")
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": [{"name": "default", "template": "x"}]}))
    assert chat_template_source(plan) == str(model / "tokenizer_config.json") + " (chat_template)"
    (model / "processor_config.json").write_text(json.dumps({"chat_template": "{{ x }}"}))
    assert chat_template_source(plan) == str(model / "processor_config.json") + " (chat_template)"


def test_the_tokenizer_path_and_an_explicit_chat_template_count(tmp_path, base):
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "chat_template.jinja").write_text("{{ messages }}")
    assert chat_template_source(dict(base, argv=base["argv"] + ["--tokenizer-path", str(tok)])) == \
        str(tok / "chat_template.jinja")
    assert chat_template_source(dict(base, argv=base["argv"] + ["--chat-template=chatml"])) == "--chat-template chatml"
    assert chat_template_source(base) is None


# ------------------------------------------------------------------------------------------ asking
def test_an_instruct_model_is_asked_to_repeat_the_number_greedily(instruct):
    server = Server(v1_chat_completions=(200, chat("The number is %s." % NUMBER)))
    res = answer_probe(instruct, "auto", http=server, api_key="k", rng=rng())
    assert res["state"] == "passed" and res["number"] == NUMBER and res["endpoint"] == "/v1/chat/completions"
    assert res["answer"] == "The number is %s." % NUMBER and res["finish_reason"] == "stop"
    assert res["summary"] == ('the answer probe passed (asked to repeat %s through /v1/chat/completions: '
                              '"The number is %s.")' % (NUMBER, NUMBER))
    call, = server.calls
    assert call["method"] == "POST" and call["headers"] == {"Authorization": "Bearer k"}
    assert call["body"] == {"model": "glm-5-nvfp4", "temperature": 0, "max_tokens": PROBE_MAX_TOKENS,
                            "messages": [{"role": "user", "content": "Repeat this number exactly, digits only, and "
                                                                     "say nothing else: %s" % NUMBER}],
                            "chat_template_kwargs": {"enable_thinking": False, "thinking": False}}


def test_each_probe_draws_a_new_number(instruct):
    seen = set()
    for _ in range(5):
        server = Server(v1_chat_completions=(200, chat("ok")))
        with pytest.raises(HealthError):
            answer_probe(instruct, http=server)
        seen.add(server.calls[0]["body"]["messages"][0]["content"].rsplit(" ", 1)[1])
    assert len(seen) == 5 and all(len(n) == 8 and n.isdigit() for n in seen)


@pytest.mark.parametrize("answer", [
    NUMBER, "Sure: %s" % NUMBER, "%s,%s,%s" % (NUMBER[:2], NUMBER[2:5], NUMBER[5:]),
    "%s %s %s" % (NUMBER[:2], NUMBER[2:5], NUMBER[5:]),
])
def test_the_answer_must_contain_the_number(instruct, answer):
    res = answer_probe(instruct, http=Server(v1_chat_completions=(200, chat(answer))), rng=rng())
    assert res["state"] == "passed"


def test_a_thinking_models_reasoning_counts_as_its_answer(instruct):
    server = Server(v1_chat_completions=(200, chat(None, "length", 64, "The user wants %s repeated" % NUMBER)))
    assert answer_probe(instruct, http=server, rng=rng())["state"] == "passed"


def test_garbage_fails_naming_the_number_and_what_came_back(instruct):
    garbage = "the of and\nto in \x1b[31mis was " + "for on that " * 40
    server = Server(v1_chat_completions=(200, chat(garbage, "length", 64)))
    with pytest.raises(HealthError) as err:
        answer_probe(instruct, http=server, rng=rng())
    msg = str(err.value)
    assert msg.startswith("The answer probe failed: asked to repeat %s (POST http://127.0.0.1:30000/v1/chat/"
                          "completions, temperature 0, at most 64 tokens), the server answered \"the of and\\nto in "
                          "\\x1b[31mis was for on that " % NUMBER), msg
    assert '..." (64 tokens, finish reason length), without "%s". A server that answers wrongly does not serve' \
        % NUMBER in msg
    assert "\n" not in msg and "\x1b" not in msg and len(msg) < 600
    assert err.value.result["answer_probe"]["state"] == "failed"
    assert err.value.result["answer_probe"]["answer"] == garbage


def test_an_empty_answer_fails_too(instruct):
    with pytest.raises(HealthError, match=r'the server answered "" \(1 tokens, finish reason stop\), without'):
        answer_probe(instruct, http=Server(v1_chat_completions=(200, chat(None, tokens=1))), rng=rng())


def test_a_base_model_is_skipped_in_auto_and_continues_a_text_when_on(base):
    server = Server()
    res = answer_probe(base, "auto", http=server)
    assert res["state"] == "skipped" and server.calls == []
    assert res["summary"].startswith("the answer probe was skipped: a base model (no --chat-template, no "
                                     "chat_template in %s's processor_config.json" % base["model_path"])
    server = Server(generate=(200, {"text": " %s." % NUMBER, "meta_info": {
        "completion_tokens": 4, "finish_reason": {"type": "stop", "matched": 2}}}))
    res = answer_probe(base, "on", http=server, rng=rng())
    assert res["state"] == "passed" and res["endpoint"] == "/generate" and res["finish_reason"] == "stop"
    assert server.calls[0]["body"] == {"text": "Repeat the number %s.\nThe number is" % NUMBER,
                                       "sampling_params": {"max_new_tokens": PROBE_MAX_TOKENS, "temperature": 0}}


def test_off_asks_nothing(instruct):
    server = Server()
    assert answer_probe(instruct, False, http=server) == {"state": "skipped", "why": "the answer probe is off",
                                                          "summary": "the answer probe is off"}
    assert server.calls == []


def test_a_probe_of_ones_own(base):
    settings = {"prompt": "The capital of France is", "expect": "paris", "max_tokens": 4}
    server = Server(generate=(200, {"text": " Paris.", "meta_info": {"completion_tokens": 2}}))
    res = answer_probe(base, settings, http=server)
    assert res["state"] == "passed" and res["prompt"] == "The capital of France is" and res["expect"] == "paris"
    assert server.calls[0]["body"]["sampling_params"] == {"max_new_tokens": 4, "temperature": 0}
    server = Server(generate=(200, {"text": " Lyon.", "meta_info": {"completion_tokens": 2}}))
    with pytest.raises(HealthError) as err:
        answer_probe(base, settings, http=server)
    assert str(err.value).startswith('The answer probe failed: asked "The capital of France is", expecting "paris" '
                                     '(POST http://127.0.0.1:30000/generate, temperature 0, at most 4 tokens), the '
                                     'server answered " Lyon." (2 tokens, finish reason ?), without "paris".')
    numbered = {"prompt": "Echo {number} please", "expect": "<{number}>", "endpoint": "chat", "mode": "on"}
    server = Server(v1_chat_completions=(200, chat("<%s>" % NUMBER)))
    assert answer_probe(base, numbered, http=server, rng=rng())["state"] == "passed"
    assert server.calls[0]["body"]["messages"][0]["content"] == "Echo %s please" % NUMBER


@pytest.mark.parametrize("answer, words", [
    ((500, {"error": "boom"}), 'answered 500: {"error": "boom"}'),
    ((401, {"error": "Unauthorized"}), "answered 401: {\"error\": \"Unauthorized\"} (the server wants an API key"),
    ((200, {"unexpected": True}), "got no answer in SGLang's shape: {\"unexpected\": true}"),
    ((200, "not json"), "got no answer in SGLang's shape: not json"),
    ((0, "Connection refused"), "got no answer (Connection refused)"),
])
def test_http_failures_are_named(instruct, answer, words):
    with pytest.raises(HealthError) as err:
        answer_probe(instruct, http=Server(v1_chat_completions=answer), rng=rng())
    assert str(err.value).startswith("The answer probe (asked to repeat %s; POST http://127.0.0.1:30000/v1/chat/"
                                     "completions, temperature 0, at most 64 tokens) " % NUMBER)
    assert words in str(err.value)


# ------------------------------------------------------------------------------------------ in health
def test_verify_runs_the_probe_after_the_generation(instruct):
    server = Server(v1_chat_completions=(200, chat("The number is %s." % NUMBER)))
    res = verify(instruct, http=server, probe=probe_settings("auto"), rng=rng(), clock=Clock(), sleep=Clock().sleep)
    assert server.paths() == ["/health", "/model_info", "/generate", "/v1/chat/completions"]
    assert res["generated_tokens"] == 8 and res["answer_probe"]["state"] == "passed"
    server = Server()
    assert "answer_probe" not in verify(instruct, http=server, clock=Clock(), sleep=Clock().sleep)   # no probe
    assert server.paths() == ["/health", "/model_info", "/generate"]


def test_a_wrong_answer_fails_health_with_the_plan_and_the_last_good_one(tmp_path, instruct, ready_on_30000):
    (tmp_path / "current_plan.json").write_text(json.dumps(instruct))
    good = dict(instruct, layout={"name": "tp8"})
    (tmp_path / "last_good_plan.json").write_text(json.dumps(good))
    server = Server(v1_chat_completions=(200, chat("the of and to", "length", 64)))
    clock = Clock()
    with pytest.raises(HealthError) as err:
        check("topolaunch-sglang.service", str(tmp_path / "current_plan.json"), str(tmp_path / "last_good_plan.json"),
              run=Unit([(active(), LOG)]).run, http=server, clock=clock, sleep=clock.sleep, verify_server=True,
              owner=ME, probe=probe_settings("auto"), rng=rng())
    assert str(err.value).startswith("The answer probe failed: asked to repeat %s" % NUMBER)
    res = err.value.result
    assert res["state"] == "answer" and res["plan"] == instruct and res["last_good_plan"] == good
    assert res["last_good_differs"] is True and res["generated_tokens"] == 8
    assert json.loads((tmp_path / "last_good_plan.json").read_text()) == good          # not recorded


# ------------------------------------------------------------------------------------------ the real simulator
def _sim_plan(lab, server, chat_template=True):
    model = lab.model("llama-2-7b")
    if chat_template:
        with open(model + "/tokenizer_config.json", "w", encoding="utf-8") as f:
            json.dump({"chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"}, f)
    elif os.path.exists(model + "/tokenizer_config.json"):
        os.remove(model + "/tokenizer_config.json")
    return {"host": "127.0.0.1", "port": server.port, "model_path": model, "served_model_name": "llama",
            "argv": ["--model-path", model]}


def test_the_simulator_passes_as_a_correct_model_and_fails_with_garbage_output(  # noqa: F811
        tmp_path, sim_site):  # pylint: disable=redefined-outer-name
    lab = Lab(tmp_path, sim_site)
    try:
        model = lab.model("llama-2-7b")
        good = lab.launch("--model-path", model, "--served-model-name", "llama").wait_ready()
        res = verify(_sim_plan(lab, good), probe=probe_settings("auto"), ready_timeout=10)
        assert res["answer_probe"]["state"] == "passed" and res["answer_probe"]["finish_reason"] == "stop"
        number = res["answer_probe"]["number"]
        assert res["answer_probe"]["answer"] == "The number is %s." % number
        assert answer_probe(_sim_plan(lab, good, chat_template=False), "on")["endpoint"] == "/generate"
        bad = lab.launch("--model-path", model, "--served-model-name", "llama",
                         SGLANG_SIM_FAULT="garbage_output", CUDA_VISIBLE_DEVICES="1").wait_ready()
        with pytest.raises(HealthError) as err:
            verify(_sim_plan(lab, bad), probe=probe_settings("auto"), ready_timeout=10)
        asked = err.value.result["answer_probe"]["number"]
        assert str(err.value).startswith("The answer probe failed: asked to repeat %s" % asked)
        assert "finish reason length), without \"%s\"" % asked in str(err.value)
    finally:
        lab.cleanup()
