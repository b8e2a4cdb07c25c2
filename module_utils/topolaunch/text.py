"""What may not reach a systemd unit, an env file or a command line: one rule shared by the planner (plan_args) and
the launch (launch.py). Plain Python 3.9+ stdlib."""

__all__ = ["control_character"]

# systemd ends a unit line at LF and at CR; an env file line at either; NEL and the Unicode line and paragraph
# separators end a line for Python's splitlines.
_LINE_ENDS = "\u0085\u2028\u2029"


def control_character(text):
    """The first control character of `text` (C0, DEL, or a character that ends a line), or None."""
    for c in str(text):
        if ord(c) < 0x20 or ord(c) == 0x7f or c in _LINE_ENDS:
            return c
    return None
