#!/usr/bin/env python3
"""Turn benchmark results into FINDINGS.md and PNG plots: tools/report.py RESULTS_DIR [--out DIR] [--model NAME]
[--fingerprint FP].

The logic is plugin_utils/report.py (controller code of the collection); its docstring says what it writes.
"""
import sys

from ansible_collections.topolaunch.sglang.plugins.plugin_utils import report

if __name__ == "__main__":
    sys.exit(report.main())
