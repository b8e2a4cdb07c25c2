#!/usr/bin/env python3
"""Extract SGLang's launch_server flags from a wheel, without importing sglang.

Two ways of declaring flags are read, both from ``sglang/srt/server_args.py``'s ``ServerArgs.add_cli_args``:

- argparse calls (0.5.9): ``parser.add_argument("--tp-size", type=int, default=ServerArgs.tp_size, ...)``.
- annotated fields (0.5.23): ``add_cli_args_from_dataclass(parser, ServerArgs)`` turns every field declared as
  ``A[T, "help"]`` or ``A[T, Arg(...)]`` in ``sglang/srt/arg_groups/fields/*.py`` into a flag. This tool mirrors
  ``sglang/srt/arg_groups/arg_utils.py`` (``add_cli_args_from_dataclass``): the flag is ``Arg.cli_name`` or
  ``--`` + the field name with ``_`` -> ``-``, plus ``Arg.aliases``; dest is the field; ``Arg.action`` wins
  (with ``action_kwargs``); else ``Optional[X]`` is unwrapped; ``Literal[...]`` gives choices (type from the
  first value); ``List[X]`` gives ``nargs="+"`` (or ``Arg.nargs``) unless a ``type_parser`` is set; ``bool``
  gives ``store_true``; anything else is a scalar (``type_parser`` or str/int/float, else str), required when
  it has no default. ``no_cli`` fields and fields without an ``A[...]`` help are not flags. The fields come in
  ServerArgs' order: ``collect_input_fields`` puts ``POSITIONAL_FIELD_ORDER`` (arg_groups/field_order.py)
  first, then the rest by namespace class (``_INPUT_NAMESPACES``) and declaration.

Both become the same intermediate (option strings + add_argument keyword values) and one interpreter of argparse
semantics turns that into the table entry. Static values are evaluated with ``ast``: literals, module-level
constants, names imported from other modules of the wheel, class attributes (``Backend.ALL``),
``Class.Attr.keys()``, ``list()/set()/tuple()`` of those, field defaults (``dataclasses.field`` /
``msgspec.field`` with ``default_factory``), ``_declared_default("name")`` (a field's default) and zero-argument
module functions that end in ``return <static expr>`` (``_reasoning_parser_choices()``). What cannot be
evaluated is recorded as ``None`` with a note.

Table entry, keyed by the canonical long flag (the option string that spells the ServerArgs field the flag
sets, else the one that spells ``dest``, else the first). A key is left out when it holds its default
(ENTRY_DEFAULTS below; ``field`` is left out when it equals ``dest``):

    dest            argparse's dest
    field           the ServerArgs field it ends in (0.5.9's from_cli_args renames tensor_parallel_size to
                    tp_size), None when the dest is no field (--config)
    type            int, float, str, json (json.loads), json_list (json_list_type), nullable_str ("" or "None"
                    -> None), human_int (human_readable_int: 1k, 1Mi, ...), cuda_graph_config
                    (parse_cuda_graph_config_arg: a JSON object), cuda_graph_backend (parse_cuda_graph_backend_arg:
                    a string, tc_piecewise refused); None: argparse's raw string (or no value, for switches)
    default, choices, nargs, const, required   as argparse gets them (const also holds DeprecatedStoreConstAction's
                    const_value); sets become sorted lists
    action          None (store), store_true, store_false, BooleanOptionalAction (argparse's: also --no-<flag>),
                    or SGLang's own class: DeprecatedAction (no value; 0.5.9: warns and does nothing),
                    DeprecatedStoreTrueAction (warns, stores True), DeprecatedStoreConstAction (warns, stores
                    const), LoRAPathAction (stores the list of values)
    aliases         the other option strings; option_strings: all of them in declaration order (left out when
                    it is [canonical] + aliases)
    deprecated      True when the source marks the flag deprecated: a Deprecated* action, or a help text that
                    starts with "Deprecated" / "(Deprecated" / "Note: <flag> is deprecated"
    replacement     what the source says to use instead (the action's new_flag, else "use --x" in the help)
    notes           what could not be evaluated

Supported versions and the exact wheel each table comes from are in WHEELS (pinned file names, so every host
downloads the same file whatever its own Python is).

Usage:
    tools/sglang_flags.py --all                 # download every supported wheel (cached) and write every table
    tools/sglang_flags.py --all --check         # exit 1 if a committed table differs from its wheel
    tools/sglang_flags.py --download            # only fetch the wheels into build/wheels
    tools/sglang_flags.py --version 0.5.23      # one version
    tools/sglang_flags.py --wheel path/to/sglang.whl [--out FILE]   # a wheel you have
    tools/sglang_flags.py --diff 0.5.9 0.5.23   # markdown: removed, renamed, deprecated, changed, new flags

Adding a version: add it to WHEELS (file name from `pip download --no-deps --only-binary=:all: sglang==X`), run
`tools/sglang_flags.py --all`, import the new table in module_utils/topolaunch/plan_args.py.
"""
import argparse
import ast
import os
import pathlib
import re
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
WHEEL_DIR = ROOT / "build" / "wheels"
SERVER_ARGS = "sglang/srt/server_args.py"

# version -> the wheel its table is extracted from. 0.5.23 ships only CPython-specific manylinux_2_34 wheels
# (cp311, cp312, cp313; x86_64 and aarch64; no sdist): pip download needs --python-version and --platform.
WHEELS = {
    "0.5.9": {"file": "sglang-0.5.9-py3-none-any.whl"},
    "0.5.23": {"file": "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl",
               "python_version": "3.11", "platform": "manylinux_2_34_x86_64"},
}

ENTRY_DEFAULTS = {
    "type": None, "default": None, "choices": None, "action": None, "nargs": None, "const": None,
    "required": False, "aliases": [], "deprecated": False, "replacement": None, "notes": [],
}
ENTRY_KEYS = ("dest", "field", "type", "default", "choices", "action", "nargs", "const", "required", "aliases",
              "option_strings", "deprecated", "replacement", "notes")

# source spelling of an argparse `type=` (or Arg.type_parser) -> table type name
TYPE_NAMES = {
    "int": "int",
    "float": "float",
    "str": "str",
    "json.loads": "json",
    "json_list_type": "json_list",
    "nullable_str": "nullable_str",
    "human_readable_int": "human_int",
    "parse_cuda_graph_config_arg": "cuda_graph_config",
    "parse_cuda_graph_backend_arg": "cuda_graph_backend",
}
_MISSING = object()


CONTAINERS = {"list": list, "tuple": tuple, "set": set, "frozenset": set, "dict": dict}


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
        self.functions = {}  # name -> FunctionDef
        for node in tree.body:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        self.assigns[target.id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
                self.assigns[node.target.id] = node.value
            elif isinstance(node, ast.ImportFrom):
                self._add_import(node)
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
            elif isinstance(node, ast.FunctionDef):
                self.functions[node.name] = node
        self.locals = {}
        self.calls = {}  # function name -> python callable of evaluated arguments (hooks of the extractor)

    def _add_import(self, node):
        if node.module and node.level == 0:
            for alias in node.names:
                self.imports[alias.asname or alias.name] = (node.module, alias.name)

    def other(self, dotted):
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
        if name in self.functions:
            return ("function", self, self.functions[name])
        if name in self.imports:
            mod, attr = self.imports[name]
            if self.source.module(mod) is None:
                return Unresolved("%s is imported from %s, which is not in the wheel" % (name, mod))
            return self.other(mod).lookup(attr)
        if name in ("int", "float", "str", "bool", "list", "dict", "set", "frozenset", "tuple"):
            return ("builtin", name)
        return Unresolved("name %s is not a static module-level value" % name)

    def _with_locals(self, scope, expr):
        saved = self.locals
        self.locals = scope
        try:
            return self.eval(expr)
        finally:
            self.locals = saved

    def class_attr(self, cls_ref, attr):
        """A class-level value; names in it resolve in the class body first (ALL = (FULL, BREAKABLE))."""
        _, owner, cls = cls_ref
        scope = {}
        for node in cls.body:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        scope[target.id] = node.value
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == attr:
                if node.value is None:
                    return Unresolved("%s.%s has no default" % (cls.name, attr))
                return owner.field_default(node.value)
        if attr in scope:
            return owner._with_locals(scope, scope[attr])
        return Unresolved("%s.%s is not a class-level value" % (cls.name, attr))

    def field_default(self, expr):
        """Default of a dataclass/msgspec field: the value, or field(default=... / default_factory=...)."""
        if isinstance(expr, ast.Call) and ast.unparse(expr.func) in ("dataclasses.field", "field", "msgspec.field"):
            for kw in expr.keywords:
                if kw.arg == "default":
                    return self.eval(kw.value)
                if kw.arg == "default_factory":
                    factory = kw.value
                    if isinstance(factory, ast.Lambda):
                        return self.eval(factory.body)
                    return self.eval(ast.Call(func=factory, args=[], keywords=[]))
            return Unresolved("field() without default")
        return self.eval(expr)

    def _function_result(self, ref):
        """Result of a zero-argument module function whose last statement is `return <static expr>`."""
        _, owner, func = ref
        if func.args.args or not func.body or not isinstance(func.body[-1], ast.Return) or func.body[-1].value is None:
            return Unresolved("function %s does not end in a static return" % func.name)
        scope_owner = owner.other(owner.dotted)
        for stmt in func.body:
            if isinstance(stmt, ast.ImportFrom):
                scope_owner._add_import(stmt)
        return scope_owner.eval(func.body[-1].value)

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
            return self._call(node)
        return Unresolved("expression %s" % ast.unparse(node))

    def _call(self, node):
        if isinstance(node.func, ast.Attribute) and node.func.attr == "keys" and not node.args:
            base = self.eval(node.func.value)
            if isinstance(base, dict):
                return list(base.keys())
            return base if isinstance(base, Unresolved) else Unresolved(ast.unparse(node))
        if isinstance(node.func, ast.Name) and node.func.id in self.calls and not node.keywords:
            args = [self.eval(a) for a in node.args]
            bad = [a for a in args if isinstance(a, Unresolved)]
            return bad[0] if bad else self.calls[node.func.id](*args)
        func = self.eval(node.func)
        if isinstance(func, tuple) and func[0] == "builtin" and func[1] in CONTAINERS:
            if node.keywords:
                return Unresolved(ast.unparse(node))
            if not node.args:
                return CONTAINERS[func[1]]()
            arg = self.eval(node.args[0])
            if isinstance(arg, Unresolved):
                return arg
            if isinstance(arg, tuple) and arg and arg[0] in ("class", "function", "builtin"):
                return Unresolved("call %s" % ast.unparse(node))
            return CONTAINERS[func[1]](arg)
        if isinstance(func, tuple) and func[0] == "function" and not node.args and not node.keywords:
            return self._function_result(func)
        return Unresolved("call %s" % ast.unparse(node))


def _plain(value):
    """Sets become sorted lists, tuples lists, so the table is deterministic and JSON-like."""
    if isinstance(value, set):
        return sorted(value, key=repr)
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


class Field:
    """One ServerArgs field: name, annotation and default expressions, and the evaluator of its module."""

    def __init__(self, name, node, ev):
        self.name, self.annotation, self.value, self.ev = name, node.annotation, node.value, ev

    def default(self):
        return _MISSING if self.value is None else self.ev.field_default(self.value)


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

    fields = _server_args_fields(ev, server_args)
    ev.calls["_declared_default"] = lambda name: (
        _plain(fields[name].default()) if name in fields else Unresolved("%s is no ServerArgs field" % name))
    renames = _cli_renames(server_args)  # argparse dest -> ServerArgs field (0.5.9's from_cli_args)
    flags = {}

    def add(option_strings, kwargs, line):
        canonical, entry = _flag_entry(option_strings, kwargs, fields, renames)
        if canonical in flags:
            raise ValueError("flag %s declared twice (line %d)" % (canonical, line))
        flags[canonical] = entry

    for stmt in add_cli_args.body:
        # Local helper assignments (e.g. tool_call_parser_choices = ...) are visible to later calls.
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    ev.locals[target.id] = stmt.value
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            call = stmt.value
            func = ast.unparse(call.func)
            if func == "parser.add_argument":
                add(*_argparse_call(ev, call), call.lineno)
                continue
            if func == "add_cli_args_from_dataclass":
                if [ast.unparse(a) for a in call.args] != ["parser", "ServerArgs"] or call.keywords:
                    raise ValueError("add_cli_args_from_dataclass(%s) at line %d: extend the extractor" % (
                        ", ".join(ast.unparse(a) for a in call.args), call.lineno))
                for field in fields.values():
                    made = _dataclass_call(field)
                    if made is not None:
                        add(*made, field.annotation.lineno)
                continue
        # Anything else (if/for around add_argument) would make the table incomplete: refuse loudly.
        for inner in ast.walk(stmt):
            if isinstance(inner, ast.Call) and ast.unparse(inner.func) in (
                    "parser.add_argument", "add_cli_args_from_dataclass"):
                raise ValueError("%s inside %s at line %d: extend the extractor" % (
                    ast.unparse(inner.func), type(stmt).__name__, stmt.lineno))
    if not flags:
        raise ValueError("no parser.add_argument calls found in ServerArgs.add_cli_args")
    return version, flags


def _class_fields(cls, ev):
    return [Field(n.target.id, n, ev) for n in cls.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
            and not ast.unparse(n.annotation).startswith(("ClassVar", "typing.ClassVar"))]


def _server_args_fields(ev, server_args):
    """{name: Field} in ServerArgs' field order.

    0.5.9: the annotated attributes of the ServerArgs dataclass. 0.5.23: server_args.py calls
    ``collect_input_fields(_INPUT_NAMESPACES)`` (arg_groups/fields/__init__.py), which orders the namespace
    classes' fields by POSITIONAL_FIELD_ORDER, then the rest in namespace and declaration order; ServerArgs' own
    annotations follow (``ServerArgs.__annotations__ = {**_annotations, **ServerArgs.__annotations__}``).
    """
    collected = {}
    for stmt in ev.source.module(ev.dotted).body:
        expr = stmt.value if isinstance(stmt, ast.Assign) else None
        if isinstance(expr, ast.Call) and ast.unparse(expr.func) == "collect_input_fields":
            classes = ev.eval(expr.args[0])
            if isinstance(classes, Unresolved) or not all(
                    isinstance(c, tuple) and c[0] == "class" for c in classes):
                raise ValueError("collect_input_fields(%s) is not a static list of classes" % ast.unparse(
                    expr.args[0]))
            mod, attr = ev.imports["collect_input_fields"]
            order = ev.other(mod).lookup("POSITIONAL_FIELD_ORDER")
            if isinstance(order, Unresolved):
                raise ValueError("POSITIONAL_FIELD_ORDER of %s: %s" % (mod, order.why))
            declared = {}
            for _, owner, cls in classes:
                bases = [ast.unparse(b) for b in cls.bases]
                if bases != ["msgspec.Struct"]:
                    raise ValueError("namespace class %s has bases %s: extend the extractor" % (cls.name, bases))
                for field in _class_fields(cls, owner):
                    if field.name in declared:
                        raise ValueError("%s is declared twice (%s)" % (field.name, cls.name))
                    declared[field.name] = field
            for name_ in [n for n in order if n in declared] + [n for n in declared if n not in set(order)]:
                collected[name_] = declared[name_]
    for field in _class_fields(server_args, ev):
        collected.setdefault(field.name, field)
    return collected


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


# ------------------------------------------------------------------------------------- argparse call -> kwargs


def _action_info(ev, node):
    """(name, __init__ keyword defaults) of an action: a string ('store_true') or a class of the wheel or argparse."""
    if isinstance(node, ast.Constant):
        return node.value, {}
    name = ast.unparse(node).split(".")[-1]
    ref = ev.eval(node)
    defaults = {}
    if isinstance(ref, tuple) and ref and ref[0] == "class":
        _, owner, cls = ref
        init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if init is not None:
            args = init.args.args
            for arg, default in zip(args[len(args) - len(init.args.defaults):], init.args.defaults):
                value = owner.eval(default)
                if not isinstance(value, Unresolved):
                    defaults[arg.arg] = value
    return name, defaults


def _argparse_call(ev, call):
    """(option strings, kwargs) of a parser.add_argument call; kwargs hold evaluated values, `type` and
    `action` their source spelling, `_action_defaults` the action class's __init__ defaults."""
    option_strings = []
    for arg in call.args:
        if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
            raise ValueError("non-literal option string at line %d" % call.lineno)
        option_strings.append(arg.value)
    kwargs = {}
    for kw in call.keywords:
        if kw.arg is None:
            raise ValueError("**kwargs in add_argument at line %d: extend the extractor" % call.lineno)
        if kw.arg == "type":
            kwargs["type"] = ast.unparse(kw.value)
        elif kw.arg == "action":
            kwargs["action"], kwargs["_action_defaults"] = _action_info(ev, kw.value)
        else:
            kwargs[kw.arg] = ev.eval(kw.value)
    return option_strings, kwargs


# ------------------------------------------------------------------------------ dataclass field -> kwargs


def _subscript(node):
    """(head spelling, [argument nodes]) of X[a, b], or (None, None)."""
    if not isinstance(node, ast.Subscript):
        return None, None
    args = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    return ast.unparse(node.value).split(".")[-1], list(args)


def _is_none(node):
    return (isinstance(node, ast.Constant) and node.value is None) or (isinstance(node, ast.Name) and node.id == "None")


def _unwrap_optional(node):
    """arg_utils._unwrap_optional: Optional[X], Union[X, None], X | None -> X; anything else unchanged."""
    head, args = _subscript(node)
    if head == "Optional" and len(args) == 1:
        return args[0]
    if head == "Union" or (isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr)):
        if head is None:
            args, stack = [], [node]
            while stack:
                part = stack.pop()
                if isinstance(part, ast.BinOp) and isinstance(part.op, ast.BitOr):
                    stack.extend([part.right, part.left])
                else:
                    args.append(part)
        non_none = [a for a in args if not _is_none(a)]
        if len(non_none) == 1:
            return non_none[0]
    return node


def _infer_type(node_or_name):
    """arg_utils._infer_type_func: str, int, float as themselves, anything else str."""
    name = node_or_name if isinstance(node_or_name, str) else ast.unparse(node_or_name)
    return name if name in ("str", "int", "float") else "str"


def _arg_meta(field):
    """The field's CLI metadata, as arg_utils._unwrap_annotated finds it: {Arg keyword: value node}, or None
    when the field has no A[T, "help"] / A[T, Arg(...)] annotation. Returns (inner type node, meta)."""
    head, args = _subscript(field.annotation)
    if head not in ("A", "Annotated") or len(args) < 2:
        return None, None
    for extra in args[1:]:
        if isinstance(extra, ast.Call) and ast.unparse(extra.func).split(".")[-1] == "Arg":
            if extra.args:
                raise ValueError("Arg() with positional arguments for %s: extend the extractor" % field.name)
            return args[0], {kw.arg: kw.value for kw in extra.keywords}
        if isinstance(extra, ast.Constant) and isinstance(extra.value, str):
            return args[0], {"help": extra}
    return args[0], None


def _dataclass_call(field):
    """(option strings, kwargs) that add_cli_args_from_dataclass passes to parser.add_argument for the field,
    or None when the field is no flag."""
    raw, meta = _arg_meta(field)
    if meta is None:
        return None
    ev = field.ev

    def value(key, default=None):
        return ev.eval(meta[key]) if key in meta else default

    if value("no_cli", False) is True:
        return None
    cli_name = value("cli_name") or "--" + field.name.replace("_", "-")
    names = [cli_name] + list(value("aliases") or [])
    default = field.default()
    kwargs = {"help": value("help", "")}
    if field.name != cli_name.lstrip("-").replace("-", "_"):
        kwargs["dest"] = field.name
    if default is not _MISSING:
        kwargs["default"] = default

    if "action" in meta:
        kwargs["action"], kwargs["_action_defaults"] = _action_info(ev, meta["action"])
        extra = meta.get("action_kwargs")
        if extra is not None:
            if not isinstance(extra, ast.Dict) or None in extra.keys:
                raise ValueError("action_kwargs of %s is not a dict literal: extend the extractor" % field.name)
            for key, node in zip(extra.keys, extra.values):
                key = ev.eval(key)
                kwargs[key] = ast.unparse(node) if key == "type" else ev.eval(node)
        return names, kwargs

    inner = _unwrap_optional(raw)
    type_parser = ast.unparse(meta["type_parser"]) if "type_parser" in meta else None
    head, args = _subscript(inner)
    const = value("const")
    if head == "Literal":
        literal = [ast.literal_eval(a) for a in args]
        kwargs["type"] = type_parser or _infer_type(type(literal[0]).__name__ if literal else "str")
        kwargs["choices"] = value("choices") or literal
    elif head in ("List", "list") and type_parser is None:
        kwargs["type"] = _infer_type(args[0]) if args else "str"
        kwargs["nargs"] = value("nargs") or "+"
        if value("choices"):
            kwargs["choices"] = value("choices")
    elif isinstance(inner, ast.Name) and inner.id == "bool":
        kwargs["action"] = "store_true"
        return names, kwargs
    else:
        kwargs["type"] = type_parser or _infer_type(inner)
        if value("choices"):
            kwargs["choices"] = value("choices")
        if value("nargs"):
            kwargs["nargs"] = value("nargs")
        required = value("required")
        if required is True or (required is None and default is _MISSING):
            kwargs["required"] = True
    if const is not None:
        kwargs["const"] = const
    return names, kwargs


# ------------------------------------------------------------------------------------- kwargs -> table entry

DEPRECATED_HELP = re.compile(r"^\(?Deprecated\b")
USE_INSTEAD = re.compile(r"\b[Uu]se (--[^\s),]+)")


def _flag_entry(option_strings, kwargs, fields, renames):
    """Canonical flag and table entry of one add_argument (argparse's semantics, SGLang's action classes)."""
    notes = []

    def value(key, default=None):
        if key not in kwargs:
            return default
        got = kwargs[key]
        if isinstance(got, Unresolved):
            notes.append("%s unresolved: %s" % (key, got.why))
            return None
        return _plain(got)

    dest = value("dest")
    if dest is None:
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

    action = kwargs.get("action")
    action_defaults = kwargs.get("_action_defaults", {})
    type_name = None
    if "type" in kwargs:
        type_name = TYPE_NAMES.get(kwargs["type"])
        if type_name is None:
            notes.append("type %s is not known to the extractor" % kwargs["type"])

    if "default" in kwargs:
        default = value("default")
    elif action == "store_true":
        default = False
    elif action == "store_false":
        default = True
    else:
        default = _plain(action_defaults.get("default"))
    nargs = value("nargs") if "nargs" in kwargs else action_defaults.get("nargs")
    const = value("const") if "const" in kwargs else value("const_value")

    help_text = kwargs.get("help")
    help_text = help_text if isinstance(help_text, str) else ""  # f-strings stay unresolved: no note, not needed
    deprecated = bool(
        (action or "").startswith("Deprecated") or DEPRECATED_HELP.match(help_text)
        or any(help_text.startswith("Note: %s is deprecated" % s) for s in option_strings))
    replacement = None
    if deprecated:
        replacement = value("new_flag")
        if replacement is None:
            found = USE_INSTEAD.search(help_text)
            replacement = found.group(1).rstrip(".") if found else None
    aliases = [s for s in option_strings if s != canonical]
    entry = {
        "dest": dest,
        "field": field,
        "type": type_name,
        "default": default,
        "choices": value("choices"),
        "action": action,
        "nargs": nargs,
        "const": const,
        "required": bool(value("required", False)),
        "aliases": aliases,
        "option_strings": option_strings,
        "deprecated": deprecated,
        "replacement": replacement,
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


# ----------------------------------------------------------------------------------------------- output


def compact(canonical, entry):
    """The entry without the keys that hold their default (ENTRY_DEFAULTS; field when it equals dest,
    option_strings when it is [canonical] + aliases)."""
    out = {}
    for key in ENTRY_KEYS:
        val = entry[key]
        if key == "field" and val == entry["dest"]:
            continue
        if key == "option_strings" and val == [canonical] + entry["aliases"]:
            continue
        if key in ENTRY_DEFAULTS and val == ENTRY_DEFAULTS[key] and type(val) is type(ENTRY_DEFAULTS[key]):
            continue
        out[key] = val
    return out


def expand(canonical, entry):
    """Inverse of compact: every key present."""
    full = dict(ENTRY_DEFAULTS, field=entry["dest"])
    full.update(entry)
    full.setdefault("option_strings", [canonical] + list(full["aliases"]))
    return full


def render_module(version, flags, wheel_name):
    lines = [
        '"""SGLang %s launch_server flags, extracted from %s by tools/sglang_flags.py. Do not edit.' % (
            version, wheel_name),
        "",
        "Regenerate: tools/sglang_flags.py --all. Keys: canonical long flag. An entry leaves out the keys that hold",
        "their default (ENTRY_DEFAULTS; field when it equals dest; option_strings when it is [flag] + aliases);",
        "tools/sglang_flags.py describes every key.",
        '"""',
        "",
        "VERSION = %r" % version,
        "ENTRY_DEFAULTS = " + literal(ENTRY_DEFAULTS),
        "",
        "FLAGS = {",
    ]
    for flag, entry in flags.items():
        lines.append("    %r: %s," % (flag, literal(compact(flag, entry), 4, 150 - len(repr(flag)))))
    lines += ["}", ""]
    return "\n".join(lines)


def module_path(version):
    return ROOT / "module_utils" / "topolaunch" / ("sglang_flags_%s.py" % version.replace(".", "_"))


def download_wheel(version, dest=WHEEL_DIR):
    """Path of the pinned wheel of a supported version in dest (pip download --no-deps when not there yet)."""
    spec = WHEELS[version]
    dest = pathlib.Path(dest)
    path = dest / spec["file"]
    if path.is_file():
        return str(path)
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "sglang==%s" % version, "-d", str(dest)]
    if "python_version" in spec:
        cmd += ["--python-version", spec["python_version"], "--platform", spec["platform"]]
    print("downloading: %s" % " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=True)
    if not path.is_file():
        raise FileNotFoundError("pip download left no %s in %s" % (spec["file"], dest))
    return str(path)


def write_or_check(wheel, out, check, expect_version=None):
    version, flags = extract_flags(wheel)
    if expect_version and version != expect_version:
        raise ValueError("wheel %s is version %s, not %s" % (wheel, version, expect_version))
    out = pathlib.Path(out) if out else module_path(version)
    text = render_module(version, flags, os.path.basename(wheel))
    if check:
        current = out.read_text() if out.exists() else ""
        if current != text:
            print("%s differs from what %s gives: regenerate with tools/sglang_flags.py --all" % (out, wheel),
                  file=sys.stderr)
            return 1
        print("%s matches %s (%d flags)" % (out, wheel, len(flags)))
        return 0
    out.write_text(text)
    print("wrote %s: %d flags from %s" % (out, len(flags), wheel))
    for flag, entry in flags.items():
        for note in entry["notes"]:
            print("  note %s: %s" % (flag, note))
    return 0


def diff_tables(old, new):
    """Markdown lines: what changed for a user between two versions' tables (module_utils/topolaunch tables)."""
    import importlib.util

    def load(version):
        spec = importlib.util.spec_from_file_location("t", module_path(version))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return {flag: expand(flag, entry) for flag, entry in module.FLAGS.items()}

    a, b = load(old), load(new)
    spelled_b = {s: flag for flag, e in b.items() for s in e["option_strings"]}
    out = ["### Flags of %s that %s no longer has (%d)" % (old, new, sum(f not in spelled_b for f in a)), ""]
    for flag in a:
        if flag not in spelled_b:
            out.append("- `%s`%s" % (flag, " (deprecated in %s)" % old if a[flag]["deprecated"] else ""))
    moved = [f for f in a if f not in b and f in spelled_b]
    out += ["", "### Flags of %s that are aliases in %s (%d)" % (old, new, len(moved)), ""]
    out += ["- `%s` -> `%s`" % (f, spelled_b[f]) for f in moved]
    dep = [f for f in b if b[f]["deprecated"]]
    out += ["", "### Deprecated in %s (%d)" % (new, len(dep)), ""]
    out += ["- `%s`: %s" % (f, "use `%s`" % b[f]["replacement"] if b[f]["replacement"] else "no replacement named")
            for f in dep]
    changed = []
    for flag in a:
        if flag in b:
            keys = [k for k in ("dest", "type", "default", "action", "nargs", "required") if a[flag][k] != b[flag][k]]
            lost = sorted(set(a[flag]["choices"] or []) - set(b[flag]["choices"] or [])) if b[flag]["choices"] else []
            parts = ["%s %r -> %r" % (k, a[flag][k], b[flag][k]) for k in keys]
            if lost:
                parts.append("choices dropped: %s" % ", ".join(map(str, lost)))
            if a[flag]["choices"] and b[flag]["choices"] is None:
                parts.append("any value accepted (choices %s dropped)" % "/".join(map(str, a[flag]["choices"])))
            if parts:
                changed.append("- `%s`: %s" % (flag, "; ".join(parts)))
    out += ["", "### Flags in both whose declaration changed (%d; added choices not listed)" % len(changed), ""]
    out += changed
    added = [f for f in b if f not in a]
    out += ["", "### New in %s (%d)" % (new, len(added)), "", ", ".join("`%s`" % f for f in added), ""]
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all", action="store_true", help="every supported version (WHEELS)")
    parser.add_argument("--download", action="store_true", help="only download the supported wheels")
    parser.add_argument("--version", choices=sorted(WHEELS), help="one supported version")
    parser.add_argument("--wheel", help="path of an sglang wheel")
    parser.add_argument("--wheel-dir", default=str(WHEEL_DIR))
    parser.add_argument("--out", help="output module (default module_utils/topolaunch/sglang_flags_<ver>.py)")
    parser.add_argument("--check", action="store_true", help="compare with the output file, write nothing")
    parser.add_argument("--diff", nargs=2, metavar=("OLD", "NEW"), choices=sorted(WHEELS),
                        help="print (markdown) what changed between two committed tables")
    args = parser.parse_args(argv)
    if args.diff:
        print("\n".join(diff_tables(*args.diff)))
        return 0
    if sum(bool(x) for x in (args.all, args.download, args.version, args.wheel)) != 1:
        parser.error("give one of --all, --download, --version, --wheel")
    if args.out and (args.all or args.download):
        parser.error("--out goes with --version or --wheel")
    try:
        if args.download:
            for version in WHEELS:
                print(download_wheel(version, args.wheel_dir))
            return 0
        if args.wheel:
            return write_or_check(args.wheel, args.out, args.check)
        rc = 0
        for version in (sorted(WHEELS) if args.all else [args.version]):
            rc |= write_or_check(download_wheel(version, args.wheel_dir), args.out, args.check, version)
        return rc
    except (ValueError, FileNotFoundError, subprocess.CalledProcessError) as exc:
        print("sglang_flags: %s" % exc, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
