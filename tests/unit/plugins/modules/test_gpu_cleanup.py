"""Module gpu_cleanup: main() on a corrupt running plan (one line naming the file) and in check mode (what it would
stop), and a foreign process on our GPU failing it with nothing stopped."""
import pytest

from ansible_collections.topolaunch.sglang.plugins.module_utils.cleanup import CleanupError, cleanup
from ansible_collections.topolaunch.sglang.plugins.modules import gpu_cleanup
from cleanup_cases import OTHER, OURS, _alive, _opts, needs_root, nvml, procs  # noqa: F401  pylint: disable=unused-import  (fixtures)


@pytest.mark.parametrize("content, words", [
    ("[1, 2]", "is not a JSON object but list"),
    ('"plan"', "is not a JSON object but str"),
    ('{"gpu_indices": ["a"]}', 'gpu_indices ["a"] is not a list of GPU indices'),
    ('{"gpu_indices": {"0": 1}}', 'gpu_indices {"0": 1} is not a list of GPU indices'),
    ('{"gpu_indices": [0, -1]}', "gpu_indices [0, -1] is not a list of GPU indices"),
    ('{"gpu_indices": [true]}', "gpu_indices [true] is not a list of GPU indices"),
    ('{"gpu_indices": [0], "port": "x"}', 'port "x" is not a port number'),
    ('{"gpu_indices": [0], "port": 70000}', "port 70000 is not a port number"),
])
def test_a_corrupt_running_plan_fails_in_one_line_naming_the_file(nvml, tmp_path, content, words, run_module,
                                                                  monkeypatch):
    path = tmp_path / "current_plan.json"
    path.write_text(content)
    with pytest.raises(CleanupError) as err:
        cleanup(_opts(tmp_path), nvml)
    msg = str(err.value)
    assert msg.startswith("the running plan %s" % path) and words in msg and "\n" not in msg, msg
    assert msg.endswith("(remove it if the server it describes is gone)")
    monkeypatch.setattr(gpu_cleanup, "import_nvml", lambda: nvml)
    rc, out, _ = run_module(gpu_cleanup, {"gpu_indices": [0], "current_plan_path": str(path)})
    assert rc == 1 and out["msg"] == msg and out["stage"] == "cleanup"


@needs_root
def test_module_main_check_mode_and_foreign_failure(nvml, procs, tmp_path, monkeypatch, run_module):
    monkeypatch.setattr(gpu_cleanup, "import_nvml", lambda: nvml)
    ours = procs.spawn("sglang::scheduler_PP0_TP0", OURS, gpus=[0])
    args = {"gpu_indices": [0, 1], "service_user": OURS, "current_plan_path": str(tmp_path / "none.json")}
    rc, out, _ = run_module(gpu_cleanup, args, check_mode=True)
    assert rc == 0
    assert out["changed"] is True and [p["pid"] for p in out["would_stop"]] == [ours] and _alive(ours)

    foreign = procs.spawn(None, OTHER, gpus=[1], body="sleep 603")
    rc, out, _ = run_module(gpu_cleanup, args)
    assert rc == 1
    assert out["failed"] is True and "pid %d user %s" % (foreign, OTHER) in out["msg"]
    assert _alive(ours) and _alive(foreign)
