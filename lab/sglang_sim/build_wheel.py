#!/usr/bin/env python3
"""Build the SGLang simulator wheels, one per supported SGLang release: sglang-<release>+sim-py3-none-any.whl.

    python3 lab/sglang_sim/build_wheel.py --out DIR [--version 0.5.23 ...]     # default: every release in RELEASES

Every wheel comes from the same sources; what differs is sglang/version.py (written here: `0.5.23+sim`), from which
the simulator takes the release it behaves as (sglang/_sim/release.py), the files only some releases have
(sglang/benchmark/ exists from 0.5.23 on) and the metadata (Requires-Python as the real wheel states it).
A wheel is a zip with the package files and a .dist-info (METADATA, WHEEL, RECORD); no build backend needed.
The simulator shares modules with the rest of the repository; they are copied into the wheel here, at build time,
under sglang/_sim/ (their single sources stay where they are):

    module_utils/topolaunch/sglang_flags_<release>.py   the flag tables (argparse is built from them)
    module_utils/topolaunch/model_config.py             model facts (layers, experts, parameters, KV bytes)
    lab/fakenvml/fakegpu.py                             registration of GPU memory with the fake NVML

`pip install sglang==0.5.23` accepts 0.5.23+sim (a local version label), and with both wheels in one directory
`==0.5.9` picks 0.5.9+sim. The `all` extra, which the sglang role installs (`sglang[all]`), pulls setproctitle
(real SGLang depends on it; without it the ranks put their title in argv[0] only) and PyYAML (`--config FILE.yaml`;
real SGLang's [all] brings it through its diffusion extra). Timestamps are fixed, so the same sources give the same
wheel (same sha256).
"""
import argparse
import base64
import hashlib
import pathlib
import sys
import zipfile

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from sglang._sim.resources import SOURCES  # noqa: E402 - the list of shared modules lives with the loader

NAME = "sglang"
TAG = "py3-none-any"
DATE = (2026, 1, 1, 0, 0, 0)
# Supported releases and what their wheels state: Requires-Python from the real METADATA
# (59:sglang-0.5.9.dist-info/METADATA:211, 523:sglang-0.5.23.dist-info/METADATA:213). A release needs its flag
# table (module_utils/topolaunch/sglang_flags_<release>.py, tools/sglang_flags.py) too.
RELEASES = {"0.5.9": {"requires_python": ">=3.10"}, "0.5.23": {"requires_python": ">=3.11"}}
# Package paths (prefixes) that exist only from a release on
SINCE = {"sglang/benchmark/": "0.5.23"}
METADATA = """\
Metadata-Version: 2.1
Name: sglang
Version: {version}
Summary: SGLang simulator for the topolaunch lab (not SGLang): launch_server and the benchmark client without a GPU
License: Apache-2.0
Requires-Python: {requires_python}
Provides-Extra: all
Requires-Dist: setproctitle; extra == "all"
Requires-Dist: PyYAML; extra == "all"

The topolaunch lab's stand-in for SGLang {public}: `python -m sglang.launch_server` and the benchmark client
behave like SGLang {public}'s from the outside; no GPU work is done and every number it reports is simulated.
See lab/sglang_sim/README.md in the topolaunch repository.
"""
VERSION_PY = """\
# Written by lab/sglang_sim/build_wheel.py: the simulator behaves as SGLang {public}.
__version__ = "{version}"
__version_tuple__ = {version_tuple!r}
"""
WHEEL = """\
Wheel-Version: 1.0
Generator: topolaunch lab/sglang_sim/build_wheel.py
Root-Is-Purelib: true
Tag: {tag}
"""


def release_key(text):
    return tuple(int(part) for part in text.split("."))


def package_files(release):
    """(path in wheel, bytes) of the package for one release: sources, then the shared modules copied in."""
    files = []
    for path in sorted((HERE / NAME).rglob("*.py")):
        rel = path.relative_to(HERE).as_posix()
        if any(rel.startswith(prefix) and release_key(release) < release_key(since) for prefix, since in SINCE.items()):
            continue
        data = path.read_bytes()
        if rel == "sglang/version.py":
            version = "%s+sim" % release
            data = VERSION_PY.format(public=release, version=version,
                                     version_tuple=tuple(int(p) for p in release.split(".")) + ("sim",)).encode()
        files.append((rel, data))
    for module, source in sorted(SOURCES.items()):
        src = ROOT / source
        if not src.is_file():
            sys.exit("build_wheel: %s is missing (the simulator bundles it as sglang/_sim/%s.py)" % (source, module))
        header = ("# Copied from %s by lab/sglang_sim/build_wheel.py; edit the original.\n" % source).encode()
        files.append(("%s/_sim/%s.py" % (NAME, module), header + src.read_bytes()))
    return files


def record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (path, digest, len(data))


def build(out_dir, release):
    if release not in RELEASES:
        sys.exit("build_wheel: %s is not a supported release (%s)" % (release, ", ".join(RELEASES)))
    version = "%s+sim" % release
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dist_info = "%s-%s.dist-info" % (NAME, version)
    files = package_files(release)
    metadata = METADATA.format(version=version, public=release, **RELEASES[release])
    files += [
        ("%s/METADATA" % dist_info, metadata.encode()),
        ("%s/WHEEL" % dist_info, WHEEL.format(tag=TAG).encode()),
        ("%s/top_level.txt" % dist_info, b"sglang\n"),
    ]
    record = "".join(record_line(p, d) + "\n" for p, d in files) + "%s/RECORD,,\n" % dist_info
    files.append(("%s/RECORD" % dist_info, record.encode()))
    wheel = out_dir / ("%s-%s-%s.whl" % (NAME, version, TAG))
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in files:
            info = zipfile.ZipInfo(path, date_time=DATE)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    tmp.replace(wheel)
    return wheel


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory to write the wheels into (created if missing)")
    parser.add_argument("--version", action="append", choices=sorted(RELEASES, key=release_key),
                        help="SGLang release to build the simulator as (repeatable; default: every one)")
    args = parser.parse_args(argv)
    for release in args.version or sorted(RELEASES, key=release_key):
        print(build(args.out, release))
    return 0


if __name__ == "__main__":
    sys.exit(main())
