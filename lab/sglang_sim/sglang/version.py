# The simulator's version: `<SGLang release>+sim`. build_wheel.py writes each wheel's own version here (one wheel
# per supported release); this source copy is what a run from the source tree (PYTHONPATH=lab/sglang_sim) reports.
__version__ = "0.5.9+sim"
__version_tuple__ = (0, 5, 9, "sim")
