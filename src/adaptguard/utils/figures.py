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


def check_figure_path(path: str | os.PathLike, name: str = "path") -> None:
    """The format comes from the suffix (png, svg, pdf, ...): refuse one matplotlib cannot write, before any work."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    suffix = Path(path).suffix.lower().lstrip(".")
    supported = FigureCanvasAgg.get_supported_filetypes()
    if suffix not in supported:
        raise ValueError(f"{name}: {path}: unsupported figure type {suffix or '(no suffix)'!r}; use one of "
                         f"{', '.join(sorted(supported))}")


def save_figure(fig, path: str | os.PathLike, **savefig_kwargs: Any) -> Path:
    """Save `fig` at `path` in the format its suffix names (PNG for .png, SVG for .svg, ...), atomically (a
    temporary file renamed; nothing left behind on failure)."""
    check_figure_path(path)
    fmt = Path(path).suffix.lower().lstrip(".")
    return atomic_write(path, lambda f: fig.savefig(f, format=fmt, **savefig_kwargs), binary=True)
