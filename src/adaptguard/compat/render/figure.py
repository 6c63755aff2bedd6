"""The flip-quadrant figure of a compatibility report (Echterhoff et al. Fig. 2/4), for the page and `--plot`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ...utils.figures import new_figure, save_figure
from ..comparison import Comparison
from .report import pct


def plot_quadrants(report: Comparison | Mapping, path: Path) -> None:
    """Flip quadrants per task (Echterhoff et al. Fig. 2/4): a 2×2 count grid for 0/1 metrics, a scatter of
    S(old) vs S(new) coloured by gain/regression for similarity tasks."""
    from matplotlib.patches import Rectangle

    entries = list(Comparison.of(report).tasks.items())
    cols = min(3, len(entries))
    rows = math.ceil(len(entries) / cols)
    fig = new_figure(figsize=(4.2 * cols, 3.8 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, (name, e) in zip(axes.flat, entries):
        if e.correct is not None:
            # the share of runs right per item on each side (one run: 0/1), so that with replicates each cell is the
            # mean count over every (old run, new run) pair, as the title's NFR and PFR are
            sides = e.runs if e.get("counts_are_means") else [[run] for run in e.correct]
            old, new = (np.asarray(runs, dtype=float).mean(0) for runs in sides)  # (R, N) -> (N,)
            grid = np.array([[((1 - old) * new).sum(), (old * new).sum()],
                             [((1 - old) * (1 - new)).sum(), (old * (1 - new)).sum()]])
            labels = [["positive flip", "both right"], ["both wrong", "negative flip"]]
            colors = [["#b7e4c7", "#d8e2dc"], ["#e9ecef", "#f4a3a8"]]
            for i in range(2):
                for j in range(2):
                    ax.add_patch(Rectangle((j, 1 - i), 1, 1, color=colors[i][j]))
                    count = f"{grid[i, j]:.0f}" if float(grid[i, j]).is_integer() else f"{grid[i, j]:.1f}"
                    ax.text(j + 0.5, 1.5 - i, f"{labels[i][j]}\n{count} ({100 * grid[i, j] / e['n']:.1f}%)",
                            ha="center", va="center", fontsize=9)
            ax.set_xlim(0, 2)
            ax.set_ylim(0, 2)
            ax.set_xticks([0.5, 1.5], ["old wrong", "old right"])
            ax.set_yticks([0.5, 1.5], ["new wrong", "new right"])
        else:
            d = e.delta
            ax.hist(d, bins=30, color="#adb5bd")
            ax.axvline(0, color="black", lw=1)
            ax.set_xlabel(f"D = {e['similarity']}(new) − {e['similarity']}(old)")
            ax.set_ylabel("items")
        ax.set_title(f"{name}\nNFR {pct(e.get('nfr', e.get('smooth_nfr')))}%  "
                     f"PFR {pct(e.get('pfr', e.get('smooth_pfr')))}%"
                     + ("  (means over run pairs)" if e.get("counts_are_means") else ""), fontsize=9)
    for ax in list(axes.flat)[len(entries):]:
        ax.axis("off")
    fig.tight_layout()
    save_figure(fig, path, dpi=100)


def figure_png(report: Comparison | Mapping) -> bytes | None:
    """The flip-quadrant figure as PNG bytes (None without matplotlib, the [plots] extra)."""
    import tempfile

    from ...extras import installed

    if not installed("matplotlib"):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        plot_quadrants(report, Path(tmp) / "flips.png")
        return (Path(tmp) / "flips.png").read_bytes()
