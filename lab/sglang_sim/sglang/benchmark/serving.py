"""`python -m sglang.benchmark.serving`: SGLang 0.5.23's benchmark client module; the lab's client is
sglang/_sim/client.py."""
from sglang._sim.client import *  # noqa: F401,F403 - the client's names, as SGLang's module exposes them
from sglang._sim.client import cli_main

if __name__ == "__main__":
    cli_main()
