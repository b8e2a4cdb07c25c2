"""Fitting the performance model's efficiency constants to measurements, and the fit of one machine.

Plain Python 3.9+ stdlib; runs on the host (inside sglang_plan) and on the controller (plugin_utils/calibration.py).
Two users of one machinery (FIT's bounds and widths, a coordinate search over them):

- the calibration set (plugin_utils/calibration.py): published measurements of many machines, fitted once into
  plan_perf.EFFICIENCY;
- one machine (this file's fit_machine, through plan_with_fit): the served-throughput measurements of layouts on
  one topology fingerprint and model (what a tune or a sweep measured) correct the estimates of the layouts not yet
  measured there. The fit starts from, and is pulled towards, plan_perf's committed values; it moves only the
  constants the measurements determine, and only ratios between layouts measured at one workload count (the
  absolute speed of a machine is not what a layout choice needs, and the lab's simulator runs on its own time
  scale). The fit is kept on the controller in results/<model>/<fingerprint>/fit.json and given back to the
  planner (PlanRequest.fits); it is made again when the measurements it was made from change.

Precedence in the plan: a measurement at the workload ranks first (the planner), the fit corrects the estimates of
the others, preflight link measurements correct link speeds (other constants than these), the tables the rest.
"""
import math

from . import plan_perf, planner
from .plan_score import estimate

# What a fit may move: (lower bound, upper bound, physically expected value, log width). The calibration fit pulls
# each constant towards its expected value; a machine's fit towards plan_perf's committed (calibrated) value; the
# width says how far, in log terms, the pull lets it go before it costs as much as a misfit.
FIT = {
    "gemm": (0.2, 0.95, 0.70, 0.3),
    "attention": (0.1, 0.9, 0.50, 0.5),
    "memory": (0.4, 0.95, 0.80, 0.2),
    "layer_us": (2.0, 400.0, 20.0, 1.5),
    "eager_factor": (1.0, 20.0, 4.0, 1.0),
    "step_ms": (0.1, 30.0, 1.5, 1.5),
    "request_us": (0.5, 200.0, 12.0, 1.5),
    "ep_skew": (0.01, 1.0, 0.15, 1.5),
}
# A machine's fit: how much the pull towards the committed constants weighs against the mean squared ratio error.
MACHINE_PRIOR_WEIGHT = 0.02
# A constant is determined by the measurements when doubling it moves some measured ratio by at least this much
# (in log terms, per unit of log change of the constant) beyond what the constants already chosen explain.
DETERMINED = 0.05
# Fewer independent ratios than this make a poor fit (a fit with few points is said to be poor).
GOOD_FIT_RATIOS = 3


def predict(inputs, eff):
    """Estimated output tok/s of one evaluated layout (the planner's estimate inputs) with the constants eff."""
    if not inputs:
        return 0.0
    i = inputs
    return estimate(i["model"], i["layout"], i["stages"], i["links"], i["gpu"], i["workload"], i["kv_tokens"],
                    i["settings"], shape=i["shape"], eff=eff)["tokens_per_s"]


def median(values):
    v = sorted(values)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2.0 if v else 0.0


def coordinate_search(objective, start, keys, rounds=3, points=13, refine=0):
    """Minimise objective(eff) over the constants `keys` within FIT's bounds: each constant in turn over its whole
    range (log-spaced points between its bounds), kept at the best value, the others held; then `refine` times
    over the grid step around it, each time a finer grid. A few rounds. Deterministic, and it crosses the plateaus
    that rank counts make."""
    eff = dict(start)
    best = objective(eff)
    for _round in range(rounds):
        moved = False
        for key in keys:
            lo, hi = FIT[key][:2]
            grid = [lo * (hi / lo) ** (k / (points - 1.0)) for k in range(points)]
            step = (hi / lo) ** (1.0 / (points - 1.0))
            for _level in range(refine + 1):
                for value in grid:
                    trial = dict(eff)
                    trial[key] = value
                    score = objective(trial)
                    if score < best - 1e-9:
                        best, eff, moved = score, trial, True
                half = points // 2
                grid = [min(hi, max(lo, eff[key] * step ** (k / float(half)))) for k in range(-half, half + 1)]
                step = step ** (1.0 / half)
        if not moved:
            break
    return eff


# ----------------------------------------------------------------------------------------------------- a machine


def ratio_errors(points, eff):
    """log((predicted a / predicted b) / (measured a / measured b)) for every pair of layouts measured at one
    workload. points: [{workload, layout, inputs, measured}]."""
    groups = {}
    for p in points:
        groups.setdefault(_workload_key(p["workload"]), []).append(p)
    errors = []
    for group in groups.values():
        preds = [predict(p["inputs"], eff) for p in group]
        for a in range(len(group)):
            for b in range(a + 1, len(group)):
                if preds[a] > 0 and preds[b] > 0:
                    errors.append(math.log((preds[a] / preds[b]) / (group[a]["measured"] / group[b]["measured"])))
    return errors


def _workload_key(w):
    return (w["input_len"], w["output_len"], w["concurrency"])


def _independent(points):
    """How many independent ratios the points give: per workload, the layouts measured there less one."""
    per = {}
    for p in points:
        per.setdefault(_workload_key(p["workload"]), set()).add(p["layout"])
    return sum(len(layouts) - 1 for layouts in per.values())


def determined_constants(points, base, limit):
    """The constants the measured ratios determine, most telling first, at most `limit`: each constant's effect on
    the ratios (d error / d log constant) less what the constants already chosen explain (Gram-Schmidt), kept
    while it is at least DETERMINED."""
    here = ratio_errors(points, base)
    effects = {}
    for key in FIT:
        trial = dict(base)
        trial[key] = base[key] * 2.0
        effects[key] = [(e2 - e1) / math.log(2.0) for e1, e2 in zip(here, ratio_errors(points, trial))]
    chosen, basis = [], []
    while len(chosen) < limit:
        best, best_norm, best_vec = None, DETERMINED, None
        for key, vec in effects.items():
            if key in chosen:
                continue
            rest = list(vec)
            for b in basis:
                dot = sum(x * y for x, y in zip(rest, b))
                rest = [x - dot * y for x, y in zip(rest, b)]
            norm = math.sqrt(sum(x * x for x in rest) / max(1, len(rest)))
            if norm > best_norm:
                best, best_norm, best_vec = key, norm, rest
        if best is None:
            break
        chosen.append(best)
        length = math.sqrt(sum(x * x for x in best_vec))
        basis.append([x / length for x in best_vec])
    return chosen


def fit_machine(points, base=None, error=None):
    """The fit of one machine's measured points [{workload, layout, inputs, measured}]: {efficiency (the constants
    moved), constants (their names), points, ratios (independent), error_before, error_after (median |log ratio
    error| with the committed constants and with the fit), quality (good/poor/none), why}."""
    base = dict(base or plan_perf.EFFICIENCY)
    error = plan_perf.MODEL_ERROR if error is None else error
    independent = _independent(points)
    before = [abs(e) for e in ratio_errors(points, base)]
    out = {"points": len(points), "ratios": independent, "constants": [], "efficiency": {},
           "error_before": round(median(before), 4) if before else None, "error_after": None}
    if independent == 0:
        return dict(out, quality="none", why=("no fit: it needs two layouts measured at one workload (%d measured "
                                              "point%s)" % (len(points), "" if len(points) == 1 else "s")))
    keys = determined_constants(points, base, independent)
    eff = base
    if keys:
        def objective(trial):
            errs = ratio_errors(points, trial)
            pull = sum(((math.log(trial[k]) - math.log(base[k])) / FIT[k][3]) ** 2 for k in keys)
            return sum(e * e for e in errs) / max(1, len(errs)) + MACHINE_PRIOR_WEIGHT * pull
        eff = coordinate_search(objective, base, keys, rounds=3, points=13, refine=2)
    after = [abs(e) for e in ratio_errors(points, eff)]
    moved = {k: _short(eff[k]) for k in keys if abs(eff[k] / base[k] - 1) > 1e-6}
    out.update(constants=sorted(moved), efficiency=moved, error_after=round(median(after), 4))
    poor = []
    if independent < GOOD_FIT_RATIOS:
        poor.append("few points: %d independent ratio%s between measured layouts (%d or more make a good fit)"
                    % (independent, "" if independent == 1 else "s", GOOD_FIT_RATIOS))
    fitted_error = out["error_after"] or 0.0
    if fitted_error > error:
        poor.append("its error on these measurements (%.3f) is above the model's on the calibration set (%.3f)"
                    % (fitted_error, error))
    if not moved:
        poor.append("no constant moved")
    return dict(out, quality="poor" if poor else "good", why="; ".join(poor))


def _short(value):
    return float("%.4g" % value)


# ----------------------------------------------------------------------------------------------------- planning


def basis_of(records):
    """What a fit was made from: (layout, concurrency, input, output, run id) of each record, sorted."""
    return sorted([str(r.get("layout")), r.get("max_concurrency"), r.get("input_len"), r.get("output_len"),
                   str(r.get("run_id"))] for r in records)


def of_this_machine(plan_result, records):
    """The records (measured results, failures) of the plan's model and topology: the names and fingerprints the
    planner matches measurements by."""
    names = {plan_result.get("model_name"), plan_result.get("served_model_name")} - {None}
    path = str(plan_result.get("model_path") or "").rstrip("/")
    if path:
        names.add(path.rsplit("/", maxsplit=1)[-1])
    prints = {plan_result.get("topology_fingerprint"), plan_result.get("cluster_fingerprint")}
    prints.update(n.get("topology_fingerprint") for n in plan_result.get("per_node") or [])
    return [rec for rec in records or [] if isinstance(rec, dict) and rec.get("model") in names
            and rec.get("topology_fingerprint") in prints]


def records_of(plan_result, measured):
    """The measured records of the plan's model and topology (numbers only)."""
    return [rec for rec in of_this_machine(plan_result, measured)
            if all(_number(rec.get(k)) for k in ("output_throughput", "max_concurrency", "input_len", "output_len"))
            and rec["output_throughput"] > 0]


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def machine_points(request, records):
    """The planner's estimate inputs of every measured layout at its workload, with the committed constants."""
    by_workload = {}
    for rec in records:
        w = {"input_len": int(rec["input_len"]), "output_len": int(rec["output_len"]),
             "concurrency": int(rec["max_concurrency"])}
        by_workload.setdefault(_workload_key(w), (w, {}))[1][rec["layout"]] = rec
    points = []
    for _key, (w, recs) in sorted(by_workload.items()):
        fields = {name: getattr(request, name) for name in planner.PlanRequest.FIELDS}
        # plain layouts, as measured without speculative decoding (a layout+nextn record is not fitted: the fit's
        # constants are the target model's; the accept length is its own figure)
        fields.update(workload=w, fits=None, measured=None, layout="auto", speculative="off")
        names = sorted(recs)
        layouts = []
        for name in names:
            try:
                layouts.append(planner.parse_layout(name))
            except planner.PlanError:
                layouts.append(None)
        wanted = [l for l in layouts if isinstance(l, dict)]
        evaluated = iter(planner.evaluate_layouts(planner.PlanRequest(**fields), wanted))
        for name, layout in zip(names, layouts):
            cand = next(evaluated) if isinstance(layout, dict) else None
            inputs = (cand.get("estimate") or {}).get("inputs") if cand else None
            if inputs and predict(inputs, plan_perf.EFFICIENCY) > 0:
                points.append({"workload": w, "layout": name, "inputs": inputs,
                               "measured": float(recs[name]["output_throughput"])})
    return points


def plan_with_fit(request):
    """plan(request) with this machine's fit. request.fits holds the saved fits (the planner applies the one of this
    model and topology); when the measurements of this machine (request.measured) are not the ones that fit was
    made from, a new fit is made and the plan made again with it.

    Returns (plan, fit record to save or None when the one used is up to date or there are no measurements)."""
    result = planner.plan(request)
    records = records_of(result, request.measured)
    basis = basis_of(records)
    used = result.get("fit") or {}
    if not records or used.get("basis") == basis:
        return result, None
    fit = fit_machine(machine_points(request, records))
    record = dict(fit, model=result["model_name"], topology_fingerprint=result["topology_fingerprint"], basis=basis)
    others = [f for f in request.fits or [] if not (isinstance(f, dict) and f.get("model") == record["model"]
                                                    and f.get("topology_fingerprint") == record["topology_fingerprint"])]
    fields = {name: getattr(request, name) for name in planner.PlanRequest.FIELDS}
    fields["fits"] = others + [record]
    return planner.plan(planner.PlanRequest(**fields)), record
