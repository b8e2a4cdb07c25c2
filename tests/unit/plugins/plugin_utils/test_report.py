"""plugin_utils/report.py (tools/report.py): FINDINGS.md content and PNG plots from a results directory."""
import os
import pathlib
import struct
import sys
from ansible_collections.topolaunch.sglang.plugins.plugin_utils import results
from ansible_collections.topolaunch.sglang.plugins.plugin_utils import report
from bench_cases import SERVER_INFO_SIM, bench_line, tune_data

TOPOLOGY = {"fingerprint": "a1b2c3d4e5f6", "gpu_count": 8, "driver_version": "580.95.05", "cuda_driver_version": "13.0",
            "gpus": [{"name": "NVIDIA RTX PRO 6000 Blackwell Server Edition"}] * 8}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def store(root, layout, started, throughput, server_info=None, completed=None, versions=None):
    asked = [{"max_concurrency": c, "num_prompts": c * 4} for c in throughput]
    lines = "".join(bench_line(concurrency=c, completed=(completed or {}).get(c, c * 4), output_throughput=tp,
                               server_info=server_info, p99_ttft_ms=100.0 + c, median_ttft_ms=50.0 + c) + "\n"
                    for c, tp in throughput.items())
    return results.record_run(
        str(root), "glm-5-nvfp4", "a1b2c3d4e5f6", layout, started, asked, lines,
        meta={"host": "field", "started": started, "bench": {"seed": 7, "warmup_requests": 2}},
        plan={"cuda_visible_devices": "0,1,2,3,4,5,6,7", "argv": ["--tp-size", "8"],
              "env": {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}}, topology=TOPOLOGY,
        versions=versions or {"sglang": "0.5.9", "topolaunch_commit": "abc123def456"})


def png_size(path):
    with open(path, "rb") as handle:
        head = handle.read(24)
    assert head[:8] == PNG_MAGIC, "%s is not a PNG" % path
    return struct.unpack(">II", head[16:24])


def test_report_on_real_results(tmp_path):
    store(tmp_path, "tp8", "2026-11-30T10:00:00Z", {1: 100.0, 8: 700.0, 32: 2000.0})
    store(tmp_path, "tp4pp2", "2026-11-30T10:10:00Z", {1: 120.0, 8: 600.0, 32: 1500.0})
    out = tmp_path / "report"
    written = report.build(str(tmp_path), str(out), now="NOW")
    findings = (out / "FINDINGS.md").read_text()
    assert written[0] == str(out / "FINDINGS.md")
    assert "SIMULATED" not in findings
    assert "## glm-5-nvfp4 on topology a1b2c3d4e5f6, input 64 / output 32 tokens" in findings
    assert ("**Winner: tp8**, peak output 2,000.0 tok/s at concurrency 32, 33.3% above the runner-up tp4pp2 "
            "(peak 1,500.0 tok/s).") in findings
    assert "| 1 | tp4pp2 | 120.0 | tp8 | 100.0 | 20.0 % |" in findings
    assert "| 32 | tp8 | 2,000.0 | tp4pp2 | 1,500.0 | 33.3 % |" in findings
    # layout x concurrency row: output, total, TTFT p50/p99, ITL p50/p99, E2E p50
    assert "| tp8 | 8 | 32/32 | 700.0 | 2,100.0 | 58.0 | 108.0 | 11.50 | 19.00 | 480.0 | 20261130T100000Z |" in findings
    # provenance: GPUs, driver/CUDA, versions, timestamps, launch
    assert "8 x NVIDIA RTX PRO 6000 Blackwell Server Edition | 580.95.05 / 13.0 | 0.5.9 | abc123def456" in findings
    assert "2026-11-30T10:10:00Z" in findings and "seed 7, 2 warmup requests" in findings
    assert ("`CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 python -m sglang.launch_server "
            "--tp-size 8`") in findings
    assert "## Failures\n\nNone recorded." in findings
    pngs = [p for p in written if p.endswith(".png")]
    assert len(pngs) == 2
    for path in pngs:
        assert "](plots/%s)" % os.path.basename(path) in findings
        width, height = png_size(path)
        assert width >= 600 and height >= 400
        assert os.path.getsize(path) > 20000  # a drawn chart, not an empty canvas


def test_simulated_results_are_marked(tmp_path):
    store(tmp_path, "tp8", "2026-11-30T10:00:00Z", {1: 100.0, 8: 700.0}, server_info=SERVER_INFO_SIM,
          versions={"sglang": "0.5.9+sim"})
    report.build(str(tmp_path), now="NOW")
    findings = (tmp_path / "FINDINGS.md").read_text()
    assert findings.splitlines()[2].startswith("> **SIMULATED RESULTS.**")
    assert "tokens (SIMULATED)" in findings
    assert "(the only layout measured)" in findings


def test_simulated_plot_differs_from_real_plot(tmp_path):
    # The SIMULATED watermark is drawn into the picture: same numbers, different pixels.
    real, sim = tmp_path / "real", tmp_path / "sim"
    store(real, "tp8", "2026-11-30T10:00:00Z", {1: 100.0, 8: 700.0})
    store(sim, "tp8", "2026-11-30T10:00:00Z", {1: 100.0, 8: 700.0}, server_info=SERVER_INFO_SIM)
    real_pngs = [p for p in report.build(str(real), now="NOW") if p.endswith(".png")]
    sim_pngs = [p for p in report.build(str(sim), now="NOW") if p.endswith(".png")]
    for a, b in zip(real_pngs, sim_pngs):
        assert open(a, "rb").read() != open(b, "rb").read()


def test_failures_and_partial_points_are_listed(tmp_path):
    store(tmp_path, "tp8", "2026-11-30T10:00:00Z", {1: 100.0, 8: 700.0}, completed={8: 10})
    results.record_run(str(tmp_path), "glm-5-nvfp4", "a1b2c3d4e5f6", "tp2pp4", "2026-11-30T10:20:00Z", [],
                       error={"stage": "health", "message": "unit died: CUDA out of memory | at load"})
    report.build(str(tmp_path), now="NOW")
    findings = (tmp_path / "FINDINGS.md").read_text()
    assert "| 20261130T102000Z | glm-5-nvfp4 | a1b2c3d4e5f6 | tp2pp4 | health | unit died: CUDA out of memory \\| at load |" \
        in findings
    assert "bench of tp8 failed at concurrency 8: completed 10 of 32 prompts" in findings
    # the partial point is not in the measurement table
    assert "| tp8 | 8 |" not in findings and "| tp8 | 1 | 4/4 |" in findings


def test_only_failures_still_reports(tmp_path):
    results.record_run(str(tmp_path), "m", "fp", "tp8", "2026-11-30T10:20:00Z", [],
                       error={"stage": "launch", "message": "bad flag"})
    written = report.build(str(tmp_path), now="NOW")
    assert written == [str(tmp_path / "FINDINGS.md")]
    assert "No complete measurement yet." in (tmp_path / "FINDINGS.md").read_text()


def test_no_results_is_a_clear_error(tmp_path, capsys):
    assert report.main([str(tmp_path)]) == 2
    assert "no benchmark results under %s" % tmp_path in capsys.readouterr().err
    assert report.main([str(tmp_path / "nope")]) == 2
    assert "no results directory" in capsys.readouterr().err


def test_filters(tmp_path, capsys):
    store(tmp_path, "tp8", "2026-11-30T10:00:00Z", {1: 100.0})
    assert report.main([str(tmp_path), "--fingerprint", "ffffffffffff"]) == 2
    assert "for ffffffffffff" in capsys.readouterr().err
    assert report.main([str(tmp_path), "--model", "glm-5-nvfp4", "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "FINDINGS.md").exists()


def test_a_tune_shows_predicted_against_measured(tmp_path):
    store(tmp_path, "tp8", "2026-11-30T10:00:00Z", {4: 1800.0}, server_info=SERVER_INFO_SIM)
    results.record_tune(str(tmp_path), "glm-5-nvfp4", "a1b2c3d4e5f6", "2026-11-30T09:59:00Z",
                        dict(tune_data(), host="field"))
    written = report.build(str(tmp_path), now="NOW")
    findings = (tmp_path / "FINDINGS.md").read_text()
    assert "## Tune of glm-5-nvfp4 on topology a1b2c3d4e5f6 (field, 2026-11-30T09:59:00Z) (SIMULATED)" in findings
    assert ("Workload: input 64 / output 16 tokens at concurrency 4. The model picked **tp4pp2**; the measured "
            "winner is **tp8** (the plan's source: measured).") in findings
    assert "| tp4pp2 | 217.0 | 700.0 | = | = | - | measured (run 20261130T100100Z) |" in findings
    assert "| tp8 | 212.0 | 1,800.0 | -2.3% | +157.1% | x2.63 | measured (run 20261130T100200Z) |" in findings
    assert "| tp2pp4 | 188.0 | - | -13.4% | - | - | FAILED at health: died while starting: OOM |" in findings
    assert "- Wrong: tp8 was predicted 2.3% slower than tp4pp2 and measured 157.1% faster: off by x2.63." in findings
    assert ("- The model's error on this machine: median |log ratio error| 0.900 before the fit, 0.100 after "
            "(calibration set: 0.183); fit of step_ms 12.9 from 3 measured points; a poor fit: few points.") in findings
    [plot] = [p for p in written if os.path.basename(p).startswith("tune_")]
    assert "](plots/%s)" % os.path.basename(plot) in findings and png_size(plot)[0] >= 600
    assert findings.index("## Tune of") < findings.index("## Failures")


def test_a_tune_draws_the_interactivity_curve_with_its_slo(tmp_path):
    """Per layout: output tok/s per GPU against output tok/s per user, the plan's predicted curve as a line and the
    measured points (1000 / median TPOT), the TPOT SLO as a line."""
    store(tmp_path, "tp8", "2026-11-30T10:00:00Z", {4: 1800.0}, server_info=SERVER_INFO_SIM)
    tune = tune_data()
    tune["workload"]["output_len"] = 32   # the stored run's lengths
    tune["workload"]["slo"] = {"ttft_ms": 900.0, "tpot_ms": 20.0, "ttft_percentile": 99, "tpot_percentile": 50}
    for row in tune["layouts"]:
        row["gpus"] = 8
        row["curve"] = [[1, 100.0, 100.0], [4, 320.0, 80.0]] if row["layout"] == "tp8" else None
    results.record_tune(str(tmp_path), "glm-5-nvfp4", "a1b2c3d4e5f6", "2026-11-30T09:59:00Z", dict(tune, host="f"))
    groups = results.summarize(results.load_runs(str(tmp_path)))
    [stored] = results.load_tunes(str(tmp_path))
    series = {s["layout"]: s for s in report.interactivity_series(stored, groups)}
    tpot = groups[0]["layouts"]["tp8"][4]["tpot_p50_ms"]
    assert series["tp8"]["predicted"] == [(100.0, 12.5), (80.0, 40.0)]
    assert series["tp8"]["measured"] == [(1000.0 / tpot, 1800.0 / 8, 4)]
    written = report.build(str(tmp_path), now="NOW")
    [plot] = [p for p in written if p.endswith("_interactivity.png")]
    assert png_size(plot)[0] >= 600
    assert "Interactivity: throughput per GPU vs speed per user (SLO also p99 TTFT <= 900 ms)" in \
        (tmp_path / "FINDINGS.md").read_text()
