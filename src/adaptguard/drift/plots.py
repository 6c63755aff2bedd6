"""Figures of the drift theory (Ni et al., App. A)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike

from ..utils.figures import new_figure, save_figure


def plot_theorem_a2(
    r: ArrayLike, f: ArrayLike, argmax: float, path: str | os.PathLike[str], *, paper_argmax: float | None = None
) -> Path:
    """Plot the curve ``f`` over ``r`` (both shape (k,), k >= 2) with its maximiser as a PNG at ``path``.

    ``paper_argmax`` (e.g. the (A32) value) is drawn as a second, dashed marker. The PNG is written to a temporary
    file next to ``path`` and renamed, so readers never see a partial file. Returns ``path`` as a ``Path``.
    """
    r_arr, f_arr = np.asarray(r, dtype=float), np.asarray(f, dtype=float)
    if r_arr.ndim != 1 or r_arr.shape != f_arr.shape or r_arr.size < 2:
        raise ValueError(f"r and f must be 1-D of equal length >= 2, got shapes {r_arr.shape} and {f_arr.shape}")
    if not (np.all(np.isfinite(r_arr)) and np.all(np.isfinite(f_arr))):
        raise ValueError("r and f must be finite")
    for name, value in (("argmax", argmax), ("paper_argmax", paper_argmax)):
        if value is not None and not 0 <= value <= 1:
            raise ValueError(f"{name} must lie in [0, 1], got {value!r}")
    fig = new_figure(figsize=(6, 4))
    ax = fig.add_subplot()
    ax.plot(r_arr, f_arr, color="C0", label="lower bound f(r)")
    ax.axvline(argmax, color="C3", label=f"maximiser r = {argmax:.3f}")
    if paper_argmax is not None:
        ax.axvline(paper_argmax, color="C2", linestyle="--", label=f"(A32) r = {paper_argmax:.3f}")
    ax.axvline(0.5, color="grey", linestyle=":", linewidth=1)
    ax.set(xlabel="similarity r(i, j)", ylabel="excess error bound f(r)", title="Theorem A2 (Ni et al., A28-A33)")
    ax.legend()
    fig.tight_layout()
    return save_figure(fig, path)
