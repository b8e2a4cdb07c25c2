"""Choose the interpreter an SGLang venv is made from; print the choice as JSON (the sglang role's validate step).

An SGLang release has wheels for some CPython versions only (0.5.23: 3.11, 3.12, 3.13; docs/sglang-versions.md).
The host's python3 is used when it is one of them; else an interpreter of a matching version that is installed
(/usr/bin/python3.X, /usr/local/bin/python3.X) or that the distribution offers (apt: python3.X and python3.X-venv,
e.g. python3.11 on Ubuntu 22.04, whose python3 is 3.10); else the role refuses, before anything changed, saying
why. An interpreter the user names (sglang_base_python) is used as it is, or refused when its version has no wheels.

Run by the host's python3 with one argument, JSON {"sglang_version", "supported": ["3.11", ...] ([] = no
constraint known), "base_python": "" or a path}. Prints {"python", "python_version", "packages" (apt packages to
install), "reason"} or {"error"}. Stdlib only, Python 3.6+.
"""
import json
import os
import re
import subprocess
import sys

DEFAULT_PYTHON = "/usr/bin/python3"
SEARCH_DIRS = ("/usr/bin", "/usr/local/bin")


def _key(version):
    return tuple(int(p) for p in version.split("."))


def decide(sglang_version, supported, default, installed, offered, explicit=None):
    """The interpreter for the venv of `sglang_version`.

    supported: CPython versions ("3.11") the release has wheels for ([] = not known: any); default: (path,
    version) of the host's python3 (version None when it does not run); installed: {version: path} of matching
    interpreters found; offered: versions whose python3.X and python3.X-venv the distribution's apt offers;
    explicit: (path, version) of sglang_base_python when the user set it. Returns {python, python_version,
    packages, reason} or {error}."""
    wanted = ", ".join(supported)
    if explicit is not None:
        path, version = explicit
        if version is None:
            return {"error": "sglang_base_python %s does not run" % path}
        if supported and version not in supported:
            return {"error": "sglang_base_python %s is Python %s, but SGLang %s has wheels for CPython %s only"
                             % (path, version, sglang_version, wanted)}
        return {"python": path, "python_version": version, "packages": [],
                "reason": "sglang_base_python, Python %s" % version}
    path, version = default
    if version is not None and (not supported or version in supported):
        return {"python": path, "python_version": version, "packages": [],
                "reason": "the host's python3 (%s) has SGLang %s's wheels" % (version, sglang_version)}
    # An installed interpreter before one to install; the newest first.
    for candidate in sorted(set(supported) & (set(installed) | set(offered)),
                            key=lambda v: (v in installed, _key(v)), reverse=True):
        packages = ["python3.%s" % candidate.split(".")[1], "python3.%s-venv" % candidate.split(".")[1]] \
            if candidate in offered else []
        return {"python": installed.get(candidate, "/usr/bin/python%s" % candidate), "python_version": candidate,
                "packages": packages,
                "reason": "SGLang %s has wheels for CPython %s only and the host's python3 is %s: Python %s %s"
                          % (sglang_version, wanted, version or "missing", candidate,
                             "from the distribution" if packages else "found on the host")}
    return {"error": "SGLang %s has wheels for CPython %s only; this host's python3 (%s) is %s and its distribution "
                     "offers none of %s (with its -venv package). Use a distribution that has one (Debian 12, Ubuntu "
                     "24.04), or set sglang_base_python to a CPython %s interpreter"
                     % (sglang_version, wanted, path, version or "missing",
                        ", ".join("python%s" % v for v in supported), wanted)}


def apt_offered(policy):
    """Package names with an install candidate in `apt-cache policy NAME...` output."""
    found = re.findall(r"^(\S+):\n\s+Installed: .*\n\s+Candidate: (.*)$", policy, re.MULTILINE)
    return {name for name, candidate in found if candidate.strip() != "(none)"}


def python_version(path):
    """'3.11' for the interpreter at path, None when it does not run."""
    try:
        out = subprocess.run([path, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.decode().strip() or None


def main():
    args = json.loads(sys.argv[1])
    supported = [str(v) for v in args.get("supported") or []]
    explicit = None
    if args.get("base_python"):
        explicit = (args["base_python"], python_version(args["base_python"]))
    default = (DEFAULT_PYTHON, python_version(DEFAULT_PYTHON))
    if explicit is None and default[1] is not None and (not supported or default[1] in supported):
        # The host's python3 has the release's wheels: the choice (decide's first), without asking apt.
        print(json.dumps(decide(args["sglang_version"], supported, default, {}, [], None), sort_keys=True))
        return
    installed = {}
    for version in supported:
        for directory in SEARCH_DIRS:
            path = os.path.join(directory, "python%s" % version)
            if version not in installed and os.access(path, os.X_OK) and python_version(path) == version:
                installed[version] = path
    offered = []
    names = [n for v in supported for n in ("python%s" % v, "python%s-venv" % v)]
    if names and explicit is None:
        try:
            policy = subprocess.run(["apt-cache", "policy"] + names, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, check=False, timeout=120).stdout.decode()
        except (OSError, subprocess.SubprocessError):
            policy = ""
        have = apt_offered(policy)
        offered = [v for v in supported if {"python%s" % v, "python%s-venv" % v} <= have]
    choice = decide(args["sglang_version"], supported, default, installed, offered, explicit)
    print(json.dumps(choice, sort_keys=True))


if __name__ == "__main__":
    main()
