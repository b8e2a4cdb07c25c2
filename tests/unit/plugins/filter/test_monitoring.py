"""filter_plugins/monitoring.py: what Prometheus scrapes from the inventory, the problems found before any change
(a monitoring host not in the inventory, an address that is not one, two listeners on one port, a loopback target
another machine's Prometheus cannot reach, a port another program holds), and the alert rules from the thresholds."""
import pathlib

import pytest
import yaml

from ansible_collections.topolaunch.sglang.plugins.filter import monitoring as m

ROOT = pathlib.Path(__file__).resolve().parents[4]
GROUPS = {"all": ["field", "naive", "mon"], "sglang_servers": ["field"], "gpu_hosts": ["field", "naive"],
          "monitoring": ["mon"]}


def hostvars(**over):
    hv = {"field": {"ansible_host": "10.0.0.1", "topolaunch_host": "10.0.0.1"},
          "naive": {"ansible_host": "10.0.0.2", "monitoring_listen_address": "10.0.0.2"},
          "mon": {"ansible_host": "10.0.0.9"}}
    for host, values in over.items():
        hv[host] = dict(hv[host], **values)
    return hv


def test_every_server_and_gpu_host_is_scraped_where_it_listens():
    jobs = {j["job_name"]: j for j in m.monitoring_scrape_configs(["mon"], hostvars(), GROUPS, "5s")}
    assert list(jobs) == ["sglang", "node", "gpu"]
    assert jobs["sglang"]["static_configs"] == [{"targets": ["10.0.0.1:30000"], "labels": {"host": "field"}}]
    assert [c["targets"] for c in jobs["node"]["static_configs"]] == [["10.0.0.1:9100"], ["10.0.0.2:9100"]]
    assert [c["targets"] for c in jobs["gpu"]["static_configs"]] == [["10.0.0.1:9400"], ["10.0.0.2:9400"]]
    assert jobs["gpu"]["scrape_interval"] == "5s"
    assert m.monitoring_problems(["mon"], hostvars(), GROUPS) == []


def test_the_inventory_ports_replicas_gateway_and_wildcards():
    hv = hostvars(field={"topolaunch_replica_ports": [30001, 30002], "topolaunch_gateway_metrics_port": 29000,
                         "monitoring_node_exporter_port": 9200, "monitoring_listen_address": "0.0.0.0"},
                  naive={"monitoring_listen_address": "fd00::2"})
    jobs = {j["job_name"]: j for j in m.monitoring_scrape_configs(["mon"], hv, GROUPS)}
    assert [c["targets"][0] for c in jobs["sglang"]["static_configs"]] == ["10.0.0.1:30001", "10.0.0.1:30002"]
    assert jobs["sglang-gateway"]["static_configs"][0]["targets"] == ["10.0.0.1:29000"]
    # a wildcard listener is scraped at the host's ansible_host; IPv6 in brackets
    assert [c["targets"][0] for c in jobs["node"]["static_configs"]] == ["10.0.0.1:9200", "[fd00::2]:9100"]
    assert m.monitoring_problems(["mon"], hv, GROUPS) == []


def test_the_replicas_this_runs_plan_serves_and_their_gateway_are_scraped():
    """Issue 23 item 2 with replicas: the plan puts the replicas on their ports (the inventory does not say)."""
    plan = {"replicas": [{"index": 0, "unit": "topolaunch-sglang@0.service", "port": 30001},
                         {"index": 1, "unit": "topolaunch-sglang@1.service", "port": 30002}],
            "gateway": {"unit": "topolaunch-gateway.service", "port": 30000}}
    jobs = {j["job_name"]: j for j in m.monitoring_scrape_configs(["mon"], hostvars(field={"topolaunch_plan": plan}),
                                                                  GROUPS)}
    assert [c["targets"][0] for c in jobs["sglang"]["static_configs"]] == ["10.0.0.1:30001", "10.0.0.1:30002"]
    assert jobs["sglang-gateway"]["static_configs"][0]["targets"] == ["10.0.0.1:29000"]
    single = {j["job_name"]: j for j in m.monitoring_scrape_configs(
        ["mon"], hostvars(field={"topolaunch_plan": {"port": 30000}}), GROUPS)}
    assert list(single) == ["sglang", "node", "gpu"]
    # the stage run alone (no plan in the run): what the host runs, read from it (relaunch_host_plan)
    alone = {j["job_name"]: j for j in m.monitoring_scrape_configs(
        ["mon"], hostvars(field={"relaunch_host_plan": plan}), GROUPS)}
    assert [c["targets"][0] for c in alone["sglang"]["static_configs"]] == ["10.0.0.1:30001", "10.0.0.1:30002"]
    assert alone["sglang-gateway"]["static_configs"][0]["targets"] == ["10.0.0.1:29000"]
    # this run's plan wins over what the host ran before it
    run = {j["job_name"]: j for j in m.monitoring_scrape_configs(
        ["mon"], hostvars(field={"relaunch_host_plan": plan, "topolaunch_plan": {"port": 30000}}), GROUPS)}
    assert list(run) == ["sglang", "node", "gpu"]


def test_a_server_across_nodes_is_scraped_on_node_0_only():
    groups = dict(GROUPS, sglang_servers=["field", "naive"])
    nodes = {"topolaunch_nodes": ["field", "naive"]}
    hv = hostvars(field=nodes, naive=dict(nodes, topolaunch_host="10.0.0.2"))
    jobs = {j["job_name"]: j for j in m.monitoring_scrape_configs(["mon"], hv, groups)}
    assert [c["labels"]["host"] for c in jobs["sglang"]["static_configs"]] == ["field"]


def test_replicas_on_several_hosts_are_scraped_each_on_its_host_and_the_gateway_on_its_own():
    groups = dict(GROUPS, sglang_servers=["field", "naive"])
    replicas = [{"index": 0, "node_rank": 0, "unit": "topolaunch-sglang@0.service", "host": "10.0.0.1", "port": 30001},
                {"index": 1, "node_rank": 1, "unit": "topolaunch-sglang@1.service", "host": "10.0.0.2", "port": 30002}]
    plan = {"replicas": replicas, "replica_nodes": [{"node_rank": 0}, {"node_rank": 1}],
            "gateway": {"unit": "topolaunch-gateway.service", "node_rank": 0, "port": 30000}}
    nodes = {"topolaunch_nodes": ["field", "naive"]}
    hv = hostvars(field=dict(nodes, topolaunch_plan=dict(plan, node_rank=0)),
                  naive=dict(nodes, topolaunch_host="10.0.0.2", topolaunch_plan=dict(plan, node_rank=1)))
    jobs = {j["job_name"]: j for j in m.monitoring_scrape_configs(["mon"], hv, groups)}
    assert [(c["labels"]["host"], c["targets"][0]) for c in jobs["sglang"]["static_configs"]] == [
        ("field", "10.0.0.1:30001"), ("naive", "10.0.0.2:30002")]
    assert [c["labels"]["host"] for c in jobs["sglang-gateway"]["static_configs"]] == ["field"]


def test_no_targets_no_jobs():
    assert m.monitoring_scrape_configs([], {}, {"all": []}) == []
    assert m.monitoring_problems([], {}, {}) == []


@pytest.mark.parametrize("mon, over, expected", [
    (["mon", "ghost"], {}, "monitoring_hosts names 'ghost', which is not a host of the inventory"),
    (["mon"], {"naive": {"monitoring_listen_address": "localhost"}},
     "monitoring_listen_address of host naive is 'localhost': not an IP address"),
    (["mon"], {"field": {"topolaunch_host": "10.0.0.1:80"}}, "topolaunch_host of host field is '10.0.0.1:80': not an IP address"),
    (["mon"], {"field": {"monitoring_gpu_exporter_port": 70000}},
     "monitoring_gpu_exporter_port of host field is 70000: not a port (1-65535)"),
    (["mon"], {"field": {"monitoring_gpu_exporter_port": 30000}},
     "monitoring_gpu_exporter_port of host field is 30000, which topolaunch_port of host field already listens on (10.0.0.1)"),
    (["mon"], {"mon": {"monitoring_prometheus_address": "nowhere"}},
     "monitoring_prometheus_address of host mon is 'nowhere': not an IP address"),
    (["mon"], {"field": {"monitoring_gpu_exporter": "other"}},
     "monitoring_gpu_exporter of host field is 'other': one of nvitop, dcgm"),
    (["mon"], {"naive": {"monitoring_listen_address": "127.0.0.1"}},
     "node of host naive listens on 127.0.0.1 (monitoring_listen_address), which Prometheus on mon cannot reach: "
     "give the host an address Prometheus reaches"),
])
def test_each_problem_is_one_line_naming_the_field(mon, over, expected):
    problems = m.monitoring_problems(mon, hostvars(**over), GROUPS)
    assert expected in problems, problems
    assert all("\n" not in p for p in problems)


def test_two_hosts_of_one_machine_share_its_ports_and_loopback():
    """The lab: every host is 127.0.0.1 (one network); loopback is reachable, one port is not two listeners."""
    hv = {h: {"ansible_host": "127.0.0.1"} for h in ("field", "naive", "mon")}
    assert m.monitoring_problems(["mon"], hv, GROUPS) == [
        "monitoring_node_exporter_port of host naive is 9100, which monitoring_node_exporter_port of host field already "
        "listens on (127.0.0.1)",
        "monitoring_gpu_exporter_port of host naive is 9400, which monitoring_gpu_exporter_port of host field already "
        "listens on (127.0.0.1)"]
    hv["naive"].update(monitoring_node_exporter_port=9101, monitoring_gpu_exporter_port=9401)
    assert m.monitoring_problems(["mon"], hv, GROUPS) == []


def test_the_listeners_of_a_host():
    got = m.monitoring_listeners("field", hostvars(), GROUPS, ["mon"])
    assert [(x["job"], x["port"], x["unit"]) for x in got] == [
        ("sglang", 30000, "topolaunch-sglang.service"), ("node", 9100, "prometheus-node-exporter.service"),
        ("gpu", 9400, "topolaunch-gpu-exporter.service")]
    assert m.monitoring_listeners("mon", hostvars(), GROUPS, ["mon"]) == [
        {"job": "prometheus", "address": "127.0.0.1", "port": 9090, "field": "monitoring_prometheus_port",
         "unit": "prometheus.service"}]


def test_a_port_held_by_another_program_conflicts_and_its_own_unit_does_not():
    want = m.monitoring_listeners("field", hostvars(), GROUPS)
    sshd = {"address": "0.0.0.0", "port": 9100, "pid": 12, "comm": "sshd", "unit": "ssh.service"}
    own = {"address": "10.0.0.1", "port": 9400, "pid": 40, "comm": "nvitop-exporter",
           "unit": "topolaunch-gpu-exporter.service"}
    server = {"address": "10.0.0.1", "port": 30000, "pid": 50, "comm": "python3", "unit": "topolaunch-sglang.service"}
    other_address = {"address": "10.0.0.7", "port": 9100, "pid": 13, "comm": "x", "unit": ""}
    assert m.monitoring_port_conflicts([own, server, other_address], want, "field") == []
    assert m.monitoring_port_conflicts([sshd, own], want, "field") == [
        "monitoring_node_exporter_port of host field is 9100, which is in use by sshd (pid 12, ssh.service) on 0.0.0.0"]
    unknown = {"address": "::", "port": 9400, "pid": None, "comm": "", "unit": ""}
    assert m.monitoring_port_conflicts([unknown], want, "field") == [
        "monitoring_gpu_exporter_port of host field is 9400, which is in use by ? (pid ?, no unit) on ::"]


def alerts(rules):
    return {r["alert"]: r for g in rules["groups"] for r in g["rules"]}


def test_the_rules_carry_the_thresholds_and_sglang_names():
    rules = alerts(m.monitoring_rules({"kv_usage": 0.9, "for": "3m", "ttft_p99_target_ms": 800}))
    assert rules["SGLangKVCacheFull"]["expr"].endswith("(sglang:token_usage) > 0.9")
    assert rules["SGLangKVCacheFull"]["for"] == "3m"
    assert "sglang:time_to_first_token_seconds_bucket" in rules["SGLangTTFTAboveTarget"]["expr"]
    assert rules["SGLangTTFTAboveTarget"]["expr"].endswith("> 0.8")
    assert "sglang:num_queue_reqs" in rules["SGLangGenerationStalled"]["expr"]
    assert "gpu_memory_percent_Percentage > 98" == rules["GPUMemoryFull"]["expr"]
    assert "GPUXidError" not in rules


def test_no_ttft_alert_without_a_target_and_dcgm_names():
    rules = alerts(m.monitoring_rules({"gpu_exporter": "dcgm"}))
    assert "SGLangTTFTAboveTarget" not in rules
    assert "DCGM_FI_DEV_FB_USED" in rules["GPUMemoryFull"]["expr"] and "GPUXidError" in rules


@pytest.mark.parametrize("settings, expected", [
    ({"kv_usage": 1.5}, "monitoring_alert_kv_usage is 1.5: a number from 0.0 to 1.0"),
    ({"for": "soon"}, "monitoring_alert_for is 'soon': a Prometheus duration such as 30s, 5m"),
    ({"ttft_p99_target_ms": -1}, "monitoring_alert_ttft_p99_target_ms is -1: a number >= 0.0"),
    ({"gpu_exporter": "x"}, "monitoring_gpu_exporter is 'x': one of nvitop, dcgm"),
])
def test_bad_thresholds_are_one_line(settings, expected):
    assert m.monitoring_settings_problems(settings) == [expected]
    with pytest.raises(ValueError):
        m.monitoring_rules(settings)


def test_the_defaults_are_the_roles():
    role = yaml.safe_load((ROOT / "roles/monitoring/defaults/main.yml").read_text())
    shared = yaml.safe_load((ROOT / "roles/topolaunch/defaults/main.yml").read_text())
    for name, value in m.DEFAULTS.items():
        assert (role if name.startswith("monitoring_") else shared)[name] == value, name
    settings = m.monitoring_rules({})
    assert settings == m.monitoring_rules({k[len("monitoring_alert_"):]: v for k, v in role.items()
                                           if k.startswith("monitoring_alert_") and "{{" not in str(v)})


def test_every_filter_is_registered():
    assert set(m.FilterModule().filters()) == {"monitoring_problems", "monitoring_scrape_configs",
                                               "monitoring_listeners", "monitoring_port_conflicts", "monitoring_rules",
                                               "monitoring_settings_problems"}


@pytest.mark.parametrize("version", ["0_5_9", "0_5_23"])
def test_the_rules_name_metrics_each_release_exports_with_their_types(version):
    """Every sglang: name in the rules is in the release's own metrics table (tools/sglang_metrics.py extracted it
    from the wheel), histograms through their _bucket series, and model_name is one of their labels."""
    import importlib
    import re
    table = importlib.import_module(
        "ansible_collections.topolaunch.sglang.plugins.module_utils.sglang_metrics_%s" % version)
    rules = m.monitoring_rules({"ttft_p99_target_ms": 500})
    exprs = " ".join(r["expr"] for g in rules["groups"] for r in g["rules"])
    used = set(re.findall(r"sglang:[a-z_]+", exprs))
    assert {"sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
            "sglang:generation_tokens_total", "sglang:time_to_first_token_seconds_bucket"} <= used
    for name in used:
        base = name[:-len("_bucket")] if name.endswith("_bucket") else name
        meta = table.METRICS[base]
        assert meta["type"] == ("histogram" if name.endswith("_bucket") else meta["type"]), name
        labels = table.COLLECTOR_LABELS[meta["collector"]]
        assert "model_name" in labels, name
