"""docs/DESIGN.md, the contracts between the pieces, names every module, action plugin, filter, role, stage
playbook and plugin_utils file there is: a piece added without its place in the design fails here."""
import re

import pytest

import paths

ROOT = paths.ROOT
DESIGN = (ROOT / "docs" / "DESIGN.md").read_text()


def pieces():
    for kind, folder, pattern in (("module", "library", "*.py"), ("action plugin", "action_plugins", "*.py"),
                                  ("filter", "filter_plugins", "*.yml"), ("plugin_utils", "plugin_utils", "*.py"),
                                  ("playbook", "playbooks", "*.yml")):
        for path in sorted((ROOT / folder).glob(pattern)):
            if path.stem != "__init__":
                yield kind, path.stem if kind in ("module", "action plugin", "filter") else path.name
    for role in sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "meta" / "main.yml").is_file()):
        yield "role", role


@pytest.mark.parametrize("kind, name", list(pieces()))
def test_design_names_every_piece(kind, name):
    quoted = r"`[^`]*(?<![\w.-])%s(?![\w-])[^`]*`" % re.escape(name)    # inside backquotes, as a whole word
    assert re.search(quoted, DESIGN), "docs/DESIGN.md does not name the %s %s" % (kind, name)


def test_every_stage_of_the_stage_table_has_its_role_and_module():
    table = DESIGN.split("## One name per stage", 1)[1].split("\n\n", 1)[1].split("\n\n", 1)[0]
    rows = [line.split("|")[1:-1] for line in table.splitlines()[2:]]
    stages = {row[0].strip().split()[0] for row in rows}
    assert {"topology", "preflight", "plan", "validate", "cleanup", "launch", "health", "bench", "relaunch",
            "tune"} <= stages
    roles = {name for kind, name in pieces() if kind == "role"}
    for row in rows:
        named = set(re.findall(r"`([a-z_]+)`", row[2]))
        assert named and named <= roles, row
