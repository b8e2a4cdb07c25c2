#!/usr/bin/env python3
"""Extract SGLang's launch_server flags from a wheel, without importing sglang.

SGLang declares its server flags in ``sglang/srt/server_args.py``: ``ServerArgs.add_cli_args(parser)`` calls
``parser.add_argument(...)`` once per flag. This tool opens the wheel with ``zipfile``, parses that file with
``ast`` and evaluates the keyword arguments that are static: literals, module-level constants
(``ATTENTION_BACKEND_CHOICES``), names imported from other modules of the same wheel
(``SUPPORTED_LORA_TARGET_MODULES``), ``Class.Attr.keys()`` of class-level dict literals
(``ReasoningParser.DetectorMap``), and ``ServerArgs.<field>`` defaults (the dataclass field's default or
``default_factory``). What cannot be evaluated statically is recorded as ``None`` with a note.

Table entry, keyed by the canonical long flag (the option string that spells the ServerArgs field the flag
sets, else the one that spells ``dest``, else the first). ``dest`` is argparse's dest (first long option string
unless given); ``field`` is the ServerArgs field it ends in (``from_cli_args`` renames tensor_parallel_size
to tp_size, ...), None when the dest is not a field:

    {"dest": "tensor_parallel_size", "field": "tp_size", "type": "int", "default": 1, "choices": None, "action": None, "nargs": None,
     "const": None, "required": False, "aliases": ["--tensor-parallel-size"],
     "option_strings": ["--tensor-parallel-size", "--tp-size"], "notes": []}

``type`` names: ``int``, ``float``, ``str``, ``json`` (json.loads), ``json_list`` (sglang's json_list_type),
``nullable_str`` (sglang's nullable_str: "" or "None" -> None), or None (argparse's default: the raw string).
``action``: None (store), ``store_true``, ``store_false``, ... or the name of SGLang's own action class
(``DeprecatedAction``: takes no value, only warns; ``LoRAPathAction``: stores the list of values).
``option_strings`` keeps declaration order; ``aliases`` is option_strings without the canonical flag.

Usage:
    tools/sglang_flags.py --version 0.5.9                 # pip download into build/wheels, write the module
    tools/sglang_flags.py --wheel path/to/sglang.whl      # use a wheel you have
    tools/sglang_flags.py --version 0.5.9 --check         # exit 1 if the committed table differs
"""
import argparse
import ast
import glob
import os
import pathlib
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
SERVER_ARGS = "sglang/srt/server_args.py"


class Unresolved:
    """A value that cannot be evaluated statically; carries why."""

    def __init__(self, why):
        self.why = why

    def __repr__(self):
        return "Unresolved(%r)" % self.why


class WheelSource:
    """Parsed modules of one wheel, looked up by dotted module name."""

    def __init__(self, wheel_path):
        self.zip = zipfile.ZipFile(wheel_path)
        self.names = set(self.zip.namelist())
        self._trees = {}

    def version(self):
        for name in self.names:
            if name.endswith(".dist-info/METADATA") and name.startswith("sglang-"):
                for line in self.zip.read(name).decode("utf-8").splitlines():
                    if line.startswith("Version:"):
                        return line.split(":", 1)[1].strip()
        raise ValueError("no sglang-*.dist-info/METADATA with a Version line in the wheel")

    def module(self, dotted):
        """ast.Module of a module of the wheel, or None when the wheel does not hold it."""
        if dotted not in self._trees:
            base = dotted.replace(".", "/")
            tree = None
            for path in (base + ".py", base + "/__init__.py"):
                if path in self.names:
                    tree = ast.parse(self.zip.read(path).decode("utf-8"), filename=path)
                    break
            self._trees[dotted] = tree
        return self._trees[dotted]


class Evaluator:
    """Static evaluation of expressions in one module of a wheel (module scope + optional locals)."""

    def __init__(self, source, dotted, depth=0):
        self.source = source
        self.dotted = dotted
        self.depth = depth
        tree = source.module(dotted)
        if tree is None:
            raise ValueError("module %s is not in the wheel" % dotted)
        self.assigns = {}  # name -> expr (last module-level assignment wins, as at import time)
        self.imports = {}  # name -> (module, name)
        self.classes = {}  # name -> ClassDef
        for node in tree.body:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        self.assigns[target.id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
                self.assigns[node.target.id] = node.value
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    self.imports[alias.asname or alias.name] = (node.module, alias.name)
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
        self.locals = {}

    def _other(self, dotted):
        if self.depth > 5:
            raise ValueError("import chain too deep at %s" % dotted)
        return Evaluator(self.source, dotted, self.depth + 1)

    def lookup(self, name):
        if name in self.locals:
            return self.eval(self.locals[name])
        if name in self.assigns:
            return self.eval(self.assigns[name])
        if name in self.classes:
            return ("class", self, self.classes[name])
        if name in self.imports:
            mod, attr = self.imports[name]
            if self.source.module(mod) is None:
                return Unresolved("%s is imported from %s, which is not in the wheel" % (name, mod))
            return self._other(mod).lookup(attr)
        if name in ("int", "float", "str", "bool", "list", "dict", "set", "tuple"):
            return ("builtin", name)
        return Unresolved("name %s is not a static module-level value" % name)

    def class_attr(self, cls_ref, attr):
        _, owner, cls = cls_ref
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == attr:
                if node.value is None:
                    return Unresolved("%s.%s has no default" % (cls.name, attr))
                return owner.field_default(node.value)
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id == attr:
                        return owner.eval(node.value)
        return Unresolved("%s.%s is not a class-level value" % (cls.name, attr))

    def field_default(self, expr):
        """Default of a dataclass field: the value, or dataclasses.field(default=... / default_factory=...)."""
        if isinstance(expr, ast.Call) and ast.unparse(expr.func) in ("dataclasses.field", "field"):
            for kw in expr.keywords:
                if kw.arg == "default":
                    return self.eval(kw.value)
                if kw.arg == "default_factory":
                    factory = kw.value
                    if isinstance(factory, ast.Lambda):
                        return self.eval(factory.body)
                    made = self.eval(ast.Call(func=factory, args=[], keywords=[]))
                    return made
            return Unresolved("dataclasses.field without default")
        return self.eval(expr)

    def eval(self, node):  # noqa: C901 - one branch per expression kind, flat on purpose
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            out = []
            for elt in node.elts:
                if isinstance(elt, ast.Starred):
                    inner = self.eval(elt.value)
                    if isinstance(inner, Unresolved):
                        return inner
                    out.extend(inner)
                else:
                    value = self.eval(elt)
                    if isinstance(value, Unresolved):
                        return value
                    out.append(value)
            if isinstance(node, ast.Set):
                return set(out)
            return tuple(out) if isinstance(node, ast.Tuple) else out
        if isinstance(node, ast.Dict):
            out = {}
            for key, value in zip(node.keys, node.values):
                if key is None:
                    return Unresolved("dict unpacking")
                k = self.eval(key)
                if isinstance(k, Unresolved):
                    return k
                out[k] = self.eval(value)  # values may stay Unresolved: keys are what choices need
            return out
        if isinstance(node, ast.Name):
            return self.lookup(node.id)
        if isinstance(node, ast.Attribute):
            base = self.eval(node.value)
            if isinstance(base, tuple) and base and base[0] == "class":
                return self.class_attr(base, node.attr)
            if isinstance(base, Unresolved):
                return base
            return Unresolved("attribute %s" % ast.unparse(node))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            value = self.eval(node.operand)
            return value if isinstance(value, Unresolved) else -value
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = self.eval(node.left), self.eval(node.right)
            for side in (left, right):
                if isinstance(side, Unresolved):
                    return side
            return left + right if isinstance(node.op, ast.Add) else left * right
        if isinstance(node, ast.Subscript):
            base, index = self.eval(node.value), self.eval(node.slice)
            for side in (base, index):
                if isinstance(side, Unresolved):
                    return side
            return base[index]
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute) and node.func.attr == "keys" and not node.args:
                base = self.eval(node.func.value)
                if isinstance(base, dict):
                    return list(base.keys())
                return base if isinstance(base, Unresolved) else Unresolved(ast.unparse(node))
            func = self.eval(node.func)
            if isinstance(func, tuple) and func[0] == "builtin" and func[1] in ("list", "tuple", "set", "dict"):
                if node.keywords:
                    return Unresolved(ast.unparse(node))
                if not node.args:
                    return {"list": [], "tuple": (), "set": set(), "dict": {}}[func[1]]
                arg = self.eval(node.args[0])
                if isinstance(arg, Unresolved):
                    return arg
                return {"list": list, "tuple": tuple, "set": set, "dict": dict}[func[1]](arg)
            return Unresolved("call %s" % ast.unparse(node))
        return Unresolved("expression %s" % ast.unparse(node))


TYPE_NAMES = {
    "int": "int",
    "float": "float",
    "str": "str",
    "json.loads": "json",
    "json_list_type": "json_list",
    "nullable_str": "nullable_str",
}


def _plain(value):
    """Sets become sorted lists so the table is deterministic and JSON-like."""
    if isinstance(value, set):
        return sorted(value, key=repr)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def extract_flags(wheel_path):
    """Return (version, flags) for the sglang wheel at wheel_path."""
    source = WheelSource(wheel_path)
    version = source.version()
    module = "sglang.srt.server_args"
    if source.module(module) is None:
        raise ValueError("%s has no %s" % (wheel_path, SERVER_ARGS))
    ev = Evaluator(source, module)
    server_args = ev.classes.get("ServerArgs")
    if server_args is None:
        raise ValueError("%s defines no class ServerArgs" % SERVER_ARGS)
    add_cli_args = next(
        (n for n in server_args.body if isinstance(n, ast.FunctionDef) and n.name == "add_cli_args"), None
    )
    if add_cli_args is None:
        raise ValueError("ServerArgs has no add_cli_args")

    fields = _dataclass_fields(server_args)
    renames = _cli_renames(server_args)  # argparse dest -> ServerArgs field (from_cli_args)
    flags = {}
    for stmt in add_cli_args.body:
        # Local helper assignments (e.g. tool_call_parser_choices = ...) are visible to later calls.
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    ev.locals[target.id] = stmt.value
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            call = stmt.value
            if ast.unparse(call.func) != "parser.add_argument":
                continue
            canonical, entry = _flag_entry(ev, call, fields, renames)
            if canonical in flags:
                raise ValueError("flag %s declared twice (line %d)" % (canonical, call.lineno))
            flags[canonical] = entry
            continue
        # Anything else (if/for around add_argument) would make the table incomplete: refuse loudly.
        for inner in ast.walk(stmt):
            if isinstance(inner, ast.Call) and ast.unparse(inner.func) == "parser.add_argument":
                raise ValueError("add_argument inside %s at line %d: extend the extractor" % (
                    type(stmt).__name__, stmt.lineno))
    if not flags:
        raise ValueError("no parser.add_argument calls found in ServerArgs.add_cli_args")
    return version, flags


def _dataclass_fields(cls):
    return [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]


def _cli_renames(cls):
    """from_cli_args copies some argparse dests to differently named fields: args.tp_size = args.tensor_parallel_size."""
    renames = {}
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == "from_cli_args":
            for stmt in ast.walk(node):
                if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                        and isinstance(stmt.targets[0], ast.Attribute) and isinstance(stmt.value, ast.Attribute)
                        and ast.unparse(stmt.targets[0].value) == "args" and ast.unparse(stmt.value.value) == "args"):
                    renames[stmt.value.attr] = stmt.targets[0].attr
    return renames


def _flag_entry(ev, call, fields, renames):
    option_strings = []
    for arg in call.args:
        if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
            raise ValueError("non-literal option string at line %d" % call.lineno)
        option_strings.append(arg.value)
    kw = {k.arg: k.value for k in call.keywords}
    notes = []

    dest = None
    if "dest" in kw:
        dest = ev.eval(kw["dest"])
    else:
        longs = [s for s in option_strings if s.startswith("--")]
        dest = (longs or option_strings)[0].lstrip("-").replace("-", "_")
    field = renames.get(dest, dest)
    if field not in fields:
        notes.append("dest %s is not a ServerArgs field" % dest)
        field = None
    # Canonical: the option string that spells the ServerArgs field (--tp-size for tp_size), else the one
    # that spells dest, else the first.
    spelled = ["--" + name.replace("_", "-") for name in (field, dest) if name]
    canonical = next((s for want in spelled for s in option_strings if s == want), option_strings[0])

    action = None
    if "action" in kw:
        node = kw["action"]
        action = node.value if isinstance(node, ast.Constant) else ast.unparse(node)

    type_name = None
    if "type" in kw:
        src = ast.unparse(kw["type"])
        type_name = TYPE_NAMES.get(src)
        if type_name is None:
            notes.append("type %s is not known to the extractor" % src)

    def value_of(key, default=None):
        if key not in kw:
            return default
        value = ev.eval(kw[key])
        if isinstance(value, Unresolved):
            notes.append("%s unresolved: %s" % (key, value.why))
            return None
        return _plain(value)

    if "default" in kw:
        default = value_of("default")
    elif action == "store_true":
        default = False
    elif action == "store_false":
        default = True
    else:
        default = None

    nargs = value_of("nargs")
    if nargs is None and action == "DeprecatedAction":
        nargs = 0  # DeprecatedAction.__init__ defaults nargs=0: the flag takes no value
    entry = {
        "dest": dest,
        "field": field,
        "type": type_name,
        "default": default,
        "choices": value_of("choices"),
        "action": action,
        "nargs": nargs,
        "const": value_of("const"),
        "required": bool(value_of("required", False)),
        "aliases": [s for s in option_strings if s != canonical],
        "option_strings": option_strings,
        "notes": notes,
    }
    return canonical, entry


def literal(value, indent=0, width=110):
    """value as a Python literal that passes pep8 (ansible-test sanity checks the collection's module_utils): on one
    line when it fits, else one item per line with 4-space hanging indents."""
    text = repr(value)
    if indent + len(text) <= width or not isinstance(value, (dict, list)) or not value:
        return text
    pad = " " * (indent + 4)
    if isinstance(value, dict):
        items = ["%s%r: %s," % (pad, k, literal(v, indent + 4, width)) for k, v in value.items()]
        return "{\n" + "\n".join(items) + "\n" + " " * indent + "}"
    items = ["%s%s," % (pad, literal(v, indent + 4, width)) for v in value]
    return "[\n" + "\n".join(items) + "\n" + " " * indent + "]"


def render_module(version, flags, wheel_name):
    lines = [
        '"""SGLang %s launch_server flags, extracted from %s by tools/sglang_flags.py. Do not edit.' % (
            version, wheel_name),
        "",
        "Regenerate: tools/sglang_flags.py --version %s" % version,
        "Keys: canonical long flag. Entry fields are described in tools/sglang_flags.py.",
        '"""',
        "",
        "VERSION = %r" % version,
        "",
        "FLAGS = " + literal(flags),
        "",
    ]
    return "\n".join(lines)


def module_path(version):
    return ROOT / "module_utils" / "topolaunch" / ("sglang_flags_%s.py" % version.replace(".", "_"))


def download_wheel(version, dest):
    """The wheel of sglang==version in dest (pip download --no-deps when it is not there yet)."""
    dest = pathlib.Path(dest)
    found = sorted(glob.glob(str(dest / ("sglang-%s-*.whl" % version))))
    if found:
        return found[0]
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "sglang==%s" % version, "-d", str(dest)]
    print("downloading: %s" % " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True)
    found = sorted(glob.glob(str(dest / ("sglang-%s-*.whl" % version))))
    if not found:
        raise FileNotFoundError("pip download left no sglang-%s-*.whl in %s" % (version, dest))
    return found[0]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", help="path of an sglang wheel")
    parser.add_argument("--version", help="sglang version to pip download into --wheel-dir")
    parser.add_argument("--wheel-dir", default=str(ROOT / "build" / "wheels"))
    parser.add_argument("--out", help="output module (default module_utils/topolaunch/sglang_flags_<ver>.py)")
    parser.add_argument("--check", action="store_true", help="compare with the output file, write nothing")
    args = parser.parse_args(argv)
    if not args.wheel and not args.version:
        parser.error("give --wheel or --version")
    wheel = args.wheel or download_wheel(args.version, args.wheel_dir)
    version, flags = extract_flags(wheel)
    if args.version and version != args.version:
        parser.error("wheel %s is version %s, not %s" % (wheel, version, args.version))
    out = pathlib.Path(args.out) if args.out else module_path(version)
    text = render_module(version, flags, os.path.basename(wheel))
    unresolved = [(k, n) for k, e in flags.items() for n in e["notes"]]
    if args.check:
        current = out.read_text() if out.exists() else ""
        if current != text:
            print("%s differs from what %s gives: regenerate with tools/sglang_flags.py --version %s" % (
                out, wheel, version), file=sys.stderr)
            return 1
        print("%s matches %s (%d flags)" % (out, wheel, len(flags)))
        return 0
    out.write_text(text)
    print("wrote %s: %d flags from %s" % (out, len(flags), wheel))
    for flag, note in unresolved:
        print("  note %s: %s" % (flag, note))
    return 0


if __name__ == "__main__":
    sys.exit(main())
