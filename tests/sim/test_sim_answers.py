"""The simulator's answers (sglang/_sim/answers.py): a prompt holding a number is answered as a correct instruct
model asked to repeat it answers (a sentence with the number, then its end-of-sequence token: finish reason stop),
on /generate, /v1/chat/completions and /v1/completions in SGLang's response shapes; the fault garbage_output makes
every answer filler words to max_new_tokens without the number. In-process for the rules, the built wheel in real
processes (simlab.py, 127.0.0.1:33000-33999) for the endpoints.
"""
import json

import pytest

from sglang._sim import answers  # noqa: E402
from sglang._sim.engine import WORDS  # noqa: E402
from sglang._sim.launcher import parse_faults  # noqa: E402

PROMPT = "Repeat this number exactly, digits only, and say nothing else: 48213077"


@pytest.mark.parametrize("prompt, words", [
    (PROMPT, ["The", "number", "is", "48213077."]),
    ("first 11 then 22.", ["The", "number", "is", "22."]),          # the last number of the prompt
    ("Repeat the number 90817263.\nThe number is", ["The", "number", "is", "90817263."]),
    ("The capital of France is", None),
    ("t17 t18 t31999 [UNK]", None),                                  # the random-ids words hold no number
    ("", None), (None, None),
])
def test_reply_words(prompt, words):
    assert answers.reply_words(prompt) == words


def test_eos_id_from_config_then_generation_config(tmp_path):
    assert answers.eos_token_id(str(tmp_path)) is None
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 8]}))
    assert answers.eos_token_id(str(tmp_path)) == 7
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 154820}))
    assert answers.eos_token_id(str(tmp_path)) == 154820


def test_an_answer_stops_at_its_eos_token_when_there_is_room():
    said = answers.Answers(None)
    req = said.request("r1", PROMPT, 12, 64)
    assert req.max_new == 5 and req.text(5) == "The number is 48213077." and req.text(2) == "The number"
    assert answers.finish_reason(req, 5) == {"type": "stop", "matched": None}
    short = said.request("r2", PROMPT, 12, 3)                        # no room for the sentence: cut at 3
    assert short.max_new == 3 and short.text(3) == "The number is"
    assert answers.finish_reason(short, 3) == {"type": "length", "length": 3}
    plain = said.request("r3", "hello", 1, 6)
    assert plain.max_new == 6 and answers.finish_reason(plain, 6) == {"type": "length", "length": 6}
    garbage = answers.Answers(None, garbage=True).request("r4", PROMPT, 12, 64)
    assert garbage.max_new == 64 and "48213077" not in garbage.text(64)
    assert set(garbage.text(64).split()) <= set(WORDS)


def test_garbage_output_is_a_fault_and_may_name_a_layout():
    assert parse_faults("garbage_output") == {"garbage_output": True}
    assert parse_faults("garbage_output@tp4pp2", "tp8") == {}
    assert parse_faults("garbage_output@tp4pp2", "tp4pp2") == {"garbage_output": True}


def _model_with_eos(lab, eos):
    path = lab.model("llama-2-7b")
    with open(path + "/config.json", encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["eos_token_id"] = eos
    with open(path + "/config.json", "w", encoding="utf-8") as f:
        json.dump(cfg, f)
    return path


def test_the_server_repeats_the_number_on_every_endpoint(lab):
    server = lab.launch("--model-path", _model_with_eos(lab, [2, 3]), "--served-model-name", "llama").wait_ready()
    status, body = server.post("/v1/chat/completions", {
        "model": "llama", "messages": [{"role": "user", "content": PROMPT}], "temperature": 0, "max_tokens": 64,
        "chat_template_kwargs": {"enable_thinking": False, "thinking": False}})
    out = json.loads(body)
    choice = out["choices"][0]
    assert status == 200 and out["object"] == "chat.completion"
    assert choice["message"]["content"] == "The number is 48213077." and choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "stop" and choice["matched_stop"] == 2
    assert out["usage"]["completion_tokens"] == 5                      # 4 words and the EOS token
    status, body = server.post("/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 64,
                                                                                "temperature": 0}})
    out = json.loads(body)
    assert status == 200 and out["text"] == "The number is 48213077."
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": 2}
    assert out["meta_info"]["completion_tokens"] == 5 and out["output_ids"][-1] == 2
    status, body = server.post("/v1/completions", {"model": "llama", "prompt": PROMPT, "max_tokens": 64})
    choice = json.loads(body)["choices"][0]
    assert status == 200 and choice["text"] == "The number is 48213077." and choice["finish_reason"] == "stop"
    # streamed: the same words, the last chunk says stop
    status, body = server.post("/v1/chat/completions", {"model": "llama", "stream": True, "max_tokens": 64,
                                                        "messages": [{"role": "user", "content": PROMPT}]})
    chunks = [json.loads(e[len("data: "):]) for e in body.decode().split("\n\n") if e and e != "data: [DONE]"]
    assert "".join(c["choices"][0]["delta"]["content"] for c in chunks) == "The number is 48213077."
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    # a prompt without a number: filler words to max_new_tokens, as before
    status, body = server.post("/generate", {"text": "The capital of France is",
                                             "sampling_params": {"max_new_tokens": 8}})
    out = json.loads(body)
    assert len(out["text"].split()) == 8 and out["meta_info"]["finish_reason"] == {"type": "length", "length": 8}


def test_garbage_output_answers_without_the_number(lab):
    server = lab.launch("--model-path", lab.model("llama-2-7b"), SGLANG_SIM_FAULT="garbage_output").wait_ready()
    assert "SGLANG_SIM_FAULT=garbage_output" in server.log()
    status, body = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": PROMPT}],
                                                        "temperature": 0, "max_tokens": 16})
    choice = json.loads(body)["choices"][0]
    assert status == 200 and len(choice["message"]["content"].split()) == 16
    assert "48213077" not in choice["message"]["content"] and choice["finish_reason"] == "length"
    status, body = server.post("/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 8}})
    out = json.loads(body)
    assert status == 200 and "48213077" not in out["text"] and out["meta_info"]["completion_tokens"] == 8
