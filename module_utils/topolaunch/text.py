"""What may not reach a systemd unit, an env file or a command line: one rule shared by the planner (plan_args) and
the launch (launch.py); and how a text someone else wrote (a server's answer) is shown in a one-line message
(health.py). Plain Python 3.9+ stdlib."""

__all__ = ["control_character", "shown"]

# systemd ends a unit line at LF and at CR; an env file line at either; NEL and the Unicode line and paragraph
# separators end a line for Python's splitlines.
_LINE_ENDS = "\u0085\u2028\u2029"


def control_character(text):
    """The first control character of `text` (C0, DEL, or a character that ends a line), or None."""
    for c in str(text):
        if ord(c) < 0x20 or ord(c) == 0x7f or c in _LINE_ENDS:
            return c
    return None


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\", '"': '\\"'}


def _is_control(c):
    return ord(c) < 0x20 or 0x7f <= ord(c) < 0xa0 or c in _LINE_ENDS


def shown(text, limit=200):
    """`text` in double quotes for a one-line message: every control character (C0, DEL, C1, a line end) escaped
    as Python writes it (\\n, \\x1b, \\u2028; a backslash and a quote too), cut to `limit` characters with '...'."""
    pieces = [_ESCAPES.get(c) or (("\\x%02x" % ord(c) if ord(c) < 0x100 else "\\u%04x" % ord(c))
                                  if _is_control(c) else c) for c in str(text)]
    if sum(len(p) for p in pieces) <= limit:
        return '"%s"' % "".join(pieces)
    kept, room = [], max(limit - 3, 0)
    for piece in pieces:                 # whole escapes only: a cut never leaves half of one
        if len(piece) > room:
            break
        kept.append(piece)
        room -= len(piece)
    return '"%s..."' % "".join(kept)
