"""The simulator's speculative decoding, as each release parses, resolves and refuses it (expected strings as the real
wheels have them, file:line in the comments), and its decode speed following its own accept length
(SGLANG_SIM_ACCEPT_LENGTH), so that a tune can measure it."""
import json
import shutil

import pytest
from simlab import ROOT, SPECS

import sglang.version  # noqa: E402
from sglang._sim import engine, flags, hardware, modelcfg, perf, validate  # noqa: E402
from sglang._sim.launcher import Launcher, SimConfigError  # noqa: E402

MODELS = ROOT / "tests/fixtures/models"
NEXTN = ["--speculative-algorithm", "NEXTN"]


def as_release(monkeypatch, version):
    monkeypatch.setattr(sglang.version, "__version__", version + "+sim")


def _args(argv, architecture="GlmMoeDsaForCausalLM"):
    args = flags.prepare_server_args(["--model-path", "/m"] + argv)
    args.post_init(97887, mla=True, architecture=architecture)
    return args


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_nextn_resolves_as_the_release_does(monkeypatch, caplog, version):
    as_release(monkeypatch, version)
    args = _args(["--tp-size", "8"] + NEXTN)
    assert args.speculative_algorithm == "EAGLE"                          # NEXTN is an alias of EAGLE
    assert args.max_running_requests == 48                               # reset where unset
    assert (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens) == (3, 1, 4)
    assert args.speculative_draft_model_path == "/m"                     # MTP: the draft is the checkpoint's
    assert ("Max running requests is reset to 48 for speculative decoding. You can override this by explicitly "
            "setting --max-running-requests.") in caplog.messages
    assert _args(["--tp-size", "8", "--max-running-requests", "96"] + NEXTN).max_running_requests == 96
    # topk 1: num_draft_tokens = num_steps + 1 (59:server_args.py:2436-2443)
    args = _args(NEXTN + ["--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
                          "--speculative-num-draft-tokens", "8"])
    assert args.speculative_num_draft_tokens == 3
    with pytest.raises(AssertionError):   # steps unset, topk set: SGLang's bare assert
        _args(NEXTN + ["--speculative-eagle-topk", "1"])


def test_0_5_9_spec_v2_switch_turns_the_overlap_scheduler_on(monkeypatch):
    as_release(monkeypatch, "0.5.9")
    monkeypatch.delenv("SGLANG_ENABLE_SPEC_V2", raising=False)
    assert _args(NEXTN).disable_overlap_schedule is True
    monkeypatch.setenv("SGLANG_ENABLE_SPEC_V2", "True")
    assert _args(NEXTN).disable_overlap_schedule is False
    with pytest.raises(ValueError, match="Spec v2 currently only supports topk = 1 for speculative decoding."):
        _args(NEXTN + ["--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
                       "--speculative-num-draft-tokens", "4"])


def test_pp_refuses_speculative_decoding_as_each_release(monkeypatch):
    as_release(monkeypatch, "0.5.9")
    args = _args(["--tp-size", "4", "--pp-size", "2"] + NEXTN)
    with pytest.raises(AssertionError, match="Pipeline parallelism is not compatible with overlap schedule, "
                                             "speculative decoding, mixed chunked prefill."):
        args.check()
    as_release(monkeypatch, "0.5.23")
    monkeypatch.delenv("SGLANG_ENABLE_PP_SPEC", raising=False)
    args = _args(["--tp-size", "4", "--pp-size", "2"] + NEXTN)
    # 523:sglang/srt/arg_groups/validation_hook.py:160-164
    with pytest.raises(AssertionError, match=r"PP \+ speculative decoding \(MTP\) is only supported on prefill nodes"):
        args.check()
    monkeypatch.setenv("SGLANG_ENABLE_PP_SPEC", "1")
    _args(["--tp-size", "4", "--pp-size", "2"] + NEXTN).check()


def _model(tmp_path, mtp):
    root = tmp_path / ("mtp" if mtp else "plain")
    root.mkdir()
    shutil.copy(str(MODELS / "glm-5-nvfp4" / "config.json"), str(root / "config.json"))
    index = json.loads((MODELS / "glm-5-nvfp4" / "model.safetensors.index.json").read_text())
    index["weight_map"] = {"model.layers.%d.eh_proj.weight" % (78 if mtp else 77): "a.safetensors"}
    (root / "model.safetensors.index.json").write_text(json.dumps(index))
    return str(root)


def _speculative_launcher(monkeypatch, tmp_path, model, accept=None):
    as_release(monkeypatch, "0.5.23")
    monkeypatch.setenv("SGLANG_SIM_GPU_SPEC", str(SPECS / "proxmox-8x-rtx-pro-6000-vnuma.json"))
    monkeypatch.setenv("FAKE_NVML_STATE_DIR", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    if accept is not None:
        monkeypatch.setenv("SGLANG_SIM_ACCEPT_LENGTH", accept)
    launcher = Launcher(["--model-path", model, "--tp-size", "8"] + NEXTN)
    launcher.prepare()
    return launcher


def test_decode_speed_follows_the_accept_length_and_shrinks_with_the_batch(tmp_path):
    spec = hardware.load_spec(str(SPECS / "proxmox-8x-rtx-pro-6000-vnuma.json"))
    model = modelcfg.load(_model(tmp_path, True))
    assert model.draft_weights and not modelcfg.load(_model(tmp_path, False)).draft_weights
    layout = perf.Layout(8, 1, 1, list(range(8)), validate.pp_layer_split(model.layers, 1))
    plain, spec_model = perf.PerfModel(model, spec, layout), perf.PerfModel(model, spec, layout)
    spec_model.speculative = (3, 4, 1)
    accept = 2.5

    def gain(batch):
        return accept * plain.decode_step(batch, batch * 1024) / spec_model.decode_step(batch, batch * 1024)

    assert gain(1) > 1.3 and gain(512) < min(gain(1), gain(64))   # the verify pass grows compute-bound


def test_accept_length_knob_below_one_is_refused(monkeypatch, tmp_path):
    assert engine.Engine(None, 1.0, 1, 1).tokens_per_step == 1.0
    with pytest.raises(SimConfigError, match="SGLANG_SIM_ACCEPT_LENGTH='0.5' must be >= 1"):
        _speculative_launcher(monkeypatch, tmp_path, _model(tmp_path, True), "0.5")
