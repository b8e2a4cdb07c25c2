"""The preflight's bandwidth heatmap (artifacts/<host>/preflight.png), drawn on the controller with matplotlib.

One panel per P2P setting measured (P2P=Enabled, and P2P=Disabled when the P2P-off pass ran): row = source GPU,
column = destination GPU, as p2pBandwidthLatencyTest's matrix. A measured copy is coloured by its GB/s (one
colour scale for both panels, 0 to the fastest pair) and labelled with it; the diagonal (each GPU's local copy,
not P2P) is grey; a pair that hung, failed, gave wrong data or was skipped has its own colour and word. The cells
are drawn from an RGBA array on axes at fixed places (`panel_rects`), so a test can read each cell's colour back.
"""
import os

__all__ = ["FIGSIZE", "DPI", "STATUS_COLORS", "LOCAL_COLOR", "CMAP", "panel_rects", "cell_grid", "draw"]

FIGSIZE = (6.4, 5.6)             # inches per panel
DPI = 100
CMAP = "viridis"
LOCAL_COLOR = "#9e9e9e"
STATUS_COLORS = {"hang": "#d62728", "failed": "#8c1c13", "wrong": "#ff7f0e", "skipped": "#dddddd",
                 "missing": "#ffffff"}
WORDS = {"hang": "hang", "failed": "fail", "wrong": "wrong", "skipped": "skip", "missing": "-"}


def panel_rects(count):
    """[left, bottom, width, height] in figure fractions of each panel's matrix, and of the colour bar."""
    width = 0.74 / count
    panels = [[0.09 + k * (width + 0.02 * (count > 1)), 0.12, width - 0.02 * (count > 1), 0.74] for k in range(count)]
    return panels, [0.87, 0.12, 0.025, 0.74]


def cell_grid(record, p2p_disabled):
    """n x n cells of one panel: ("gbps", value) for a measured copy, ("local", value) on the diagonal, or
    (status, None). None when the record has no pair measured with this P2P setting."""
    gpus = record["gpus"]
    pos = {g: k for k, g in enumerate(gpus)}
    cells = [[("missing", None)] * len(gpus) for _row in gpus]
    seen = False
    for p in record["pairs"]:
        if p["src"] not in pos or p["dst"] not in pos:
            continue
        i, j = pos[p["src"]], pos[p["dst"]]
        if p["local"]:
            if not p2p_disabled:
                cells[i][j] = ("local", p["gbps"])
            continue
        if p["p2p_disabled"] != p2p_disabled:
            continue
        seen = True
        if p["status"] == "ok" and p["gbps"] is not None:
            cells[i][j] = ("gbps", p["gbps"])
        else:
            cells[i][j] = (p["status"] if p["status"] in STATUS_COLORS else "failed", None)
    for k in range(len(gpus)):
        if cells[k][k][0] == "missing":
            cells[k][k] = ("local", None)
    return cells if seen else None


def draw(record, path, title=""):
    """Write the heatmap PNG of a preflight record to `path` (directories made); returns the panels drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import colors

    panels = [(name, grid) for name, grid in (("P2P=Enabled", cell_grid(record, False)),
                                              ("P2P=Disabled", cell_grid(record, True))) if grid]
    top = max([v for _name, grid in panels for row in grid for kind, v in row if kind == "gbps"] or [1.0])
    norm = colors.Normalize(vmin=0.0, vmax=top)
    cmap = matplotlib.colormaps[CMAP]
    rects, colorbar_rect = panel_rects(len(panels))
    fig = plt.figure(figsize=(FIGSIZE[0] * len(panels), FIGSIZE[1]), dpi=DPI)
    gpus = record["gpus"]
    for (name, grid), rect in zip(panels, rects):
        ax = fig.add_axes(rect)
        rgba = [[cmap(norm(v)) if kind == "gbps" else colors.to_rgba(LOCAL_COLOR if kind == "local" else STATUS_COLORS[kind])
                 for kind, v in row] for row in grid]
        ax.imshow(rgba, interpolation="nearest", aspect="auto")
        for i, row in enumerate(grid):
            for j, (kind, v) in enumerate(row):
                text = "%.1f" % v if kind == "gbps" else "local" if kind == "local" else WORDS[kind]
                light = kind == "gbps" and norm(v) < 0.6 or kind in ("hang", "failed")
                ax.text(j, i, text, ha="center", va="center", fontsize=7, color="white" if light else "black")
        ax.set_xticks(range(len(gpus)))
        ax.set_xticklabels([str(g) for g in gpus])
        ax.set_yticks(range(len(gpus)))
        ax.set_yticklabels([str(g) for g in gpus])
        ax.set_xlabel("destination GPU")
        ax.set_ylabel("source GPU")
        ax.set_title("%s, GB/s one way" % name, fontsize=10)
    mappable = matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap)
    fig.colorbar(mappable, cax=fig.add_axes(colorbar_rect), label="GB/s")
    simulated = bool(record.get("env", {}).get("simulated"))
    fig.suptitle("%sP2P copy bandwidth, preflight %s of topology %s%s" % (
        title + ": " if title else "", record.get("created") or "", record.get("fingerprint") or "-",
        " (SIMULATED: lab stand-in)" if simulated else ""), fontsize=11)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return [name for name, _grid in panels]
