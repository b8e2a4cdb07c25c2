"""module_utils/topolaunch/text.py: what may not reach a unit, an env file or a command line."""
import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils.text import control_character


@pytest.mark.parametrize("text, bad", [
    ("glm-5", None), ("/srv/models/GLM 5 (NVFP4)", None), ("tëxt, ümlaut, 模型", None), ("", None), (42, None),
    ("a\nb", "\n"), ("a\rb", "\r"), ("tab\there", "\t"), ("\x00", "\x00"), ("esc\x1b[0m", "\x1b"), ("del\x7f", "\x7f"),
    ("nel\u0085", "\u0085"), ("line\u2028sep", "\u2028"), ("para\u2029", "\u2029"), ("ab\x01\n", "\x01"),
])
def test_control_character(text, bad):
    assert control_character(text) == bad
