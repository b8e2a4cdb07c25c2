"""layout: tune - which layouts to measure on this machine before choosing one.

Plain Python 3.9+ stdlib. sglang_plan plans a tune as `auto` and then asks select() which valid candidates could
win: the top one and every one whose figure is within the model's error of it (plan_perf.MODEL_ERROR, the median
|log ratio error| on the calibration set), at most `max_count` of them. A layout's figure is its measured output
throughput at this workload when there is one (the planner attaches it), else its estimate brought to the measured
scale: the estimates of the measured layouts against their measurements (geometric mean of the ratios) say how
fast this machine runs against the model, so a measurement and an estimate compare. Expert-parallel variants of one
tp/pp/dp shape whose estimates are within SAME_SHAPE count once (the model cannot tell them apart), unless listed.
Layouts measured already are not measured again unless `remeasure`; a layout that failed to start on this machine
(and has no measurement since) cannot win and is left out, unless `remeasure`.
"""
import math
import os

from . import model_config, plan_perf, plan_speculative, planner, tune_start
from . import tune_backends as backend_variants
from .plan_args import FlagIndex
from .plan_fit import of_this_machine, plan_with_fit
from .planner import SGLANG_FACTS, PlanError

# sglang_plan's options that only a tune reads (tune_plan's keywords).
TUNE_OPTIONS = ("failures", "tune_max", "tune_remeasure", "tune_layouts", "tune_backends")
# A failure at these stages: the layout did not start on this machine (a bench failure is not one).
START_STAGES = ("validate", "cleanup", "launch", "health")

# EP variants of one shape whose estimates differ by less than this are one candidate: what a measurement calls
# a tie (the calibration set counts layouts measured within 5% as tied).
SAME_SHAPE = 0.05


def _estimate(c):
    return float((c.get("estimate") or {}).get("tokens_per_s") or 0.0)


def _measured(c):
    return float(c["measured"]["output_throughput"]) if c.get("measured") else None


def select(candidates, max_count=3, error=None, remeasure=False, listed=None, failed=None):
    """candidates: the plan's candidates table (valid ones with estimate, measured at this workload where measured).

    Returns {measure: [names to measure, best first], chosen: [names that could win, measured or not], model_pick (the
    highest estimate), rows: one per valid candidate {name, estimate, measured, figure, status, note}, scale, error,
    max, reasons (bad input)}."""
    error = plan_perf.MODEL_ERROR if error is None else float(error)
    failed = set(failed or [])
    by_name = {c["name"]: c for c in candidates}
    valid = [c for c in candidates if c.get("valid") and _estimate(c) > 0]
    ratios = [math.log(_measured(c) / _estimate(c)) for c in valid if _measured(c)]
    scale = math.exp(sum(ratios) / len(ratios)) if ratios else 1.0

    def figure(c):
        return _measured(c) or _estimate(c) * scale

    rows = {c["name"]: {"name": c["name"], "estimate": _estimate(c), "measured": _measured(c),
                        "figure": round(figure(c), 1), "status": "", "note": ""} for c in valid}
    reasons, chosen = [], []
    if listed:
        for name in listed:
            if name not in by_name:
                reasons.append("tune_layouts: %s is not a layout of these GPUs (%s)"
                               % (name, ", ".join(sorted(by_name))))
            elif name not in rows:
                reasons.append("tune_layouts: %s is not valid here: %s"
                               % (name, "; ".join(by_name[name].get("reasons") or ["no estimate"])))
            elif name not in chosen:
                chosen.append(name)
        for name, row in rows.items():
            row["status"], row["note"] = ("listed", "") if name in chosen else ("not listed", "")
    else:
        # a layout that misses the workload's SLO (measured, or predicted even at concurrency 1) cannot win while
        # another may meet it
        missed = {c["name"]: planner.slo_missed(c) for c in valid}
        if all(missed.values()):
            missed = {}
        ranked = sorted((c for c in valid if not missed.get(c["name"])), key=lambda c: (-figure(c), c["name"]))
        top = figure(ranked[0]) if ranked else 0.0
        for name, why in missed.items():
            if why:
                rows[name]["status"], rows[name]["note"] = "misses the SLO", why
        for c in ranked:
            row = rows[c["name"]]
            if c["name"] in failed and not _measured(c) and not remeasure:
                row["status"], row["note"] = "failed before", "failed to start here; tune_remeasure tries it again"
                continue
            if figure(c) < top * math.exp(-error):
                row["status"] = "cannot win"
                row["note"] = "the best is %.0f%% faster, more than the model's error (%.0f%%)" % (
                    (top / figure(c) - 1) * 100, (math.exp(error) - 1) * 100)
                continue
            twin = next((k for k in chosen if _shape(by_name[k]) == _shape(c)
                         and abs(math.log(_estimate(c) / _estimate(by_name[k]))) <= math.log(1 + SAME_SHAPE)), None)
            if twin:
                row["status"], row["note"] = "same as " + twin, "an EP variant the model cannot tell from %s" % twin
                continue
            if len(chosen) >= max_count:
                row["status"], row["note"] = "over the limit", "topolaunch_tune_max is %d" % max_count
                continue
            chosen.append(c["name"])
    measure = []
    for name in chosen:
        row = rows[name]
        if row["measured"] and not remeasure:
            row["status"] = "measured"
        else:
            row["status"] = "measure"
            measure.append(name)
    order = {name: k for k, name in enumerate(chosen)}
    pick = max(valid, key=lambda c: (_estimate(c), c["name"]))["name"] if valid else None
    return {"measure": measure, "chosen": chosen, "model_pick": pick, "scale": round(scale, 4), "error": error,
            "max": max_count,
            "rows": sorted(rows.values(), key=lambda r: (r["name"] not in order, order.get(r["name"], 0),
                                                         -r["figure"], r["name"])),
            "reasons": reasons}


def _shape(c):
    return (c["tp"], c["pp"], c["dp"], plan_speculative.split_name(c["name"])[1])


def speculative_candidates(candidates, error=None):
    """The candidates as a tune measures them, with speculative decoding as a choice of its own (issue 28 item 2):
    a layout planned with NEXTN is named layout + plan_speculative.SUFFIX; a layout the planner evaluated both ways
    (topolaunch_speculative auto) whose two estimates are within the model's error of each other (the model cannot
    tell which is faster) is offered both ways, each with its own estimate and measurement, so the tune measures
    both and the faster measured is kept (the plan after the tune picks the faster measured variant)."""
    error = plan_perf.MODEL_ERROR if error is None else float(error)
    out = []
    for c in candidates:
        spec = c.get("speculative") or {}
        if not c.get("valid") or not spec:
            out.append(c)
            continue
        on = bool(spec.get("on"))
        mine = dict(c, name=c["name"] + (plan_speculative.SUFFIX if on else ""))
        out.append(mine)
        est_on, est_off = spec.get("estimate_on"), spec.get("estimate_off")
        if not est_on or not est_off or abs(math.log(est_on / est_off)) > error:
            continue
        other = not on
        measured = spec.get("measured_on" if other else "measured_off")
        twin = dict(c, name=c["name"] + (plan_speculative.SUFFIX if other else ""),
                    estimate=dict(c.get("estimate") or {}, tokens_per_s=est_on if other else est_off),
                    speculative=dict(spec, on=other))
        twin.pop("measured", None)
        if measured:
            twin["measured"] = dict(c.get("measured") or {}, output_throughput=measured)
        out.append(twin)
    return out


def report_lines(tune):
    """The selection as readable lines for the plan's report."""
    lines = ["tune: the model's error is %.0f%%; measuring %s" % (
        (math.exp(tune["error"]) - 1) * 100, ", ".join(tune["measure"]) or "nothing new")]
    if tune["scale"] != 1.0:
        lines.append("tune: this machine measures %.3g x the model's estimates (measured layouts' geometric mean)"
                     % tune["scale"])
    lines.append("%-14s %10s %10s %10s  %s" % ("layout", "estimate", "measured", "figure", "tune"))
    for row in tune["rows"]:
        lines.append("%-14s %10.1f %10s %10.1f  %s%s" % (
            row["name"], row["estimate"], "-" if row["measured"] is None else "%.1f" % row["measured"], row["figure"],
            row["status"], " (%s)" % row["note"] if row["note"] else ""))
    return lines


def _bench_batch_sizes(result, measure):
    """The batch sizes the tune's benches run: each measured layout's point (the workload's concurrency, `max`'s
    or the SLO's: its estimate's), else the plan's."""
    layouts = {backend_variants.base_layout(name) for name in measure}
    sizes = {int(c["estimate"]["concurrency"]) for c in result["candidates"]
             if c.get("name") in layouts and isinstance((c.get("estimate") or {}).get("concurrency"), (int, float))}
    fallback = result.get("concurrency") or result["workload"]["concurrency"]
    return sorted(sizes) or [int(fallback) if isinstance(fallback, (int, float)) else 1]


def _model_facts(request):
    """The model facts (model_config.model_facts) of a plan request, as the planner reads them."""
    if request.model:
        return model_config.model_facts(request.model["config"], request.model["total_size"],
                                        request.model.get("name"))
    config, total = model_config.load_model_dir(request.model_path)
    return model_config.model_facts(config, total, os.path.basename(str(request.model_path).rstrip("/")))


def backend_candidates(request, result, selection, tune_backends_value, tune_max, remeasure=False, failed=()):
    """Add the backend variants of topolaunch_tune_backends to the selection (tune_backends.py): PlanError with
    one line naming the field for a kind or value the installed release lacks, or a kind the operator set."""
    version = result["sglang_version"]
    index = FlagIndex(version)
    facts = SGLANG_FACTS[index.version]
    wanted, reasons = backend_variants.check(tune_backends_value, facts, version, request.server_args, index)
    if reasons:
        raise PlanError(reasons)
    selection["variants"], selection["backend_notes"] = {}, []
    if not wanted:
        return selection
    capabilities = planner._compute_capabilities(request)  # pylint: disable=protected-access
    variants, notes = backend_variants.candidates(wanted, facts, _model_facts(request), capabilities, version)
    selection["backend_notes"] = notes
    return backend_variants.add_variants(selection, variants, result["candidates"], tune_max, remeasure, failed)


def tune_plan(request, failures=None, tune_max=3, tune_remeasure=False, tune_layouts=None, tune_backends=None):
    """Plan a tune: the plan as `auto` (with this machine's fit), requested_layout tune, and the selection with its
    report lines. Returns (plan, fit to save or None, selection); PlanError for a bad tune_max, tune_layouts or
    tune_backends (topolaunch_tune_backends: backend_candidates)."""
    if isinstance(tune_max, bool) or not isinstance(tune_max, int) or tune_max < 1:
        raise PlanError(["tune_max (topolaunch_tune_max) must be a positive integer, got %r" % (tune_max,)])
    result, fit = plan_with_fit(request)
    result["requested_layout"] = "tune"
    failed = {r.get("layout") for r in of_this_machine(result, failures) if r.get("stage") in START_STAGES}
    selection = select(speculative_candidates(result["candidates"]), tune_max, remeasure=tune_remeasure,
                       listed=tune_layouts, failed=failed)
    if selection["reasons"]:
        raise PlanError(selection["reasons"], {"candidates": result["candidates"],
                                               "topology_fingerprint": result["topology_fingerprint"]})
    backend_candidates(request, result, selection, tune_backends, tune_max, tune_remeasure, failed)
    # what the starts cost (tune_start.py): the candidates start cheaper, for the bench's batch size only
    selection["start"] = tune_start.tune_cost(
        SGLANG_FACTS[result["sglang_version"]], result["memory"]["gpu_memory_bytes"], result["candidates"],
        selection["measure"], request.server_args or {}, _bench_batch_sizes(result, selection["measure"]))
    selection["report"] = report_lines(selection) + ["tune: " + n for n in selection["backend_notes"]] + \
        tune_start.cost_lines(selection["start"])
    return result, fit, selection
