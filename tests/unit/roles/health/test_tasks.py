"""The health role's closing line (roles/health/tasks/main.yml), rendered by Ansible itself: a server that the
validate step left running (the same plan: a second `make demo`) is reported as "up for N s, not restarted", however
sglang_health's first look went, and a server this play started as "ready N s after its start"."""

import pytest
import yaml
from local_play import run_plays
import paths

ROOT = paths.ROOT
WAIT = {"plan": {"served_model_name": "glm", "layout": {"name": "tp8"}, "gpu_indices": [0, 1], "port": 30000},
        "since_start_s": 71.9, "generated_tokens": 8, "generated_text": "Paris"}
CASES = {
    # validate kept the server; health's first look did not find it ready (it waited a chunk): still not restarted
    "kept": {"launch_validated": {"replace": False}, "health_wait": dict(WAIT, already_serving=False)},
    "replaced": {"launch_validated": {"replace": True}, "health_wait": dict(WAIT, already_serving=False)},
    "no validate, found serving": {"health_wait": dict(WAIT, already_serving=True)},
    "no validate, started": {"health_wait": dict(WAIT, already_serving=False)},
    "probed": {"health_wait": dict(WAIT, already_serving=False, answer_probe={
        "state": "passed", "summary": 'the answer probe passed (asked to repeat 48213077 through /v1/chat/completions: '
                                      '"The number is 48213077.")'})},
}


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    """{case: the line health reports}, every case in one ansible-playbook run."""
    base = tmp_path_factory.mktemp("health")
    tasks = yaml.safe_load((ROOT / "roles" / "health" / "tasks" / "main.yml").read_text())
    msg = [t for t in tasks if t["name"] == "Report the healthy server"][0]["ansible.builtin.debug"]["msg"]
    defaults = {}
    for role in ("topolaunch", "health"):
        defaults.update(yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text()))
    plays = []
    for i, (case, variables) in enumerate(CASES.items()):
        plays.append({"name": case, "hosts": "localhost", "gather_facts": False, "vars": dict(defaults, **variables),
                      "tasks": [{"ansible.builtin.set_fact": {"report_%d" % i: msg}}]})
    return dict(zip(CASES, run_plays(plays, base, ["report_%d" % i for i in range(len(CASES))])))


@pytest.mark.parametrize("case, said", [
    ("kept", "up for 71.9 s, not restarted"),
    ("replaced", "ready 71.9 s after its start"),
    ("no validate, found serving", "up for 71.9 s, not restarted"),
    ("no validate, started", "ready 71.9 s after its start"),
])
def test_health_says_whether_the_server_was_restarted(reports, case, said):
    assert said in reports[case], reports[case]
    assert "serves glm (tp8 on GPUs 0,1) on port 30000" in reports[case]


def test_health_names_the_answer_probe_when_it_ran(reports):
    assert reports["probed"].endswith('/generate gave 8 tokens ("Paris"); the answer probe passed (asked to repeat '
                                      '48213077 through /v1/chat/completions: "The number is 48213077.").'), \
        reports["probed"]
    assert "answer probe" not in reports["replaced"]
