"""filter_plugins/status.py: the values of named metrics in a Prometheus text exposition (summed over series, the
maximum for ratios), and the lines playbooks/status.yml prints for a server."""
from ansible_collections.topolaunch.sglang.plugins.filter.status import FilterModule, metric_values, status_lines

TEXT = """# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="glm",pp_rank="0",tp_rank="0"} 3.0
sglang:num_running_reqs{engine_type="unified",model_name="glm",pp_rank="1",tp_rank="0"} 2.0
sglang:token_usage{model_name="glm",tp_rank="0"} 0.25
sglang:token_usage{model_name="glm",tp_rank="1"} 0.5
sglang:gen_throughput{model_name="glm",tp_rank="0"} NaN
sglang:num_queue_reqs 4
garbage line
topolaunch_watchdog_gave_up{unit="a.service"} 0
topolaunch_watchdog_gave_up{unit="b.service"} 1
"""


def test_values_are_summed_or_their_maximum_taken():
    got = metric_values(TEXT, ["sglang:num_running_reqs", "sglang:token_usage", "sglang:num_queue_reqs",
                               "sglang:gen_throughput", "topolaunch_watchdog_gave_up", "absent"])
    assert got == {"sglang:num_running_reqs": 5.0, "sglang:token_usage": 0.5, "sglang:num_queue_reqs": 4.0,
                   "topolaunch_watchdog_gave_up": 1.0}
    assert metric_values("", ["x"]) == {} and metric_values(None, None) == {}


def test_the_lines_of_a_serving_server():
    lines = status_lines({
        "plan": {"layout": {"name": "tp4pp2"}, "gpu_indices": [0, 1], "served_model_name": "glm",
                 "sglang_version": "0.5.23", "source": "heuristic"},
        "unit": {"ActiveState": "active", "SubState": "running", "NRestarts": "0"}, "uptime_s": 90061.5,
        "health": {"status": 200, "url": "http://127.0.0.1:30000/health"},
        "metrics": {"sglang:num_running_reqs": 5.0, "sglang:num_queue_reqs": 0.0, "sglang:token_usage": 0.5,
                    "sglang:gen_throughput": 812.5},
        "watchdog": {"topolaunch_watchdog_healthy": 1.0, "topolaunch_watchdog_consecutive_failures": 0.0,
                     "topolaunch_watchdog_restarts_last_hour": 1.0, "topolaunch_watchdog_restarts_total": 2.0,
                     "topolaunch_watchdog_gave_up": 0.0},
        "watchdog_journal": ["restarted topolaunch-sglang.service after 3 failed probes"]})
    assert lines == [
        "plan: tp4pp2 on GPUs 0,1, model glm, SGLang 0.5.23 (heuristic)",
        "unit: active/running, up 1d 01:01:01, 0 restart(s) by systemd",
        "health: ok (http://127.0.0.1:30000/health 200)",
        "now: 5 running, 0 queued, token usage 0.5, 812.5 tokens/s generated",
        "watchdog: healthy, 0 failure(s) in a row, 1 restart(s) in the last hour (2 in all)",
        "watchdog log: restarted topolaunch-sglang.service after 3 failed probes"]


def test_the_lines_of_a_host_with_nothing_running():
    lines = status_lines({"plan": {}, "unit": {"ActiveState": "inactive", "SubState": "dead", "NRestarts": "0"},
                          "uptime_s": None, "health": {"status": -1, "url": "http://x/health", "msg": "refused"},
                          "watchdog": {"topolaunch_watchdog_gave_up": 1.0}})
    assert lines[0] == "plan: none (no current_plan.json: nothing launched here)"
    assert lines[1] == "unit: inactive/dead, up -, 0 restart(s) by systemd"
    assert lines[2] == "health: no answer (http://x/health refused)"
    assert status_lines({"health": {"status": 503, "url": "u"}})[2] == "health: FAILING (u 503)"
    assert lines[3].startswith("now: no metrics")
    assert lines[4].endswith("GAVE UP: the server is left down")


def test_filters_are_registered():
    assert set(FilterModule().filters()) == {"metric_values", "status_lines"}
