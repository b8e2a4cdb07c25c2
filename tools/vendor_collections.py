#!/usr/bin/env python3
"""Install the pinned third-party Ansible collections topolaunch uses into .ansible/collections (ansible.cfg's
collections_path), from the `ansible` package wheel on PyPI: Galaxy is not always reachable, PyPI is, and the
`ansible` wheel carries the released collections. The wheel is pinned by version and sha256 and cached in
build/wheels; each collection's MANIFEST.json version is checked against its pin.

    tools/vendor_collections.py            # install (no-op when the pinned versions are there)
    tools/vendor_collections.py --check    # exit 1 when a pinned collection is missing or another version
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHEEL = {"name": "ansible", "version": "12.3.0",
         "sha256": "cd156f82fa87f7a899212b0efa9f7ca3a24d609212de9f78428a572eb01e5414"}
COLLECTIONS = {"community.proxmox": "1.4.0"}
DEST = os.path.join(ROOT, ".ansible", "collections", "ansible_collections")
CACHE = os.path.join(ROOT, "build", "wheels")


def wheel_path():
    return os.path.join(CACHE, "%s-%s-py3-none-any.whl" % (WHEEL["name"], WHEEL["version"]))


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch():
    path = wheel_path()
    if not os.path.exists(path):
        os.makedirs(CACHE, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                        "-d", CACHE, "%s==%s" % (WHEEL["name"], WHEEL["version"])], check=True)
    got = sha256(path)
    if got != WHEEL["sha256"]:
        raise SystemExit("vendor_collections: %s has sha256 %s, pinned %s" % (path, got, WHEEL["sha256"]))
    return path


def installed(name):
    manifest = os.path.join(DEST, *name.split("."), "MANIFEST.json")
    try:
        with open(manifest) as f:
            return json.load(f)["collection_info"]["version"]
    except (OSError, ValueError, KeyError):
        return None


def install(name, version, wheel):
    prefix = "ansible_collections/%s/" % name.replace(".", "/")
    target = os.path.join(DEST, *name.split("."))
    with zipfile.ZipFile(wheel) as z:
        members = [m for m in z.namelist() if m.startswith(prefix) and not m.endswith("/")]
        manifest = json.loads(z.read(prefix + "MANIFEST.json"))
        if manifest["collection_info"]["version"] != version:
            raise SystemExit("vendor_collections: %s in %s is %s, pinned %s"
                             % (name, os.path.basename(wheel), manifest["collection_info"]["version"], version))
        shutil.rmtree(target, ignore_errors=True)
        for member in members:
            rel = os.path.normpath(member[len(prefix):])
            if rel.startswith("..") or os.path.isabs(rel):
                raise SystemExit("vendor_collections: unsafe path %r in the wheel" % member)
            out = os.path.join(target, rel)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with z.open(member) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    wrong = {n: v for n, v in COLLECTIONS.items() if installed(n) != v}
    if args.check:
        for name, version in sorted(wrong.items()):
            print("vendor_collections: %s %s not installed (found %s)" % (name, version, installed(name)))
        return 1 if wrong else 0
    if wrong:
        wheel = fetch()
        for name, version in sorted(wrong.items()):
            install(name, version, wheel)
            print("vendor_collections: installed %s %s into %s" % (name, version, os.path.relpath(DEST, ROOT)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
