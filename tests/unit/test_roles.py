"""Every role has a README that names each of its variables, depends on the shared role topolaunch (every role but
that one), and has an argument spec (that one has no tasks: nothing to validate)."""
import pathlib
import re

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "meta" / "main.yml").is_file())  # a role has meta


@pytest.mark.parametrize("role", ROLES)
def test_role_documents_its_variables_and_uses_the_shared_names(role):
    path = ROOT / "roles" / role
    readme = (path / "README.md").read_text()
    assert readme.startswith("# Role topolaunch.sglang.%s\n" % role)
    deps = yaml.safe_load((path / "meta" / "main.yml").read_text())["dependencies"]
    if role == "topolaunch":
        names = yaml.safe_load((path / "defaults" / "main.yml").read_text())
        assert deps == [] and not (path / "tasks").exists()
    else:
        assert {"role": "topolaunch.sglang.topolaunch"} in deps
        specs = yaml.safe_load((path / "meta" / "argument_specs.yml").read_text())["argument_specs"]
        names = {n for spec in specs.values() for n in spec.get("options") or {}}
    missing = sorted(n for n in names if "`%s`" % n not in readme)
    assert not missing, "%s/README.md does not name %s" % (role, missing)


# ----------------------------------------------------------------- where results are filed (one rule, in Python)
# A server across nodes: its results are filed under the cluster fingerprint (every node's topology), never under
# one node's. The rule is plugin_utils/results.py filed_under; a task that files or looks up results passes the plan
# (the sglang_bench action plugin applies the rule) or asks the filter topolaunch.sglang.results_fingerprint.
TWO_NODES = {"model_name": "glm-5-nvfp4", "topology_fingerprint": "node0fingerp", "cluster_fingerprint": "clusterfinge",
             "layout": {"name": "tp8pp2", "nnodes": 2}, "per_node": [{"node_rank": 0}, {"node_rank": 1}]}
PLAN_VARS = {"tune_base_plan": TWO_NODES, "topolaunch_plan": TWO_NODES, "relaunch_plan": TWO_NODES,
             "bench_serving": {"plan": TWO_NODES, "url": "http://127.0.0.1:30000"}}
FILES = ("record", "tune", "query")


def _tasks(items):
    for task in items or []:
        yield task
        for key in ("block", "rescue", "always"):
            yield from _tasks(task.get(key))


def results_tasks():
    """(file, task name, args, the variables the file's tasks define: set_fact and vars) of every sglang_bench
    task that files or looks up results, in roles/ and playbooks/."""
    found = []
    for path in sorted(list((ROOT / "roles").glob("*/tasks/*.yml")) + list((ROOT / "playbooks").glob("*.yml"))):
        plays = yaml.safe_load(path.read_text()) or []
        tasks = [t for p in plays for t in _tasks(p.get("tasks"))] if path.parent.name == "playbooks" \
            else list(_tasks(plays))
        for task in tasks:
            args = task.get("topolaunch.sglang.sglang_bench")
            if args and args.get("state", "record") in FILES:
                found.append((path, task["name"], args))
    return found


def defined_vars():
    """Every variable the roles' and playbooks' tasks define (set_fact, task and play vars), as its expression."""
    pool = {}
    for path in sorted(list((ROOT / "roles").glob("*/tasks/*.yml")) + list((ROOT / "playbooks").glob("*.yml"))):
        items = yaml.safe_load(path.read_text()) or []
        for task in _tasks([t for p in items for t in ([p] + list(p.get("tasks") or []))]):
            for source in (task.get("ansible.builtin.set_fact"), task.get("vars")):
                for key, value in (source or {}).items():
                    pool.setdefault(key, value)
    return pool


def test_every_result_of_a_server_across_nodes_is_filed_under_its_cluster_fingerprint(tmp_path):
    from local_play import run_plays  # pylint: disable=import-outside-toplevel

    tasks = results_tasks()
    assert len(tasks) >= 4     # the bench query and record, a failed layout, the tune's record
    exprs = {}
    for i, (_path, _name, args) in enumerate(tasks):
        exprs["fp_%d" % i] = (args["topology_fingerprint"] if "topology_fingerprint" in args
                              else "{{ (%s).cluster_fingerprint | default((%s).topology_fingerprint) }}"
                              % ((args["plan"].strip("{} "),) * 2) if isinstance(args.get("plan"), str)
                              else "no plan, no fingerprint")
    defaults = {}
    for role in ("topolaunch", "bench", "tune"):
        defaults.update(yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text()) or {})
    variables = dict(defaults, **dict({k: v for k, v in defined_vars().items() if k not in PLAN_VARS}, **PLAN_VARS))
    play = {"name": "fingerprints", "hosts": "localhost", "gather_facts": False, "vars": variables,
            "tasks": [{"ansible.builtin.set_fact": exprs}]}
    got = run_plays([play], tmp_path, list(exprs))
    wrong = ["%s: %r (task %r)" % (path.relative_to(ROOT), fp, name)
             for (path, name, _args), fp in zip(tasks, got) if fp != TWO_NODES["cluster_fingerprint"]]
    assert not wrong, "filed under another fingerprint than the cluster's:\n" + "\n".join(wrong)


# ----------------------------------------------------------------- -e key=value: every number and switch as a string
# Extra-vars from the command line are strings (`-e bench_point_timeout=600`). The argument specs type them, but a
# role's argument check does not convert what the tasks read: every read of a numeric or boolean variable casts it
# (`| int`, `| float`, `| bool`), or prints it whole (a message, a unit line), or hands it whole to a module option or
# a default of another such variable, whose own argument spec or reads cast it (never to a member of a dict default:
# the module's dict option does not cast its members; the lab test that found it: tests/lab/test_lifecycle.py).
RAW_KEYS = ("when", "that", "failed_when", "changed_when", "until")
CAST = re.compile(r"\s*\|\s*(int|float|bool|string)\b|\s*~")
DEFAULT = re.compile(r"\s*\|\s*default\(")


def _past_defaults(after):
    """`after` past any `| default(...)` (balanced parentheses): a cast may follow the defaults."""
    while True:
        m = DEFAULT.match(after)
        if not m:
            return after
        depth, i = 1, m.end()
        while i < len(after) and depth:
            depth += {"(": 1, ")": -1}.get(after[i], 0)
            i += 1
        after = after[i:]
SHARED_TYPED = {"int": int, "bool": bool}


def typed_vars():
    """{name: (type, an example value)} of every numeric and boolean variable a user may set: the options so typed in
    the argument specs, and the shared role's defaults holding a number or a switch."""
    found = {}
    for path in sorted((ROOT / "roles").glob("*/meta/argument_specs.yml")):
        role = path.parts[-3]
        defaults = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text()) or {}
        for spec in yaml.safe_load(path.read_text())["argument_specs"].values():
            for name, option in (spec.get("options") or {}).items():
                kind = option.get("type")
                if kind in ("int", "float", "bool"):
                    value = defaults.get(name, option.get("default"))
                    if not isinstance(value, (int, float)):     # a template or none: an example of its type
                        value = {"int": 1, "float": 1.5, "bool": True}[kind]
                    found[name] = (kind, value)
    shared = yaml.safe_load((ROOT / "roles" / "topolaunch" / "defaults" / "main.yml").read_text())
    for name, value in shared.items():
        if isinstance(value, (bool, int)):
            found.setdefault(name, ("bool" if isinstance(value, bool) else "int", value))
    return found


def _strings(node, key=None):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _strings(v, k)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v, key)
    elif isinstance(node, str):
        yield key, node


def uncast_reads(names, root=ROOT):
    """'file: name in ...' for every read of one of `names` in the roles' and playbooks' YAML and templates that
    neither casts it nor prints or hands it on whole."""
    word = re.compile(r"(?<![\w.'\"])(%s)(?![\w'\"])" % "|".join(sorted(names, key=len, reverse=True)))
    block = re.compile(r"\{\{-?(.*?)-?\}\}|\{%-?(.*?)-?%\}", re.S)
    wrong = []

    def check(where, expression, statement, whole_ok=True):
        expression = re.sub(r"'[^']*'|\"[^\"]*\"", "''", expression)      # names inside quotes are text
        whole = expression.strip()
        for m in word.finditer(expression):
            before, after = expression[:m.start()], expression[m.end():]
            if CAST.match(_past_defaults(after)) or re.search(r"~\s*$", before) or (whole == m.group(1) and not statement
                                                                    and whole_ok):
                continue
            wrong.append("%s: %s in %r" % (where, m.group(1), re.sub(r"\s+", " ", whole)[:120]))

    yml = sorted(root.glob("roles/*/tasks/*.yml")) + sorted(root.glob("roles/*/handlers/*.yml")) \
        + sorted(root.glob("roles/*/vars/*.yml")) + sorted(root.glob("playbooks/*.yml")) + [root / "deploy.yml"]
    for path in yml + sorted(root.glob("roles/*/defaults/main.yml")):
        where = str(path.relative_to(root))
        for key, text in _strings(yaml.safe_load(path.read_text())):
            if path.parent.name == "defaults" and key in names:
                continue    # a default of another such variable: checked where that one is read
            if key in RAW_KEYS:
                check(where, text, True)
                continue
            for m in block.finditer(text):
                # a default or var that hands one on whole to a name that is not such a variable (a dict's
                # member: a module option whose inner values no argument spec casts) must cast it
                check(where, m.group(1) if m.group(1) is not None else m.group(2), m.group(1) is None,
                      path.parent.name not in ("defaults", "vars"))
    for path in sorted(root.glob("roles/*/templates/*")):
        for m in block.finditer(path.read_text()):
            check(str(path.relative_to(root)), m.group(1) if m.group(1) is not None else m.group(2), m.group(1) is None)
    return wrong


def test_every_numeric_or_boolean_variable_is_cast_where_it_is_read():
    names = typed_vars()
    assert {"bench_point_timeout", "launch_hardening", "topolaunch_port", "preflight_step_timeout"} <= set(names)
    wrong = uncast_reads(names)
    assert not wrong, "read without | int, | float or | bool (a string from -e breaks it):\n" + "\n".join(wrong)


def test_the_reads_check_finds_an_uncast_read(tmp_path):
    """The check itself: a comparison, a condition, a filter argument and a template's `if` without a cast."""
    (tmp_path / "roles" / "x" / "tasks").mkdir(parents=True)
    (tmp_path / "roles" / "x" / "templates").mkdir()
    (tmp_path / "deploy.yml").write_text("[]\n")
    (tmp_path / "roles" / "x" / "tasks" / "main.yml").write_text(
        "- ansible.builtin.assert: {that: [x_timeout >= 1, x_port | int > 0]}\n"
        "  when: x_force\n"
        "- ansible.builtin.debug: {msg: \"{{ x_list | f(x_timeout) }} {{ x_timeout }}s\"}\n")
    (tmp_path / "roles" / "x" / "templates" / "u.j2").write_text("{% if x_force %}A={{ x_port }}{% endif %}\n")
    wrong = uncast_reads({"x_timeout", "x_port", "x_force"}, tmp_path)
    assert len(wrong) == 4 and sum("x_timeout" in w for w in wrong) == 2, wrong


def test_every_numeric_or_boolean_variable_passes_its_argument_spec_as_an_extra_var_string(tmp_path):
    """Each role's argument check, and the bench's check of its settings, in one local play, with every such
    variable given as `-e name=value`."""
    from local_play import run_plays  # pylint: disable=import-outside-toplevel

    names = typed_vars()
    extra = {n: str(v).lower() if kind == "bool" else str(v) for n, (kind, v) in names.items()}
    tasks = []
    for path in sorted((ROOT / "roles").glob("*/meta/argument_specs.yml")):
        for entry, spec in yaml.safe_load(path.read_text())["argument_specs"].items():
            options = {n: o for n, o in (spec.get("options") or {}).items() if n in names}
            if options:
                tasks.append({"name": "%s %s" % (path.parts[-3], entry), "ansible.builtin.validate_argument_spec": {
                    "argument_spec": options}})
    # the bench's own check of its settings, as the role has it (it crashed on `-e bench_point_timeout=600`)
    bench = yaml.safe_load((ROOT / "roles" / "bench" / "tasks" / "main.yml").read_text())
    tasks += [t for t in bench if t.get("name") == "Check the bench settings"]
    tasks.append({"ansible.builtin.set_fact": {"types": "{{ {%s} }}" % ", ".join(
        "%r: %s | type_debug" % (n, n) for n in names)}})
    defaults = {}
    for role in ("topolaunch", "bench"):
        defaults.update(yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text()) or {})
    play = {"name": "specs", "hosts": "localhost", "gather_facts": False, "vars": defaults, "tasks": tasks}
    got = run_plays([play], tmp_path, ["types"], extra_vars=extra)[0]
    assert len(tasks) > 12 and set(got) == set(names)
    assert {t for t in got.values()} <= {"str", "_AnsibleTaggedStr"}, got   # they did arrive as strings
