"""Run plays on localhost with the project's ansible.cfg, as the role-rendering unit tests do."""
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent


def run_plays(plays, base, facts, extra_vars=None, with_output=False, python=None):
    """Run `plays` (a list of play dicts) from `base`; a last play writes the facts named in `facts` (registered by
    the plays) as a JSON list in one module call. Returns that list; the run must succeed. `extra_vars`: {name: text}
    given as `-e name=text`, strings as on a command line. `with_output`: (that list, the run's output). `python`:
    the modules' interpreter (default this one; another user than ours may not be able to run it)."""
    out = pathlib.Path(base) / "facts.json"
    plays = plays + [{"name": "write", "hosts": "localhost", "gather_facts": False, "tasks": [
        {"ansible.builtin.copy": {"dest": str(out), "mode": "0600",
                                  "content": "{{ [%s] | to_json }}" % ", ".join(facts)}}]}]
    (pathlib.Path(base) / "play.yml").write_text(json.dumps(plays))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    extra = [a for k, v in (extra_vars or {}).items() for a in ("-e", "%s=%s" % (k, v))]
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", "-e",
                           "ansible_python_interpreter=" + (python or sys.executable), *extra, str(pathlib.Path(base) / "play.yml")],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return (json.loads(out.read_text()), proc.stdout + proc.stderr) if with_output else json.loads(out.read_text())
