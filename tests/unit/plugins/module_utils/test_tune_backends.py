"""module_utils/tune_backends.py: backends as tune candidates (topolaunch_tune_backends) - the release's choices
(sglang_facts_*.BACKENDS, from the wheels), the known-combinations ranking, the variants a tune measures, the plan
that records and launches the measured backend, and one-line errors naming the field for bad input."""
import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import (known_combinations, planner, tune,
                                                                       tune_backends)
from ansible_collections.topolaunch.sglang.plugins.module_utils.plan_args import FlagIndex
from plan_cases import model_path, synth_facts

LAB = {"input_len": 64, "output_len": 16, "concurrency": 4}


@pytest.fixture(scope="module")
def vnuma(tmp_path_factory):
    return synth_facts("proxmox-8x-rtx-pro-6000-vnuma", tmp_path_factory.mktemp("vnuma"))


def request(topology, **extra):
    return planner.PlanRequest(topology=topology, model_path=model_path("glm-5-nvfp4"), workload=LAB,
                               sglang_version=extra.pop("sglang_version", "0.5.23"), **extra)


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_the_backend_choices_are_the_flag_tables(version):
    """The facts' BACKENDS equal the flag table's choices and defaults (both read from the same wheel)."""
    index = FlagIndex(version)
    kinds = tune_backends.kinds_of(planner.SGLANG_FACTS[version])
    assert set(kinds) == {"moe_runner_backend", "attention_backend", "fp4_gemm_backend", "fp8_gemm_backend"}
    for spec in kinds.values():
        assert spec["choices"] == index.choices(spec["flag"])
        assert spec["default"] == index.flags[spec["flag"]]["default"]
    assert "cutlass" in kinds["moe_runner_backend"]["choices"] and kinds["moe_runner_backend"]["default"] == "auto"


def test_variant_names_round_trip():
    name = tune_backends.variant_name("tp8ep8", {"moe_runner_backend": "cutlass"})
    assert name == "tp8ep8+moe_runner_backend.cutlass"
    assert tune_backends.split_variant(name) == ("tp8ep8", {"moe_runner_backend": "cutlass"})
    assert tune_backends.split_variant("tp4pp2") == ("tp4pp2", {})
    assert tune_backends.split_variant("TP4+PP2") == ("TP4+PP2", {})      # a layout spelled with '+'


def test_the_table_ranks_the_moe_runners_close_on_sm120_for_nvfp4(vnuma):
    """The field spec (SM120) + GLM-5 NVFP4: the knowledge base's close MoE runners, the default (auto) being the
    layout itself, deep_gemm never; on SM90 no rule ranks any, and the tune says to list them."""
    layouts = len(tune.tune_plan(request(vnuma), tune_max=10)[2]["chosen"])    # the layouts within the error
    plan, _, selection = tune.tune_plan(request(vnuma), tune_max=layouts + 2, tune_backends=["moe_runner_backend"])
    base = selection["chosen"][0]
    assert base == plan["layout"]["name"]
    names = [tune_backends.variant_name(base, {"moe_runner_backend": v})
             for v in ("cutlass", "flashinfer_cutlass")]
    assert selection["chosen"][layouts:] == names and selection["measure"][layouts:] == names
    assert selection["variants"][names[0]] == {"layout": base, "backends": {"moe_runner_backend": "cutlass"}}
    rows = {r["name"]: r for r in selection["rows"]}
    assert "sm12-fp4-moe-runner" in rows[names[0]]["note"]
    over = tune_backends.variant_name(base, {"moe_runner_backend": "flashinfer_cutedsl"})
    assert rows[over]["status"] == "over the limit"                      # tune_max counts the variants
    assert any(line.startswith(names[0]) for line in selection["report"])
    # what the candidate starts cost counts the variants (as their layout)
    assert set(selection["start"]["layouts"]) == set(selection["measure"])
    rule = next(r for r in known_combinations.BACKEND_RULES if r["id"] == "sm12-fp4-moe-runner")
    assert "deep_gemm" in rule["unsupported"] and rule["source"].startswith(known_combinations.KNOWLEDGE_BASE)


def test_a_listed_unsupported_value_is_not_measured(vnuma):
    selection = tune.tune_plan(request(vnuma), tune_max=5, tune_layouts=["tp8ep8"],
                               tune_backends={"moe_runner_backend": ["deep_gemm", "triton"]})[2]
    assert selection["measure"] == ["tp8ep8", "tp8ep8+moe_runner_backend.triton"]
    assert any("deep_gemm is not measured" in n and "sm12-fp4-moe-runner" in n for n in selection["backend_notes"])


def test_no_ranking_without_a_rule_says_to_list_values(vnuma):
    selection = tune.tune_plan(request(vnuma), tune_max=5, tune_layouts=["tp8ep8"],
                               tune_backends=["fp8_gemm_backend"])[2]
    assert selection["measure"] == ["tp8ep8"]
    assert "rank no fp8_gemm_backend values" in selection["backend_notes"][0]


@pytest.mark.parametrize("value, message", [
    (["b12x_runner"], "topolaunch_tune_backends: 'b12x_runner' is not a backend kind of SGLang 0.5.23 (its kinds: "),
    ({"moe_runner_backend": ["b12x"]}, "topolaunch_tune_backends.moe_runner_backend: b12x is not a "
                                       "--moe-runner-backend of SGLang 0.5.23 (its choices: auto, deep_gemm,"),
    ({"moe_runner_backend": "cutlass", "attention_backend": ["nope"]},
     "topolaunch_tune_backends.attention_backend: nope is not a --attention-backend"),
    ("moe_runner_backend: cutlass", "not a backend kind"),
    (42, "topolaunch_tune_backends must be a list of backend kinds"),
    ({"moe_runner_backend": [1]}, "topolaunch_tune_backends.moe_runner_backend must be a list of backend names"),
])
def test_bad_tune_backends_is_one_line_naming_the_field(vnuma, value, message):
    with pytest.raises(planner.PlanError) as err:
        tune.tune_plan(request(vnuma), tune_backends=value)
    assert len(err.value.reasons) == 1 and "\n" not in err.value.reasons[0]
    assert err.value.reasons[0].startswith(message) or message in err.value.reasons[0]


def test_a_backend_the_older_release_lacks_is_refused(vnuma):
    """flashinfer_megamoe is a 0.5.23 MoE runner, not a 0.5.9 one."""
    with pytest.raises(planner.PlanError, match="moe_runner_backend: flashinfer_megamoe is not a --moe-runner-backend "
                                                "of SGLang 0.5.9"):
        tune.tune_plan(request(vnuma, sglang_version="0.5.9"),
                       tune_backends={"moe_runner_backend": ["flashinfer_megamoe"]})
    assert tune.tune_plan(request(vnuma), tune_layouts=["tp8ep8"],
                          tune_backends={"moe_runner_backend": ["flashinfer_megamoe"]})[2]["measure"][-1] == \
        "tp8ep8+moe_runner_backend.flashinfer_megamoe"


def test_a_kind_the_operator_set_cannot_be_tuned(vnuma):
    with pytest.raises(planner.PlanError, match=r"topolaunch_tune_backends.moe_runner_backend: server_args sets it "
                                                r"\(moe_runner_backend\)"):
        tune.tune_plan(request(vnuma, server_args={"moe_runner_backend": "cutlass"}),
                       tune_backends=["moe_runner_backend"])


def measured(topology, layout, tput):
    return {"model": "glm-5-nvfp4", "topology_fingerprint": topology["fingerprint"], "layout": layout,
            "output_throughput": tput, "max_concurrency": 4, "input_len": 64, "output_len": 16}


def argv_value(plan, flag):
    return plan["argv"][plan["argv"].index(flag) + 1] if flag in plan["argv"] else None


def test_a_candidates_plan_runs_and_records_its_backend(vnuma):
    plan = planner.plan(request(vnuma, layout="tp8ep8", backends={"moe_runner_backend": "cutlass"}))
    assert argv_value(plan, "--moe-runner-backend") == "cutlass"
    assert plan["backends"] == {"moe_runner_backend": "cutlass"}
    assert plan["layout"]["variant"] == "tp8ep8+moe_runner_backend.cutlass"
    assert "Backends: --moe-runner-backend cutlass (a tune's backend candidate)." in plan["reason"]
    with pytest.raises(planner.PlanError, match="backends.moe_runner_backend: 'b12x' is not a --moe-runner-backend"):
        planner.plan(request(vnuma, layout="tp8ep8", backends={"moe_runner_backend": "b12x"}))


def test_the_measured_winner_is_launched_with_its_backend(vnuma):
    """Measured: tp8ep8 with the default MoE runner, and faster with cutlass: auto plans tp8ep8 with cutlass, the
    candidates table lists both figures; an explicit layout measures the plain one; a slower variant is not used."""
    records = [measured(vnuma, "tp8ep8", 900.0), measured(vnuma, "tp8ep8+moe_runner_backend.cutlass", 1200.0),
               measured(vnuma, "tp4pp2", 800.0)]
    plan = planner.plan(request(vnuma, measured=records))
    assert plan["layout"]["name"] == "tp8ep8" and plan["source"] == "measured"
    assert plan["backends"] == {"moe_runner_backend": "cutlass"} and argv_value(plan, "--moe-runner-backend") == "cutlass"
    assert "measured fastest with them" in plan["reason"]
    row = next(c for c in plan["candidates"] if c["name"] == "tp8ep8")
    assert row["measured"]["variants"] == {"tp8ep8": 900.0, "tp8ep8+moe_runner_backend.cutlass": 1200.0}
    explicit = planner.plan(request(vnuma, measured=records, layout="tp8ep8"))
    assert "backends" not in explicit and argv_value(explicit, "--moe-runner-backend") is None
    slower = [measured(vnuma, "tp8ep8", 1300.0)] + records[1:]
    assert "backends" not in planner.plan(request(vnuma, measured=slower))
    # the operator's own value wins, with a warning
    mine = planner.plan(request(vnuma, measured=records, server_args={"moe_runner_backend": "triton"}))
    assert argv_value(mine, "--moe-runner-backend") == "triton" and "backends" not in mine
    assert any("server_args.moe_runner_backend='triton' is kept as set" in w for w in mine["warnings"])


def test_a_tune_after_measuring_a_variant_measures_nothing_again(vnuma):
    records = [measured(vnuma, "tp8ep8", 900.0), measured(vnuma, "tp8ep8+moe_runner_backend.cutlass", 1200.0)]
    selection = tune.tune_plan(request(vnuma, measured=records), tune_layouts=["tp8ep8"],
                               tune_backends={"moe_runner_backend": ["cutlass"]})[2]
    assert selection["measure"] == []
    only_variant = tune.tune_plan(request(vnuma, measured=records[1:]), tune_layouts=["tp8ep8"],
                                  tune_backends={"moe_runner_backend": ["cutlass"]})[2]
    assert only_variant["measure"] == ["tp8ep8"]      # the layout with the release's defaults is not measured yet


@pytest.mark.parametrize("rule", known_combinations.BACKEND_RULES, ids=lambda r: r["id"])
def test_every_ranked_backend_is_a_choice_of_the_releases_it_was_checked_against(rule):
    for version in rule["checked"]:
        choices = tune_backends.kinds_of(planner.SGLANG_FACTS[version])[rule["kind"]]["choices"]
        assert set(rule["close"]) <= set(choices), (version, set(rule["close"]) - set(choices))
        assert not rule["unsupported"] or set(rule["unsupported"]) & set(choices), version   # values it has


def test_a_variant_that_failed_to_start_is_left_out_unless_remeasured(vnuma):
    variant = "tp8ep8+moe_runner_backend.cutlass"
    failures = [{"model": "glm-5-nvfp4", "topology_fingerprint": vnuma["fingerprint"], "layout": variant,
                 "stage": "launch"}]
    args = {"tune_layouts": ["tp8ep8"], "tune_backends": {"moe_runner_backend": ["cutlass"]}, "failures": failures}
    selection = tune.tune_plan(request(vnuma), **args)[2]
    assert selection["measure"] == ["tp8ep8"]
    assert {r["name"]: r["status"] for r in selection["rows"]}[variant] == "failed before"
    assert tune.tune_plan(request(vnuma), tune_remeasure=True, **args)[2]["measure"] == ["tp8ep8", variant]
