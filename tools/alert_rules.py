#!/usr/bin/env python3
"""The alert rules, checked and tested with the real promtool (`make rules`, a phase of `make test`).

    .venv/bin/python tools/alert_rules.py [--out build/rules] [--tests tests/rules]

promtool comes from the pinned Debian prometheus .deb (lab/repo/build.py DEBIAN_DEBS: downloaded once into
build/debian-debs/, its sha256 checked), extracted into build/promtool/; nothing is installed on this machine.
For each variant of tests/rules/settings.yml (the GPU exporter kinds, thresholds on top of the role's defaults)
the rules are rendered by the role's own filter (filter_plugins/monitoring.py monitoring_rules) into
OUT/<variant>.rules.yml, then

- `promtool check rules` on it;
- every alert must have a test file, tests/rules/<variant>/<Alert>.yml or tests/rules/common/<Alert>.yml, with at
  least one check where it must fire (exp_alerts not empty) and one where it must not (exp_alerts: []);
- `promtool test rules` on every test file (a copy in OUT/tests/ whose rule_files names the rendered file): a
  rule that should fire and does not, or fires when it should not, fails.

Exit status 0 when all pass; otherwise 1, with promtool's output and one line per problem.
"""
import argparse
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEFAULTS = ROOT / "roles/monitoring/defaults/main.yml"
PREFIX = "monitoring_alert_"


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def promtool(out_dir):
    """build/promtool/usr/bin/promtool from the pinned prometheus .deb (extracted once)."""
    tool = out_dir / "usr/bin/promtool"
    build = _load(ROOT / "lab/repo/build.py", "lab_repo_build")
    deb = build.debian_deb("prometheus")
    stamp = out_dir / ".from"
    if tool.is_file() and stamp.is_file() and stamp.read_text() == deb.name:
        return tool
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    tar = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out_dir), "./usr/bin/promtool"], input=tar, check=True)
    stamp.write_text(deb.name)
    return tool


def default_settings():
    """The role's plain (untemplated) monitoring_alert_* defaults, without the prefix."""
    defaults = yaml.safe_load(DEFAULTS.read_text())
    out = {k[len(PREFIX):]: v for k, v in defaults.items()
           if k.startswith(PREFIX) and not (isinstance(v, str) and "{{" in v)}
    out["gpu_exporter"] = defaults["monitoring_gpu_exporter"]
    return out


def alerts_of(rules):
    return [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]


def test_file_problems(path, alert):
    """Why a test file does not test `alert` both ways ([] when it does)."""
    doc = yaml.safe_load(path.read_text()) or {}
    checks = [c for t in doc.get("tests") or [] for c in t.get("alert_rule_test") or [] if c.get("alertname") == alert]
    problems = []
    if not any(c.get("exp_alerts") for c in checks):
        problems.append(f"{path}: no check where {alert} must fire (exp_alerts not empty)")
    if not any("exp_alerts" in c and not c["exp_alerts"] for c in checks):
        problems.append(f"{path}: no check where {alert} must not fire (exp_alerts: [])")
    if doc.get("rule_files"):
        problems.append(f"{path}: leave rule_files out (the rendered rules file is put in)")
    return problems


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "build/rules")
    ap.add_argument("--tests", type=Path, default=ROOT / "tests/rules")
    ap.add_argument("--promtool", type=Path, help="a promtool to use (default: the pinned .deb's)")
    args = ap.parse_args(argv)
    tool = args.promtool or promtool(ROOT / "build/promtool")
    monitoring = _load(ROOT / "filter_plugins/monitoring.py", "monitoring_filters")
    variants = yaml.safe_load((args.tests / "settings.yml").read_text())["variants"]
    if args.out.exists():
        shutil.rmtree(args.out)
    (args.out / "tests").mkdir(parents=True)
    problems, runs = [], []
    for name, overrides in variants.items():
        rules = monitoring.monitoring_rules(dict(default_settings(), **(overrides or {})))
        rendered = args.out / f"{name}.rules.yml"
        rendered.write_text(yaml.safe_dump(rules, sort_keys=False, width=1000))
        check = subprocess.run([str(tool), "check", "rules", str(rendered)], capture_output=True, text=True)
        print(check.stdout.strip() or check.stderr.strip())
        if check.returncode != 0:
            problems.append(f"promtool check rules {rendered} failed:\n{check.stdout}{check.stderr}")
            continue
        for alert in alerts_of(rules):
            found = [d / f"{alert}.yml" for d in (args.tests / name, args.tests / "common") if (d / f"{alert}.yml").is_file()]
            if not found:
                problems.append(f"alert {alert} ({name}) has no test file: {args.tests / name / (alert + '.yml')} or "
                                f"{args.tests / 'common' / (alert + '.yml')}")
                continue
            problems += test_file_problems(found[0], alert)
            doc = yaml.safe_load(found[0].read_text())
            doc["rule_files"] = [str(rendered.resolve())]
            copy = args.out / "tests" / f"{name}-{alert}.yml"
            copy.write_text(yaml.safe_dump(doc, sort_keys=False, width=1000))
            runs.append(copy)
    if runs:
        test = subprocess.run([str(tool), "test", "rules", *map(str, runs)], capture_output=True, text=True)
        print(test.stdout.strip(), test.stderr.strip(), sep="\n" if test.stderr.strip() else "")
        if test.returncode != 0:
            problems.append(f"promtool test rules failed (rc {test.returncode}): see above")
    for p in problems:
        print("FAIL: " + p, file=sys.stderr)
    if not problems:
        print(f"alert rules: {len(variants)} variants checked, {len(runs)} rule test files passed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
