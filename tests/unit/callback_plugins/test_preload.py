"""callback_plugins/preload.py: at a play's start, ansible-playbook's own process has loaded every filter and test
plugin and this collection's filter and action plugins, so that the task workers it forks inherit them."""
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
PROBE = """
import json, sys
from ansible.plugins.loader import filter_loader, init_plugin_loader, test_loader
init_plugin_loader(["%s"])
from ansible.plugins.loader import callback_loader
ours = lambda: sorted(m for m in sys.modules if m.startswith("ansible_collections.topolaunch.sglang.plugins."))
before = ours()
callback_loader.get("topolaunch.sglang.preload").v2_playbook_on_play_start(None)
print(json.dumps({"before": before, "after": ours(),
                  "wrappers": [len(filter_loader._cached_non_collection_wrappers),
                               len(test_loader._cached_non_collection_wrappers)]}))
""" % (ROOT / "collections")


def test_a_play_start_loads_the_plugins_workers_would_compile_each():
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, check=False,
                          env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg")), timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.splitlines()[-1])
    wanted = {"ansible_collections.topolaunch.sglang.plugins.%s.%s" % (kind, p.stem)
              for kind, folder in (("filter", "filter_plugins"), ("action", "action_plugins"))
              for p in (ROOT / folder).glob("*.py")}
    assert not wanted & set(seen["before"])
    assert wanted <= set(seen["after"]), wanted - set(seen["after"])
    assert min(seen["wrappers"]) > 10          # Ansible's own filters and tests (to_json, bool, ...; version, ...)


def test_ansible_cfg_enables_it():
    assert "callbacks_enabled = topolaunch.sglang.preload" in (ROOT / "ansible.cfg").read_text()
