"""inventory/example: what a user copies plans without a complaint for the SGLang version it pins, and the lab and
the project's defaults pin the same version."""

import yaml

from ansible_collections.topolaunch.sglang.plugins.module_utils.plan_args import FlagIndex, check_server_args
import paths

ROOT = paths.ROOT
EXAMPLE = yaml.safe_load((ROOT / "inventory" / "example" / "group_vars" / "all" / "main.yml").read_text())
DEFAULTS = yaml.safe_load((ROOT / "roles" / "topolaunch" / "defaults" / "main.yml").read_text())


def test_the_field_launch_is_written_for_the_pinned_version():
    """The field launch in 0.5.23's names: flashinfer attention, cutlass FP8 GEMM, trtllm DSA prefill and decode,
    the flashinfer_cutlass MoE runner; every flag exists, none is deprecated, each value is one of its choices."""
    version = EXAMPLE["topolaunch_sglang_version"]
    assert version == DEFAULTS["topolaunch_sglang_version"] == "0.5.23"
    items, values, reasons, warnings = check_server_args(EXAMPLE["topolaunch_server_args"], FlagIndex(version))
    assert (reasons, warnings) == ([], [])
    assert {flag: words[1:] for flag, words in items} == {
        "--mem-fraction-static": ["0.92"], "--max-running-requests": ["1024"], "--attention-backend": ["flashinfer"],
        "--fp8-gemm-backend": ["cutlass"], "--dsa-prefill-backend": ["trtllm"], "--dsa-decode-backend": ["trtllm"],
        "--moe-runner-backend": ["flashinfer_cutlass"]}


def test_the_field_launch_of_0_5_9_names_the_successors():
    """The same launch as 0.5.9 spelled it fails for 0.5.23 naming each replacement."""
    old = dict(EXAMPLE["topolaunch_server_args"])
    old["nsa_prefill_backend"] = old.pop("dsa_prefill_backend")
    old["nsa_decode_backend"] = old.pop("dsa_decode_backend")
    _, _, reasons, _ = check_server_args(old, FlagIndex("0.5.23"))
    assert reasons == ["server_args.nsa_decode_backend: removed in 0.5.23, use dsa_decode_backend",
                       "server_args.nsa_prefill_backend: removed in 0.5.23, use dsa_prefill_backend"]
    assert check_server_args(old, FlagIndex("0.5.9"))[2] == []
