"""plugin_utils/preflight_plot.py: the heatmap is a PNG of the record's grid (each cell's colour read back at its
place)."""
from ansible_collections.topolaunch.sglang.plugins.plugin_utils import preflight_plot
import paths
from preflight_cases import hang_record  # noqa: F401  pylint: disable=unused-import  (fixtures)

ROOT = paths.ROOT


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
