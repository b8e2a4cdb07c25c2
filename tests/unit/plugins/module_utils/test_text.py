"""module_utils/topolaunch/text.py: what may not reach a unit, an env file or a command line."""
import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils.text import control_character, shown


@pytest.mark.parametrize("text, bad", [
    ("glm-5", None), ("/srv/models/GLM 5 (NVFP4)", None), ("tëxt, ümlaut, 模型", None), ("", None), (42, None),
    ("a\nb", "\n"), ("a\rb", "\r"), ("tab\there", "\t"), ("\x00", "\x00"), ("esc\x1b[0m", "\x1b"), ("del\x7f", "\x7f"),
    ("nel\u0085", "\u0085"), ("line\u2028sep", "\u2028"), ("para\u2029", "\u2029"), ("ab\x01\n", "\x01"),
])
def test_control_character(text, bad):
    assert control_character(text) == bad


@pytest.mark.parametrize("text, limit, out", [
    ("The number is 48213077.", 200, '"The number is 48213077."'),
    ("a\nb\r\tc", 200, '"a\\nb\\r\\tc"'),
    ("esc\x1b[0m del\x7f c1\x85 nul\x00", 200, '"esc\\x1b[0m del\\x7f c1\\x85 nul\\x00"'),
    ("line\u2028para\u2029", 200, '"line\\u2028para\\u2029"'),
    ('say "hi" \\ bye', 200, '"say \\"hi\\" \\\\ bye"'),
    ("模型 ümlaut", 200, '"模型 ümlaut"'),
    ("x" * 50, 10, '"xxxxxxx..."'),
    ("\n" * 50, 10, '"\\n\\n\\n..."'),              # cut after escaping, whole escapes: at most the limit
    ("", 10, '""'), (None, 10, '"None"'),
])
def test_shown(text, limit, out):
    assert shown(text, limit) == out
