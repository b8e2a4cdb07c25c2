"""The model's pre-check (roles/model_weights/tasks/validate.yml, the provision's "check the inputs before any
change"), run by Ansible itself on localhost: with `model_weights_source: path` a missing model directory, or one
without the required files, fails there naming `topolaunch_model_path`; a complete one passes. And the download's
tasks, skipped for any other source than hf, template their names without a warning."""

import os
import pathlib
import shutil
import tempfile

import pytest
import yaml
from local_play import run_plays
import paths

ROOT = paths.ROOT


@pytest.fixture(scope="module")
def checks(tmp_path_factory):
    """{case: the pre-check's failure message, or 'passed'}, every case in one ansible-playbook run."""
    base = tmp_path_factory.mktemp("model_weights")
    (base / "complete").mkdir()
    (base / "complete" / "config.json").write_text("{}")
    (base / "complete" / "model.safetensors.index.json").write_text('{"metadata": {"total_size": 1}}')
    (base / "no_index").mkdir()
    (base / "no_index" / "config.json").write_text("{}")
    cases = {"missing": base / "missing", "no index": base / "no_index", "complete": base / "complete"}
    plays = []
    for i, path in enumerate(cases.values()):
        plays.append({"name": "case %d" % i, "hosts": "localhost", "gather_facts": False,
                      "vars": {"model_weights_source": "path", "topolaunch_model_path": str(path)},
                      "tasks": [{"block": [
                          {"ansible.builtin.include_role": {"name": "topolaunch.sglang.model_weights",
                                                            "tasks_from": "validate"}},
                          {"ansible.builtin.set_fact": {"check_%d" % i: "passed"}}],
                          "rescue": [{"ansible.builtin.set_fact": {"check_%d" % i: "{{ ansible_failed_result.msg }}"}}]}]})
    return dict(zip(cases, run_plays(plays, base, ["check_%d" % i for i in range(len(cases))]))), cases


def test_a_missing_model_directory_fails_the_pre_check_naming_topolaunch_model_path(checks):
    said, cases = checks
    assert "topolaunch_model_path '%s', which does not exist" % cases["missing"] in said["missing"], said["missing"]


def test_a_model_directory_without_its_index_fails_naming_the_file(checks):
    said, cases = checks
    assert "topolaunch_model_path '%s', which lacks model.safetensors.index.json" % cases["no index"] in said["no index"]


def test_a_complete_model_directory_passes(checks):
    assert checks[0]["complete"] == "passed"


def test_the_skipped_download_names_its_tasks_without_a_template_warning(tmp_path):
    defaults = {}
    for role in ("topolaunch", "model_weights"):
        defaults.update(yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text()))
    defaults.update(yaml.safe_load((ROOT / "roles" / "model_weights" / "vars" / "main.yml").read_text()))
    play = {"name": "source path", "hosts": "localhost", "gather_facts": False,
            "vars": dict(defaults, model_weights_source="path", topolaunch_model_path=str(tmp_path / "model")),
            "tasks": [{"ansible.builtin.import_tasks": str(ROOT / "roles" / "model_weights" / "tasks" / "download.yml"),
                       "when": "model_weights_source == 'hf'"}]}
    _facts, output = run_plays([play], tmp_path, [], with_output=True)
    assert "Start the download" in output and "is undefined" not in output and "template error" not in output, output


FAKE_SUDO = """#!/bin/sh
# sudo as Ansible calls it (sudo -H -S -n -u USER /bin/sh -c ...), done by runuser: this test runs as root
while [ $# -gt 0 ]; do
  case "$1" in -u) user=$2; shift 2;; -p) shift 2;; -*) shift;; *) break;; esac
done
exec runuser -u "$user" -- "$@"
"""


PYTHON = "/usr/bin/python3"      # one the service user can run (this venv's may live under /root)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser") or not os.access(PYTHON, os.X_OK),
                    reason="becomes another user: needs root, runuser and a system python")
def test_the_index_is_read_as_the_service_user_never_root_through_a_link():
    """Issue 25 item 11: root slurped model.safetensors.index.json, following a symlink to a root-only file (its
    content was printed at -v). Read as the service user, the link to a root-only file fails; a plain index passes."""
    base = pathlib.Path(tempfile.mkdtemp(prefix="tl-model-", dir="/tmp"))
    try:
        base.chmod(0o755)
        secret = base / "root-only.json"
        secret.write_text('{"metadata": {"total_size": 1}, "note": "ROOT-ONLY-S3CR3T"}')
        secret.chmod(0o600)
        for name in ("linked", "plain"):
            (base / name).mkdir()
            (base / name).chmod(0o755)
            (base / name / "config.json").write_text("{}")
        (base / "linked" / "model.safetensors.index.json").symlink_to(secret)
        (base / "plain" / "model.safetensors.index.json").write_text('{"metadata": {"total_size": 1}}')
        for f in base.rglob("*.json"):
            if f != secret and not f.is_symlink():
                f.chmod(0o644)
        sudo = base / "sudo"
        sudo.write_text(FAKE_SUDO)
        sudo.chmod(0o755)
        plays = []
        for i, name in enumerate(("linked", "plain")):
            plays.append({"name": name, "hosts": "localhost", "gather_facts": False,
                          "vars": {"model_weights_source": "path", "topolaunch_model_path": str(base / name),
                                   "model_weights_inputs_checked": True, "topolaunch_service_user": "nobody",
                                   "ansible_become_exe": str(sudo)},
                          "tasks": [{"block": [
                              {"ansible.builtin.include_role": {"name": "topolaunch.sglang.model_weights"}},
                              {"ansible.builtin.set_fact": {"read_%d" % i: "passed"}}],
                              "rescue": [{"ansible.builtin.set_fact": {
                                  "read_%d" % i: "{{ ansible_failed_result.msg | default('failed') }}"}}]}]})
        (linked, plain), output = run_plays(plays, base, ["read_0", "read_1"], with_output=True,
                                            python=PYTHON)
        assert plain == "passed", plain
        assert linked != "passed" and "ROOT-ONLY-S3CR3T" not in linked + output, linked
    finally:
        shutil.rmtree(base)
