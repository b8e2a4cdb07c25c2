"""filter_plugins/rolling.py: the drain timeout as seconds, or a one-line error naming topolaunch_drain_timeout;
the role default passes it."""
import pathlib

import pytest
import yaml
from ansible.errors import AnsibleFilterError

from ansible_collections.topolaunch.sglang.plugins.filter.rolling import (FilterModule, rolling_decide,
                                                                           rolling_drain_timeout,
                                                                           rolling_drain_timeout_problem,
                                                                           rolling_failed)

ROOT = pathlib.Path(__file__).resolve().parents[4]


def test_the_filter_is_registered_and_the_default_passes():
    assert FilterModule().filters()["rolling_drain_timeout"] is rolling_drain_timeout
    default = yaml.safe_load((ROOT / "roles/topolaunch/defaults/main.yml").read_text())["topolaunch_drain_timeout"]
    assert rolling_drain_timeout(default) > 0
    assert rolling_drain_timeout("45") == 45.0                      # -e topolaunch_drain_timeout=45


@pytest.mark.parametrize("value", ["0", -5, "never"])
def test_a_bad_drain_timeout_fails_naming_the_field(value):
    with pytest.raises(AnsibleFilterError) as e:
        rolling_drain_timeout(value)
    assert str(e.value).startswith("topolaunch_drain_timeout: %r" % (value,)) and "\n" not in str(e.value)
    # what the relaunch asserts before anything stops: the same line, no exception
    assert rolling_drain_timeout_problem(value) == str(e.value)


def test_a_good_drain_timeout_has_no_problem():
    assert FilterModule().filters()["rolling_drain_timeout_problem"] is rolling_drain_timeout_problem
    assert rolling_drain_timeout_problem("120") == "" and rolling_drain_timeout_problem(0.5) == ""


GW = "topolaunch-gateway.service"


def _plan(index, port):
    return {"replica": {"index": index, "unit": "topolaunch-sglang@%d.service" % index}, "host": "127.0.0.1",
            "port": port, "gpu_indices": [index], "argv": ["--port", str(port)]}


WANTED = {"replicas": [{"index": i, "unit": "topolaunch-sglang@%d.service" % i, "host": "127.0.0.1",
                        "port": 30001 + i, "gpu_indices": [i], "numa_nodes": None} for i in (0, 1)]}
ACTIVE = {"topolaunch-sglang@0.service": "active", "topolaunch-sglang@1.service": "active", GW: "active"}


def test_an_unchanged_layout_with_the_gateway_active_rolls_else_all():
    plans = [_plan(0, 30001), _plan(1, 30002)]
    assert rolling_decide(WANTED, plans, ACTIVE, GW)["mode"] == "rolling"
    down = dict(ACTIVE, **{GW: "inactive"})
    assert rolling_decide(WANTED, plans, down, GW)["reason"].startswith("no gateway")
    assert "no replica runs yet" in rolling_decide(WANTED, [], ACTIVE, GW)["reason"]


def test_failed_names_the_replica_and_those_before_it():
    msg = rolling_failed({"index": 1, "unit": "topolaunch-sglang@1.service"}, "health", "boom", [0])
    assert msg.startswith("rolling relaunch stopped at replica 1 (topolaunch-sglang@1.service), step health: boom")
    assert msg.endswith("replicas replaced before it: 0")
