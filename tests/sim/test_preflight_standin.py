"""lab/preflight/worker_standin.py: the real worker's command line and lines, answered from the spec's links
(expectations computed here from the spec JSON and the documented ring formula), hangs the orchestrator must
kill, and whole preflights of the field specs through the real orchestrator."""
import ast
import importlib.util
import json
import pathlib
import subprocess
import sys
import time

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import preflight

ROOT = pathlib.Path(__file__).resolve().parents[2]
STANDIN = ROOT / "lab" / "preflight" / "worker_standin.py"
WORKER = ROOT / "roles" / "preflight" / "files" / "preflight_worker.py"
SPECS = ROOT / "lab" / "specs"
FIELD = SPECS / "proxmox-8x-rtx-pro-6000-vnuma.json"
HANG = SPECS / "proxmox-8x-rtx-pro-6000-p2p-hang.json"


def load_module(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


standin = load_module(STANDIN, "worker_standin")


def answer(spec_path, *argv, env=None):
    """The stand-in's JSON lines for argv (spec given as a path)."""
    full = {"FAKE_NVML_SPEC": str(spec_path), "PATH": "/usr/bin:/bin"}
    full.update(env or {})
    out = subprocess.run([sys.executable, str(STANDIN), *argv], capture_output=True, text=True, env=full, timeout=30,
                         check=False)
    return out.returncode, [json.loads(line) for line in out.stdout.splitlines()]


def results(lines):
    return [l for l in lines if l["event"] == "result"]


def spec_json(path=FIELD):
    return json.loads(pathlib.Path(path).read_text())


def pair_gbps(spec, a, b):
    for entry in spec["links"]["pairs"]:
        if entry["gpus"] in ([a, b], [b, a]) and "gbps" in entry:
            value = entry["gbps"]
            if isinstance(value, list):
                return value[0] if entry["gpus"] == [a, b] else value[1]
            return value
    return spec["links"]["default"]["gbps"]


@pytest.mark.parametrize("argv,message", [
    (["p2p", "--src", "0"], "--src and --dst go together"),
    (["allreduce"], "allreduce needs --gpus A,B,... or --group A,B,..."),
    (["allreduce", "--gpus", "0,0"], "GPUs must be distinct"),
    (["p2p", "--pair", "0-1"], "is not a pair like 0:1"),
])
def test_command_line_is_the_real_workers(argv, message):
    for script in (STANDIN, WORKER):
        out = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, check=False,
                             env={"PATH": "/usr/bin:/bin"}, timeout=30)
        assert out.returncode == 2 and message in out.stderr, script


def test_standin_needs_the_real_worker_beside_it(tmp_path):
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "worker_standin.py").write_text(STANDIN.read_text())
    out = subprocess.run([sys.executable, str(lone / "worker_standin.py"), "env"], capture_output=True, text=True,
                         check=False, env={"FAKE_NVML_SPEC": str(FIELD)}, timeout=30)
    assert out.returncode == 1 and "preflight_worker.py is neither beside" in json.loads(out.stdout)["message"]
    (lone / "preflight_worker.py").write_text(WORKER.read_text())
    out = subprocess.run([sys.executable, str(lone / "worker_standin.py"), "env"], capture_output=True, text=True,
                         check=False, env={"FAKE_NVML_SPEC": str(FIELD)}, timeout=30)
    assert out.returncode == 0 and json.loads(out.stdout)["device_count"] == 8


def test_standin_is_stdlib_only_and_never_reads_the_planner():
    tree = ast.parse(STANDIN.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"importlib", "json", "os", "signal", "sys"}         # no topolaunch module at all


def test_env_and_pairs_from_the_spec():
    spec = spec_json()
    code, lines = answer(FIELD, "p2p", "--env", "--pair", "0:4", "--pair", "4:0", "--pair", "2:2", "--pair", "1:2")
    assert code == 0
    env = lines[0]
    assert env["step"] == "env" and env["device_count"] == 8 and env["simulated"] is True
    assert env["devices"][5]["pci_bus_id"] == spec["gpus"][5]["pci_bus_id"]
    got = {(r["src"], r["dst"]): r for r in results(lines[1:])}
    assert got[(0, 4)]["gbps"] == pair_gbps(spec, 0, 4) and got[(4, 0)]["gbps"] == pair_gbps(spec, 4, 0)
    assert got[(0, 4)]["gbps"] != got[(4, 0)]["gbps"]                  # per direction
    assert got[(2, 2)]["local"] and got[(2, 2)]["gbps"] == 1000.0      # links.local absent: the documented default
    assert got[(1, 2)]["latency_us"] == spec["links"]["default"]["latency_us"]
    assert all(not r["p2p_disabled"] and r["peer_access"] and r["status"] == "ok" for r in got.values())
    assert [l["event"] for l in lines[1:]] == ["begin", "result"] * 4


def test_host_path_with_p2p_off_or_without_peer_access(tmp_path):
    spec = spec_json()
    spec["p2p"]["pairs"] = [[1, 6, "CNS"]]
    spec["links"]["pairs"].append({"gpus": [2, 5], "p2p_disabled": {"gbps": [9.0, 8.0], "latency_us": 20.0}})
    spec["links"]["pairs"] = [p for p in spec["links"]["pairs"] if p["gpus"] != [2, 5] or "p2p_disabled" in p]
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    host = spec["links"]["p2p_disabled"]
    _, lines = answer(path, "p2p", "--env", "--pair", "1:6", "--pair", "0:1")
    cns, ok = results(lines[1:])
    assert lines[0]["peer_access"][1][6] is False and lines[0]["peer_access"][0][1] is True
    assert (cns["gbps"], cns["latency_us"], cns["peer_access"], cns["p2p_disabled"]) == (host["gbps"], host["latency_us"],
                                                                                          False, False)
    assert ok["gbps"] == pair_gbps(spec, 0, 1)
    _, lines = answer(path, "p2p", "--pair", "0:1", "--pair", "5:2", "--pair", "3:3", env={"NCCL_P2P_DISABLE": "1"})
    off, override, local = results(lines)
    assert (off["gbps"], off["latency_us"], off["p2p_disabled"]) == (host["gbps"], host["latency_us"], True)
    assert (override["gbps"], override["latency_us"]) == (8.0, 20.0)
    assert local["local"] and not local["p2p_disabled"] and local["gbps"] == 1000.0


def ring_expectation(spec, gpus, nbytes, p2p_off=False):
    """The documented ring formula, computed here from the spec."""
    n = len(gpus)
    edges = [(gpus[i], gpus[(i + 1) % n]) for i in range(n)]
    if p2p_off:
        gbps = [spec["links"]["p2p_disabled"]["gbps"]] * n
        lat = [spec["links"]["p2p_disabled"]["latency_us"]] * n
    else:
        gbps = [pair_gbps(spec, a, b) for a, b in edges]
        lat = [spec["links"]["default"]["latency_us"]] * n
    bandwidth = standin.RING_EFFICIENCY * min(gbps)
    latency = standin.BASE_US + 2 * (n - 1) * (max(lat) + standin.STEP_US)
    seconds = latency / 1e6 + nbytes * 2 * (n - 1) / n / (bandwidth * 1e9)
    return nbytes * 2 * (n - 1) / n / seconds / 1e9, latency


def test_allreduce_by_the_ring_formula_near_the_field_figures():
    spec = spec_json()
    groups = [[0, 1], [0, 1, 2, 3], list(range(8))]
    code, lines = answer(FIELD, "allreduce", *sum((["--group", ",".join(map(str, g))] for g in groups), []),
                         "--bytes", str(512 << 20))
    assert code == 0
    got = results(lines)
    assert [r["gpus"] for r in got] == groups
    for r, g in zip(got, groups):
        busbw, latency = ring_expectation(spec, g, 512 << 20)
        assert r["busbw_gbps"] == pytest.approx(busbw, abs=1e-3) and r["latency_us"] == pytest.approx(latency)
    # the field box measured 38.6 / 26.4 / 24.7 GB/s and 6.8 / 13.5 / 26.7 us: the formula lands near them
    assert [round(r["latency_us"], 1) for r in got] == [6.8, 14.4, 29.6]
    assert 30 < got[0]["busbw_gbps"] < 40 and 20 < got[2]["busbw_gbps"] < 30
    _, lines = answer(FIELD, "allreduce", "--gpus", "0,1,2,3", env={"NCCL_P2P_DISABLE": "1"})
    off = results(lines)[0]
    assert off["p2p_disabled"] and off["busbw_gbps"] == pytest.approx(
        ring_expectation(spec, [0, 1, 2, 3], 256 << 20, p2p_off=True)[0], abs=1e-3)


def test_hanging_pair_blocks_until_killed_and_works_with_p2p_off():
    started = time.monotonic()
    out = preflight.run_step([sys.executable, str(STANDIN), "p2p", "--pair", "0:1", "--pair", "3:7", "--pair", "7:6"],
                             1.0, preflight.worker_env({"FAKE_NVML_SPEC": str(HANG)}))
    assert out["status"] == "hang" and time.monotonic() - started < 4.0
    assert [l["event"] for l in out["lines"]] == ["begin", "result", "begin"] and out["lines"][-1]["src"] == 3
    code, lines = answer(HANG, "p2p", "--pair", "7:3", env={"NCCL_P2P_DISABLE": "1"})
    assert code == 0 and results(lines)[0]["p2p_disabled"]
    out = preflight.run_step([sys.executable, str(STANDIN), "allreduce", "--group", "0,1,2,3", "--group", "2,3,6,7"],
                             1.0, preflight.worker_env({"FAKE_NVML_SPEC": str(HANG)}))
    assert out["status"] == "hang" and [l["event"] for l in out["lines"]] == ["begin", "result", "begin"]
    code, lines = answer(HANG, "allreduce", "--gpus", "2,3,6,7", env={"NCCL_P2P_DISABLE": "1"})
    assert code == 0 and results(lines)[0]["status"] == "ok"


def test_spec_without_links_or_missing(tmp_path):
    code, lines = answer(SPECS / "hgx-8x-h100-nvswitch.json", "env")
    assert code == 1 and "has no links section" in lines[0]["message"]
    code, lines = answer(tmp_path / "absent.json", "env")
    assert code == 1 and str(tmp_path / "absent.json") in lines[0]["message"]


def test_preflight_of_the_field_box():
    record = preflight.run_preflight(sys.executable, str(STANDIN), list(range(8)), settings={"step_timeout": 5},
                                     env={"FAKE_NVML_SPEC": str(FIELD)})
    assert record["findings"] == [] and record["ok"]
    assert len(record["pairs"]) == 64 and all(p["status"] == "ok" for p in record["pairs"])
    assert list(record["figures"]["allreduce_by_size"]) == ["2", "4", "8"]


def test_preflight_of_the_box_with_a_hanging_pair_ends_in_the_fix_within_one_timeout():
    timeout = 2.0
    started = time.monotonic()
    record = preflight.run_preflight(sys.executable, str(STANDIN), list(range(8)), settings={"step_timeout": timeout},
                                     env={"FAKE_NVML_SPEC": str(HANG)})
    took = time.monotonic() - started
    assert took < timeout + 3.0, took
    assert [f["id"] for f in record["findings"]] == ["preflight-p2p-hang", "preflight-p2p-disabled-by-plan"]
    assert record["findings"][0]["gpus"] == [3, 7]
    assert record["plan_fixes"] == {"env": {"NCCL_P2P_DISABLE": "1"}, "server_args": {"disable_custom_all_reduce": True}}
    eight = [g for g in record["groups"] if g["size"] == 8]
    assert [(g["status"], g["p2p_disabled"]) for g in eight] == [("skipped", False), ("ok", True)]
    assert record["figures"]["allreduce_by_size"]["8"]["p2p_disabled"] is True


def test_the_hang_spec_differs_from_the_field_spec_only_by_the_hang():
    field, hang = spec_json(FIELD), spec_json(HANG)
    for spec in (field, hang):
        spec.pop("name")
        for entry in spec["links"]["pairs"]:
            entry.pop("hangs", None)
    assert field == hang
    assert [p["gpus"] for p in spec_json(HANG)["links"]["pairs"] if p.get("hangs")] == [[3, 7]]
