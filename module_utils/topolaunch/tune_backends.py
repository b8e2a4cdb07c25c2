"""Backends as tune candidates (topolaunch_tune_backends): which backend values a tune measures besides the layouts.

Plain Python 3.9+ stdlib. topolaunch_tune_backends names backend kinds (sglang_facts_*.BACKENDS: moe_runner_backend,
attention_backend, fp4_gemm_backend, fp8_gemm_backend where the release has the flag), as

    a list of kinds         [moe_runner_backend]: the values the known-combinations table ranks close for this GPU
                            and model (known_combinations.BACKEND_RULES close), those the installed release offers
    a mapping kind: values  {moe_runner_backend: [cutlass, triton]}: these values (each one of the release's choices)

The release's default (the flag's default: what the layout runs without the flag) is the layout itself; every other
value is an extra candidate of the layout the tune ranks first (tune.select's chosen[0]), named
<layout>+<kind>.<value> (variant_name; the name its measurements are filed under), up to topolaunch_tune_max
candidates in all. A value a rule calls unsupported here is never measured. A kind the release lacks, a value that
is not one of its choices, a kind the operator set in server_args: one-line errors naming topolaunch_tune_backends.
The plan of a measured variant records its backends (plan.backends, plan.layout.variant); planner.plan launches the
measured winner with them.
"""
from . import known_combinations, plan_speculative

FIELD = "topolaunch_tune_backends"
SEP = "+"


def variant_name(layout, backends):
    """tp8+moe_runner_backend.cutlass: a layout with backend values (kinds sorted)."""
    return layout + "".join("%s%s.%s" % (SEP, kind, value) for kind, value in sorted((backends or {}).items()))


def split_variant(name):
    """(layout name, {kind: value}) of a variant name; a plain layout name (or any other text) gives {}."""
    if not isinstance(name, str) or SEP not in name:
        return name, {}
    head, *parts = name.split(SEP)
    if not parts or not all("." in p and p.split(".", 1)[0] and p.split(".", 1)[1] for p in parts):
        return name, {}
    return head, dict(p.split(".", 1) for p in parts)


def base_layout(name):
    """The layout a tune candidate starts as: its name without a backend variant or the speculative suffix
    (plan_speculative.split_name: tp8ep8+nextn)."""
    return split_variant(plan_speculative.split_name(name)[0])[0]


def kinds_of(facts):
    """{kind: {flag, field, default, choices}} of the release (facts: its sglang_facts module)."""
    return {k: v for k, v in (getattr(facts, "BACKENDS", None) or {}).items() if v}


def _kind(name, kinds):
    """The kind a name means: the kind itself, or its ServerArgs field (fp8_gemm_runner_backend)."""
    if name in kinds:
        return name
    return next((k for k, v in kinds.items() if v["field"] == name), None)


def check(value, facts, version, server_args=None, index=None):
    """({kind: [values] or None (the table's close ones)}, reasons) of a topolaunch_tune_backends value.

    index: the release's plan_args.FlagIndex (a server arg spelled any way counts as set)."""
    if value in (None, "", [], {}):
        return {}, []
    kinds = kinds_of(facts)
    names = ", ".join(sorted(kinds)) or "none"
    if isinstance(value, str):
        value = [value]
    if isinstance(value, list):
        items = [(v, None) for v in value]
    elif isinstance(value, dict):
        items = list(value.items())
    else:
        return {}, ["%s must be a list of backend kinds (%s) or a mapping kind: [values], got %r"
                    % (FIELD, names, value)]
    wanted, reasons = {}, []
    set_by = {}
    for key in (server_args or {}) if isinstance(server_args, dict) else ():
        set_by[index.by_name.get(key, key) if index is not None else key] = key
    for name, values in items:
        kind = _kind(name, kinds) if isinstance(name, str) else None
        if kind is None:
            reasons.append("%s: %r is not a backend kind of SGLang %s (its kinds: %s)" % (FIELD, name, version, names))
            continue
        spec = kinds[kind]
        flag = index.by_name.get(kind, kind) if index is not None else kind
        if flag in set_by or kind in set_by:
            reasons.append("%s.%s: server_args sets it (%s); a tune cannot measure other values of it"
                           % (FIELD, kind, set_by.get(flag, set_by.get(kind))))
            continue
        if values in (None, "", []):
            wanted[kind] = None
            continue
        values = [values] if isinstance(values, str) else values
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            reasons.append("%s.%s must be a list of backend names, got %r" % (FIELD, kind, values))
            continue
        bad = [v for v in values if v not in spec["choices"]]
        if bad:
            reasons.append("%s.%s: %s is not a %s of SGLang %s (its choices: %s)"
                           % (FIELD, kind, bad[0], spec["flag"], version, ", ".join(spec["choices"])))
            continue
        wanted[kind] = list(dict.fromkeys(values))
    return wanted, reasons


def merge(backends, facts, index, server_args):
    """The plan request's backends (a tune candidate's, or the measured winner's) checked against the release:
    (applied {kind: value}, reasons, warnings). A kind the operator set in server_args keeps the operator's value."""
    if backends in (None, {}):
        return {}, [], []
    if not isinstance(backends, dict):
        return {}, ["backends must be a mapping kind: value, got %r" % (backends,)], []
    kinds, applied, reasons, warnings = kinds_of(facts), {}, [], []
    given = {index.by_name.get(k, k): (k, v) for k, v in (server_args or {}).items()} \
        if isinstance(server_args, dict) else {}
    for kind, value in sorted(backends.items(), key=lambda kv: str(kv[0])):
        spec = kinds.get(kind)
        if spec is None:
            reasons.append("backends: %r is not a backend kind of SGLang %s (its kinds: %s)"
                           % (kind, index.version, ", ".join(sorted(kinds)) or "none"))
        elif value not in spec["choices"]:
            reasons.append("backends.%s: %r is not a %s of SGLang %s (its choices: %s)"
                           % (kind, value, spec["flag"], index.version, ", ".join(spec["choices"])))
        elif index.by_name.get(kind, kind) in given:
            key, mine = given[index.by_name.get(kind, kind)]
            warnings.append("server_args.%s=%r is kept as set; the backend %s %s is not applied"
                            % (key, mine, kind, value))
        else:
            applied[kind] = value
    return applied, reasons, warnings


def candidates(wanted, facts, model, compute_capabilities, version):
    """([(kind, value, why)] to measure besides the release's defaults, notes): the values of `wanted` (check()),
    the table's close ones where none are listed, less the default and those a rule calls unsupported here."""
    kinds, out, notes = kinds_of(facts), [], []
    for kind, listed in sorted(wanted.items()):
        spec = kinds[kind]
        rules = known_combinations.backend_rules(kind, model, compute_capabilities, version)
        unsupported = {v: r for r in rules for v in r.get("unsupported", ())}
        if listed is None:
            ranked = [(v, r) for r in rules for v in r["close"]]
            if not ranked:
                notes.append("%s: the known combinations rank no %s values for these GPUs and this model; list "
                             "the values to measure (%s: {%s: [...]})" % (FIELD, kind, FIELD, kind))
            values = []
            for value, rule in ranked:
                if value not in spec["choices"]:
                    notes.append("%s: %s %s (known combination %s) is not one of SGLang %s's choices"
                                 % (FIELD, kind, value, rule["id"], version))
                elif value not in [v for v, _source in values]:
                    values.append((value, "ranked close by known combination %s (%s)"
                                   % (rule["id"], rule["source_name"])))
        else:
            values = [(v, "listed") for v in listed]
        for value, why in values:
            if value == spec["default"]:
                continue
            if value in unsupported:
                rule = unsupported[value]
                notes.append("%s: %s %s is not measured: %s (known combination %s; source: %s)"
                             % (FIELD, kind, value, rule["problem"], rule["id"], rule["source_name"]))
                continue
            out.append((kind, value, why))
    return out, notes


def add_variants(selection, variants, candidates_table, max_count, remeasure=False, failed=()):
    """Add the backend variants of the tune's first chosen layout to a tune.select() result (in place): rows,
    measure (up to max_count names in all, layouts first), and selection["variants"] {name: {layout, backends}}.
    A variant that failed to start here (failed: names) is left out unless remeasure."""
    selection.setdefault("variants", {})
    if not variants or not selection["chosen"]:
        return selection
    base = selection["chosen"][0]
    row = next(r for r in selection["rows"] if r["name"] == base)
    cand = next(c for c in candidates_table if c["name"] == base)
    measured = ((cand.get("measured") or {}).get("variants")) or {}
    if measured and base not in measured and row["status"] == "measured":
        # only a backend variant of it was measured: the layout with the release's defaults is measured too
        row["status"] = "measure"
        selection["measure"].insert(0, base)
    taken = len(selection["chosen"])
    extra = []
    for kind, value, why in variants:
        name = variant_name(base, {kind: value})
        selection["variants"][name] = {"layout": base, "backends": {kind: value}}
        got = measured.get(name)
        entry = {"name": name, "estimate": row["estimate"], "measured": got,
                 "figure": got if got else row["figure"], "status": "", "note": "%s %s: %s" % (kind, value, why)}
        if name in failed and not got and not remeasure:
            entry["status"] = "failed before"
            entry["note"] += "; failed to start here; tune_remeasure tries it again"
        elif taken >= max_count:
            entry["status"] = "over the limit"
            entry["note"] += "; topolaunch_tune_max is %d" % max_count
        else:
            taken += 1
            selection["chosen"].append(name)
            if got and not remeasure:
                entry["status"] = "measured"
            else:
                entry["status"] = "measure"
                selection["measure"].append(name)
        extra.append(entry)
    at = next(k for k, r in enumerate(selection["rows"]) if r["name"] == base) + 1
    selection["rows"][at:at] = extra
    return selection
