"""Rendering a compatibility report (`compare_runs`' dict): JSON, a text table, Markdown and the flip-quadrant
figure; `write_outputs` writes them atomically."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from ..utils.figures import new_figure, save_figure
from ..utils.files import atomic_write_text
from .flips import shorten


def _public(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if not k.startswith("_")}


def _clean(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def to_json(report: dict) -> str:
    return json.dumps(_clean({**report, "tasks": {k: _public(v) for k, v in report["tasks"].items()}}), indent=2)


def _fmt(value, pct=False) -> str:
    if value is None:
        return "–"
    if isinstance(value, (tuple, list)):
        return f"[{_fmt(value[0], pct)}, {_fmt(value[1], pct)}]"
    return f"{100 * value:.2f}" if pct else f"{value:.4g}"


# the table column that shows each gated metric (acc_drop: the new accuracy)
GATE_COLUMNS = {"old_acc": "old acc", "new_acc": "new acc", "acc_drop": "new acc", "nfr": "NFR %", "pfr": "PFR %",
                "nfr_mc": "NFR_mc %", "btc": "BTC", "smooth_nfr": "smooth NFR %", "smooth_pfr": "smooth PFR %",
                "m_g": "m_g", "m_r": "m_r", "delta_nfr": "ΔNFR_c"}


def table_rows(report: dict) -> tuple[list[str], list[list[str]]]:
    header = ["task", "n", "old acc", "new acc", "NFR %", "NFR 95% CI", "PFR %", "NFR_mc %", "BTC", "McNemar p"]
    smooth = any("similarity" in e for e in report["tasks"].values())
    compat = report.get("compatible") is not None
    if smooth:
        header += ["S", "smooth NFR %", "smooth PFR %", "m_g", "m_r"]
    if compat:
        header += ["ΔNFR_c", "Δ%NFR_c"]
    breached = {(b["task"], b["metric"]) for b in (report.get("gate") or {}).get("breaches", [])}
    rows = []
    for name, e in report["tasks"].items():
        row = [name, str(e["n"]), _fmt(e.get("old_acc")), _fmt(e.get("new_acc")), _fmt(e.get("nfr"), True),
               _fmt(e.get("nfr_ci"), True), _fmt(e.get("pfr"), True), _fmt(e.get("nfr_mc"), True),
               _fmt(e.get("btc")), _fmt(e.get("mcnemar_p"))]
        if smooth:
            row += [e.get("similarity", "–"), _fmt(e.get("smooth_nfr"), True), _fmt(e.get("smooth_pfr"), True),
                    _fmt(e.get("m_g")), _fmt(e.get("m_r"))]
        if compat:
            key = "delta_nfr" if "delta_nfr" in e else "delta_smooth_nfr"
            row += [_fmt(e.get(key), True), _fmt(e.get(f"{key}_pct"))]
        for task, metric in breached:
            column = GATE_COLUMNS.get(metric, GATE_COLUMNS["delta_nfr"] if metric.startswith("delta_") else None)
            if task == name and column in header:
                row[header.index(column)] += " (!)"  # a --fail-on breach
        rows.append(row)
    return header, rows


def flip_lines(report: dict, markdown: bool = False) -> list[str]:
    """The `--show-flips` documents: per task, prompt (shortened), gold, old and new answer."""
    lines = []
    for task, flips in (report.get("negative_flips") or {}).items():
        lines += ["", f"{'### ' if markdown else ''}{task}: {len(flips)} negative flip(s) shown"]
        if markdown and flips:
            lines += ["", "| doc_id | prompt | gold | old | new |", "|---|---|---|---|---|"]
        for f in flips:
            cells = [str(f["doc_id"]), shorten(f["prompt"]), shorten(f["gold"], 60), shorten(f["old"], 60),
                     shorten(f["new"], 60)]
            if markdown:
                lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
            else:
                lines.append(f"  doc {cells[0]}: {cells[1]!r}\n    gold {cells[2]!r} | old {cells[3]!r} | new {cells[4]!r}")
    return lines


def to_text(report: dict) -> str:
    header, rows = table_rows(report)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows), *flip_lines(report)])


def to_markdown(report: dict) -> str:
    header, rows = table_rows(report)
    new = report["new"] if isinstance(report["new"], str) else "`, `".join(report["new"])
    lines = [f"# Compatibility: `{report['old']}` → `{new}`", "",
             "NFR/PFR = negative/positive flip rate, NFR_mc = inconsistency flips, BTC = backward trust "
             "compatibility (paper 002 §3); McNemar = exact test on the discordant pairs.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    gate = report.get("gate")
    if gate is not None:
        lines += ["", f"**Gate: {'passed' if gate['passed'] else 'FAILED'}** ({', '.join(f'`{t}`' for t in gate['thresholds'])}"
                  + (f"; a breach counts at p < {gate['significance']}" if gate["significance"] is not None else "")
                  + "). Breaching cells are marked (!)."]
        lines += [f"- {b['task']}: {b['metric']} = {b['value']:.4g} {b['op']} {b['threshold']:g}"
                  + ("" if b["p_value"] is None else f" (p = {b['p_value']:.3g})") for b in gate["breaches"]]
    if report.get("negative_flips"):
        lines += ["", "## Negative flips (right before, wrong after)", *flip_lines(report, markdown=True)]
    return "\n".join(lines) + "\n"


def plot_quadrants(report: dict, path: Path) -> None:
    """Flip quadrants per task (paper 002 Fig. 2/4): a 2×2 count grid for 0/1 metrics, a scatter of
    S(old) vs S(new) coloured by gain/regression for similarity tasks."""
    from matplotlib.patches import Rectangle

    entries = list(report["tasks"].items())
    cols = min(3, len(entries))
    rows = math.ceil(len(entries) / cols)
    fig = new_figure(figsize=(4.2 * cols, 3.8 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, (name, e) in zip(axes.flat, entries):
        if e.get("_correct") is not None:
            old, new = (np.asarray(v, dtype=bool) for v in e["_correct"])
            grid = np.array([[(~old & new).sum(), (old & new).sum()], [(~old & ~new).sum(), (old & ~new).sum()]])
            labels = [["positive flip", "both right"], ["both wrong", "negative flip"]]
            colors = [["#b7e4c7", "#d8e2dc"], ["#e9ecef", "#f4a3a8"]]
            for i in range(2):
                for j in range(2):
                    ax.add_patch(Rectangle((j, 1 - i), 1, 1, color=colors[i][j]))
                    ax.text(j + 0.5, 1.5 - i, f"{labels[i][j]}\n{grid[i, j]} ({100 * grid[i, j] / e['n']:.1f}%)",
                            ha="center", va="center", fontsize=9)
            ax.set_xlim(0, 2)
            ax.set_ylim(0, 2)
            ax.set_xticks([0.5, 1.5], ["old wrong", "old right"])
            ax.set_yticks([0.5, 1.5], ["new wrong", "new right"])
        else:
            d = e["_delta"]
            ax.hist(d, bins=30, color="#adb5bd")
            ax.axvline(0, color="black", lw=1)
            ax.set_xlabel(f"D = {e['similarity']}(new) − {e['similarity']}(old)")
            ax.set_ylabel("items")
        ax.set_title(f"{name}\nNFR {_fmt(e.get('nfr', e.get('smooth_nfr')), True)}%  "
                     f"PFR {_fmt(e.get('pfr', e.get('smooth_pfr')), True)}%", fontsize=9)
    for ax in list(axes.flat)[len(entries):]:
        ax.axis("off")
    fig.tight_layout()
    save_figure(fig, path, dpi=100)


def write_outputs(report: dict, json_path=None, markdown_path=None, plot_path=None, *, flips_path=None,
                  flips: list[dict] | None = None) -> None:
    """Render the texts, draw and write the figure (the step most likely to fail), then write the texts; each file
    atomically, so a failure or an interruption leaves no half-written file and no report without its figure.
    `flips` (every flipped document) goes to `flips_path` as JSON lines."""
    rendered = []
    if json_path:
        rendered.append((Path(json_path), to_json(report)))
    if markdown_path:
        rendered.append((Path(markdown_path), to_markdown(report)))
    if flips_path:
        rendered.append((Path(flips_path), "".join(json.dumps(_clean(f)) + "\n" for f in flips or [])))
    for path, _ in rendered:
        if path.is_dir():
            raise ValueError(f"{path}: is a directory; give a file path")
    if plot_path:
        plot_quadrants(report, Path(plot_path))
    for path, text in rendered:
        atomic_write_text(path, text)
