"""SGLang simulator for the topolaunch lab (not SGLang): `sglang.launch_server` and the benchmark client behave
like the SGLang release in sglang.version (without `+sim`) from the outside, without a GPU. See
lab/sglang_sim/README.md."""
from sglang.version import __version__
