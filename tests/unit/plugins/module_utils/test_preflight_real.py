"""The preflight record of a real GPU (tests/fixtures/preflight/h200x1-vm/, made by tools/preflight_gpu_check.py
on a 1x H200 Firecracker VM: torch 2.11.0+cu130, NCCL 2.28.9, driver 580.159.04) replayed through the analysis,
and the other proofs of that run: the hang kills and the per-step costs.

One GPU: the local copy, a one-rank allreduce and the hangs are real; pairs and multi-GPU allreduces are not."""
import json

from ansible_collections.topolaunch.sglang.plugins.module_utils import preflight
import paths

FIXTURE = paths.FIXTURES / "preflight" / "h200x1-vm"


def load(name):
    return json.loads((FIXTURE / name).read_text())


def measured():
    record = load("preflight-h200x1-vm.json")
    return {k: v for k, v in record.items() if k not in preflight.DERIVED}


def test_replayed_record_gives_tables_figures_and_no_findings():
    facts = load("facts.json")
    record = preflight.derive(measured(), facts)
    assert record["fingerprint"] == facts["fingerprint"]
    assert record["env"]["torch"] == "2.11.0+cu130" and record["env"]["nccl"] == "2.28.9"
    local = record["pairs"][0]
    assert local["local"] and local["status"] == "ok" and local["wrong"] == 0
    # H200 HBM3e: a device-to-device copy moves ~2.1 TB/s of bytes copied (~4.2 TB/s read + written)
    assert 1500 < local["gbps"] < 2600 and 0.5 < local["latency_us"] < 5
    assert record["figures"]["local"] == [{"gpu": 0, "gbps": local["gbps"], "latency_us": local["latency_us"],
                                           "status": "ok"}]
    assert record["figures"]["pairs"] == []                  # one GPU: no pair
    one = record["groups"][0]
    # One rank: busbw = algbw * 2(n-1)/n = 0 by nccl-tests' formula; NCCL does no GPU work for an in-place sum of
    # one rank, so the GPU time is ~0 and what is left is the host's cost per call (~14-24 us through torch).
    assert one["status"] == "ok" and one["busbw_gbps"] == 0.0 and one["latency_us"] < 1.0
    assert 5 < one["call_us"] < 100
    assert record["figures"]["allreduce_by_size"] == {}      # sizes of 2 and more only
    assert record["findings"] == [] and record["plan_fixes"] == {"env": {}, "server_args": {}} and record["ok"]
    bandwidth = record["tables"]["p2p_bandwidth"].splitlines()
    assert bandwidth[0] == "Unidirectional P2P=Enabled Bandwidth Matrix (GB/s)"
    assert bandwidth[2] == "     0 %6.02f" % local["gbps"]
    assert "0                on           8192" in record["tables"]["allreduce"]


def test_real_per_step_costs():
    """The figures docs/preflight.md's formula takes from the real run."""
    timing = load("preflight-h200x1-vm.json")["timing"]
    costs = load("costs.json")
    assert 2.0 < timing["p2p_startup_seconds"] < 8.0 and 2.0 < timing["allreduce_startup_seconds"] < 8.0
    assert 0.02 < costs["p2p_batch"]["per_pair"] < 0.2         # one local copy of 256 MiB, 13 times, checked
    assert costs["allreduce_session"]["status"] == "ok" and len(costs["allreduce_session"]["per_group"]) == 4
    assert max(costs["allreduce_session"]["per_group"]) < 1.0   # the first one makes the NCCL communicator
    host = costs["via_host"]["results"][0]
    assert host["p2p_disabled"] and host["wrong"] == 0 and 20 < host["d2h_gbps"] < 70 and 20 < host["h2d_gbps"] < 70
    # the estimate of an 8-GPU box from these 1-GPU costs (pairs and 8-rank groups as cheap as local ones)
    assert costs["estimate_8_gpus_seconds"] < 60


def test_real_hangs_were_killed_at_the_deadline():
    hangs = load("hangs.json")
    for name, hang in hangs.items():
        begin = hang["lines"][0]
        assert hang["status"] == "hang" and not hang["unkillable"], name
        # the deadline restarts at the begin line: startup + timeout + the kill
        assert hang["timeout"] <= hang["wall"] - begin["t"] < hang["timeout"] + 2.0, name
        assert hang["leftover_worker_pids"] == [], name
        assert hang["next_step"]["status"] == "ok", name          # the GPU works right after the kill
