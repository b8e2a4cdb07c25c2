"""Load the plugins every task's worker would load again, once, in ansible-playbook's own process."""
from __future__ import annotations

DOCUMENTATION = """
    name: preload
    type: aggregate
    short_description: Load Jinja2 filters and tests, and this collection's action plugins, before the first task
    description:
      - Ansible runs each task in a worker process forked from ansible-playbook's. A worker that evaluates a filter or
        test loads every filter and test plugin file (Ansible's and those next to the playbook) and the collection's
        own, compiling each from source, because the parent process never loaded them; so does a worker that runs one
        of this collection's action plugins. This callback loads them in the parent at the start of every play, so that
        workers inherit them. It changes no output and no result.
    requirements:
      - enabled in ansible.cfg (callbacks_enabled = topolaunch.sglang.preload)
"""

import importlib
import pathlib

from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import filter_loader, test_loader

PLUGINS = pathlib.Path(__file__).parents[1]                # the collection's plugins/
PACKAGE = "ansible_collections.topolaunch.sglang.plugins"


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "topolaunch.sglang.preload"
    CALLBACK_NEEDS_ENABLED = True

    def v2_playbook_on_play_start(self, play):
        for loader in (filter_loader, test_loader):
            list(loader.all())
        for kind in ("filter", "action"):
            for path in sorted((PLUGINS / kind).glob("*.py")):
                importlib.import_module("%s.%s.%s" % (PACKAGE, kind, path.stem))
