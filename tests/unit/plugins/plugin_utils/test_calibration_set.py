"""Shape of the calibration set (tests/calibration): published layout comparisons the cost model is checked against.

Each case must carry its citation and quote, a positive workload, two or more measured layouts whose names parse
and fit the machine, a winner that is the measured best, a GPU spec and a model folder that exist and parse, and
derived machine totals that agree with the published figures beside them. The set as a whole must cover at least
15 cases, 4 GPU kinds, PCIe and NVLink/NVSwitch machines, a multi-node case and the two field cases.
"""
import copy
import json
import re

import pytest
import yaml
import paths

ROOT = paths.ROOT
CAL = ROOT / "tests" / "calibration"
SPEC_DIRS = (CAL / "specs", ROOT / "lab" / "specs")
LAYOUT = re.compile(r"^tp(\d+)(?:pp(\d+))?(?:dp(\d+))?(?:ep(\d+))?$")
FIELD_IDS = ("field-glm5-nvfp4-rtxpro6000-vm", "field-glm47-fp8-rtxpro6000-vm")
METRICS = ("output_tokens_per_s", "ratio")
INTERCONNECTS = ("nvswitch", "nvlink-bridge", "pcie")
MIB = 1024 * 1024


def load_cases():
    with open(CAL / "cases.yml") as f:
        return yaml.safe_load(f)["cases"]


def parse_layout(name):
    """{tp, pp, dp, ep} of a layout name like tp4pp2 or tp4dp2ep4, None if it does not parse."""
    m = LAYOUT.match(str(name))
    if not m:
        return None
    tp, pp, dp, ep = (int(g) if g else 1 for g in m.groups())
    return {"tp": tp, "pp": pp, "dp": dp, "ep": ep}


def spec_path(name):
    for d in SPEC_DIRS:
        p = d / (str(name) + ".json")
        if p.is_file():
            return p
    return None


def positive(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def number_in(value, text):
    """The published figure appears in the quote (digit-group commas ignored: '4,180' holds 4180)."""
    plain = re.sub(r"(?<=\d),(?=\d{3})", "", text)
    return repr(value) in plain if isinstance(value, float) else str(value) in plain


def problems(case):
    """Every way `case` breaks the set's rules, as 'id: what' lines (empty when it is well formed)."""
    cid = case.get("id") or "<no id>"
    out = []

    def bad(msg):
        out.append("%s: %s" % (cid, msg))

    cit = case.get("citation") or {}
    if not (cit.get("url") or (cit.get("repo") and cit.get("thread"))):
        bad("citation needs a url or repo + thread")
    quote = cit.get("quote")
    if not (isinstance(quote, str) and quote.strip()):
        bad("citation has no quote")
        quote = ""
    if case.get("engine") not in ("sglang", "vllm", "trtllm"):
        bad("engine %r is not sglang, vllm or trtllm" % case.get("engine"))

    hw = case.get("hardware") or {}
    per_node, nodes = hw.get("gpus_per_node"), hw.get("nodes")
    if not (isinstance(per_node, int) and per_node > 0 and isinstance(nodes, int) and nodes > 0):
        bad("hardware.gpus_per_node and hardware.nodes must be positive integers")
        per_node, nodes = 0, 0
    gpus = per_node * nodes
    if hw.get("interconnect") not in INTERCONNECTS:
        bad("hardware.interconnect %r is not one of %s" % (hw.get("interconnect"), ", ".join(INTERCONNECTS)))
    if nodes > 1 and not hw.get("network"):
        bad("a multi-node case names its inter-node network (or says it is not stated)")

    spec_file = spec_path(case.get("spec"))
    gpu_mib = None
    if spec_file is None:
        bad("spec %r is in neither tests/calibration/specs nor lab/specs" % case.get("spec"))
    else:
        spec = json.loads(spec_file.read_text())
        sgpus = spec.get("gpus") or []
        if len(sgpus) != per_node:
            bad("spec %s has %d GPUs, hardware.gpus_per_node is %s" % (spec_file.name, len(sgpus), per_node))
        if any(g.get("name") != hw.get("gpu") for g in sgpus):
            bad("spec %s GPU names differ from hardware.gpu %r" % (spec_file.name, hw.get("gpu")))
        links = [g.get("nvlinks", 0) for g in sgpus]
        if hw.get("interconnect") == "pcie" and any(links):
            bad("a pcie case's spec has NVLinks")
        if hw.get("interconnect") == "nvswitch" and (not all(links) or (spec.get("nvlink") or {}).get("fabric") != "nvswitch"):
            bad("an nvswitch case's spec lacks an NVSwitch fabric")
        if {g["pcie"]["max_gen"] for g in sgpus} != {hw.get("pcie_gen")}:
            bad("hardware.pcie_gen %r differs from the spec's PCIe generation" % hw.get("pcie_gen"))
        if len({g.get("numa_node") for g in sgpus}) != hw.get("numa_nodes"):
            bad("hardware.numa_nodes %r differs from the spec's NUMA nodes" % hw.get("numa_nodes"))
        gpu_mib = min((g.get("memory_total_mib", 0) for g in sgpus), default=None)

    model = case.get("model") or {}
    mdir = ROOT / str(model.get("config"))
    total_size = None
    if not model.get("config") or not mdir.is_dir():
        bad("model.config %r is not a directory" % model.get("config"))
    else:
        try:
            cfg = json.loads((mdir / "config.json").read_text())
            index = json.loads((mdir / "model.safetensors.index.json").read_text())
        except (OSError, ValueError) as exc:
            bad("model folder %s does not parse: %s" % (model.get("config"), exc))
        else:
            cfg = cfg.get("text_config", cfg)
            for key in ("num_hidden_layers", "hidden_size"):
                if not (isinstance(cfg.get(key), int) and cfg[key] > 0):
                    bad("%s/config.json has no positive %s" % (model.get("config"), key))
            total_size = (index.get("metadata") or {}).get("total_size")
            if not (isinstance(total_size, int) and total_size > 0):
                bad("%s index has no positive metadata.total_size" % model.get("config"))
                total_size = None

    wl = case.get("workload") or {}
    for key in ("input_len", "output_len"):
        if not (isinstance(wl.get(key), int) and wl[key] > 0):
            bad("workload.%s must be a positive integer" % key)
    load = [wl.get(k) for k in ("concurrency", "request_rate", "num_prompts")]
    if not any(positive(v) for v in load) or any(v is not None and not positive(v) for v in load):
        bad("workload needs a positive concurrency, request_rate or num_prompts (others positive or null)")

    metric = case.get("metric")
    if metric not in METRICS:
        bad("metric %r is not one of %s" % (metric, ", ".join(METRICS)))
        return out
    measured = case.get("measured") or []
    if len(measured) < 2:
        bad("needs at least two measured layouts")
    # a measured layout is named by its label where two share a layout name (attention DP on or off)
    names = [m.get("label", m.get("layout")) for m in measured]
    if len(set(names)) != len(names):
        bad("a layout is measured twice: %s" % names)
    values = {}
    for m in measured:
        name, lay = m.get("layout"), parse_layout(m.get("layout"))
        if lay is None:
            bad("layout %r does not parse as tpN[ppN][dpN][epN]" % name)
            continue
        if lay["tp"] * lay["pp"] * lay["dp"] > gpus:
            bad("layout %s needs %d GPUs, the case has %d" % (name, lay["tp"] * lay["pp"] * lay["dp"], gpus))
        if lay["tp"] % lay["ep"]:
            bad("layout %s: ep must divide tp" % name)
        if total_size and gpu_mib and total_size > lay["tp"] * lay["pp"] * gpu_mib * MIB:
            bad("layout %s: %d weight bytes do not fit %d GPUs of %d MiB" % (name, total_size, lay["tp"] * lay["pp"], gpu_mib))
        value = m.get(metric)
        if not positive(value):
            bad("layout %s has no positive %s" % (name, metric))
            continue
        values[m.get("label", name)] = value
        published = value
        if "output_tokens_per_s_per_gpu" in m:
            published = m["output_tokens_per_s_per_gpu"]
            if m.get("gpus_measured") != lay["tp"] * lay["pp"]:
                bad("layout %s: gpus_measured %r is not tp*pp = %d" % (name, m.get("gpus_measured"), lay["tp"] * lay["pp"]))
            if abs(published * gpus - value) > 0.01:
                bad("layout %s: %s per GPU x %d GPUs is not %s" % (name, published, gpus, value))
        elif "per_replica_output_tokens_per_s" in m:
            published = m["per_replica_output_tokens_per_s"]
            if m.get("replicas") != lay["dp"]:
                bad("layout %s: replicas %r is not its dp %d" % (name, m.get("replicas"), lay["dp"]))
            if abs(published * lay["dp"] - value) > 0.01:
                bad("layout %s: %s per replica x %d is not %s" % (name, published, lay["dp"], value))
        if metric == "output_tokens_per_s" and not number_in(published, quote):
            bad("layout %s: published figure %s is not in the quote" % (name, published))
    if metric == "ratio":
        base = case.get("baseline")
        if base not in values or values[base] != 1.0:
            bad("ratio case: baseline %r must be a measured layout with ratio 1.0" % base)
    if values and case.get("winner") != max(values, key=values.get):
        bad("winner %r is not the measured best %r" % (case.get("winner"), max(values, key=values.get)))
    return out


CASES = load_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.get("id", "?") for c in CASES])
def test_case_is_well_formed(case):
    assert problems(case) == []


def test_set_coverage():
    ids = [c["id"] for c in CASES]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    assert len(CASES) >= 15
    assert len({c["hardware"]["gpu"] for c in CASES}) >= 4
    kinds = {c["hardware"]["interconnect"] for c in CASES}
    assert "pcie" in kinds and kinds & {"nvswitch", "nvlink-bridge"}
    assert any(c["hardware"]["nodes"] > 1 for c in CASES)


def test_field_cases_use_the_decided_workload():
    by_id = {c["id"]: c for c in CASES}
    for cid in FIELD_IDS:
        wl = by_id[cid]["workload"]
        assert (wl["input_len"], wl["output_len"], wl["concurrency"]) == (1024, 1024, 1024), cid
    glm47 = {m["layout"]: m["output_tokens_per_s"] for m in by_id["field-glm47-fp8-rtxpro6000-vm"]["measured"]}
    assert glm47 == {"tp8": 4180, "tp4pp2": 5154}
    assert by_id["field-glm5-nvfp4-rtxpro6000-vm"]["winner"] == "tp8"


def _case(cid):
    return copy.deepcopy(next(c for c in CASES if c["id"] == cid))


@pytest.mark.parametrize("break_it, expect", [
    (lambda c: c["citation"].pop("quote"), "no quote"),
    (lambda c: c["citation"].update(url=None, repo=None), "url or repo"),
    (lambda c: c["measured"].pop(), "at least two"),
    (lambda c: c["measured"][0].update(layout="tp16"), "needs 16 GPUs"),
    (lambda c: c["measured"][0].update(layout="tensor8"), "does not parse"),
    (lambda c: c.update(winner="tp8"), "winner"),
    (lambda c: c["workload"].update(output_len=0), "output_len"),
    (lambda c: c["workload"].update(concurrency=None, request_rate=None, num_prompts=None), "concurrency"),
    (lambda c: c.update(spec="no-such-spec"), "spec"),
    (lambda c: c["model"].update(config="tests/calibration/models/absent"), "not a directory"),
    (lambda c: c["measured"][1].update(output_tokens_per_s=5000), "not in the quote"),
], ids=["quote", "citation", "one-layout", "too-big", "name", "winner", "workload", "load", "spec", "model",
        "number"])
def test_a_broken_case_is_reported(break_it, expect):
    case = _case("field-glm47-fp8-rtxpro6000-vm")
    break_it(case)
    assert any(expect in p for p in problems(case)), problems(case)


def test_derived_totals_and_fit_are_checked():
    case = _case("trtllm-rtxpro6000-qwen3-235b-fp4-1k1k")
    case["measured"][0]["output_tokens_per_s"] = 13000
    assert any("per GPU x 8 GPUs" in p for p in problems(case))
    case = _case("sglang-h200x8-glm46-fp8-sharegpt")
    case["measured"][1]["replicas"] = 4
    assert any("replicas 4 is not its dp 2" in p for p in problems(case))
    case = _case("sglang-h100x4-glm45-air-bf16-sharegpt")
    case["measured"][0]["layout"] = "tp2dp2"
    assert any("do not fit 2 GPUs" in p for p in problems(case))
