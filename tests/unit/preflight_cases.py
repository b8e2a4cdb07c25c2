"""The preflight record of the box whose GPU pair 3-7 hangs with P2P, measured by the lab's stand-in worker: as the
tests of preflight_plot.py and the action plugin gpu_preflight use it."""
import sys

import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils import preflight
import paths

ROOT = paths.ROOT


STANDIN = str(ROOT / "lab" / "preflight" / "worker_standin.py")
HANG = ROOT / "lab" / "specs" / "proxmox-8x-rtx-pro-6000-p2p-hang.json"


@pytest.fixture(scope="module")
def hang_record():
    """The box whose pair 3-7 hangs with P2P: both passes (P2P on with the hang, P2P off for every pair)."""
    return preflight.run_preflight(sys.executable, STANDIN, list(range(8)), settings={"step_timeout": 4.0},
                                   fingerprint="abcdef012345", env={"FAKE_NVML_SPEC": str(HANG)})
