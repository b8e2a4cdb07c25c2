"""Controller-side files of the stages: JSON artifacts (artifacts/<host>/topology.json, plan.json, candidates.json)
written by the action plugins in-process. Plain Python 3.9+ stdlib."""
import json
import os

from ansible_collections.topolaunch.sglang.plugins.module_utils.system import file_differs, write_atomic

__all__ = ["json_text", "save_json"]


def json_text(data):
    """Pretty JSON as Ansible's to_nice_json writes it, and a newline."""
    return json.dumps(data, indent=4, sort_keys=True) + "\n"


def save_json(path, data):
    """Write data as pretty JSON to path (directories made, 0644, owned by us) unless it already holds exactly that;
    True when written."""
    text = json_text(data)
    owner = (os.getuid(), os.getgid())
    if not file_differs(path, text, 0o644, owner):
        return False
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    write_atomic(path, text, 0o644, owner)
    return True
