"""Lab tests: the `lab` marker selects the tests that boot lab hosts (`pytest -m lab`)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "lab: boots lab hosts with lab/lab.py (needs root, systemd-nspawn, debootstrap)")
