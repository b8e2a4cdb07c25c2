"""Where things are, for the unit tests wherever their file sits in the mirror of the code (tests/unit/<path>)."""
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]   # the repository
FIXTURES = ROOT / "tests" / "fixtures"


def load_script(path, name):
    """A script that is not a package's module (a role's files/, tools/) imported from its file, as `name`."""
    import importlib.util  # pylint: disable=import-outside-toplevel
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
