"""The SGLang release this simulator was built as, and the version checks its version-specific behaviour uses.

build_wheel.py writes the wheel's version into sglang/version.py (`0.5.23+sim`); the release is that version
without the `+sim` label. Read at call time, so tests can switch it (monkeypatch sglang.version.__version__).
Every difference between releases is written where the behaviour is, as `if release.at_least("0.5.23")`, with the
file and line of each real wheel it follows (docs/sglang-versions.md in the repository collects them).
"""
import sglang.version


def sim_version():
    """The installed simulator's own version: `0.5.23+sim`."""
    return sglang.version.__version__


def version():
    """The SGLang release stood in for: `0.5.23`."""
    return sim_version().split("+", 1)[0]


def parse(text):
    return tuple(int(part) for part in text.split("."))


def at_least(text):
    return parse(version()) >= parse(text)
