"""roles/bench/files/bench_client.py: the benchmark client gets the API key from a file, as OPENAI_API_KEY; the key
never is on a command line, and what the client prints and writes reaches nobody with the key in it."""
import json
import os
import subprocess
import sys
import paths

ROOT = paths.ROOT
WRAPPER = ROOT / "roles" / "bench" / "files" / "bench_client.py"
KEY = 'sk-b3nch "k3y" \\ ünï'
bench_client = paths.load_script(WRAPPER, "bench_client")

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


# The client of a sweep: appends a line per point to --output-file (the key in its server_info); at the concurrency
# named FAIL it exits 2 with the key in its stderr.
SWEEP_CLIENT = r"""
import json, os, sys
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
key = os.environ.get("OPENAI_API_KEY", "")
if args["--max-concurrency"] == os.environ.get("FAIL"):
    print("Traceback: refused with " + key, file=sys.stderr)
    sys.exit(2)
with open(args["--output-file"], "a") as f:
    f.write(json.dumps({"max_concurrency": int(args["--max-concurrency"]), "completed": int(args["--num-prompts"]),
                        "server_info": {"api_key": key}}) + "\n")
"""


def sweep(tmp_path, points, fail=None, key=KEY):
    key_file = tmp_path / "api-key"
    key_file.write_text(key)
    spec = {"server_python": sys.executable, "output_file": str(tmp_path / "run.jsonl"), "point_timeout": 30,
            "client": [sys.executable, "-c", SWEEP_CLIENT], "points": points}
    env = dict(os.environ, FAIL=str(fail or ""))
    proc = subprocess.run([sys.executable, str(WRAPPER), "--key-file", str(key_file), "--sweep", json.dumps(spec)],
                          capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "k3y" not in proc.stdout and "k3y" not in proc.stderr
    return json.loads(proc.stdout)


def test_a_sweep_runs_every_point_in_one_call_and_prints_the_run(tmp_path):
    out = sweep(tmp_path, [{"max_concurrency": 1, "num_prompts": 4}, {"max_concurrency": 4, "num_prompts": 8}])
    lines = [json.loads(line) for line in out["lines"].splitlines()]
    assert [(l["max_concurrency"], l["completed"]) for l in lines] == [(1, 4), (4, 8)]
    assert lines[0]["server_info"]["api_key"] == "<redacted>"
    assert [r["max_concurrency"] for r in out["client_runs"]] == [1, 4] and out["error"] is None
    assert out["client_runs"][0]["delta"].startswith("0:00:")          # the format perf/sweep_overhead.py reads
    assert out["versions"]["python"] == "%d.%d.%d" % sys.version_info[:3]
    assert not (tmp_path / "run.jsonl").exists()                       # printed, then removed from the host


def test_a_sweep_stops_at_the_failing_point_and_says_why_without_the_key(tmp_path):
    out = sweep(tmp_path, [{"max_concurrency": 1, "num_prompts": 4}, {"max_concurrency": 4, "num_prompts": 8},
                           {"max_concurrency": 8, "num_prompts": 8}], fail=4)
    assert [r["max_concurrency"] for r in out["client_runs"]] == [1, 4]
    assert (out["error"]["max_concurrency"], out["error"]["rc"]) == (4, 2)
    assert out["error"]["stderr"] == "Traceback: refused with <redacted>"
    assert len(out["lines"].splitlines()) == 1                          # the point measured before is kept


def test_a_sweep_never_appends_to_an_earlier_output(tmp_path):
    (tmp_path / "run.jsonl").write_text("earlier\n")
    out = sweep(tmp_path, [{"max_concurrency": 1, "num_prompts": 4}])
    assert out["client_runs"] == [] and "already exists" in out["error"]["msg"]
    assert (tmp_path / "run.jsonl").read_text() == "earlier\n"
