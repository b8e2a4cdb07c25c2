"""What the simulated model says: filler words, except to a prompt that holds a number, which it answers as a correct
instruct model asked to repeat that number does (topolaunch's health probe asks exactly that): one sentence naming
the prompt's last number, then its end-of-sequence token, so the generation stops early (finish reason `stop`, as
SGLang reports FINISH_MATCHED_TOKEN: 59:/523:sglang/srt/managers/schedule_batch.py, {"type": "stop", "matched": id}).

A number is a run of digits standing as a word of its own ("48213077", "48213077."; not the "17" of "t17", so the
benchmark's random-ids words are never taken for one). The end-of-sequence id is config.json's `eos_token_id`
(its first one when a list), else generation_config.json's, else null.

The fault `garbage_output` (SGLANG_SIM_FAULT) makes the model answer filler words to every prompt, to the full
max_new_tokens: plausible tokens without the number, as a server whose KV cache dtype or kernel garbles output.
"""
import json
import os
import re

from sglang._sim.engine import GenRequest

NUMBER = re.compile(r"\b\d+\b")


def reply_words(prompt):
    """The words a correct instruct model answers `prompt` with, or None when the simulator has nothing to say."""
    numbers = NUMBER.findall(prompt or "")
    if not numbers:
        return None
    return ["The", "number", "is", numbers[-1] + "."]


def eos_token_id(model_path):
    """The model's end-of-sequence token id (the first of a list), from config.json, else generation_config.json."""
    for name in ("config.json", "generation_config.json"):
        try:
            with open(os.path.join(model_path or "", name), encoding="utf-8") as f:
                value = json.load(f).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, list):
            value = value[0] if value else None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


class AnswerRequest(GenRequest):
    """A request the model answers in words of its own, ending with the end-of-sequence token (not in the text, as
    SGLang skips special tokens; counted in completion_tokens and output_ids as SGLang counts it) when
    max_new_tokens leaves room for it."""

    def __init__(self, rid, prompt_tokens, max_new_tokens, words, eos, internal=False, stream=False):
        self.words = list(words)
        self.stops = len(self.words) + 1 <= max_new_tokens
        self.eos = eos
        super().__init__(rid, prompt_tokens, len(self.words) + 1 if self.stops else max_new_tokens,
                         internal=internal, stream=stream)

    def text(self, n):
        return " ".join(self.words[:n])

    def token_id(self, i):
        if self.stops and i == len(self.words) and self.eos is not None:
            return self.eos
        return super().token_id(i)


class Answers:
    """The model's answers on this server: `request(...)` makes the request the engine runs for a prompt."""

    def __init__(self, model_path, garbage=False):
        self.eos = eos_token_id(model_path)
        self.garbage = garbage

    def request(self, rid, prompt, prompt_tokens, max_new_tokens, internal=False, stream=False):
        words = None if self.garbage else reply_words(prompt)
        if words is None:
            return GenRequest(rid, prompt_tokens, max_new_tokens, internal=internal, stream=stream)
        return AnswerRequest(rid, prompt_tokens, max_new_tokens, words, self.eos, internal=internal, stream=stream)


def finish_reason(req, done):
    """SGLang's meta_info finish_reason of a finished request: stopped at its EOS token, else at max_new_tokens."""
    if isinstance(req, AnswerRequest) and req.stops and done >= req.max_new:
        return {"type": "stop", "matched": req.eos}
    return {"type": "length", "length": done}
