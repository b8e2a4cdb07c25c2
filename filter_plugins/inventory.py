"""Filter: the topolaunch_* variables an inventory sets that no role knows (a typo is otherwise silently ignored).

    warning: "{{ ansible_inventory_sources | topolaunch.sglang.unknown_topolaunch_vars }}"

The known names are read from the collection's roles, never kept by hand: every top-level key of a role's
defaults/main.yml and vars/main.yml and every option of its meta/argument_specs.yml. The inventory's files are the
ones Ansible reads for a source (the source, its group_vars/ and host_vars/: secrets.py's _var_files); every mapping
key starting with topolaunch_ anywhere in them is a variable it sets. Returns '<file>: <name> (did you mean
<known>?)' lines, one per file.
"""
import difflib
import os

import yaml

from ansible_collections.topolaunch.sglang.plugins.filter.secrets import _Loader, _var_files

PREFIX = "topolaunch_"


def _roles_dir():
    """The collection's roles/: <collection>/plugins/filter/ holds this file (this repository links filter_plugins/
    there, beside roles/)."""
    for start in (os.path.abspath(__file__), os.path.realpath(__file__)):
        folder = os.path.dirname(start)
        for _level in range(4):
            if os.path.isfile(os.path.join(folder, "roles", "topolaunch", "defaults", "main.yml")):
                return os.path.join(folder, "roles")
            folder = os.path.dirname(folder)
    return None


ROLES_DIR = _roles_dir()


def _load(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.load(handle, Loader=_Loader)  # nosec B506: a SafeLoader with Ansible's tags
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None


def known_vars(roles_dir=ROLES_DIR):
    """Every variable name the roles define: their defaults and vars, and their argument specs' options."""
    names = set()
    for role in sorted(os.listdir(roles_dir)) if roles_dir and os.path.isdir(roles_dir) else []:
        for rel in ("defaults/main.yml", "vars/main.yml"):
            data = _load(os.path.join(roles_dir, role, rel))
            names |= set(data) if isinstance(data, dict) else set()
        specs = _load(os.path.join(roles_dir, role, "meta", "argument_specs.yml"))
        for entry in ((specs or {}).get("argument_specs") or {}).values() if isinstance(specs, dict) else []:
            names |= set((entry or {}).get("options") or {}) if isinstance(entry, dict) else set()
    return names


def _set_names(data):
    found = set()
    if isinstance(data, dict):
        for key, value in data.items():
            if isinstance(key, str) and key.startswith(PREFIX):
                found.add(key)
            else:
                found |= _set_names(value)
    elif isinstance(data, list):
        for value in data:
            found |= _set_names(value)
    return found


def unknown_topolaunch_vars(sources, known=None):
    """'<file>: name (did you mean ...?), ...' for every inventory file of `sources` (ansible_inventory_sources)
    that sets a topolaunch_* variable none of the roles knows (`known`: known_vars() unless given)."""
    known = set(known_vars() if known is None else known)
    if isinstance(sources, str):
        sources = [sources]
    out = []
    for source in sources or []:
        for path in _var_files(str(source)):
            unknown = sorted(_set_names(_load(path)) - known)
            if unknown:
                words = []
                for name in unknown:
                    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8)
                    words.append("%s (did you mean %s?)" % (name, close[0]) if close else name)
                out.append("%s: %s" % (path, ", ".join(words)))
    return out


class FilterModule:
    """topolaunch.sglang inventory filters."""

    def filters(self):
        return {"unknown_topolaunch_vars": unknown_topolaunch_vars}
