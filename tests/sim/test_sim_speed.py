"""SGLANG_SIM_LAYOUT_SPEED: the lab's truth per layout (issue 12), so that a test can make the simulated machine
disagree with the planner's prediction. A factor per layout name multiplies the simulated throughput; layouts
not named run at 1; a bad value is refused at start with one line naming the variable and the item.
"""
import json
import time

import pytest
from simlab import ROOT, SPECS


from sglang._sim import hardware, modelcfg, perf, validate  # noqa: E402
from sglang._sim.launcher import SimConfigError, parse_backend_speed, parse_layout_speed  # noqa: E402

LLAMA = "llama-2-7b"


@pytest.mark.parametrize("sizes, name", [
    ((8, 1, 1, 1), "tp8"), ((4, 2, 1, 1), "tp4pp2"), ((2, 2, 1, 2), "tp2pp2ep2"), ((4, 1, 2, 1), "tp4dp2"),
    ((1, 1, 1, 1), "tp1"), ((8, 2, 1, 1), "tp8pp2"),  # two nodes of 8: the name does not say where ranks run
])
def test_layout_names(sizes, name):
    assert perf.layout_name(*sizes) == name


def test_knob_parses():
    assert parse_layout_speed("tp4pp2=1.6, tp8=0.7") == {"tp4pp2": 1.6, "tp8": 0.7}
    assert parse_layout_speed("") == {} and parse_layout_speed(None) == {}


@pytest.mark.parametrize("raw, item, why", [
    ("tp8", "tp8", "expected LAYOUT=FACTOR"),
    ("tp8=0", "tp8=0", "is not a positive number"),
    ("tp8=-1.5", "tp8=-1.5", "is not a positive number"),
    ("tp8=fast", "tp8=fast", "is not a positive number"),
    ("tp8=nan", "tp8=nan", "is not a positive number"),
    ("tp4pp2=1.6,pp2tp4=2", "pp2tp4=2", "is not a layout name"),
    ("tp8pp1=2", "tp8pp1=2", "is not a layout name"),  # parts of size 1 are left out of names
    ("TP8=2", "TP8=2", "is not a layout name"),
    ("tp8=2,tp8=3", "tp8=3", "named twice"),
])
def test_bad_knob_values_name_the_item(raw, item, why):
    with pytest.raises(SimConfigError) as err:
        parse_layout_speed(raw)
    assert str(err.value).startswith("SGLANG_SIM_LAYOUT_SPEED: bad item %r: " % item)
    assert why in str(err.value)


def test_the_factor_divides_step_times():
    spec = hardware.load_spec(str(SPECS / "proxmox-8x-rtx-pro-6000-vnuma.json"))
    model = modelcfg.load(str(ROOT / "tests/fixtures/models/glm-5-nvfp4"))
    layout = perf.Layout(4, 2, 1, list(range(8)), validate.pp_layer_split(model.layers, 2))
    base = perf.PerfModel(model, spec, layout)
    fast = perf.PerfModel(model, spec, layout, speed=1.6)
    for batch in (1, 8, 64):
        assert fast.decode_step(batch, batch * 512) == pytest.approx(base.decode_step(batch, batch * 512) / 1.6)
    assert fast.prefill(2048, 2) == pytest.approx(base.prefill(2048, 2) / 1.6)


def generate_seconds(server, tokens):
    tic = time.monotonic()
    status, body = server.post("/generate", {"text": "a b c", "sampling_params": {"max_new_tokens": tokens}})
    assert status == 200 and json.loads(body)["meta_info"]["completion_tokens"] == tokens
    return time.monotonic() - tic


def test_the_knob_changes_served_throughput_by_its_factor(lab):
    model = lab.model(LLAMA)
    plain = lab.launch("--model-path", model, SGLANG_SIM_TIME_SCALE="0.3").wait_ready()
    # the layout is tp1 (llama on one GPU, the next one); tp8 is named too but does not apply
    slow = lab.launch("--model-path", model, SGLANG_SIM_TIME_SCALE="0.3", CUDA_VISIBLE_DEVICES="1",
                      SGLANG_SIM_LAYOUT_SPEED="tp1=0.25,tp8=3").wait_ready()
    info = json.loads(slow.get("/server_info")[1])["simulation"]["performance_model"]
    base = json.loads(plain.get("/server_info")[1])["simulation"]["performance_model"]
    assert (info["layout"], info["layout_speed"], base["layout_speed"]) == ("tp1", 0.25, 1.0)
    for batch, ms in base["decode_step_ms"].items():
        assert info["decode_step_ms"][batch] == pytest.approx(ms / 0.25, rel=1e-3)
    assert "SGLANG_SIM_LAYOUT_SPEED: layout tp1 runs at 0.25 times" in slow.log()
    ratio = generate_seconds(slow, 64) / generate_seconds(plain, 64)
    assert 3.0 < ratio < 5.0, ratio  # 4 expected; wall-clock noise of a small machine on either side


def test_a_bad_knob_is_refused_at_start_in_one_line(lab):
    res = lab.run("sglang.launch_server", "--model-path", lab.model(LLAMA), SGLANG_SIM_LAYOUT_SPEED="tp4pp2=1.6,tp8=0")
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert "simulator: SGLANG_SIM_LAYOUT_SPEED: bad item 'tp8=0': the factor '0' is not a positive number" in lines[0]


# SGLANG_SIM_BACKEND_SPEED: the lab's truth per backend value (issue 28: backends as tune candidates).


def test_backend_knob_parses_against_the_releases_choices():
    assert parse_backend_speed("moe_runner_backend:cutlass=1.5, attention_backend:flashinfer=0.8") == [
        ("moe_runner_backend", "cutlass", 1.5), ("attention_backend", "flashinfer", 0.8)]
    assert parse_backend_speed("") == [] and parse_backend_speed(None) == []


@pytest.mark.parametrize("raw, item, why", [
    ("moe_runner_backend=2", "moe_runner_backend=2", "expected FLAG:VALUE=FACTOR"),
    ("moe_runner_backend:cutlass", "moe_runner_backend:cutlass", "expected FLAG:VALUE=FACTOR"),
    ("moe_runner_backend:b12x=2", "moe_runner_backend:b12x=2", "b12x is not one of the choices of --moe-runner-backend"),
    ("no_such_backend:x=2", "no_such_backend:x=2", "no_such_backend is no flag with choices"),
    ("moe_runner_backend:cutlass=0", "moe_runner_backend:cutlass=0", "is not a positive number"),
    ("moe_runner_backend:cutlass=2,moe_runner_backend:cutlass=3", "moe_runner_backend:cutlass=3", "named twice"),
])
def test_bad_backend_knob_values_name_the_item(raw, item, why):
    with pytest.raises(SimConfigError) as err:
        parse_backend_speed(raw)
    assert str(err.value).startswith("SGLANG_SIM_BACKEND_SPEED: bad item %r: " % item)
    assert why in str(err.value)


def test_the_backend_knob_applies_to_a_server_with_that_backend(lab):
    model = lab.model(LLAMA)
    knob = "moe_runner_backend:cutlass=2.5,moe_runner_backend:triton=0.5"
    fast = lab.launch("--model-path", model, "--moe-runner-backend", "cutlass", SGLANG_SIM_BACKEND_SPEED=knob)
    plain = lab.launch("--model-path", model, CUDA_VISIBLE_DEVICES="1", SGLANG_SIM_BACKEND_SPEED=knob)
    fast.wait_ready()
    plain.wait_ready()
    info = json.loads(fast.get("/server_info")[1])["simulation"]["performance_model"]
    base = json.loads(plain.get("/server_info")[1])["simulation"]["performance_model"]
    assert (info["layout_speed"], base["layout_speed"]) == (2.5, 1.0)
    assert "SGLANG_SIM_BACKEND_SPEED: its backends run at 2.5 times" in fast.log()


def test_a_backend_the_release_lacks_is_refused_as_sglang_does(lab):
    res = lab.run("sglang.launch_server", "--model-path", lab.model(LLAMA), "--moe-runner-backend", "b12x")
    assert res.returncode == 2
    assert "error: argument --moe-runner-backend: invalid choice: 'b12x' (choose from " in res.stderr
