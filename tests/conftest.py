"""Shared test setup: module_utils importable as in Ansible, fake NVML loaded in-process."""
import pathlib
import sys

import ansible.module_utils

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Modules import `ansible.module_utils.topolaunch.*`; Ansible finds it through ansible.cfg's module_utils.
if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))
# Pure logic is also importable as `topolaunch.*`, and modules as `library.*`-style paths.
for p in (ROOT / "module_utils", ROOT / "library", ROOT, ROOT / "lab"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))
