"""module_utils/topolaunch/plan_preflight.py and the planner's use of a preflight record: measured pairs replace
the table values, measured allreduce figures replace the link efficiency, plan_fixes are applied, NCCL_P2P_LEVEL=SYS
only when proven, NCCL_TOPO_FILE when written; a record of another topology or a bad one changes nothing.
Records come from the lab stand-in (lab/preflight/worker_standin.py) over the lab specs."""
import copy
import sys

import pytest

from plan_cases import model_path, synth_facts
from ansible_collections.topolaunch.sglang.plugins.module_utils import plan_preflight, planner, preflight
import paths

ROOT = paths.ROOT
STANDIN = str(ROOT / "lab" / "preflight" / "worker_standin.py")
SPECS = ROOT / "lab" / "specs"
VNUMA = "proxmox-8x-rtx-pro-6000-vnuma"
HANG = "proxmox-8x-rtx-pro-6000-p2p-hang"
GLM5 = model_path("glm-5-nvfp4")
LLAMA = model_path("llama-3.1-70b")


def record_of(spec, facts, timeout=5.0):
    """The stand-in's preflight of a lab spec, keyed by these facts' fingerprint."""
    return preflight.run_preflight(sys.executable, STANDIN, list(range(8)), settings={"step_timeout": timeout},
                                   fingerprint=facts["fingerprint"], facts=facts,
                                   env={"FAKE_NVML_SPEC": str(SPECS / (spec + ".json"))})


@pytest.fixture(scope="module")
def field(tmp_path_factory):
    facts = synth_facts(VNUMA, tmp_path_factory.mktemp("vnuma"))
    return facts, record_of(VNUMA, facts)


def request(facts, **extra):
    return planner.PlanRequest(**dict({"topology": facts, "model_path": GLM5}, **extra))


def candidate(facts, name, **extra):
    return next(c for c in planner.evaluate_layouts(request(facts, **extra)) if c["name"] == name)


def group(record, gpus):
    return next(g for g in record["figures"]["groups"] if g["gpus"] == gpus)


def test_measured_pairs_and_allreduce_replace_the_tables(field):
    facts, record = field
    table, measured = candidate(facts, "tp8"), candidate(facts, "tp8", preflight=record)
    # tp8: the group of all GPUs was measured itself: its bus bandwidth and 8 KB latency are the links' figures
    links = measured["placement"]["links"]
    assert links.busbw == pytest.approx(group(record, list(range(8)))["busbw_gbps"] * 1e9)
    assert links.latency == pytest.approx(group(record, list(range(8)))["latency_us"] * 1e-6)
    assert table["placement"]["links"].busbw != links.busbw
    assert measured["estimate"]["comm_ms"] != table["estimate"]["comm_ms"]
    # tp4: the two socket groups were measured; the slower decides
    tp4 = candidate(facts, "tp4pp2", preflight=record)["placement"]["links"]
    assert tp4.busbw == pytest.approx(min(group(record, g)["busbw_gbps"] for g in ([0, 1, 2, 3], [4, 5, 6, 7])) * 1e9)
    # the slowest measured pair of the group, not the table's PCIe figure, is the group's link
    assert measured["placement"]["groups"][0][0]["bandwidth_gbps"] == min(
        p["gbps"] for p in record["figures"]["pairs"])
    plan = planner.plan(request(facts, preflight=record))
    assert "Link figures measured on this machine by the preflight of %s (topology %s): 56 GPU pairs, NCCL " \
           "allreduce at 2/4/8 GPUs." % (record["created"], facts["fingerprint"]) in plan["reason"]
    assert plan["link_figures"] == {"source": "preflight", "created": record["created"], "cross_socket_p2p": False}
    assert planner.plan(request(facts))["link_figures"]["source"] == "tables"


def test_a_group_not_measured_takes_its_size_s_efficiency(field):
    facts, record = field
    node = planner.NodeTopology(facts)
    node.use_preflight(record["figures"])
    four = [g for g in record["figures"]["groups"] if g["size"] == 4]
    efficiency = min(g["busbw_gbps"] / node.group_bandwidth(g["gpus"]) for g in four)
    busbw, latency = node.allreduce_figures([0, 1, 4, 5])           # across the sockets: not measured as such
    assert busbw == pytest.approx(efficiency * node.group_bandwidth([0, 1, 4, 5]))
    assert latency == max(g["latency_us"] for g in four)
    assert node.allreduce_figures([0, 1, 2]) is None                 # no group of 3 measured: the tables' figures
    assert node.allreduce_figures([0, 1, 2, 3]) == (group(record, [0, 1, 2, 3])["busbw_gbps"],
                                                    group(record, [0, 1, 2, 3])["latency_us"])


def test_the_hanging_pair_s_fixes_are_applied_by_the_plan(tmp_path):
    facts = synth_facts(HANG, tmp_path)
    record = record_of(HANG, facts, timeout=1.0)
    assert record["plan_fixes"]["env"] == {"NCCL_P2P_DISABLE": "1"}
    plan = planner.plan(request(facts, layout="tp8", preflight=record))
    assert plan["env"]["NCCL_P2P_DISABLE"] == "1" and "--disable-custom-all-reduce" in plan["argv"]
    assert any(w.startswith("NCCL_P2P_DISABLE=1 and --disable-custom-all-reduce: the preflight of") for w in plan["warnings"])
    # the links are the host path, as measured with P2P off
    links = candidate(facts, "tp8", preflight=record)["placement"]["links"]
    assert links.kind == "host" and links.busbw == pytest.approx(
        group(record, list(range(8)))["busbw_gbps"] * 1e9)
    assert group(record, list(range(8)))["p2p_disabled"] is True
    # the user's own value wins, with a warning
    plan = planner.plan(request(facts, layout="tp8", preflight=record,
                                server_args={"disable_custom_all_reduce": False}))
    assert "--disable-custom-all-reduce" not in plan["argv"]
    assert any("server_args.disable_custom_all_reduce=False overrides the preflight's fix" in w for w in plan["warnings"])
    # without the record the same box plans with P2P on (NVML says OK): nothing of it leaks
    plain = planner.plan(request(facts, layout="tp8"))
    assert "NCCL_P2P_DISABLE" not in plain["env"] and "--disable-custom-all-reduce" not in plain["argv"]


def test_cross_socket_p2p_only_when_the_record_proves_it(field):
    facts, record = field
    plan = planner.plan(request(facts, layout="tp8", preflight=record))
    assert "NCCL_P2P_LEVEL" not in plan["env"]           # measured, not faster with the stand-in: not proven
    proven = copy.deepcopy(record)
    cross = proven["figures"]["cross_socket_p2p"]
    cross["groups"] = [dict(g, busbw_gbps=40.0, status="ok") for g in cross["groups"]]
    cross["proven"] = True
    plan = planner.plan(request(facts, layout="tp8", preflight=proven))
    assert plan["env"]["NCCL_P2P_LEVEL"] == "SYS" and plan["link_figures"]["cross_socket_p2p"] is True
    assert any(w.startswith("NCCL_P2P_LEVEL=SYS: a TP group crosses the socket interconnect and the preflight")
               for w in plan["warnings"])
    links = candidate(facts, "tp8", preflight=proven)["placement"]["links"]
    assert links.p2p_sys and links.busbw == pytest.approx(40.0e9)         # the figures measured with SYS
    # a layout whose TP groups stay on a socket does not need it
    assert "NCCL_P2P_LEVEL" not in planner.plan(request(facts, layout="tp4pp2", preflight=proven))["env"]


def test_nccl_topology_file(field):
    facts, _record = field
    plan = planner.plan(request(facts, nccl_topo_file="/etc/topolaunch/nccl_topo.xml"))
    assert plan["env"]["NCCL_TOPO_FILE"] == "/etc/topolaunch/nccl_topo.xml"
    assert any(w.startswith("NCCL_TOPO_FILE=/etc/topolaunch/nccl_topo.xml: the preflight stage wrote") for w in plan["warnings"])
    with pytest.raises(planner.PlanError, match="nccl_topo_file: 'nccl_topo.xml' is not an absolute path"):
        planner.plan(request(facts, nccl_topo_file="nccl_topo.xml"))


def test_a_record_of_another_topology_changes_nothing(field):
    facts, record = field
    other = dict(record, fingerprint="000000000000")
    plan, plain = planner.plan(request(facts, preflight=other)), planner.plan(request(facts))
    assert any("the preflight record is for topology 000000000000, not %s" % facts["fingerprint"] in w
               for w in plan["warnings"])
    assert plan["estimate"] == plain["estimate"] and plan["link_figures"]["source"] == "tables"


def test_a_record_that_says_the_gpus_are_unsafe_refuses_the_plan(field):
    facts, record = field
    unsafe = dict(record, ok=False, findings=[{"id": "preflight-no-fix", "severity": "error",
                                               "message": "the GPUs misbehave with P2P off too"}])
    with pytest.raises(planner.PlanError, match="found GPUs that cannot be used safely, even with P2P off: "
                                                "preflight-no-fix: the GPUs misbehave with P2P off too"):
        planner.plan(request(facts, preflight=unsafe))


@pytest.mark.parametrize("bad, message", [
    ("text", "preflight: must be a preflight record (a mapping), got str"),
    ({"fingerprint": "x"}, "preflight.figures: missing or not a mapping"),
    ({"fingerprint": "", "figures": {"pairs": [], "groups": []}}, "preflight.fingerprint: '' is not"),
    ({"fingerprint": "x", "figures": {"pairs": [{"src": 0}], "groups": 3}}, "preflight.figures.pairs[0]: {'src': 0} is not"),
    ({"fingerprint": "x", "figures": {"pairs": [], "groups": [{"gpus": [0, "1"]}]}}, "preflight.figures.groups[0]"),
    ({"fingerprint": "x", "figures": {"pairs": [], "groups": []}, "plan_fixes": {"env": {"A;B": "1"}}},
     "preflight.plan_fixes.env: 'A;B'='1' is not an environment variable"),
    ({"fingerprint": "x", "figures": {"pairs": [], "groups": []}, "ok": "yes"}, "preflight.ok: 'yes' is not"),
])
def test_a_bad_record_is_refused_naming_the_field(field, bad, message):
    facts, _record = field
    with pytest.raises(planner.PlanError) as exc:
        planner.plan(request(facts, preflight=bad))
    assert any(message in r for r in exc.value.reasons), exc.value.reasons


def test_check_record_and_describe():
    assert plan_preflight.check_record(None) == (None, [])
    assert plan_preflight.describe({"figures": {}}, False) == ""
