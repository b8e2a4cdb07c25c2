"""Turn benchmark results into FINDINGS.md and PNG plots (the command is tools/report.py; the sglang_bench action
plugin's state=report, which a tune runs, calls build()).

    tools/report.py RESULTS_DIR [--out DIR] [--model NAME] [--fingerprint FP]

RESULTS_DIR is laid out as results/<model>/<topology fingerprint>/<layout>/<run id>.* (the bench stage writes it).
Writes DIR/FINDINGS.md and DIR/plots/*.png (DIR defaults to RESULTS_DIR) and prints their paths. Per model x
topology x workload: every layout x concurrency (output and total tok/s, TTFT p50/p99, ITL p50/p99, E2E p50), the best
layout per concurrency and by how much, the winner, failures, and where the numbers come from. Per tune: the
layouts it measured, predicted against measured, which prediction was wrong by how much, and the model's error on
the machine before and after the fit. Results from the lab's simulator are marked SIMULATED in the text and on
every plot. Controller code; matplotlib is imported only to draw.
"""
import argparse
import datetime
import math
import os
import sys

from ansible_collections.topolaunch.sglang.plugins.plugin_utils import results

SIM_BANNER = ("> **SIMULATED RESULTS.** These numbers come from the lab's SGLang simulator (its server_info says "
              "simulated), not from GPUs. They show that the tooling works; they say nothing about real hardware.")


# ---------------------------------------------------------------------------------------------------- text


def fmt(value, digits=1):
    if value is None:
        return "-"
    return "{:,.{d}f}".format(value, d=digits)


def group_title(group):
    title = "%s on topology %s, input %s / output %s tokens" % (
        group["model"], group["topology_fingerprint"], group["input_len"], group["output_len"])
    return title + (" (SIMULATED)" if group["simulated"] else "")


def group_slug(group):
    return "%s_%s_in%s_out%s" % (results.safe_name(group["model"]), group["topology_fingerprint"],
                                 group["input_len"], group["output_len"])


def winner_text(group):
    w = group["winner"]
    text = "**Winner: %s**, peak output %s tok/s at concurrency %d" % (
        w["layout"], fmt(w["output_throughput"]), w["max_concurrency"])
    if w["runner_up"] is None:
        return text + " (the only layout measured)."
    if w["margin_pct"] is None:
        return text + "; runner-up %s measured 0 tok/s." % w["runner_up"]
    return text + ", %s%% above the runner-up %s (peak %s tok/s)." % (
        fmt(w["margin_pct"]), w["runner_up"], fmt(w["runner_up_throughput"]))


def best_table(group):
    lines = ["| concurrency | best layout | output tok/s | runner-up | runner-up tok/s | best leads by |",
             "| ---: | --- | ---: | --- | ---: | ---: |"]
    for row in group["best"]:
        lead = "-" if row["margin_pct"] is None else fmt(row["margin_pct"]) + " %"
        lines.append("| %d | %s | %s | %s | %s | %s |" % (
            row["max_concurrency"], row["best"], fmt(row["output_throughput"]), row["runner_up"] or "(only one)",
            fmt(row["runner_up_throughput"]), lead))
    return lines


def measurement_table(group):
    lines = ["| layout | concurrency | prompts done/asked | output tok/s | total tok/s | TTFT p50 ms | TTFT p99 ms "
             "| ITL p50 ms | ITL p99 ms | E2E p50 ms | run |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for layout in sorted(group["layouts"]):
        for c, p in sorted(group["layouts"][layout].items()):
            lines.append("| %s | %d | %d/%s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                layout, c, p["completed"], p["num_prompts"] if p["num_prompts"] is not None else "?",
                fmt(p["output_throughput"]), fmt(p["total_throughput"]), fmt(p["ttft_p50_ms"]), fmt(p["ttft_p99_ms"]),
                fmt(p["itl_p50_ms"], 2), fmt(p["itl_p99_ms"], 2), fmt(p["e2e_p50_ms"]), p["run_id"]))
    return lines


def provenance(group):
    lines = ["| layout | run | host | started | GPUs | driver / CUDA | sglang | topolaunch | launch |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for run in group["runs"]:
        topo = run.get("topology") or {}
        versions = run.get("versions") or {}
        meta = run.get("meta") or {}
        plan = run.get("plan") or {}
        names = sorted({g.get("name", "?") for g in topo.get("gpus", [])})
        gpus = "%s x %s" % (topo.get("gpu_count", len(topo.get("gpus", [])) or "?"), " + ".join(names) or "?")
        launch = ""
        if plan:
            env = dict(plan.get("env") or {"CUDA_VISIBLE_DEVICES": plan.get("cuda_visible_devices", "?")})
            launch = "`%s python -m sglang.launch_server %s`" % (
                " ".join("%s=%s" % kv for kv in sorted(env.items())), " ".join(str(a) for a in plan.get("argv", [])))
        lines.append("| %s | %s | %s | %s | %s | %s / %s | %s | %s | %s |" % (
            run["layout"], run["run_id"], meta.get("host", "?"), meta.get("started", "?"), gpus,
            versions.get("driver_version", topo.get("driver_version", "?")),
            versions.get("cuda_driver_version", topo.get("cuda_driver_version", "?")),
            versions.get("sglang", "?"), versions.get("topolaunch_commit", "?"), launch.replace("|", "\\|")))
    bench = {}
    for run in group["runs"]:
        bench = (run.get("meta") or {}).get("bench") or bench
    if bench:
        lines += ["", "Client: `python -m sglang.bench_serving --backend sglang --dataset-name %s "
                      "--random-range-ratio 1.0`, seed %s, %s warmup requests per point." % (
                          bench.get("dataset_name", "random-ids"), bench.get("seed", "?"),
                          bench.get("warmup_requests", "?"))]
    return lines


def failure_lines(fails):
    lines = ["| when (run) | model | topology | layout | stage | what failed |", "| --- | --- | --- | --- | --- | --- |"]
    for f in fails:
        message = f["message"].replace("|", "\\|").replace("\n", " ")
        cells = (f["run_id"], f["model"], f["topology_fingerprint"], f["layout"], f["stage"], message)
        lines.append("| %s | %s | %s | %s | %s | %s |" % cells)
    return lines


def tune_title(tune):
    return "Tune of %s on topology %s (%s, %s)%s" % (
        tune.get("model"), tune.get("topology_fingerprint"), tune.get("host", "?"), tune.get("started", "?"),
        " (SIMULATED)" if tune.get("simulated") else "")


def tune_reference(tune):
    """The layout both predictions and measurements are compared with: the model's pick when it was measured,
    else the measured winner."""
    measured = [r for r in tune["layouts"] if r.get("measured")]
    pick = next((r for r in measured if r["layout"] == tune.get("predicted_winner") and r.get("predicted")), None)
    return pick or max(measured, key=lambda r: r["measured"], default=None)


def tune_rows(tune):
    """Per layout: predicted and measured relative to the reference and how far off the prediction was
    (measured ratio / predicted ratio)."""
    ref = tune_reference(tune)
    rows = []
    for r in tune["layouts"]:
        row = dict(r, predicted_rel=None, measured_rel=None, off=None)
        if ref and r.get("predicted") and ref.get("predicted"):
            row["predicted_rel"] = r["predicted"] / ref["predicted"]
        if ref and r.get("measured"):
            row["measured_rel"] = r["measured"] / ref["measured"]
        if row["predicted_rel"] and row["measured_rel"] and r is not ref:
            row["off"] = row["measured_rel"] / row["predicted_rel"]
        rows.append(row)
    return ref, rows


def _pct(rel):
    return "-" if rel is None else "%+.1f%%" % ((rel - 1) * 100)


def tune_lines(tune, plots):
    ref, rows = tune_rows(tune)
    w = tune.get("workload") or {}
    out = ["## " + tune_title(tune), ""]
    if tune.get("simulated"):
        out += ["**SIMULATED**: lab simulator numbers, not a GPU measurement.", ""]
    out.append("Workload: input %s / output %s tokens at concurrency %s. The model picked **%s**; the measured "
               "winner is **%s** (the plan's source: %s)." % (
                   w.get("input_len", "?"), w.get("output_len", "?"), w.get("concurrency", "?"),
                   tune.get("predicted_winner") or "?", tune.get("winner") or "?", tune.get("winner_source") or "?"))
    out.append("")
    name = ref["layout"] if ref else "-"
    out += ["| layout | predicted tok/s | measured tok/s | predicted vs %s | measured vs %s | prediction off by | "
            "this tune |" % (name, name), "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        what = r["status"]
        if r["status"] == "failed":
            what = "FAILED at %s: %s" % (r.get("stage") or "?", (r.get("message") or "")[:300])
        elif r.get("run_id"):
            what += " (run %s)" % r["run_id"]
        out.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            r["layout"], fmt(r.get("predicted")), fmt(r.get("measured")),
            "=" if r["layout"] == name else _pct(r["predicted_rel"]),
            "=" if r["layout"] == name else _pct(r["measured_rel"]),
            "-" if r["off"] is None else "x%.2f" % r["off"],
            what.replace("|", "\\|").replace("\n", " ")))
    wrong = [r for r in rows if r["off"] is not None and ((r["predicted_rel"] - 1) * (r["measured_rel"] - 1) < 0
                                                          or abs(math.log(r["off"])) > (tune.get("error") or 0.0))]
    out.append("")
    if wrong:
        for r in wrong:
            out.append("- Wrong: %s was predicted %s than %s and measured %s: off by x%.2f." % (
                r["layout"], _relative(r["predicted_rel"]), name, _relative(r["measured_rel"]), r["off"]))
    elif ref:
        out.append("- Every prediction of this tune was within the model's error of its measurement.")
    out += ["- The model's error on this machine: %s." % fit_text(tune.get("fit"), tune.get("error")), ""]
    for title, path in plots.get(tune_slug(tune), []):
        out.append("![%s](%s)" % (title, path))
    return out + [""]


def _relative(rel):
    if rel is None:
        return "?"
    return "%.1f%% %s" % (abs(rel - 1) * 100, "faster" if rel >= 1 else "slower")


def fit_text(fit, error):
    calibration = "" if error is None else " (calibration set: %.3f)" % error
    if not fit:
        return "no fit yet%s" % calibration
    if fit.get("error_after") is None:
        return "%s%s" % (fit.get("why") or "no fit", calibration)
    text = "median |log ratio error| %.3f before the fit, %.3f after%s; fit of %s from %s measured points" % (
        fit["error_before"], fit["error_after"], calibration,
        ", ".join("%s %s" % kv for kv in sorted((fit.get("efficiency") or {}).items())) or "no constant",
        fit.get("points", "?"))
    return text + ("; a %s fit: %s" % (fit.get("quality"), fit["why"]) if fit.get("why") else "; a good fit")


def tune_slug(tune):
    return "tune_%s_%s_%s" % (results.safe_name(tune.get("model") or "model"), tune.get("topology_fingerprint"),
                              tune.get("run_id"))


def findings_md(groups, fails, plots, source, now, tunes=()):
    out = ["# Findings: which layout serves fastest", ""]
    if any(g["simulated"] for g in groups):
        out += [SIM_BANNER, ""]
    out += ["Generated %s by `tools/report.py` from `%s`. Throughput is output tokens per second; the winner is the "
            "layout with the highest output throughput at any measured concurrency. Only complete points count "
            "(a point where fewer prompts completed than were asked is listed under Failures)." % (now, source), ""]
    if not groups:
        out += ["No complete measurement yet.", ""]
    for group in groups:
        out += ["## " + group_title(group), ""]
        if group["simulated"]:
            out += ["**SIMULATED**: lab simulator numbers, not a GPU measurement.", ""]
        out += [winner_text(group), "", "### Best layout per concurrency", ""] + best_table(group)
        out += ["", "### All measurements", ""] + measurement_table(group)
        out += ["", "### Plots", ""]
        for title, path in plots.get(group_slug(group), []):
            out.append("![%s](%s)" % (title, path))
        out += ["", "### Provenance", "", "Topology fingerprint `%s`." % group["topology_fingerprint"], ""]
        out += provenance(group) + [""]
    for tune in tunes:
        out += tune_lines(tune, plots)
    out += ["## Failures", ""]
    out += failure_lines(fails) if fails else ["None recorded."]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------------- plots


def _mark_simulated(fig, ax):
    ax.text(0.5, 0.5, "SIMULATED", transform=ax.transAxes, fontsize=56, color="red", alpha=0.12,
            ha="center", va="center", rotation=25, weight="bold")
    fig.text(0.99, 0.01, "lab simulator, not GPU measurements", color="red", ha="right", va="bottom", fontsize=9)


def _save(plt, fig, ax, group, out_dir, suffix, title, slug=None):
    """Title, grid, legend and the SIMULATED mark, then write plots/<slug>_<suffix>.png; returns (title, path)."""
    prefix = "SIMULATED: " if group["simulated"] else ""
    ax.set_title("%s%s\n%s, topology %s, in/out %s/%s tokens" % (
        prefix, title, group["model"], group["topology_fingerprint"], group["input_len"], group["output_len"]),
        fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.legend(title=None if slug else "layout")
    if group["simulated"]:
        _mark_simulated(fig, ax)
    fig.tight_layout()
    path = os.path.join("plots", "%s.png" % "_".join(filter(None, (slug or group_slug(group), suffix))))
    fig.savefig(os.path.join(out_dir, path))
    plt.close(fig)
    return title, path


def plot_group(group, out_dir):
    """Two PNGs per group; returns [(title, path relative to the report)]."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(os.path.join(out_dir, "plots"), exist_ok=True)
    layouts = sorted(group["layouts"])

    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=110)
    concurrencies = sorted({c for points in group["layouts"].values() for c in points})
    for layout in layouts:
        points = sorted(group["layouts"][layout].items())
        ax.plot([c for c, _point in points], [p["output_throughput"] or 0.0 for _c, p in points], marker="o", linewidth=2,
                label=layout + (" (winner)" if group["winner"]["layout"] == layout else ""))
    ax.set_xscale("log", base=2)
    ax.set_xticks(concurrencies)
    ax.set_xticklabels([str(c) for c in concurrencies])
    ax.set_xlabel("max concurrency (requests in flight)")
    ax.set_ylabel("output throughput (tokens/s)")
    ax.set_ylim(bottom=0)
    made = [_save(plt, fig, ax, group, out_dir, "throughput", "Output throughput vs concurrency")]

    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=110)
    ttfts = []
    for index, layout in enumerate(layouts):
        points = [(c, p) for c, p in sorted(group["layouts"][layout].items()) if p["ttft_p99_ms"] is not None]
        xs = [p["output_throughput"] or 0.0 for _c, p in points]
        ys = [p["ttft_p99_ms"] for _c, p in points]
        ttfts += ys
        ax.plot(xs, ys, marker="o", linewidth=2, label=layout)
        for (c, _point), x, y in zip(points, xs, ys):
            # alternate label sides per layout so labels of close points do not sit on each other
            ax.annotate("c=%d" % c, (x, y), textcoords="offset points", xytext=(6, 6 if index % 2 == 0 else -13),
                        fontsize=8)
    if ttfts and min(ttfts) > 0 and max(ttfts) / min(ttfts) > 50:
        ax.set_yscale("log")
    ax.set_xlabel("output throughput (tokens/s)")
    ax.set_ylabel("TTFT p99 (ms)")
    made.append(_save(plt, fig, ax, group, out_dir, "ttft_p99",
                      "Tail time to first token vs throughput (labels: concurrency; better is right and down)"))
    return made


def plot_tune(tune, out_dir):
    """One PNG per tune: predicted and measured throughput of each layout relative to the reference layout."""
    ref, rows = tune_rows(tune)
    rows = [r for r in rows if r["predicted_rel"] is not None or r["measured_rel"] is not None]
    if not ref or not rows:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(os.path.join(out_dir, "plots"), exist_ok=True)
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=110)
    xs = range(len(rows))
    width = 0.38
    for offset, key, label in ((-width / 2, "predicted_rel", "predicted (the model)"),
                               (width / 2, "measured_rel", "measured")):
        values = [r[key] or 0.0 for r in rows]
        bars = ax.bar([x + offset for x in xs], values, width, label=label)
        for rect, r in zip(bars, rows):
            text = "failed" if key == "measured_rel" and r["status"] == "failed" else (
                "-" if r[key] is None else "%.2f" % r[key])
            ax.annotate(text, (rect.get_x() + rect.get_width() / 2, rect.get_height()), textcoords="offset points",
                        xytext=(0, 3), ha="center", fontsize=8)
    ax.axhline(1.0, color="gray", linewidth=1, linestyle="--")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([r["layout"] + (" (pick)" if r["layout"] == tune.get("predicted_winner") else "")
                        + (" (winner)" if r["layout"] == tune.get("winner") else "") for r in rows])
    ax.set_ylabel("output throughput relative to %s" % ref["layout"])
    w = tune.get("workload") or {}
    group = {"simulated": tune.get("simulated"), "model": tune.get("model"),
             "topology_fingerprint": tune.get("topology_fingerprint"), "input_len": w.get("input_len"),
             "output_len": w.get("output_len")}
    path = _save(plt, fig, ax, group, out_dir, "", "Tune %s: predicted vs measured at concurrency %s" % (
        tune.get("run_id"), w.get("concurrency")), slug=tune_slug(tune))
    return [path]


def interactivity_series(tune, groups):
    """Per layout of a tune with its GPU count: the predicted curve [(output tok/s per user, output tok/s per GPU)]
    (the plan's interactivity_curve) and the measured points of the tune's model, topology and lengths
    [(1000 / median TPOT, output tok/s / GPUs, concurrency)]."""
    w = tune.get("workload") or {}
    group = next((g for g in groups if g["model"] == tune.get("model")
                  and g["topology_fingerprint"] == tune.get("topology_fingerprint")
                  and g["input_len"] == w.get("input_len") and g["output_len"] == w.get("output_len")), None)
    series = []
    for r in tune.get("layouts") or []:
        gpus = r.get("gpus")
        if not gpus:
            continue
        predicted = [(user, tput / gpus) for _c, tput, user in r.get("curve") or []]
        points = ((group or {}).get("layouts") or {}).get(r["layout"], {})
        measured = [(1000.0 / p["tpot_p50_ms"], (p["output_throughput"] or 0.0) / gpus, c)
                    for c, p in sorted(points.items()) if p.get("tpot_p50_ms")]
        if predicted or measured:
            series.append({"layout": r["layout"], "predicted": predicted, "measured": measured})
    return series


def plot_interactivity(tune, groups, out_dir):
    """One PNG per tune with curves: per layout, output tok/s per GPU against output tok/s per user, predicted as
    lines and measured as points (labelled with their concurrency); a TPOT SLO is the vertical line users must be
    right of."""
    series = interactivity_series(tune, groups)
    if not series:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(os.path.join(out_dir, "plots"), exist_ok=True)
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=110)
    for index, s in enumerate(series):
        color = "C%d" % (index % 10)
        if s["predicted"]:
            ax.plot(*zip(*s["predicted"]), linewidth=2, color=color, label=s["layout"] + " predicted")
        if s["measured"]:
            xs, ys, cs = zip(*s["measured"])
            ax.scatter(xs, ys, color=color, marker="o", s=40, label=s["layout"] + " measured", zorder=3)
            for x, y, c in zip(xs, ys, cs):
                ax.annotate("c=%d" % c, (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
    w = tune.get("workload") or {}
    slo = w.get("slo") or {}
    if slo.get("tpot_ms"):
        ax.axvline(1000.0 / slo["tpot_ms"], color="red", linestyle="--", linewidth=1.5,
                   label="SLO: p%s TPOT <= %g ms" % (slo.get("tpot_percentile", 50), slo["tpot_ms"]))
    ax.set_xlabel("output tokens/s per user (1000 / TPOT ms)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    group = {"simulated": tune.get("simulated"), "model": tune.get("model"),
             "topology_fingerprint": tune.get("topology_fingerprint"), "input_len": w.get("input_len"),
             "output_len": w.get("output_len")}
    title = "Interactivity: throughput per GPU vs speed per user"
    if slo.get("ttft_ms"):
        title += " (SLO also p%s TTFT <= %g ms)" % (slo.get("ttft_percentile", 99), slo["ttft_ms"])
    return [_save(plt, fig, ax, group, out_dir, "interactivity", title, slug=tune_slug(tune))]


# ---------------------------------------------------------------------------------------------------- main


def build(results_dir, out_dir=None, model=None, fingerprint=None, now=None):
    """Write FINDINGS.md and the plots; returns the list of files written."""
    out_dir = out_dir or results_dir
    if not os.path.isdir(results_dir):
        raise results.ResultsError("no results directory %s (the bench stage writes it)" % results_dir)
    runs = results.load_runs(results_dir, model=model, fingerprint=fingerprint)
    if not runs:
        raise results.ResultsError("no benchmark results under %s%s" % (
            results_dir, "".join(" for %s" % x for x in (model, fingerprint) if x)))
    groups = results.summarize(runs)
    fails = results.failures(runs)
    tunes = results.load_tunes(results_dir, model=model, fingerprint=fingerprint)
    os.makedirs(out_dir, exist_ok=True)
    plots = {group_slug(g): plot_group(g, out_dir) for g in groups}
    plots.update({tune_slug(t): plot_tune(t, out_dir) + plot_interactivity(t, groups, out_dir) for t in tunes})
    now = now or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    findings = os.path.join(out_dir, "FINDINGS.md")
    with open(findings, "w") as handle:
        handle.write(findings_md(groups, fails, plots, results_dir, now, tunes))
    return [findings] + [os.path.join(out_dir, p) for made in plots.values() for _title, p in made]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("results_dir", metavar="RESULTS_DIR")
    parser.add_argument("--out", help="where FINDINGS.md and plots/ go (default RESULTS_DIR)")
    parser.add_argument("--model", help="only this model")
    parser.add_argument("--fingerprint", help="only this topology fingerprint")
    args = parser.parse_args(argv)
    try:
        written = build(args.results_dir, args.out, args.model, args.fingerprint)
    except results.ResultsError as exc:
        print("report: %s" % exc, file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
