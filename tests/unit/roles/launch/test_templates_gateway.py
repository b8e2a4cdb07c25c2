"""The launch role's gateway unit (roles/launch/templates/gateway.service.j2) for a plan with replicas, rendered by
Ansible itself: smg's argv from the plan (worker URLs, policy, health checks), the API key only as a credential
(LoadCredential=, never in the unit's command line), hardened, and a unit systemd loads."""
import re
import shutil
import subprocess

import pytest
import yaml
from local_play import run_plays
from plan_cases import model_path, synth_facts
import paths
from ansible_collections.topolaunch.sglang.plugins.module_utils import gateway, planner

ROOT = paths.ROOT
TEMPLATE = ROOT / "roles" / "launch" / "templates" / "gateway.service.j2"
KEY = 'sk-t0p "s3cr3t" %h $HOME'
CASES = {"keyed": {"topolaunch_api_key": KEY}, "plain": {}}
ANALYZE = shutil.which("systemd-analyze")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    base = tmp_path_factory.mktemp("gateway")
    facts = synth_facts("proxmox-8x-rtx-pro-6000-vnuma", base)
    defaults = yaml.safe_load((ROOT / "roles/topolaunch/defaults/main.yml").read_text())
    plan = gateway.serve(planner.plan(planner.PlanRequest(topology=facts, model_path=model_path("llama-3.1-70b"),
                                                          layout="tp4dp2", sglang_version="0.5.23")),
                         facts, "auto", defaults["topolaunch_gateway_releases"], defaults["topolaunch_gateway_version"])
    plays = []
    for case, extra in CASES.items():
        variables = {}
        for names in ("topolaunch/defaults", "launch/defaults", "launch/vars"):
            variables.update(yaml.safe_load((ROOT / "roles" / names / "main.yml").read_text()))
        variables.update({"relaunch_plan": plan})
        variables.update(extra)
        plays.append({"name": case, "hosts": "localhost", "gather_facts": False, "vars": variables, "tasks": [
            {"ansible.builtin.set_fact": {"rendered_" + case: "{{ lookup('ansible.builtin.template', '%s') }}"
                                          % TEMPLATE}}]})
    return dict(zip(CASES, run_plays(plays, base, ["rendered_" + c for c in CASES]))), plan


def exec_start(text):
    """ExecStart= joined over its continuation lines, unquoted."""
    joined = re.search(r"^ExecStart=(.*?)(?<!\\)$", text.replace("\\\n", " "), flags=re.M | re.S).group(1)
    return re.findall(r'"((?:[^"\\]|\\.)*)"', joined)


def test_the_gateway_runs_the_plans_argv_through_its_launcher(rendered):
    units, plan = rendered
    argv = exec_start(units["plain"])
    assert argv[:2] == ["/opt/topolaunch/gateway/bin/python", "/opt/topolaunch/gateway/gateway_launcher.py"]
    assert argv[2:] == plan["gateway"]["argv"]
    assert argv[argv.index("--worker-urls") + 1:argv.index("--worker-urls") + 3] == [
        "http://127.0.0.1:30001", "http://127.0.0.1:30002"]
    assert "topolaunch-sglang@0.service, topolaunch-sglang@1.service" in units["plain"]
    assert "LoadCredential" not in units["plain"]


def test_the_key_is_a_credential_only(rendered):
    units, _ = rendered
    text = units["keyed"]
    assert "s3cr3t" not in text
    assert [line for line in text.splitlines() if line.startswith("LoadCredential=")] == [
        "LoadCredential=api-key:/etc/topolaunch/gateway-api-key"]


def _unit(tmp_path, text):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    text = text.replace("/opt/topolaunch/gateway/bin/python", str(python))
    text = re.sub(r"^(User|Group)=.*$", r"\1=root", text, flags=re.M)
    path = tmp_path / "topolaunch-gateway.service"
    path.write_text(text)
    return path


@pytest.mark.skipif(not ANALYZE, reason="needs systemd-analyze")
@pytest.mark.parametrize("case", list(CASES))
def test_systemd_loads_the_gateway_unit(rendered, case, tmp_path):
    path = _unit(tmp_path, rendered[0][case])
    proc = subprocess.run([ANALYZE, "verify", str(path)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and str(path) not in proc.stderr, proc.stderr


@pytest.mark.skipif(not ANALYZE, reason="needs systemd-analyze")
def test_gateway_security_exposure_at_most_the_servers(rendered, tmp_path):
    path = _unit(tmp_path, rendered[0]["plain"])
    proc = subprocess.run([ANALYZE, "security", "--offline=true", "--no-pager", str(path)], capture_output=True,
                          text=True, check=False)
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", proc.stdout + proc.stderr)
    assert found and float(found.group(1)) <= 4.5, proc.stdout + proc.stderr


@pytest.mark.skipif(not ANALYZE, reason="needs systemd-analyze")
def test_the_validate_phase_refuses_a_gateway_unit_systemd_would_not_load(rendered, tmp_path):
    """roles/launch/tasks/gateway_validate.yml (replicas.yml runs it before anything stops): a unit systemd-analyze
    verify accepts passes; one it refuses (here a gateway venv that is not an absolute path: systemd cannot exec its
    python) fails naming the unit and systemd's words."""
    venv = tmp_path / "gw"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\n")
    (venv / "bin" / "python").chmod(0o755)
    variables = {"relaunch_plan": rendered[1], "topolaunch_service_user": "root", "topolaunch_service_group": "root",
                 "ansible_become_method": "su"}
    plays = [{"name": case, "hosts": "localhost", "gather_facts": False,
              "vars": dict(variables, topolaunch_gateway_venv=path), "tasks": [{"block": [
                  {"ansible.builtin.include_role": {"name": "topolaunch.sglang.launch",
                                                    "tasks_from": "gateway_validate"}},
                  {"ansible.builtin.set_fact": {"verified_" + case: "passed"}}],
                  "rescue": [{"ansible.builtin.set_fact": {"verified_" + case: "{{ ansible_failed_result.msg }}"}}]}]}
             for case, path in (("good", str(venv)), ("relative", "opt/gw"))]
    good, relative = run_plays(plays, tmp_path, ["verified_good", "verified_relative"])
    assert good == "passed"
    assert relative.startswith("Cannot start the gateway: systemd-analyze verify refuses its rendered unit "
                               "topolaunch-gateway.service: topolaunch-gateway.service:"), relative
    assert "nothing was stopped" in relative and "\n" not in relative
