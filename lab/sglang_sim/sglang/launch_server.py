"""Launch the inference server (simulated: see sglang/_sim/launcher.py)."""
import sys

from sglang._sim.launcher import main

if __name__ == "__main__":
    sys.exit(main())
