"""Figures through matplotlib's object API (`Figure` + the Agg canvas): no pyplot, so no global backend switch
and no figure registry to leak from a library function (a notebook's backend stays as the user set it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .files import atomic_write


def new_figure(**kwargs: Any):
    """A `matplotlib.figure.Figure` attached to an Agg canvas (keyword arguments go to `Figure`).
    matplotlib is the `[plots]` extra."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ImportError("plotting needs matplotlib: pip install 'adaptguard[plots]'") from err
    fig = Figure(**kwargs)
    FigureCanvasAgg(fig)
    return fig


def save_figure(fig, path: str | os.PathLike, **savefig_kwargs: Any) -> Path:
    """Save `fig` as a PNG at `path` atomically (a temporary file renamed; nothing left behind on failure)."""
    return atomic_write(path, lambda f: fig.savefig(f, format="png", **savefig_kwargs), binary=True)
