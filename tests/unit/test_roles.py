"""Every role has a README that names each of its variables, depends on the shared role topolaunch (every role but
that one), and has an argument spec (that one has no tasks: nothing to validate)."""
import pathlib

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
