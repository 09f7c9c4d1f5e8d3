#!/usr/bin/env python3
"""Heatmaps of a grid run (`host bench --grid`, with `--peers` for the third), from its CSV:

- `<stem>-pct`: `auto`'s % of the copy, isolated, rows down and columns across;
- `<stem>-above-copy`: the µs `auto` takes beyond the copy, on tensors whose copy takes under
  10 µs (where launch and exchange costs, not bandwidth, decide);
- `<stem>-vs-peers`: the fastest peer's time over `auto`'s (above 1: `auto` is faster), where
  peers ran.

Each is written as PNG and SVG. Cells a run did not time stay blank.

    python3 bench/grid_heatmap.py RUN.csv OUT_STEM
"""

import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from grid_csv import PEERS, read  # noqa: E402

SMALL_COPY_MS = 0.010


def heatmap(cells, rows, cols, title, label, stem, cmap, vmin, vmax, fmt):
    """Draws `cells` ({(rows, cols): value}) and writes `stem`.png and .svg."""
    grid = [[cells.get((r, c), math.nan) for c in cols] for r in rows]
    fig, ax = plt.subplots(figsize=(1.1 * len(cols) + 2.5, 0.32 * len(rows) + 1.8))
    image = ax.imshow(grid, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    ax.set_xticks(range(len(cols)), [str(c) for c in cols], rotation=30, ha="right")
    ax.set_yticks(range(len(rows)), [str(r) for r in rows])
    ax.set_xlabel("columns")
    ax.set_ylabel("rows")
    ax.set_title(title)
    for i, r in enumerate(rows):
        for j, c in enumerate(cols):
            value = cells.get((r, c))
            if value is not None and not math.isnan(value):
                ax.text(j, i, fmt(value), ha="center", va="center", fontsize=7)
    fig.colorbar(image, ax=ax, label=label)
    fig.tight_layout()
    for extension in ("png", "svg"):
        fig.savefig(f"{stem}.{extension}", dpi=110)
    plt.close(fig)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1].strip())
    runs, dtype = read(sys.argv[1])
    times = {(v,) + point: ms for v, points in runs.items() for point, (ms, _) in points.items()}
    stem = sys.argv[2]
    shapes = sorted({(r, c) for (v, r, c) in times if v == "auto"})
    rows = sorted({r for r, _ in shapes})
    cols = sorted({c for _, c in shapes})
    copy = {(r, c): times.get(("copy", r, c)) for r, c in shapes}
    auto = {(r, c): times[("auto", r, c)] for r, c in shapes}
    pct = {s: 100 * copy[s] / auto[s] for s in shapes if copy[s]}
    heatmap(pct, rows, cols, f"auto, {dtype}, % of a copy (isolated)", "% of copy",
            f"{stem}-pct", "RdYlGn", 40, 100, lambda v: f"{v:.0f}")
    above = {s: 1000 * (auto[s] - copy[s]) for s in shapes if copy[s] and copy[s] < SMALL_COPY_MS}
    heatmap(above, rows, cols, f"auto, {dtype}, µs beyond the copy (copies under 10 µs)",
            "µs", f"{stem}-above-copy", "magma_r", 0, max(above.values(), default=1),
            lambda v: f"{v:.1f}")
    fastest = {}
    for s in shapes:
        peer_times = [times[(p,) + s] for p in PEERS if (p,) + s in times]
        if peer_times:
            fastest[s] = min(peer_times) / auto[s]
    if fastest:
        # Coloured by log2 of the ratio, so that 2x either way is as far from white.
        logs = {s: math.log2(v) for s, v in fastest.items()}
        spread = max(abs(v) for v in logs.values()) or 1
        heatmap(logs, rows, cols, f"auto, {dtype}, the fastest peer's time over auto's",
                "log2 of the ratio (above 0: auto faster)", f"{stem}-vs-peers", "RdBu",
                -spread, spread, lambda v: f"{2 ** v:.2f}")


if __name__ == "__main__":
    main()
