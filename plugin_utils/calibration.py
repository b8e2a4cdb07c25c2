"""Replay the calibration set (tests/calibration/cases.yml) through the planner and score its ranking.

Controller-only code (the command is tools/calibration.py; perf/calibration.py and the unit tests call run()):

    tools/calibration.py                 per case: measured and planned order; totals; leave-one-out and
                                         leave-one-source-out
    tools/calibration.py --fit           also fit the efficiency constants (plan_perf.EFFICIENCY) to the set
    tools/calibration.py --fit --write   and write them, with MODEL_ERROR, into plan_perf.py
    tools/calibration.py --json FILE     the figures as JSON
    tools/calibration.py --server-args '{"max_running_requests": 1024}'   every case as launched with them

Every case is planned on its GPU spec (read through the real topology reader from NVML answers synthesised from
the spec) and its model directory, at its workload. For each measured layout the planner's estimate is compared with the measurement:

  winner   the planner's top layout among the measured ones is the measured winner or within 5% of it
  pairs    every pair of measured layouts is ordered as measured (a pair measured within 5% is a tie: any
           order counts as right)
  error    per pair |log(predicted ratio / measured ratio)|: its median is plan_perf.MODEL_ERROR
  leave-one-out   the constants fitted without the case, then the case predicted
  leave-one-source-out   the constants fitted without every case of the case's source (case_source), then those
                  cases predicted

A layout the planner refuses (does not fit, a rule) predicts 0 tok/s.
"""
import argparse
import json
import math
import pathlib
import sys
import tempfile

import yaml

from ansible_collections.topolaunch.sglang.plugins.module_utils import plan_perf, planner
from ansible_collections.topolaunch.sglang.plugins.module_utils.plan_fit import FIT, coordinate_search, median
from ansible_collections.topolaunch.sglang.plugins.module_utils.plan_fit import predict as predict_inputs
from ansible_collections.topolaunch.sglang.plugins.plugin_utils import spec_facts

# The repository the set lives in: this file's through the collection's symlinked view (tests that import the
# built collection set it to their own checkout).
ROOT = pathlib.Path(__file__).resolve().parents[1]
TIE = 0.05
# What the fit may move is plan_fit.FIT: bounds, the physically expected value (the prior) and how far, in log terms,
# the fit may pull it - a fit with a prior, so that a few cases cannot drag a constant anywhere. This is the weight
# of that pull in the objective.
PRIOR_WEIGHT = 4.0


def load_cases(path=None):
    with open(path or ROOT / "tests" / "calibration" / "cases.yml", encoding="utf-8") as f:
        return yaml.safe_load(f)["cases"]


def spec_path(name):
    for base in (ROOT / "tests" / "calibration" / "specs", ROOT / "lab" / "specs"):
        if (base / (name + ".json")).is_file():
            return base / (name + ".json")
    raise SystemExit("calibration: spec %s not found in tests/calibration/specs or lab/specs" % name)


OFFLINE_CONCURRENCY = 4096   # an offline run (every request at once) without a count: SGLang's largest request pool


def case_workload(case):
    w = case["workload"]
    concurrency = w.get("concurrency") or w.get("num_prompts") or OFFLINE_CONCURRENCY
    return {"input_len": int(w["input_len"]), "output_len": int(w["output_len"]), "concurrency": int(concurrency)}


def replay(case, tmp, server_args=None):
    """{layout: estimate inputs or None (refused)} for the measured layouts of a case, and their measured values;
    server_args (ServerArgs names) replays every layout as launched with them."""
    nodes = int(case["hardware"].get("nodes") or 1)
    facts = spec_facts.facts_from_spec(str(spec_path(case["spec"])), tmp)
    request = planner.PlanRequest(
        node_topologies=[facts] * nodes, nnodes=nodes, dist_init_addr="10.0.0.1:50000" if nodes > 1 else None,
        model_path=str(ROOT / case["model"]["config"]), workload=case_workload(case),
        sglang_version="0.5.9", allow_cross_node_tp=True,   # a measured layout is replayed as it ran
        server_args=server_args)
    layouts = []
    for m in case["measured"]:
        layout = planner.parse_layout(m["layout"])
        if m.get("attention_dp"):
            layout["attn_dp"] = layout["tp"]    # TensorRT-LLM's DEPn: attention data parallel over the TP group
        layouts.append(layout)
    entries = []
    for m, cand in zip(case["measured"], planner.evaluate_layouts(request, layouts)):
        # a layout the pinned SGLang's rules refuse but another engine or version ran is still estimated
        inputs = cand["estimate"]["inputs"] if cand and cand.get("estimate") else None
        if inputs and m.get("replicas"):
            # measured as ONE replica serving the whole benchmark, then multiplied (the source's own scaling):
            # each modelled replica sees the full concurrency
            inputs = dict(inputs, workload=dict(inputs["workload"],
                                                concurrency=inputs["workload"]["concurrency"] * m["replicas"]))
        value = m.get("output_tokens_per_s", m.get("ratio"))
        # label: how the report names a layout when two measured ones share a layout name (attention DP or not)
        entries.append({"layout": m.get("label", m["layout"]), "measured": float(value), "inputs": inputs,
                        "refused": None if cand and cand["valid"] else (cand["reasons"] if cand else ["not a candidate"])})
    return entries


def predict(entry, eff):
    return predict_inputs(entry["inputs"], eff)


def score_case(entries, eff):
    """(winner right, pairs right, pairs, [log errors]) of one case."""
    preds = [predict(e, eff) for e in entries]
    meas = [e["measured"] for e in entries]
    top = max(range(len(entries)), key=lambda k: preds[k])
    winner = meas[top] >= (1 - TIE) * max(meas)
    right, total, errors = 0, 0, []
    for a in range(len(entries)):
        for b in range(a + 1, len(entries)):
            total += 1
            tie = abs(meas[a] / meas[b] - 1) <= TIE
            if tie or (preds[a] - preds[b]) * (meas[a] - meas[b]) > 0:
                right += 1
            if preds[a] > 0 and preds[b] > 0:
                errors.append(abs(math.log((preds[a] / preds[b]) / (meas[a] / meas[b]))))
            else:
                errors.append(math.log(10.0))    # a refused layout that was measured: a large miss
    return winner, right, total, errors, preds


def totals(cases, eff):
    w = r = t = 0
    errors = []
    for entries in cases:
        winner, right, total, errs = score_case(entries, eff)[:4]
        w += winner
        r += right
        t += total
        errors.extend(errs)
    return {"winner": w, "cases": len(cases), "pairs_right": r, "pairs": t, "errors": errors}


def priors():
    """The efficiencies at their physically expected values (where every fit starts)."""
    eff = dict(plan_perf.EFFICIENCY)
    eff.update({k: bounds[2] for k, bounds in FIT.items()})
    return eff


def objective(cases, eff):
    """What the fit minimises: rank errors (winners missed + pairs misordered), then half the mean absolute
    log-ratio error, plus the prior's pull (each constant's |log(value / expected)| / its width). A constant moves
    far from its physical value only when that fixes several rank errors at once."""
    s = totals(cases, eff)
    wrong = (s["cases"] - s["winner"]) + (s["pairs"] - s["pairs_right"])
    misfit = sum(s["errors"]) / max(1, len(s["errors"]))
    prior = sum(abs(math.log(eff[k]) - math.log(bounds[2])) / bounds[3] for k, bounds in FIT.items())
    return wrong + 0.5 * misfit + PRIOR_WEIGHT * prior


def fit(cases, start=None, rounds=3, points=13):
    """Coordinate search (plan_fit.coordinate_search) of every FIT constant against objective(); deterministic."""
    return coordinate_search(lambda eff: objective(cases, eff), start or priors(), list(FIT), rounds, points)


def run(do_fit=False, loo=True, out=sys.stdout, server_args=None):
    raw = load_cases()
    with tempfile.TemporaryDirectory() as tmp:
        cases = [replay(c, pathlib.Path(tmp) / c["id"], server_args) for c in raw]
    eff = fit(cases) if do_fit else dict(plan_perf.EFFICIENCY)
    report = {"cases": [], "efficiency": eff}
    for case, entries in zip(raw, cases):
        winner, right, total, errors, preds = score_case(entries, eff)
        measured_order = [e["layout"] for e in sorted(entries, key=lambda e: -e["measured"])]
        planned_order = [entries[k]["layout"] for k in sorted(range(len(entries)), key=lambda k: -preds[k])]
        report["cases"].append({"id": case["id"], "winner_right": winner, "pairs_right": right, "pairs": total,
                                "measured": {e["layout"]: e["measured"] for e in entries},
                                "predicted": {e["layout"]: p for e, p in zip(entries, preds)},
                                "refused": {e["layout"]: e["refused"] for e in entries if e["refused"]},
                                "measured_order": measured_order, "planned_order": planned_order})
        planned = " > ".join("%s %s" % (entries[k]["layout"], ("%.0f" if preds[k] >= 10 else "%.3g") % preds[k])
                             for k in sorted(range(len(entries)), key=lambda k: -preds[k]))
        refused = [e["layout"] for e in entries if e["refused"]]
        print("%-3s %-44s measured %-40s planned %s%s" % (
            "ok" if winner else "MISS", case["id"], " > ".join(measured_order), planned,
            "  (refused by SGLang 0.5.9's rules: %s)" % ", ".join(refused) if refused else ""), file=out)
    s = totals(cases, eff)
    report["winner"] = s["winner"] / float(s["cases"])
    report["pairs"] = s["pairs_right"] / float(s["pairs"])
    report["median_error"] = median(s["errors"])
    print("winner agreement %d/%d (%.0f%%), pairwise order %d/%d (%.0f%%), median |log ratio error| %.3f" % (
        s["winner"], s["cases"], 100 * report["winner"], s["pairs_right"], s["pairs"], 100 * report["pairs"],
        report["median_error"]), file=out)
    if loo:
        groups = [[k] for k in range(len(cases))]
        w, r, t = held_out(cases, groups, eff, report, "loo")
        report["loo_winner"] = w / float(len(cases))
        report["loo_pairs"] = r / float(t)
        print("leave-one-out: winner agreement %d/%d (%.0f%%), pairwise order %d/%d (%.0f%%)" % (
            w, len(cases), 100 * report["loo_winner"], r, t, 100 * report["loo_pairs"]), file=out)
        sources = {}
        for k, case in enumerate(raw):
            sources.setdefault(case_source(case), []).append(k)
        w, r, t = held_out(cases, list(sources.values()), eff, report, "loso")
        report["sources"] = {name: [raw[k]["id"] for k in ks] for name, ks in sources.items()}
        report["loso_winner"] = w / float(len(cases))
        report["loso_pairs"] = r / float(t)
        print("leave-one-source-out (%d sources): winner agreement %d/%d (%.0f%%), pairwise order %d/%d (%.0f%%)" % (
            len(sources), w, len(cases), 100 * report["loso_winner"], r, t, 100 * report["loso_pairs"]), file=out)
    return report


def case_source(case):
    """Who published a case: its citation's repository (NVIDIA/TensorRT-LLM, gpustack/gpustack, the project's
    field record), else the host of its address. Leave-one-source-out holds out every case of one source at once, so
    that cases a source measured alike cannot vouch for each other."""
    citation = case.get("citation") or {}
    if citation.get("repo"):
        return str(citation["repo"])
    if citation.get("url"):
        return str(citation["url"]).split("//", 1)[-1].split("/", 1)[0]
    return case["id"]


def held_out(cases, groups, eff, report, key):
    """Each group of cases predicted with the constants fitted without it: (winners right, pairs right, pairs);
    report["cases"][k][key] says how case k fared and which constants moved."""
    w = r = t = 0
    for group in groups:
        others = [c for k, c in enumerate(cases) if k not in group]
        eff_g = fit(others, start=eff)
        for k in group:
            winner, right, total = score_case(cases[k], eff_g)[:3]
            w, r, t = w + winner, r + right, t + total
            report["cases"][k][key] = {"winner_right": winner, "pairs_right": right,
                                       "changed": {name: round(v, 3) for name, v in eff_g.items()
                                                   if abs(v - eff[name]) > 1e-9}}
    return w, r, t


def write_constants(eff, error, path=None):
    """Put the fitted efficiencies and the model's error into plan_perf.py (their lines keep their comments)."""
    import re
    path = path or pathlib.Path(plan_perf.__file__).resolve()
    text = path.read_text()
    for key, value in eff.items():
        text = re.sub(r'(\n    "%s": )[-0-9.e]+(,)' % re.escape(key), r"\g<1>%s\g<2>" % _short(value), text, count=1)
    text = re.sub(r"\nMODEL_ERROR = [0-9.]+", "\nMODEL_ERROR = %.3f" % error, text, count=1)
    path.write_text(text)
    print("wrote the fitted constants and MODEL_ERROR %.3f into %s" % (error, path))


def _short(value):
    return repr(float("%.4g" % value))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit", action="store_true", help="fit the efficiency constants to the set")
    parser.add_argument("--no-loo", action="store_true", help="skip leave-one-out and leave-one-source-out")
    parser.add_argument("--json", help="write the figures as JSON to this file")
    parser.add_argument("--server-args", type=json.loads, default=None, metavar="JSON",
                        help='replay every case launched with these server args, e.g. \'{"max_running_requests": 1024}\'')
    parser.add_argument("--write", action="store_true",
                        help="with --fit: write the fitted constants and the model's error into plan_perf.py")
    args = parser.parse_args(argv)
    if args.server_args is not None and not isinstance(args.server_args, dict):
        parser.error("--server-args must be a JSON object of ServerArgs names, got %r" % (args.server_args,))
    report = run(do_fit=args.fit, loo=not args.no_loo, server_args=args.server_args)
    if args.write:
        write_constants(report["efficiency"], report["median_error"])
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1, default=str)
    return 0
