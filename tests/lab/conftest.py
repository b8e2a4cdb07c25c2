"""Lab tests: the `lab` marker selects the tests that boot lab hosts (`pytest -m lab`); `full` marks the longer
scenarios that CI leaves out for time (`make lab-tests-full` runs them, `make lab-tests` does not).

The fixtures here need a module's own `host` fixture (a lifecyclelab.Host booted by that file on its own ports):
good_tp8 and tp4pp2 are the same relaunches for every file that uses them."""
import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "lab: boots lab hosts with lab/lab.py (needs root, systemd-nspawn, debootstrap)")
    config.addinivalue_line("markers", "full: a longer lab scenario left out of CI for time (make lab-tests-full)")


@pytest.fixture(scope="module")
def good_tp8(host):
    """tp8 healthy and recorded as last known good; returns its plan."""
    rc, out = host.relaunch("-e", "layout=tp8")
    assert rc == 0, out[-4000:]
    return host.plan("last_good_plan.json")


@pytest.fixture(scope="module")
def tp4pp2(host, good_tp8):
    """The planner's tp4pp2 plan (launched once), then tp8 back in place."""
    rc, out = host.relaunch("-e", "layout=tp4pp2")
    assert rc == 0, out[-4000:]
    plan = host.plan()
    rc, out = host.relaunch("-e", "layout=tp8")
    assert rc == 0, out[-4000:]
    return plan
