#!/usr/bin/env python3
"""What the plan predicts a tune's starts cost on the field box: a tune candidate's start (the decode CUDA graph
for the bench's batch size only, the multi-threaded loader where the release's default is off) against a normal
launch, per layout the tune measures, and the whole tune's starts (module_utils/topolaunch/tune_start.py).

    make fakenvml && .venv/bin/python perf/tune_start.py [--spec NAME] [--model NAME]

The field spec's topology is read through the lab's fake libnvidia-ml.so.1 (as perf/plan_speed.py does), the
workload is topolaunch's default (roles/topolaunch/defaults/main.yml), both supported SGLang releases. Goal: every
candidate starts in less time than its normal launch. Exits 1 when one does not. No GPU: the figures are the
model's (the field knowledge base's start: 7-8 minutes, ~208 s of it graph capture), not measurements.
"""
import argparse
import os
import pathlib
import sys

import yaml

import _common
from plan_speed import read_facts
from ansible_collections.topolaunch.sglang.plugins.module_utils import planner, tune

ROOT = pathlib.Path(__file__).resolve().parent.parent


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", default="proxmox-8x-rtx-pro-6000-vnuma")
    parser.add_argument("--model", default="glm-5-nvfp4", help="a folder of tests/fixtures/models")
    parser.add_argument("--lib", default=str(ROOT / "build" / "fakenvml" / "libnvidia-ml.so.1"))
    args = parser.parse_args()
    if not os.path.isfile(args.lib):
        parser.exit(2, "tune_start: %s is missing: run `make fakenvml` first\n" % args.lib)
    facts = read_facts(args.lib, args.spec)
    defaults = yaml.safe_load((ROOT / "roles" / "topolaunch" / "defaults" / "main.yml").read_text())
    workload = defaults["topolaunch_workload"]
    model_path = str(ROOT / "tests" / "fixtures" / "models" / args.model)
    rows, details, met = [], {}, True
    for version in sorted(planner.SGLANG_FACTS, key=lambda v: [int(p) for p in v.split(".")]):
        request = planner.PlanRequest(topology=facts, model_path=model_path, workload=workload,
                                      sglang_version=version)
        cost = tune.tune_plan(request)[2]["start"]
        details[version] = cost
        for name, parts in cost["layouts"].items():
            cand, normal = parts["candidate"], parts["normal"]
            ok = cand["total_s"] < normal["total_s"]
            met &= ok
            print("SGLang %-6s %-10s candidate %6.0f s (weights %4.0f s, %3d graph sizes %4.0f s)   normal %6.0f s "
                  "(weights %4.0f s, %3d graph sizes %4.0f s)%s" % (
                      version, name, cand["total_s"], cand["weights_s"], cand["decode_sizes"] + cand["prefill_sizes"],
                      cand["capture_s"], normal["total_s"], normal["weights_s"],
                      normal["decode_sizes"] + normal["prefill_sizes"], normal["capture_s"], "" if ok else "  NOT SHORTER"))
        first = cost["layouts"][next(iter(cost["layouts"]))] if cost["layouts"] else None
        print("SGLang %-6s tune of %s: starts %.0f s for %d candidates (%.0f s saved) + %.0f s for the winner = %.0f s"
              % (version, ", ".join(cost["layouts"]), cost["candidates_s"], len(cost["layouts"]), cost["saved_s"],
                 cost["winner_s"], cost["total_s"]))
        if first:
            rows.append(_common.row(
                "predicted start of a tune candidate vs a normal launch (%s, %s, SGLang %s, %s)" % (
                    args.spec, args.model, version, next(iter(cost["layouts"]))),
                "%.0f s vs %.0f s; the tune's starts %.0f s (%d candidates + the winner), %.0f s saved" % (
                    first["candidate"]["total_s"], first["normal"]["total_s"], cost["total_s"],
                    len(cost["layouts"]), cost["saved_s"]),
                "candidate shorter", first["candidate"]["total_s"] < first["normal"]["total_s"]))
    _common.record("tune_start", rows, workload=workload, releases=details)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
