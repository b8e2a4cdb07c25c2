"""The launch role's unit template (roles/launch/templates/unit.service.j2) and env file (sglang.env.j2) for each
replica of a DP layout, rendered by Ansible itself from the replica's own plan (replicas.replica_plan), as the
relaunch renders them: each replica's own unit (topolaunch-sglang@<i>.service) runs its own argv (its --port and
--numa-node) and reads its own env file (its GPUs); systemd loads it."""
import re
import shutil
import subprocess

import pytest
import yaml
from local_play import run_plays
from plan_cases import model_path, synth_facts
import paths
from ansible_collections.topolaunch.sglang.plugins.filter.gateway import replica_env_file
from ansible_collections.topolaunch.sglang.plugins.module_utils import gateway, planner, replicas

ROOT = paths.ROOT
TEMPLATES = ROOT / "roles" / "launch" / "templates"
ANALYZE = shutil.which("systemd-analyze")


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
    cases = {}
    for r in plan["replicas"]:
        v = dict(variables, relaunch_plan=replicas.replica_plan(plan, r),
                 topolaunch_env_file=replica_env_file(variables["topolaunch_env_file"], r["index"]))
        cases["unit%d" % r["index"]] = cases["env%d" % r["index"]] = v
    plays = [{"name": case, "hosts": "localhost", "gather_facts": False, "vars": v, "tasks": [
        {"ansible.builtin.set_fact": {"rendered_" + case: "{{ lookup('ansible.builtin.template', '%s/%s') }}" % (
            TEMPLATES, "unit.service.j2" if case.startswith("unit") else "sglang.env.j2")}}]} for case, v in cases.items()]
    return dict(zip(cases, run_plays(plays, base, ["rendered_" + c for c in cases]))), plan, variables


def test_each_replica_unit_runs_its_own_argv_and_env_file(rendered):
    files, plan, variables = rendered
    for r in plan["replicas"]:
        unit = files["unit%d" % r["index"]]
        joined = re.search(r"^ExecStart=(.*?)(?<!\\)$", unit.replace("\\\n", " "), flags=re.M | re.S).group(1)
        quoted = re.findall(r'"((?:[^"\\]|\\.)*)"', joined)
        assert quoted[1:3] == ["-m", "sglang.launch_server"] and quoted[3:] == r["argv"]
        assert quoted[quoted.index("--port") + 1] == str(r["port"])
        assert quoted[quoted.index("--numa-node") + 1:][:4] == [str(r["index"])] * 4      # one NUMA node per replica
        assert "$" not in joined                                       # no variable left for systemd to split
        assert "EnvironmentFile=%s" % replica_env_file(variables["topolaunch_env_file"], r["index"]) in unit.splitlines()


def test_each_instance_env_file_holds_its_gpus(rendered):
    files = rendered[0]
    assert 'CUDA_VISIBLE_DEVICES="4,5,6,7"' in files["env1"] and 'CUDA_VISIBLE_DEVICES="0,1,2,3"' in files["env0"]
    assert "TOPOLAUNCH_REPLICA_ARGS" not in files["env0"] + files["env1"]


@pytest.mark.skipif(not ANALYZE, reason="needs systemd-analyze")
def test_systemd_loads_a_replica_unit(rendered, tmp_path):
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    text = rendered[0]["unit1"].replace("/opt/sglang/venvs/0.5.9/bin/python", str(python))
    text = re.sub(r"^(User|Group)=.*$", r"\1=root", text, flags=re.M)
    (tmp_path / "topolaunch-sglang@1.service").write_text(text)
    proc = subprocess.run([ANALYZE, "verify", str(tmp_path / "topolaunch-sglang@1.service")], capture_output=True,
                          text=True, check=False)
    assert proc.returncode == 0 and "topolaunch-sglang@" not in proc.stderr, proc.stderr
