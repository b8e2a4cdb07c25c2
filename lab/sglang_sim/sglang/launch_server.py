"""Launch the inference server (simulated: see sglang/_sim/launcher.py)."""
import sys
import warnings

from sglang._sim import release
from sglang._sim.launcher import main

if __name__ == "__main__":
    if release.at_least("0.5.23"):  # 523:sglang/launch_server.py:70-77
        warnings.warn(
            "'python -m sglang.launch_server' is still supported, but "
            "'sglang serve' is the recommended entrypoint.\n"
            "  Example: sglang serve --model-path <model> [options]",
            UserWarning,
            stacklevel=1,
        )
    sys.exit(main())
