"""A Python literal as generated tables write it: `NAME = (` the value pretty-printed `)`, every line within pep8's
limits (continuation lines at the visual indent pprint gives them; a string too long for its line split into
adjacent literals, aligned). Used by the tools that write module_utils tables (sglang_facts.py, proxmox_schema.py)."""
import ast
import pprint
import re

MAX_LINE = 159
STRING = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")


def _split_line(line):
    """`line`, its first string literal that runs past MAX_LINE split into adjacent literals on aligned lines."""
    for m in STRING.finditer(line):
        if m.end() <= MAX_LINE:
            continue
        col, text, rest = m.start(), ast.literal_eval(m.group(0)), line[m.end():]
        room = MAX_LINE - col - len(rest) - 2
        pieces, piece = [], ""
        for ch in text:
            if len(repr(piece + ch)) > room and piece:
                pieces.append(piece)
                piece = ""
            piece += ch
        pieces.append(piece)
        out = [line[:col] + repr(pieces[0])] + [" " * col + repr(p) for p in pieces[1:]]
        out[-1] += rest
        return out
    return [line]


def literal(name, value, sort_dicts=True, width=110):
    """`name = (...)` for `value`: what a generated module holds."""
    text = pprint.pformat(value, width=width, sort_dicts=sort_dicts)
    lines = []
    for line in text.splitlines():
        lines.extend(_split_line("    " + line))
    return "%s = (\n%s\n)" % (name, "\n".join(lines))
