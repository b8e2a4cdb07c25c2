#!/usr/bin/env python3
"""Build the SGLang simulator wheel: sglang-0.5.9+sim-py3-none-any.whl.

    python3 lab/sglang_sim/build_wheel.py --out DIR

A wheel is a zip with the package files and a .dist-info (METADATA, WHEEL, RECORD); no build backend needed.
The simulator shares three modules with the rest of the repository; they are copied into the wheel here, at
build time, under sglang/_sim/ (their single sources stay where they are):

    module_utils/topolaunch/sglang_flags_0_5_9.py   the 0.5.9 flag table (argparse is built from it)
    module_utils/topolaunch/model_config.py         model facts (layers, experts, parameters, KV bytes)
    lab/fakenvml/fakegpu.py                         registration of GPU memory with the fake NVML

`pip install sglang==0.5.9` accepts 0.5.9+sim (a local version label). The `all` extra, which the sglang role
installs (`sglang[all]`), pulls setproctitle, as real SGLang depends on it; without it the ranks put their
title in argv[0] only. Timestamps are fixed, so the same sources give the same wheel (same sha256).
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
from sglang.version import __version__ as VERSION  # noqa: E402

NAME = "sglang"
TAG = "py3-none-any"
DATE = (2026, 1, 1, 0, 0, 0)
METADATA = """\
Metadata-Version: 2.1
Name: sglang
Version: {version}
Summary: SGLang simulator for the topolaunch lab (not SGLang): launch_server and bench_serving without a GPU
License: Apache-2.0
Requires-Python: >=3.9
Provides-Extra: all
Requires-Dist: setproctitle; extra == "all"

The topolaunch lab's stand-in for SGLang {public}: `python -m sglang.launch_server` and
`python -m sglang.bench_serving` behave like SGLang's from the outside; no GPU work is done and every
number it reports is simulated. See lab/sglang_sim/README.md in the topolaunch repository.
"""
WHEEL = """\
Wheel-Version: 1.0
Generator: topolaunch lab/sglang_sim/build_wheel.py
Root-Is-Purelib: true
Tag: {tag}
"""


def package_files():
    """(path in wheel, bytes) of the package: sources, then the shared modules copied in."""
    files = []
    for path in sorted((HERE / NAME).rglob("*.py")):
        files.append((path.relative_to(HERE).as_posix(), path.read_bytes()))
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


def build(out_dir):
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dist_info = "%s-%s.dist-info" % (NAME, VERSION)
    files = package_files()
    files += [
        ("%s/METADATA" % dist_info, METADATA.format(version=VERSION, public=VERSION.split("+")[0]).encode()),
        ("%s/WHEEL" % dist_info, WHEEL.format(tag=TAG).encode()),
        ("%s/top_level.txt" % dist_info, b"sglang\n"),
    ]
    record = "".join(record_line(p, d) + "\n" for p, d in files) + "%s/RECORD,,\n" % dist_info
    files.append(("%s/RECORD" % dist_info, record.encode()))
    wheel = out_dir / ("%s-%s-%s.whl" % (NAME, VERSION, TAG))
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
    parser.add_argument("--out", required=True, help="directory to write the wheel into (created if missing)")
    args = parser.parse_args(argv)
    print(build(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
