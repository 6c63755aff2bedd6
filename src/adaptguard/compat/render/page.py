"""`adaptguard compare --html`: one self-contained page per comparison, from the pieces of `html`."""

from __future__ import annotations

from collections.abc import Mapping

from ..comparison import Comparison
from ..verdicts import NOTHING_GATED, Decision, Gate
from .report import explained_lines, has_replicates, legend, run_names, table_rows


def _gate_section(gate: Gate) -> list[str]:
    """The gate's decisions as lists: breaches, then undecided thresholds, then what was left out."""
    from .decisions import decision_line
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
    sections = [f"<p>{run_names(report.old)} → {run_names(report.new)}</p>".replace("`", "")]
    if gate is not None:
        from .decisions import headline

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
    replicated = any(has_replicates(e) for e in report.tasks.values())
    sections += ["<h2>Per task</h2>", table(header, rows), "<ul>" + "".join(f"<li>{escaped(x)}</li>" for x in
                                                                          explained_lines(report)) + "</ul>",
                 "<p class='note'>" + "<br>".join(escaped(x) for x in legend(report)) + "</p>"]
    if figure_png:
        sections += ["<h2>Flip quadrants</h2>", figure(figure_png, "flip quadrants per task")]
    note = ("With replicate runs, an item is listed when it flipped in at least one (old run, new run) pair; "
            "'beyond noise' marks the items whose old runs were right more often than their new runs by more than "
            "reruns explain (Boschloo's test per item, Benjamini-Hochberg across items); they come first. "
            if replicated else "")
    sections.append(flips_section(flips, counts, note=note))
    return page("What the update broke", verdict, status, sections)
