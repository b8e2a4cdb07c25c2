"""plugin_utils/preflight_plot.py: the heatmap is a PNG of the record's grid (each cell's colour read back at its
place), and the gpu_preflight action plugin keeps the record under its fingerprint on the controller with the
heatmap beside it."""
import json
import sys

import pytest
from ansible.plugins.action import ActionBase

from ansible_collections.topolaunch.sglang.plugins.action import gpu_preflight as action
from ansible_collections.topolaunch.sglang.plugins.module_utils import preflight
from ansible_collections.topolaunch.sglang.plugins.plugin_utils import preflight_plot
from actions import make_action
import paths

ROOT = paths.ROOT
STANDIN = str(ROOT / "lab" / "preflight" / "worker_standin.py")
HANG = ROOT / "lab" / "specs" / "proxmox-8x-rtx-pro-6000-p2p-hang.json"


@pytest.fixture(scope="module")
def hang_record():
    """The box whose pair 3-7 hangs with P2P: both passes (P2P on with the hang, P2P off for every pair)."""
    return preflight.run_preflight(sys.executable, STANDIN, list(range(8)), settings={"step_timeout": 1.0},
                                   fingerprint="abcdef012345", env={"FAKE_NVML_SPEC": str(HANG)})


def pixel(image, rect, n, i, j):
    """RGB at a point of cell (row i, column j) of a panel, away from its centre (the label) and its edges."""
    height, width = image.shape[:2]
    left, bottom, w, h = rect
    x = (left + w * (j + 0.2) / n) * width
    y = (1.0 - (bottom + h * (n - i - 0.8) / n)) * height
    return tuple(round(float(c), 2) for c in image[int(y), int(x), :3])


def rgb(color):
    from matplotlib import colors
    return tuple(round(c, 2) for c in colors.to_rgb(color))


def near(a, b, tol=0.02):
    return all(abs(x - y) <= tol for x, y in zip(a, b))


def test_heatmap_is_a_png_of_the_grid(hang_record, tmp_path):
    import matplotlib
    import matplotlib.image

    path = tmp_path / "artifacts" / "hang" / "preflight.png"
    assert preflight_plot.draw(hang_record, str(path), "hang") == ["P2P=Enabled", "P2P=Disabled"]
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(str(path))
    assert image.shape[:2] == (round(preflight_plot.FIGSIZE[1] * preflight_plot.DPI),
                               round(2 * preflight_plot.FIGSIZE[0] * preflight_plot.DPI))
    (on, off), _bar = preflight_plot.panel_rects(2)
    top = max(p["gbps"] for p in hang_record["pairs"] if not p["local"] and p["status"] == "ok")
    cmap = matplotlib.colormaps[preflight_plot.CMAP]
    # P2P on: the hung pair, the direction skipped after it, the local copies, the fastest pair at the top colour
    assert pixel(image, on, 8, 3, 7) == rgb(preflight_plot.STATUS_COLORS["hang"])
    assert pixel(image, on, 8, 7, 3) == rgb(preflight_plot.STATUS_COLORS["skipped"])
    assert all(pixel(image, on, 8, k, k) == rgb(preflight_plot.LOCAL_COLOR) for k in range(8))
    fastest = max((p for p in hang_record["pairs"] if not p["local"] and p["status"] == "ok"), key=lambda p: p["gbps"])
    assert near(pixel(image, on, 8, fastest["src"], fastest["dst"]), cmap(1.0)[:3])
    slow = next(p for p in hang_record["pairs"] if (p["src"], p["dst"]) == (0, 4) and not p["p2p_disabled"])
    assert near(pixel(image, on, 8, 0, 4), cmap(slow["gbps"] / top)[:3])
    # P2P off: every pair through host memory at the same 11 GB/s
    host = cmap(11.0 / top)[:3]
    assert all(near(pixel(image, off, 8, i, j), host) for i in range(8) for j in range(8) if i != j)


def test_one_panel_when_only_p2p_was_measured():
    record = {"gpus": [0, 1], "pairs": [
        {"src": 0, "dst": 0, "gbps": 2000.0, "status": "ok", "p2p_disabled": False, "local": True},
        {"src": 0, "dst": 1, "gbps": 50.0, "status": "ok", "p2p_disabled": False, "local": False},
        {"src": 1, "dst": 0, "gbps": None, "status": "failed", "p2p_disabled": False, "local": False}]}
    assert preflight_plot.cell_grid(record, True) is None
    assert preflight_plot.cell_grid(record, False) == [[("local", 2000.0), ("gbps", 50.0)],
                                                       [("failed", None), ("local", None)]]


def test_action_keeps_records_by_fingerprint_and_the_heatmap(monkeypatch, tmp_path, hang_record):
    calls = []
    monkeypatch.setattr(ActionBase, "run", lambda self, tmp=None, task_vars=None: {})
    answer = {"changed": True, "measured": True, "record": hang_record}
    monkeypatch.setattr(action.ActionModule, "_execute_module", lambda self, module_name, module_args, task_vars: (
        calls.append((module_name, module_args)) or dict(answer)))
    path = tmp_path / "artifacts" / "hang" / "preflight.json"
    result = make_action(action, {"gpus": [0, 1], "save_to": str(path)}).run(task_vars={"inventory_hostname": "hang"})
    assert calls == [("topolaunch.sglang.gpu_preflight", {"gpus": [0, 1]})]
    assert result["saved"] is True and result["saved_to"] == str(path)
    assert result["heatmap"] == str(path.with_suffix(".png")) and path.with_suffix(".png").stat().st_size > 0
    assert json.loads(path.read_text()) == {"abcdef012345": hang_record}
    again = make_action(action, {"save_to": str(path)}).run(task_vars={})
    assert again["saved"] is False
    # another topology of the same host is kept beside it
    answer["record"] = dict(hang_record, fingerprint="0000000000aa")
    make_action(action, {"save_to": str(path)}).run(task_vars={})
    assert sorted(json.loads(path.read_text())) == ["0000000000aa", "abcdef012345"]
    # check mode with nothing measured yet: no record, nothing saved
    answer["record"] = None
    assert "saved" not in make_action(action, {"save_to": str(path)}, check_mode=True).run(task_vars={})
    path.write_text("[1, 2]")
    answer["record"] = hang_record
    with pytest.raises(Exception, match="is not a JSON object of preflight records: move it away"):
        make_action(action, {"save_to": str(path)}).run(task_vars={})
