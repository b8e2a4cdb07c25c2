"""The launch role's unit template (roles/launch/templates/unit.service.j2) as the replicas' template unit
topolaunch-sglang@.service, and its env file (sglang.env.j2) per instance, rendered by Ansible itself: the template
runs the argv every replica shares and ends with the instance's own arguments from its env file; each instance's
env file holds its GPUs and its --host/--port/--numa-node; systemd loads an instance of the template."""
import os
import re
import shutil
import subprocess

import pytest
import yaml
from local_play import run_plays
from plan_cases import model_path, synth_facts
import paths
from ansible_collections.topolaunch.sglang.plugins.module_utils import gateway, planner, replicas

ROOT = paths.ROOT
TEMPLATES = ROOT / "roles" / "launch" / "templates"
ANALYZE = shutil.which("systemd-analyze")
INSTANCE_ENV = "/etc/topolaunch/sglang@%i.env"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    base = tmp_path_factory.mktemp("replica")
    facts = synth_facts("proxmox-8x-rtx-pro-6000-vnuma", base)
    defaults = yaml.safe_load((ROOT / "roles/topolaunch/defaults/main.yml").read_text())
    plan = gateway.serve(planner.plan(planner.PlanRequest(topology=facts, model_path=model_path("llama-3.1-70b"),
                                                          layout="tp4dp2", sglang_version="0.5.9")),
                         facts, "auto", defaults["topolaunch_gateway_releases"], defaults["topolaunch_gateway_version"])
    variables = {}
    for names in ("topolaunch/defaults", "launch/defaults", "launch/vars"):
        variables.update(yaml.safe_load((ROOT / "roles" / names / "main.yml").read_text()))
    cases = {"template": dict(variables, relaunch_plan=replicas.template_plan(plan), launch_instance_env_file=INSTANCE_ENV,
                              launch_instance_args=replicas.INSTANCE_ARGS)}
    for r in plan["replicas"]:
        cases["env%d" % r["index"]] = dict(variables, relaunch_plan=replicas.replica_plan(plan, r))
    plays = [{"name": case, "hosts": "localhost", "gather_facts": False, "vars": v, "tasks": [
        {"ansible.builtin.set_fact": {"rendered_" + case: "{{ lookup('ansible.builtin.template', '%s/%s') }}" % (
            TEMPLATES, "unit.service.j2" if case == "template" else "sglang.env.j2")}}]} for case, v in cases.items()]
    return dict(zip(cases, run_plays(plays, base, ["rendered_" + c for c in cases]))), plan


def test_the_template_runs_the_shared_argv_then_the_instances_own(rendered):
    files, plan = rendered
    unit = files["template"]
    joined = re.search(r"^ExecStart=(.*?)(?<!\\)$", unit.replace("\\\n", " "), flags=re.M | re.S).group(1)
    quoted = re.findall(r'"((?:[^"\\]|\\.)*)"', joined)
    assert quoted[1:3] == ["-m", "sglang.launch_server"]
    assert quoted[3:] == replicas.template_plan(plan)["argv"]
    assert joined.rstrip().endswith(" $TOPOLAUNCH_REPLICA_ARGS")   # unquoted: systemd splits it into arguments
    assert "EnvironmentFile=/etc/topolaunch/sglang@%i.env" in unit.splitlines()
    assert "SyslogIdentifier=topolaunch-sglang@%i" in unit.splitlines()
    assert any(line.startswith("Description=") and line.endswith(", replica %i, topolaunch)")
               for line in unit.splitlines())


def test_each_instance_env_file_holds_its_gpus_and_own_arguments(rendered):
    files, _ = rendered
    assert 'TOPOLAUNCH_REPLICA_ARGS="--host 127.0.0.1 --port 30001 --numa-node 0 0 0 0"' in files["env0"]
    assert 'TOPOLAUNCH_REPLICA_ARGS="--host 127.0.0.1 --port 30002 --numa-node 1 1 1 1"' in files["env1"]
    assert 'CUDA_VISIBLE_DEVICES="4,5,6,7"' in files["env1"] and 'CUDA_VISIBLE_DEVICES="0,1,2,3"' in files["env0"]


@pytest.mark.skipif(not ANALYZE, reason="needs systemd-analyze")
def test_systemd_loads_an_instance_of_the_template(rendered, tmp_path):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    text = rendered[0]["template"].replace("/opt/sglang/venvs/0.5.9/bin/python", str(python))
    text = re.sub(r"^(User|Group)=.*$", r"\1=root", text, flags=re.M)
    (tmp_path / "topolaunch-sglang@.service").write_text(text)
    os.symlink("topolaunch-sglang@.service", tmp_path / "topolaunch-sglang@1.service")
    proc = subprocess.run([ANALYZE, "verify", str(tmp_path / "topolaunch-sglang@1.service")], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0 and "topolaunch-sglang@" not in proc.stderr, proc.stderr
