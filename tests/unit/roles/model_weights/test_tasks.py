"""The model's pre-check (roles/model_weights/tasks/validate.yml, the provision's "check the inputs before any
change"), run by Ansible itself on localhost: with `model_weights_source: path` a missing model directory, or one
without the required files, fails there naming `topolaunch_model_path`; a complete one passes. And the download's
tasks, skipped for any other source than hf, template their names without a warning."""

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
