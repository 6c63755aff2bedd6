"""Rendering a compatibility report (`compare_runs`' `Comparison`): JSON, a text table, Markdown and the
flip-quadrant figure; `write_outputs` writes them atomically. Each function that takes a report also reads a mapping
shaped as `report.json` (`Comparison.of`)."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ...utils.figures import new_figure, save_figure
from ...utils.files import atomic_write_text
from ..comparison import Comparison, json_ready
from ..metric_table import METRICS
from ..verdicts import NOTHING_GATED, Decision, Gate, ThresholdDecision
from .flips import shorten


def to_json(report: Comparison | Mapping) -> str:
    return Comparison.of(report).to_json()


def _fmt(value, pct=False) -> str:
    if value is None:
        return "–"
    if isinstance(value, (tuple, list)):
        return f"[{_fmt(value[0], pct)}, {_fmt(value[1], pct)}]"
    return f"{100 * value:.1f}" if pct else f"{value:.3g}"


def _pct(value, count=None) -> str:
    """A rate in % with one decimal, and the count behind it where there is one (a mean over run pairs keeps one
    decimal)."""
    if value is None:
        return "–"
    if count is None:
        return f"{100 * value:.1f}"
    return f"{100 * value:.1f} ({count:.0f})" if float(count).is_integer() else f"{100 * value:.1f} ({count:.1f})"


def _p(value) -> str:
    return "–" if value is None else f"{value:.2g}"


def legend(report: Comparison) -> tuple[str, str]:
    level = round(100 * report.level)
    means = any(e.get("counts_are_means") for e in report.tasks.values())
    return ("NFR: negative flips, right before and wrong after; PFR: positive flips, wrong → right; BTC: share of the "
            "old model's right answers kept; incons.: wrong answers that changed (multiple choice);",
            "noise floor: the NFR between reruns of one model (replicates); excess NFR = NFR − noise floor; MDE: the "
            f"smallest change the items (and runs) detect at 80 % power; rates in %, (counts"
            f"{', means over run pairs' if means else ''}), [{level} % intervals, the gate's: each end a one-sided "
            f"{(100 + level) / 2:g} % bound, so a threshold below the lower end is a breach and one above the upper end "
            "is clear; exact binomial for one run, over runs and items and no narrower than the items' exact one with "
            "replicates].")


def task_decisions(gate: Gate | Mapping | None, name: str) -> list[ThresholdDecision]:
    return [] if gate is None else [d for d in Gate.of(gate).decisions if d.task == name]


def _churn_word(e: Mapping, report: Comparison) -> str | None:
    if not (e.get("churn") or {}).get("churn"):
        return None
    return "churn, counted (--include-churn)" if report.include_churn else "churn (flips left out)"


def _verdict(e: Mapping, name: str, report: Comparison) -> str:
    """The task's verdict: the gate's decisions when there is a gate (the worst first), else the regression flag."""
    gate = report.gate
    churn = _churn_word(e, report)
    if gate is not None:  # every decision on the task, the worst first
        mine = task_decisions(gate, name)
        parts = [f"{kind.upper() if kind is Decision.BREACH else kind} ({', '.join(hit)})" for kind in Decision
                 if (hit := [d.expr for d in mine if d.decision is kind])]
        return "; ".join(parts + ([churn] if churn else [])) or "not gated"
    reg = e.get("regression")
    if reg is None:
        return churn or "–"
    word = "regression supported" if reg["flagged"] else "no regression shown"
    return word + (f"; {churn}" if churn else "")


def table_rows(report: Comparison | Mapping) -> tuple[list[str], list[list[str]]]:
    from ..evidence import interval

    report = Comparison.of(report)
    alpha = report.alpha
    level = f"{100 * (1 - 2 * alpha):g}%"
    replicated = any(not (e.get("replicates") or {"runs_fixed": True})["runs_fixed"] for e in report.tasks.values())
    header = ["task", "n", "acc old → new", "NFR %", f"NFR {level} CI", "PFR %", "incons. %", "BTC %"]
    header += ["runs", "noise floor %", "excess NFR %", f"excess {level} CI", "MDE %", "p (BH)"] if replicated \
        else ["McNemar p", "MDE %"]
    header.append("verdict")
    smooth = any("similarity" in e for e in report.tasks.values())
    compat = report.compatible is not None
    if smooth:
        header += ["S", "smooth NFR %", "smooth PFR %", "m_g", "m_r"]
    if compat:
        header += ["ΔNFR_c", "Δ%NFR_c"]
    breached = {(b.task, b.metric) for b in report.gate.of_kind(Decision.BREACH)} if report.gate else set()
    rows = []
    for name, e in report.tasks.items():
        r = e.get("replicates") or {}
        reg = e.get("regression") or {}
        acc = "–" if e.get("old_acc") is None else f"{100 * e['old_acc']:.1f} → " + \
            ("–" if e.get("new_acc") is None else f"{100 * e['new_acc']:.1f}")  # not measured: a group-sequential run
        nfr_ci = interval(e, "nfr", alpha) if e.get("n_negative_flips") is not None else None
        row = [name, str(e["n"]), acc, _pct(e.get("nfr"), e.get("n_negative_flips")), _fmt(nfr_ci, True),
               _pct(e.get("pfr"), e.get("n_positive_flips")), _pct(e.get("inconsistency_flips")), _pct(e.get("btc"))]
        if replicated:
            fixed = r.get("runs_fixed", True)
            row += ["–" if not r else f"{r['runs'][0]}+{r['runs'][1]}", _pct(r.get("noise_floor")),
                    _pct(r.get("excess_nfr")), "–" if fixed else _fmt(interval(e, "excess_nfr", alpha), True),
                    "–" if not r else _pct(r["mde"]),
                    "–" if not reg else f"{_p(reg['p'])} ({_p(reg['p_bh'])})"]
        else:
            row += [_p(e.get("mcnemar_p")), "–" if not r else _pct(r["mde"])]
        row.append(_verdict(e, name, report))
        if smooth:
            row += [e.get("similarity", "–"), _pct(e.get("smooth_nfr")), _pct(e.get("smooth_pfr")),
                    _fmt(e.get("m_g")), _fmt(e.get("m_r"))]
        if compat:
            key = "delta_nfr" if "delta_nfr" in e else "delta_smooth_nfr"
            row += [_pct(e.get(key)), _fmt(e.get(f"{key}_pct"))]
        for task, metric in breached:
            column = METRICS[metric].column if metric in METRICS else None
            if task == name and column in header:
                row[header.index(column)] += " (!)"  # a --fail-on breach
        rows.append(row)
    return header, rows


def task_sentence(name: str, e: Mapping, gate: Gate | Mapping | None = None, alpha: float = 0.05,
                  include_churn: bool = False) -> str:
    """What happened on one task, in one sentence a user can act on: the counts, then the decisions on it — the
    gate's where there is a gate (nothing else claims a verdict then), else the regression flag."""
    from ..gate import decision_line

    out = _task_facts(name, e)
    decided = task_decisions(gate, name)
    if gate is None:
        out += _regression_words(e)
    out += "".join(f" Gate {d.decision}: {decision_line(d).partition(': ')[2]}" for d in decided)
    churn = e.get("churn") or {}
    if churn.get("churn"):
        why = (f" Nothing shows either model above guessing (old {100 * churn['old_acc']:.1f} % vs chance "
               f"{100 * churn['chance']:.1f} %, p {_p(churn['p_above_chance'])}; new not below a uniform guess's "
               f"{100 * churn['guess_rate']:.1f} %, p {_p(churn['p_new_below_chance'])}), nor more right → wrong flips "
               f"than two guessers make (p "
               f"{_p(churn['p_flips_beyond_guessing'])}): these flips are churn")
        out += why + (", counted in the gate and the overall row (--include-churn)." if include_churn else
                      ", left out of the flip thresholds, the regression flags and the overall row.")
    return out


def _regression_words(e: Mapping) -> str:
    """The regression flag (`decide.flag_regressions`) in words, with no gate."""
    reg = e.get("regression")
    if reg is None:
        return ""
    what = ("NFR beyond rerun noise (the excess NFR above 0" if reg["tested"] == "excess_nfr" else
            "an accuracy drop (exact one-sided McNemar")
    if reg["flagged"]:
        return f" The data support {what}: p {_p(reg['p'])}, {_p(reg['p_bh'])} after BH across tasks)."
    return f" No {what.replace('an accuracy', 'accuracy')} shown: p {_p(reg['p'])}, {_p(reg['p_bh'])} after BH)."


def _task_facts(name: str, e: Mapping) -> str:
    if e.get("old_acc") is None:
        return f"{name}: smooth NFR {_pct(e.get('smooth_nfr'))} %, smooth PFR {_pct(e.get('smooth_pfr'))} % " \
               f"({e.get('similarity')})."
    r = e.get("replicates") or {}
    if e.get("new_acc") is None:  # a group-sequential run of one stratum: the new model's accuracy not measured
        rates = "; ".join(f"{k.upper()} {_pct(e[k])} %" for k in ("nfr", "pfr") if e.get(k) is not None)
        return (f"{name}: old accuracy {100 * e['old_acc']:.1f} %; {rates} (the new model's accuracy was not "
                "measured: only the items that can flip were evaluated).")
    acc = f"accuracy {100 * e['old_acc']:.1f} → {100 * e['new_acc']:.1f} % ({100 * (e['new_acc'] - e['old_acc']):+.1f} points)"
    if not (r and not r["runs_fixed"]):
        broke, fixed = round(e["n_negative_flips"]), round(e["n_positive_flips"])
        return (f"{name}: {acc}; {broke} answer{'s' * (broke != 1)} broke (NFR {_pct(e['nfr'])} %), {fixed} "
                f"{'was' if fixed == 1 else 'were'} fixed (PFR {_pct(e['pfr'])} %).")
    out = (f"{name}: {acc} over {r['runs'][0]}+{r['runs'][1]} runs; NFR {_pct(e['nfr'])} % against a noise floor of "
           f"{_pct(r['noise_floor'])} % between reruns: excess {100 * r['excess_nfr']:+.1f} points.")
    if not r["run_level"]:
        out += (" Over items only: with 1 + 2 runs the runs' own variance cannot be estimated (give a side 3 runs, "
                "or each side 2).")
    items = e.get("items")
    if items:
        named = sum(items["flagged"])
        out += (f" {named} item(s) broke beyond rerun noise (Boschloo's test per item, BH at {items['q']:g})."
                if named else
                " No single item broke beyond rerun noise" + (
                    f" (with {items['pairs']} run pairs no item can reach p below {items['min_p']:.2g}; "
                    f"{len(items['p'])} items need p ≤ {items['q'] / len(items['p']):.2g}: add runs)."
                    if items["min_p"] > items["q"] / len(items["p"]) else "."))
    return out


def runs_line(report: Comparison) -> str | None:
    runs = report.runs
    if runs and runs.get("old", 1) == 1 and all(n == 1 for n in runs.get("new", [1])):
        return ("Run-to-run variance was not measured (one run per side): give replicate runs as OLD1,OLD2 "
                "NEW1,NEW2 to measure flips against the noise floor of reruns.")
    return None


def across_lines(report: Comparison) -> list[str]:
    """Kübler et al.'s accuracy verdict across each candidate's tasks; with a gate, the numbers only (the gate's
    `overall:` threshold is the verdict, if one was given)."""
    lines = []
    across = report.across_tasks
    gated = report.gate is not None
    for label, a in across.items():
        p = a["p"]
        drop = 100 * (a["old_acc"] - a["new_acc"])
        head = (f"across tasks{'' if len(across) == 1 else f' [{label}]'} ({len(a['tasks'])} task"
                f"{'s' * (len(a['tasks']) > 1)}, {a['n']} items, churn in: an accuracy test holds at chance): "
                f"accuracy {-drop:+.1f} points; pooled p {_p(p['pooled'])}, max-drop p {_p(p['max_drop'])}, "
                f"Fisher p {_p(p['fisher'])} (one-sided, a drop > 0)")
        if gated:
            lines.append(head + ", not part of the gate unless it has an 'overall:acc_drop' threshold.")
        else:
            lines.append(head + f", each at α/3 = {a['alpha_each']:.3g}: " + (
                "the data support a drop." if a["regression"] else "no drop shown at this level."))
    return lines


def overall_lines(report: Comparison) -> list[str]:
    """The tasks that are not churn pooled: with replicates, the excess NFR and its run-level test; with one run per
    side, the pooled rates only (their test is the verdict across tasks, stated once)."""
    lines = []
    level = round(100 * report.level)
    for label, o in report.overall.items():
        head = (f"overall{'' if len(report.overall) == 1 else f' [{label}]'} ({o['tasks']} task"
                f"{'s' * (o['tasks'] > 1)}, {o['n']} items, churn tasks {'in' if report.include_churn else 'out'}"
                f"): NFR {_pct(o['nfr'])} %")
        if o["runs_fixed"]:
            lines.append(f"{head}, PFR {_pct(o['pfr'])} % (the accuracy test across tasks is below).")
        else:
            lines.append(f"{head}, excess NFR {100 * o['estimate']:+.1f} points ({level} % CI {100 * o['ci'][0]:+.1f} "
                         f"to {100 * o['ci'][1]:+.1f}, p {_p(o['p_value'])}).")
    return lines


def flip_lines(report: Comparison, markdown: bool = False) -> list[str]:
    """The `--show-flips` documents: per task, prompt (shortened), gold, old and new answer."""
    lines = []
    for task, flips in (report.negative_flips or {}).items():
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


def _explained(report: Comparison) -> list[str]:
    return [*report.notes, *(task_sentence(n, e, report.gate, report.alpha, report.include_churn)
                             for n, e in report.tasks.items()),
            *overall_lines(report), *across_lines(report), *filter(None, [runs_line(report)])]


def to_text(report: Comparison | Mapping) -> str:
    report = Comparison.of(report)
    header, rows = table_rows(report)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows), "", *_explained(report), "",
                      *legend(report), *flip_lines(report)])


def _names(side) -> str:
    if isinstance(side, str):
        return f"`{side}`"
    return ", ".join(_names(x) if isinstance(x, str) else "(" + ", ".join(f"`{y}`" for y in x) + ")" for x in side)


def to_markdown(report: Comparison | Mapping) -> str:
    report = Comparison.of(report)
    header, rows = table_rows(report)
    lines = [f"# Compatibility: {_names(report.old)} → {_names(report.new)}", "", *legend(report), "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", *(f"- {x}" for x in _explained(report))]
    gate = report.gate
    if gate is not None:
        from ..gate import describe

        first, *rest = describe(gate).splitlines()
        lines += ["", "**G" + first[1:] + "**", *(f"- {x.strip()}" for x in rest)]
    if report.negative_flips:
        lines += ["", "## Negative flips (right before, wrong after)", *flip_lines(report, markdown=True)]
    return "\n".join(lines) + "\n"


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
        ax.set_title(f"{name}\nNFR {_fmt(e.get('nfr', e.get('smooth_nfr')), True)}%  "
                     f"PFR {_fmt(e.get('pfr', e.get('smooth_pfr')), True)}%"
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


def _gate_section(gate: Gate) -> list[str]:
    """The gate's decisions as lists: breaches, then undecided thresholds, then what was left out."""
    from ..gate import decision_line
    from .html import escaped

    out = []
    for kind, title in ((Decision.BREACH, "Breaches"), (Decision.UNDECIDED, "Undecided"), (Decision.CLEAR, "Clear")):
        found = gate.of_kind(kind)
        if found:
            out += [f"<h3>{title} ({len(found)})</h3>",
                    f'<ul class="decisions {kind}">' + "".join(f"<li>{escaped(decision_line(d))}</li>" for d in found)
                    + "</ul>"]
    if gate.nothing_decided:
        out.append(f"<p>{escaped(gate.nothing_decided)}</p>")
    elif gate.left_out:
        out.append("<p class='note'>Left out: " + escaped("; ".join(f"{x.task} [{x.expr}]: {x.why}"
                                                                for x in gate.left_out)) + "</p>")
    return out


def no_gate_line(report: Comparison) -> str:
    """With no --fail-on: says nothing was gated, then what the data support (the regression flags and the verdict
    across tasks), and the largest NFR so it is not hidden behind a quiet line."""
    flagged = [n for n, e in report.tasks.items() if (e.get("regression") or {}).get("flagged")]
    across = [label for label, a in report.across_tasks.items() if a["regression"]]
    out = "No gate given (--fail-on decides thresholds). "
    if flagged:
        out += f"The data support a regression on {len(flagged)} of {len(report.tasks)} tasks: {', '.join(flagged)}."
    else:
        out += f"The data support no regression on any of the {len(report.tasks)} tasks (after BH)."
    if across:
        out += " Across tasks, they support an accuracy drop."
    rated = [(e["nfr"], n, e) for n, e in report.tasks.items() if e.get("nfr") is not None and e.get("new_acc") is not None]
    if rated:
        nfr, name, e = max(rated, key=lambda x: x[0])
        out += (f" Largest NFR: {name}, {100 * nfr:.1f} % of the items broke (accuracy "
                f"{100 * (e['new_acc'] - e['old_acc']):+.1f} points).")
    return out


def compare_page(report: Comparison | Mapping, flips: list[dict], figure_png: bytes | None) -> str:
    """`adaptguard compare --html`: the gate's outcome (or the tasks' verdicts) first, its decisions as lists, the
    table, the sentences, the legend, the figure, then the flipped items."""
    from .html import escaped, figure, flips_section, page, table

    report = Comparison.of(report)
    gate = report.gate
    sections = [f"<p>{_names(report.old)} → {_names(report.new)}</p>".replace("`", "")]
    if gate is not None:
        from ..gate import headline

        verdict = headline(gate)
        status = gate.outcome.word
        sections += ["<h2>Gate</h2>", *_gate_section(gate)]
    else:
        verdict, status = no_gate_line(report), NOTHING_GATED
    header, rows = table_rows(report)
    counts: dict[str, dict[str, int]] = {}
    for f in flips:
        counts.setdefault(f["task"], {}).setdefault(f["kind"], 0)
        counts[f["task"]][f["kind"]] += 1
    replicated = any(not (e.get("replicates") or {"runs_fixed": True})["runs_fixed"] for e in report.tasks.values())
    sections += ["<h2>Per task</h2>", table(header, rows), "<ul>" + "".join(f"<li>{escaped(x)}</li>" for x in
                                                                          _explained(report)) + "</ul>",
                 "<p class='note'>" + "<br>".join(escaped(x) for x in legend(report)) + "</p>"]
    if figure_png:
        sections += ["<h2>Flip quadrants</h2>", figure(figure_png, "flip quadrants per task")]
    note = ("With replicate runs, an item is listed when it flipped in at least one (old run, new run) pair; "
            "'beyond noise' marks the items whose old runs were right more often than their new runs by more than "
            "reruns explain (Boschloo's test per item, Benjamini-Hochberg across items); they come first. "
            if replicated else "")
    sections.append(flips_section(flips, counts, note=note))
    return page("What the update broke", verdict, status, sections)
