#!/usr/bin/env python3
"""Replay the calibration set through the planner: tools/calibration.py [--fit [--write]] [--no-loo] [--json FILE].

The logic is plugin_utils/calibration.py (controller code of the collection); docs/planner.md says what it prints.
"""
import sys

from ansible_collections.topolaunch.sglang.plugins.plugin_utils import calibration

if __name__ == "__main__":
    sys.exit(calibration.main())
