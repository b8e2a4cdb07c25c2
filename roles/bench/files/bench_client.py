"""Run the benchmark client with the server's API key, which never is on a command line or in the connection's
environment, and keep the key out of everything the run leaves behind.

    bench_client.py --key-file FILE [--redact FILE]... -- COMMAND [ARG...]

--key-file: a file only this user can read with the key (the bench role writes it 0600 and removes it after the
sweep; none = no key). COMMAND runs with it as OPENAI_API_KEY, the variable SGLang's client reads. COMMAND's
stdout and stderr come through with the key replaced by <redacted>, and so does each --redact FILE (the client's
output file: bench_serving copies the server's /server_info, api_key included, into it). The exit status is
COMMAND's. Plain Python 3 stdlib.
"""
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--key-file", required=True)
    parser.add_argument("--redact", action="append", default=[])
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no COMMAND after --")
    key = read_key(args.key_file)
    env = dict(os.environ)
    env.pop("OPENAI_API_KEY", None)
    if key:
        env["OPENAI_API_KEY"] = key
    try:
        proc = subprocess.run(command, env=env, capture_output=True, check=False)
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
