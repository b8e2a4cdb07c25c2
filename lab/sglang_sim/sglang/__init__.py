"""SGLang simulator for the topolaunch lab (not SGLang): `sglang.launch_server` and `sglang.bench_serving`
behave like SGLang 0.5.9 from the outside, without a GPU. See lab/sglang_sim/README.md."""
from sglang.version import __version__

SIMULATED = True
