"""roles/bench/files/bench_client.py: the benchmark client gets the API key from a file, as OPENAI_API_KEY; the key
never is on a command line, and what the client prints and writes reaches nobody with the key in it."""
import importlib.util
import json
import os
import subprocess
import sys
import paths

ROOT = paths.ROOT
WRAPPER = ROOT / "roles" / "bench" / "files" / "bench_client.py"
KEY = 'sk-b3nch "k3y" \\ ünï'
spec = importlib.util.spec_from_file_location("bench_client", WRAPPER)
bench_client = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_client)

# A stand-in client: prints the key it got, writes it into its output file the way bench_serving copies
# /server_info (JSON), and exits 3.
CLIENT = r"""
import json, os, sys
key = os.environ.get("OPENAI_API_KEY", "")
print("key=" + key)
print("warn " + key, file=sys.stderr)
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"server_info": {"api_key": key, "internal_states": [{"api_key": key}]},
                        "cmdline": sys.argv}) + "\n")
sys.exit(3)
"""


def run(tmp_path, key=KEY, extra_env=None):
    key_file = tmp_path / "api-key"
    if key is not None:
        key_file.write_text(key)
        key_file.chmod(0o600)
    out = tmp_path / "out.jsonl"
    env = dict(os.environ, **(extra_env or {}))
    proc = subprocess.run([sys.executable, str(WRAPPER), "--key-file", str(key_file), "--redact", str(out), "--",
                           sys.executable, "-c", CLIENT, str(out)], capture_output=True, text=True, env=env,
                          check=False)
    return proc, out


def test_the_key_reaches_the_client_and_nothing_it_leaves(tmp_path):
    proc, out = run(tmp_path)
    assert proc.returncode == 3
    assert proc.stdout == "key=<redacted>\n" and proc.stderr == "warn <redacted>\n"
    text = out.read_text()
    assert "k3y" not in text and "b3nch" not in text
    line = json.loads(text)
    assert line["server_info"] == {"api_key": "<redacted>", "internal_states": [{"api_key": "<redacted>"}]}
    assert not [a for a in line["cmdline"] if "k3y" in a]          # never on the client's command line


def test_no_key_file_means_no_key(tmp_path):
    proc, out = run(tmp_path, key=None, extra_env={"OPENAI_API_KEY": "from-the-connection"})
    assert proc.stdout == "key=\n" and json.loads(out.read_text())["server_info"]["api_key"] == ""


def test_redact_forms_and_files(tmp_path):
    assert bench_client.redact('a "%s" b' % KEY, KEY) == 'a "<redacted>" b'
    assert bench_client.redact(json.dumps({"k": KEY}), KEY) == '{"k": "<redacted>"}'
    assert bench_client.redact("nothing", "") == "nothing"
    path = tmp_path / "f"
    path.write_text("x %s y\n" % KEY)
    path.chmod(0o640)
    assert bench_client.redact_file(str(path), KEY) is True
    assert path.read_text() == "x <redacted> y\n" and (path.stat().st_mode & 0o777) == 0o640
    assert bench_client.redact_file(str(path), KEY) is False and bench_client.redact_file(str(tmp_path / "no"), KEY) is False
