"""Where things are, for the unit tests wherever their file sits in the mirror of the code (tests/unit/<path>)."""
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]   # the repository
FIXTURES = ROOT / "tests" / "fixtures"
