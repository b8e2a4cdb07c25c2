"""Lab tests: the `lab` marker selects the tests that boot lab hosts (`pytest -m lab`); `full` marks the longer
scenarios that CI leaves out for time (`make lab-tests-full` runs them, `make lab-tests` does not)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "lab: boots lab hosts with lab/lab.py (needs root, systemd-nspawn, debootstrap)")
    config.addinivalue_line("markers", "full: a longer lab scenario left out of CI for time (make lab-tests-full)")
