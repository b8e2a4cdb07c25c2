"""Benchmark results as the tests of the results tree, the sglang_bench action plugin and the report use them: a
bench_serving line, a tune's pieces, the arguments of a recorded run."""
import json

from ansible_collections.topolaunch.sglang.plugins.plugin_utils import results

SERVER_INFO_SIM = {"version": "0.5.9+sim", "simulated": True, "tp_size": 8, "pp_size": 1, "status": "ready"}
SERVER_INFO_REAL = {"version": "0.5.9", "tp_size": 8, "pp_size": 1, "max_total_num_tokens": 1200000}


def bench_line(concurrency=8, completed=32, output_throughput=1000.0, input_len=64, output_len=32,
               server_info=None, **overrides):
    """A line as bench_serving writes it: every field of SGLang's documented schema."""
    duration = 10.0
    line = {
        "backend": "sglang", "dataset_name": "random-ids", "request_rate": float("inf"),
        "max_concurrency": concurrency, "random_input_len": input_len, "random_output_len": output_len,
        "random_range_ratio": 1.0, "server_info": server_info if server_info is not None else SERVER_INFO_REAL,
        "duration": duration, "completed": completed,
        "total_input_tokens": completed * input_len, "total_output_tokens": completed * output_len,
        "request_throughput": completed / duration, "input_throughput": completed * input_len / duration,
        "output_throughput": output_throughput, "total_throughput": output_throughput * 3,
        "mean_ttft_ms": 120.0, "median_ttft_ms": 100.0, "std_ttft_ms": 20.0, "p99_ttft_ms": 250.0,
        "mean_tpot_ms": 12.0, "median_tpot_ms": 11.0, "std_tpot_ms": 1.0, "p99_tpot_ms": 15.0,
        "mean_itl_ms": 12.5, "median_itl_ms": 11.5, "std_itl_ms": 2.0, "p95_itl_ms": 16.0, "p99_itl_ms": 19.0,
        "mean_e2e_latency_ms": 500.0, "median_e2e_latency_ms": 480.0, "std_e2e_latency_ms": 50.0,
        "p90_e2e_latency_ms": 560.0, "p99_e2e_latency_ms": 600.0,
        "concurrency": concurrency * 0.9, "max_output_tokens_per_s": output_throughput * 1.2,
        "max_concurrent_requests": concurrency,
    }
    line.update(overrides)
    return json.dumps(line)  # Python writes inf as Infinity, as bench_serving does


SELECTION = {"chosen": ["tp4pp2", "tp8", "tp2pp4"], "model_pick": "tp4pp2", "error": 0.183, "scale": 1.0,
             "rows": [{"name": "tp4pp2", "estimate": 217.0}, {"name": "tp8", "estimate": 212.0},
                      {"name": "tp2pp4", "estimate": 188.0}, {"name": "tp1pp8", "estimate": 113.0}]}
OUTCOMES = [{"layout": "tp4pp2", "status": "ok", "run_id": "20261130T100100Z", "seconds": 40.0,
             "stage_started": {"plan": 1.0, "relaunch": 2.0, "bench": 30.0}, "finished": 41.0, "server_ready_s": 20.0},
            {"layout": "tp8", "status": "ok", "run_id": "20261130T100200Z", "seconds": 41.0},
            {"layout": "tp2pp4", "status": "failed", "stage": "health", "message": "died while starting: OOM"}]
CANDIDATES = [{"name": "tp8", "valid": True, "measured": {"output_throughput": 1800.0, "simulated": True}},
              {"name": "tp4pp2", "valid": True, "measured": {"output_throughput": 700.0, "simulated": True}},
              {"name": "tp1pp8", "valid": True, "measured": {"output_throughput": 300.0, "simulated": True}},
              {"name": "tp2pp4", "valid": True}, {"name": "tp3", "valid": False}]
FINAL = {"layout": {"name": "tp8"}, "source": "measured",
         "fit": {"quality": "poor", "why": "few points", "error_before": 0.9, "error_after": 0.1,
                 "efficiency": {"step_ms": 12.9}, "points": 3}}


def tune_data():
    return results.tune_record(SELECTION, OUTCOMES, CANDIDATES, FINAL, {"input_len": 64, "output_len": 16,
                                                                         "concurrency": 4})


PLAN = {"layout": {"name": "tp8", "tp": 8}, "argv": ["--tp-size", "8"], "port": 30000, "model_name": "glm-5-nvfp4",
        "topology_fingerprint": "a1b2c3d4e5f6", "reason": "auto"}
BENCH = {"dataset_name": "random-ids", "input_len": 64, "output_len": 16}


def record_args(tmp_path, completed=8, **kw):
    args = {"results_dir": str(tmp_path), "model": "glm-5-nvfp4", "topology_fingerprint": "a1b2c3d4e5f6",
            "layout": "tp8", "started": "2026-11-30T10:15:02Z",
            "points": [{"max_concurrency": 1, "num_prompts": 8}],
            "lines": bench_line(concurrency=1, completed=completed, output_throughput=321.0) + "\n",
            "meta": {"host": "field"}, "bench": BENCH, "versions": {"sglang": "0.5.9"}, "plan": PLAN}
    args.update(kw)
    return args
