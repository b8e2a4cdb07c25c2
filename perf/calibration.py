#!/usr/bin/env python3
"""How well the planner ranks published, measured layouts: tests/calibration/ replayed through the planner.

    .venv/bin/python perf/calibration.py

Prints, per case, the measured and the planned order, then the totals with the committed constants (winner
agreement: the planner's top measured layout is the winner or within 5% of it; pairwise order; the median
|log ratio error|, which is plan_perf.MODEL_ERROR), leave-one-out (the constants refitted without each case,
then that case predicted) and leave-one-source-out (refitted without every case of one source, then those
predicted). Goals: winner >= 85%, pairs >= 90%, each held-out figure no more than 10 points lower.
Exits 1 when a goal is missed. tools/calibration.py --fit --write refits the constants.
"""
import datetime
import sys

import _common
from ansible_collections.topolaunch.sglang.plugins.plugin_utils import calibration


def goals_met(report):
    """Winner >= 85%, pairs >= 90%, and neither held-out figure more than 10 points below its full-set one."""
    return (report["winner"] >= 0.85 and report["pairs"] >= 0.90
            and all(report[what] - report["%s_%s" % (held, what)] <= 0.10
                    for held in ("loo", "loso") for what in ("winner", "pairs")))


def main():
    cases = calibration.load_cases()
    print("calibration set: %d cases, %d GPU kinds, %s" % (
        len(cases), len({c["hardware"]["gpu"] for c in cases}), datetime.date.today().isoformat()))
    report = calibration.run(do_fit=False, loo=True)
    ok = goals_met(report)
    print("goals (winner >= 85%%, pairs >= 90%%, leave-one-out and leave-one-source-out within 10 points): %s"
          % ("met" if ok else "NOT MET"))
    _common.record("calibration", [_common.row(
        "the planner's ranking of %d published layout comparisons from %d sources (tests/calibration)"
        % (len(cases), len(report["sources"])),
        "winner %.0f%%, pairs %.0f%%, median log error %.3f; leave-one-out %.0f%% / %.0f%%; leave-one-source-out "
        "%.0f%% / %.0f%%" % (100 * report["winner"], 100 * report["pairs"], report["median_error"],
                             100 * report["loo_winner"], 100 * report["loo_pairs"], 100 * report["loso_winner"],
                             100 * report["loso_pairs"]),
        "winner >= 85%, pairs >= 90%, leave-one-out and leave-one-source-out within 10 points", ok)])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
