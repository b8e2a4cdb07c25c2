"""`python -m sglang.bench_serving`: the lab's benchmark client (sglang/_sim/client.py).

SGLang 0.5.9's client lives here; 0.5.23 moved it to sglang.benchmark.serving and keeps this module as a deprecated
alias that warns when imported (523:sglang/bench_serving.py:1-22).
"""
import warnings

from sglang._sim import release
from sglang._sim.client import *  # noqa: F401,F403 - the client's names, as SGLang's module exposes them
from sglang._sim.client import cli_main

if release.at_least("0.5.23"):
    warnings.warn(
        "`sglang.bench_serving` is deprecated and will be removed in a future "
        "release; use `sglang.benchmark.serving` instead "
        "(e.g. `python -m sglang.benchmark.serving`).",
        FutureWarning,
        stacklevel=1,
    )

if __name__ == "__main__":
    cli_main()
