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
