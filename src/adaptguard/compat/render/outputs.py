"""Every output of `adaptguard compare` written at once: the texts rendered and the figure drawn first, then each
file written atomically."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path

from ...utils.files import atomic_write_text
from ..comparison import Comparison, json_ready
from .figure import figure_png, plot_quadrants
from .page import compare_page
from .report import to_markdown


def write_outputs(report: Comparison | Mapping, json_path=None, markdown_path=None, plot_path=None, *,
                  flips_path=None, flips: list[dict] | None = None, html_path=None) -> None:
    """Render the texts, draw and write the figure (the step most likely to fail), then write the texts; each file
    atomically, so a failure or an interruption leaves no half-written file and no report without its figure.
    `flips` (every flipped document) goes to `flips_path` as JSON lines, and into the page at `html_path`."""
    report = Comparison.of(report)
    rendered = []
    if html_path:
        rendered.append((Path(html_path), compare_page(report, flips or [], figure_png(report))))
    if json_path:
        rendered.append((Path(json_path), report.to_json()))
    if markdown_path:
        rendered.append((Path(markdown_path), to_markdown(report)))
    if flips_path:
        rendered.append((Path(flips_path), "".join(json.dumps(json_ready(f)) + "\n" for f in flips or [])))
    for path, _ in rendered:
        if path.is_dir():
            raise ValueError(f"{path}: is a directory; give a file path")
    if plot_path:
        plot_quadrants(report, Path(plot_path))
    for path, text in rendered:
        if str(path) == "-":
            sys.stdout.write(text)
            continue
        try:
            atomic_write_text(path, text)
        except OSError as err:  # name the user's path, not the temporary file beside it
            raise OSError(err.errno, err.strerror, str(path)) from err
