"""The TTFT alert follows the workload's latency target (issue 23 item 3, issue 24 item 4): roles/monitoring's
default for monitoring_alert_ttft_p99_target_ms is topolaunch_workload.slo.ttft_ms, rendered by Ansible's own
templating; the rule exists only when the workload sets one (tests/rules/common/SGLangTTFTAboveTarget.yml tests it
both ways through promtool)."""
import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from ansible_collections.topolaunch.sglang.plugins.filter import monitoring as m
from paths import ROOT

DEFAULT = yaml.safe_load((ROOT / "roles/monitoring/defaults/main.yml").read_text())[
    "monitoring_alert_ttft_p99_target_ms"]


def target(workload):
    templar = Templar(loader=DataLoader(), variables={"topolaunch_workload": workload})
    return templar.template(trust_as_template(DEFAULT))


@pytest.mark.parametrize("workload, ms", [
    ({"input_len": 64, "output_len": 16, "concurrency": 4}, 0),
    ({"concurrency": "max", "slo": {"ttft_ms": 750}}, 750),
    ({"concurrency": 8, "slo": {"tpot_ms": 20}}, 0),
    ({"concurrency": 8, "slo": {"ttft_ms": None, "tpot_ms": 20}}, 0),
])
def test_the_ttft_rule_is_there_only_with_the_workloads_target(workload, ms):
    assert float(target(workload)) == ms
    rules = {r["alert"]: r for g in m.monitoring_rules({"ttft_p99_target_ms": str(target(workload))})["groups"]
             for r in g["rules"]}
    if ms:
        assert rules["SGLangTTFTAboveTarget"]["expr"].endswith("> %g" % (ms / 1000.0))
    else:
        assert "SGLangTTFTAboveTarget" not in rules
