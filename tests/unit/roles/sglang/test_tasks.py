"""The sglang role's service user check (roles/sglang/tasks/service_user.yml, part of its input check), run by
Ansible itself on localhost (issue 25 item 13): root is refused naming topolaunch_service_user, unless
topolaunch_force_service_user; a nologin system user and a user that does not exist yet pass."""
import pytest
from local_play import run_plays

CASES = {"root": ("root", False), "forced": ("root", True), "nologin": ("nobody", False),
         "absent": ("no-such-user-tl", False)}


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    base = tmp_path_factory.mktemp("sglang_service_user")
    plays = []
    for i, (user, forced) in enumerate(CASES.values()):
        plays.append({"name": "case %d" % i, "hosts": "localhost", "gather_facts": False,
                      "vars": {"topolaunch_service_user": user, "topolaunch_force_service_user": forced},
                      "tasks": [{"block": [
                          {"ansible.builtin.include_role": {"name": "topolaunch.sglang.sglang",
                                                            "tasks_from": "service_user"}},
                          {"ansible.builtin.set_fact": {"check_%d" % i: "passed"}}],
                          "rescue": [{"ansible.builtin.set_fact": {"check_%d" % i: "{{ ansible_failed_result.msg }}"}}]}]})
    return dict(zip(CASES, run_plays(plays, base, ["check_%d" % i for i in range(len(CASES))])))


def test_root_is_refused_naming_the_variable_unless_forced(checks):
    assert checks["root"].startswith("sglang: the service user 'root' (topolaunch_service_user) has uid 0 (root): "), \
        checks["root"]
    assert checks["root"].endswith("or set topolaunch_force_service_user: true")
    assert checks["forced"] == "passed"


def test_a_nologin_user_or_one_not_created_yet_passes(checks):
    assert checks["nologin"] == "passed" and checks["absent"] == "passed"
