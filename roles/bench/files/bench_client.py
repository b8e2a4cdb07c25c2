"""Run the benchmark client with the server's API key, which never is on a command line or in the connection's
environment, and keep the key out of everything the run leaves behind.

    bench_client.py --key-file FILE [--redact FILE]... -- COMMAND [ARG...]
    bench_client.py --key-file FILE --sweep SPEC_JSON
    bench_client.py --versions

--key-file: a file only this user can read with the key (the bench role writes it 0600 and removes it after the
sweep; none = no key). COMMAND runs with it as OPENAI_API_KEY, the variable SGLang's client reads. COMMAND's
stdout and stderr come through with the key replaced by <redacted>, and so does each --redact FILE (the client's
output file: bench_serving copies the server's /server_info, api_key included, into it). The exit status is
COMMAND's. Plain Python 3 stdlib.

--sweep (the bench role's one remote call for a whole concurrency sweep): SPEC_JSON is {server_python, output_file,
point_timeout, client: [the client's argv without the per-point flags], points: [{max_concurrency, num_prompts}]}.
It refuses an output file that exists (never appends to an earlier run), reads the versions in the server's venv
(server_python bench_client.py --versions), runs the client once per point (each under coreutils timeout, stopped
at the first failure) with the key as above, redacts the output file, and prints one JSON object: {versions, lines
(the output file's content), client_runs: [{max_concurrency, start, end, delta}], error: null or {max_concurrency,
rc, msg, stderr, stdout} (their last 20 lines)}. The output file is removed once printed.

--versions: the versions of what serves and measures in this python's environment, as JSON.
"""
import datetime
import importlib.metadata
import platform
import argparse
import json
import os
import subprocess
import sys
import tempfile

REDACTED = "<redacted>"


def read_key(path):
    """The key in `path`, or "" when there is no such file."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""


def redact(text, key):
    """`text` with the key replaced, as written and as JSON writes it inside a string."""
    if not key:
        return text
    for form in sorted({key, json.dumps(key)[1:-1], json.dumps(key, ensure_ascii=False)[1:-1]}, key=len, reverse=True):
        text = text.replace(form, REDACTED)
    return text


def redact_file(path, key):
    """Rewrite `path` (atomically, same mode) with the key replaced; True when it held the key."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
    except FileNotFoundError:
        return False
    clean = redact(text, key)
    if clean == text:
        return False
    mode = os.stat(path).st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=".redact-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
            f.write(clean)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return True


PACKAGES = ("sglang", "torch", "sgl-kernel", "flashinfer-python", "transformers", "nvidia-nccl-cu12")


def versions():
    """The versions of what serves and measures, in this python's environment."""
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    try:
        with open("/usr/local/cuda/version.json", encoding="utf-8") as handle:
            found["cuda_toolkit"] = json.load(handle)["cuda"]["version"]
    except (OSError, ValueError, KeyError):
        found["cuda_toolkit"] = None
    return found


def client_env(key):
    env = dict(os.environ)
    env.pop("OPENAI_API_KEY", None)
    if key:
        env["OPENAI_API_KEY"] = key
    return env


def tail(text, key, lines=20):
    return "\n".join(redact(text.decode("utf-8", "replace"), key).splitlines()[-lines:])


def sweep(spec, key, run=subprocess.run, now=datetime.datetime.now):
    """The whole concurrency sweep (see --sweep); returns the JSON-ready result."""
    out_file = spec["output_file"]
    if os.path.exists(out_file):
        return {"versions": None, "lines": "", "client_runs": [], "error": {
            "max_concurrency": None, "rc": None, "stderr": "", "stdout": "",
            "msg": "%s already exists: start the run again in a new second" % out_file}}
    found = run([spec["server_python"], os.path.abspath(__file__), "--versions"], capture_output=True, check=False)
    result = {"versions": json.loads(found.stdout) if found.returncode == 0 else None, "client_runs": [],
              "error": None}
    timeout = int(spec["point_timeout"])
    for point in spec["points"]:
        argv = ["timeout", "--kill-after=30", str(timeout)] + list(spec["client"]) + [
            "--num-prompts", str(point["num_prompts"]), "--max-concurrency", str(point["max_concurrency"]),
            "--output-file", out_file]
        start = now()
        try:
            proc = run(argv, env=client_env(key), capture_output=True, check=False)
            rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
        except OSError as exc:
            rc, stdout, stderr = 127, b"", str(exc).encode()
        end = now()
        result["client_runs"].append({"max_concurrency": point["max_concurrency"], "start": str(start),
                                      "end": str(end), "delta": str(end - start)})
        if rc != 0:
            result["error"] = {"max_concurrency": point["max_concurrency"], "rc": rc,
                               "msg": "timed out after %s s (bench_point_timeout)" % timeout if rc == 124
                               else "the client exited with %s" % rc,
                               "stderr": tail(stderr, key), "stdout": tail(stdout, key)}
            break
    redact_file(out_file, key)
    try:
        with open(out_file, encoding="utf-8", errors="replace") as f:
            result["lines"] = f.read()
        os.unlink(out_file)
    except FileNotFoundError:
        result["lines"] = ""
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--key-file")
    parser.add_argument("--redact", action="append", default=[])
    parser.add_argument("--sweep", help="the concurrency sweep's JSON spec")
    parser.add_argument("--versions", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.versions:
        print(json.dumps(versions(), sort_keys=True))
        return 0
    if not args.key_file:
        parser.error("--key-file is required")
    key = read_key(args.key_file)
    if args.sweep:
        print(json.dumps(sweep(json.loads(args.sweep), key), sort_keys=True))
        return 0
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no COMMAND after --")
    try:
        proc = subprocess.run(command, env=client_env(key), capture_output=True, check=False)
    except OSError as exc:
        print("bench_client.py: cannot run %s: %s" % (command[0], exc), file=sys.stderr)
        return 127
    sys.stdout.write(redact(proc.stdout.decode("utf-8", "replace"), key))
    sys.stderr.write(redact(proc.stderr.decode("utf-8", "replace"), key))
    for path in args.redact:
        redact_file(path, key)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
