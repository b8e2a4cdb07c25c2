"""The built collection, installed as an operator installs it, used from a playbook outside the repository.

`make collection` builds build/topolaunch-sglang-<version>.tar.gz; here it is installed with `ansible-galaxy
collection install` into a temporary directory, and a playbook in another temporary directory (no ansible.cfg of
this repository, no dev view on any path) calls the module topolaunch.sglang.gpu_topology and the role
topolaunch.sglang.plan on this machine (local connection) whose GPUs are the lab's fake NVML. Needs make
collection and make fakenvml (make collection-test runs both).
"""
import glob
import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent
SPEC = ROOT / "lab" / "specs" / "proxmox-8x-rtx-pro-6000-vnuma.json"
MODEL = ROOT / "tests" / "fixtures" / "models" / "glm-5-nvfp4"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    tarballs = sorted(glob.glob(str(ROOT / "build" / "topolaunch-sglang-*.tar.gz")))
    if not tarballs:
        pytest.fail("no build/topolaunch-sglang-*.tar.gz: run make collection first")
    where = tmp_path_factory.mktemp("collections")
    env = clean_env(where)
    proc = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "install", "-p", str(where), tarballs[-1]],
                          env=env, capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    listed = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "list", "topolaunch.sglang"], env=env,
                            capture_output=True, text=True, check=False, timeout=120)
    # The installed copy is the only one Ansible sees (not this repository's dev view).
    assert str(where) in listed.stdout and str(ROOT / "collections") not in listed.stdout, listed.stdout
    return where


def clean_env(collections):
    """An operator's environment: no ANSIBLE_CONFIG of this repository, only the installed collections; the fake
    NVML in place of the driver's library."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false",
               ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="false", ANSIBLE_INVENTORY_UNPARSED_WARNING="false",
               LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(ROOT / "build" / "fakenvml"),
                                                             env.get("LD_LIBRARY_PATH")])),
               FAKE_NVML_SPEC=str(SPEC))
    return env


def test_an_outside_playbook_reads_the_topology_and_plans_with_the_installed_collection(installed, tmp_path):
    project = tmp_path / "myproject"
    project.mkdir()
    (project / "inventory.yml").write_text(yaml.safe_dump({"all": {"hosts": {"box": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    (project / "site.yml").write_text(yaml.safe_dump([{
        "name": "Use topolaunch.sglang from an installed collection",
        "hosts": "box",
        "gather_facts": False,
        "tasks": [
            {"name": "Read the GPU topology", "topolaunch.sglang.gpu_topology": {}, "register": "topo"},
            {"name": "Plan with the role",
             "ansible.builtin.include_role": {"name": "topolaunch.sglang.plan"},
             "vars": {"topolaunch_tools_python": sys.executable, "topolaunch_model_path": str(MODEL),
                      "plan_layout": "tp8"}},
            {"name": "Say what was planned", "ansible.builtin.debug": {
                "msg": "planned {{ topolaunch_plan.layout.name }} for {{ topo.ansible_facts.gpu_topology.gpu_count }}"
                       " GPUs, {{ topolaunch_candidates | length }} candidates"}},
        ]}]))
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", "inventory.yml", "site.yml"], cwd=project,
                          env=clean_env(installed), capture_output=True, text=True, check=False, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "planned tp8 for 8 GPUs" in out, out[-3000:]
    # The role's controller files land beside the playbook (topolaunch_controller_dir = playbook_dir).
    plan = json.loads((project / "artifacts" / "box" / "plan.json").read_text())
    candidates = json.loads((project / "artifacts" / "box" / "candidates.json").read_text())
    assert plan["layout"]["name"] == "tp8" and "candidates" not in plan and candidates[0]["name"]


def test_renamed_modules_keep_working_by_their_old_names(installed):
    env = clean_env(installed)
    for old, new in (("sglang_wait", "sglang_health"), ("sglang_service", "sglang_launch"),
                     ("bench_record", "sglang_bench")):
        proc = subprocess.run([str(BIN / "ansible-doc"), "topolaunch.sglang." + old], env=env, capture_output=True,
                              text=True, check=False, timeout=120)
        assert proc.returncode == 0 and "topolaunch.sglang.%s" % new in proc.stdout, proc.stdout + proc.stderr


VIEW = ROOT / "collections" / "ansible_collections" / "topolaunch" / "sglang"


def view_files():
    """{relative path: bytes} of the repository's collection view (its symlinks followed), as `make collection`
    copies it: without __pycache__ and .pyc (galaxy.yml's build_ignore), and without galaxy.yml itself (the build
    writes MANIFEST.json from it)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(VIEW, followlinks=True):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for name in filenames:
            if not name.endswith(".pyc") and not (dirpath == str(VIEW) and name == "galaxy.yml"):
                path = pathlib.Path(dirpath) / name
                out[str(path.relative_to(VIEW))] = path.read_bytes()
    return out


def test_the_installed_collection_is_the_repository_s_code_byte_for_byte(installed):
    """The unit tests run on the repository's copy (tests/unit): the tarball installed by ansible-galaxy holds that
    very code, every file of the collection view, unchanged (nothing left out by the build, nothing stale)."""
    here = installed / "ansible_collections" / "topolaunch" / "sglang"
    want = view_files()
    assert len(want) > 100 and "plugins/module_utils/planner.py" in want, sorted(want)[:20]
    missing = sorted(rel for rel in want if not (here / rel).is_file())
    differ = sorted(rel for rel in want if rel not in missing and (here / rel).read_bytes() != want[rel])
    assert not missing and not differ, {"missing": missing[:20], "differ": differ[:20]}
