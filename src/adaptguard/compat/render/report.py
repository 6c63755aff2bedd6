"""Rendering a compatibility report (`compare_runs`' `Comparison`) as text: JSON, the terminal's table and
sentences, Markdown; the figure is `figure`'s, the page `page`'s, and `outputs.write_outputs` writes them all. Each
function that takes a report also reads a mapping shaped as `report.json` (`Comparison.of`)."""

from __future__ import annotations

from collections.abc import Mapping

from ..comparison import Comparison
from ..metric_table import METRICS
from ..verdicts import Decision, Evidence, Gate, ThresholdDecision
from .flips import shorten


def to_json(report: Comparison | Mapping) -> str:
    return Comparison.of(report).to_json()


def _fmt(value, pct=False) -> str:
    if value is None:
        return "–"
    if isinstance(value, (tuple, list)):
        return f"[{_fmt(value[0], pct)}, {_fmt(value[1], pct)}]"
    return f"{100 * value:.1f}" if pct else f"{value:.3g}"


def pct(value, count=None) -> str:
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


def has_replicates(entry: Mapping) -> bool:
    """Its evidence is replicate runs on a side (`evidence`)."""
    from ..evidence import evidence_of

    return evidence_of(entry).kind is Evidence.REPLICATES


def table_rows(report: Comparison | Mapping) -> tuple[list[str], list[list[str]]]:
    from ..evidence import interval

    report = Comparison.of(report)
    alpha = report.alpha
    level = f"{100 * (1 - 2 * alpha):g}%"
    replicated = any(has_replicates(e) for e in report.tasks.values())
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
    # a row of the metric table whose column the table lacks: its own column, where some task has its value
    more: dict[str, list] = {}  # column → its rows (a column may show one of several metrics, as ΔNFR_c does)
    for m in METRICS.values():
        if m.column and m.column not in header and any(e.get(m.name) is not None for e in report.tasks.values()):
            more.setdefault(m.column, []).append(m)
    header += list(more)
    breached = {(b.task, b.metric) for b in report.gate.of_kind(Decision.BREACH)} if report.gate else set()
    rows = []
    for name, e in report.tasks.items():
        r = e.get("replicates") or {}
        reg = e.get("regression") or {}
        acc = "–" if e.get("old_acc") is None else f"{100 * e['old_acc']:.1f} → " + \
            ("–" if e.get("new_acc") is None else f"{100 * e['new_acc']:.1f}")  # not measured: a group-sequential run
        nfr_ci = interval(e, "nfr", alpha) if e.get("n_negative_flips") is not None else None
        row = [name, str(e["n"]), acc, pct(e.get("nfr"), e.get("n_negative_flips")), _fmt(nfr_ci, True),
               pct(e.get("pfr"), e.get("n_positive_flips")), pct(e.get("inconsistency_flips")), pct(e.get("btc"))]
        if replicated:
            fixed = not has_replicates(e)
            row += ["–" if not r else f"{r['runs'][0]}+{r['runs'][1]}", pct(r.get("noise_floor")),
                    pct(r.get("excess_nfr")), "–" if fixed else _fmt(interval(e, "excess_nfr", alpha), True),
                    "–" if not r else pct(r["mde"]),
                    "–" if not reg else f"{_p(reg['p'])} ({_p(reg['p_bh'])})"]
        else:
            row += [_p(e.get("mcnemar_p")), "–" if not r else pct(r["mde"])]
        row.append(_verdict(e, name, report))
        if smooth:
            row += [e.get("similarity", "–"), pct(e.get("smooth_nfr")), pct(e.get("smooth_pfr")),
                    _fmt(e.get("m_g")), _fmt(e.get("m_r"))]
        if compat:
            key = "delta_nfr" if "delta_nfr" in e else "delta_smooth_nfr"
            row += [pct(e.get(key)), _fmt(e.get(f"{key}_pct"))]
        for rows_of_column in more.values():  # the first of the column's metrics the task has
            m = next((m for m in rows_of_column if e.get(m.name) is not None), rows_of_column[0])
            row.append(pct(e.get(m.name)) if m.in_rate_units else _fmt(e.get(m.name)))
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
    from .decisions import decision_line

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
        return f"{name}: smooth NFR {pct(e.get('smooth_nfr'))} %, smooth PFR {pct(e.get('smooth_pfr'))} % " \
               f"({e.get('similarity')})."
    r = e.get("replicates") or {}
    if e.get("new_acc") is None:  # a group-sequential run of one stratum: the new model's accuracy not measured
        rates = "; ".join(f"{k.upper()} {pct(e[k])} %" for k in ("nfr", "pfr") if e.get(k) is not None)
        return (f"{name}: old accuracy {100 * e['old_acc']:.1f} %; {rates} (the new model's accuracy was not "
                "measured: only the items that can flip were evaluated).")
    acc = f"accuracy {100 * e['old_acc']:.1f} → {100 * e['new_acc']:.1f} % ({100 * (e['new_acc'] - e['old_acc']):+.1f} points)"
    if not has_replicates(e):
        broke, fixed = round(e["n_negative_flips"]), round(e["n_positive_flips"])
        return (f"{name}: {acc}; {broke} answer{'s' * (broke != 1)} broke (NFR {pct(e['nfr'])} %), {fixed} "
                f"{'was' if fixed == 1 else 'were'} fixed (PFR {pct(e['pfr'])} %).")
    out = (f"{name}: {acc} over {r['runs'][0]}+{r['runs'][1]} runs; NFR {pct(e['nfr'])} % against a noise floor of "
           f"{pct(r['noise_floor'])} % between reruns: excess {100 * r['excess_nfr']:+.1f} points.")
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
                f"): NFR {pct(o['nfr'])} %")
        if o["runs_fixed"]:
            lines.append(f"{head}, PFR {pct(o['pfr'])} % (the accuracy test across tasks is below).")
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


def explained_lines(report: Comparison) -> list[str]:
    return [*report.notes, *(task_sentence(n, e, report.gate, report.alpha, report.include_churn)
                             for n, e in report.tasks.items()),
            *overall_lines(report), *across_lines(report), *filter(None, [runs_line(report)])]


def to_text(report: Comparison | Mapping) -> str:
    report = Comparison.of(report)
    header, rows = table_rows(report)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows), "", *explained_lines(report), "",
                      *legend(report), *flip_lines(report)])


def run_names(side) -> str:
    if isinstance(side, str):
        return f"`{side}`"
    return ", ".join(run_names(x) if isinstance(x, str) else "(" + ", ".join(f"`{y}`" for y in x) + ")" for x in side)


def to_markdown(report: Comparison | Mapping) -> str:
    report = Comparison.of(report)
    header, rows = table_rows(report)
    lines = [f"# Compatibility: {run_names(report.old)} → {run_names(report.new)}", "", *legend(report), "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += ["", *(f"- {x}" for x in explained_lines(report))]
    gate = report.gate
    if gate is not None:
        from .decisions import describe

        first, *rest = describe(gate).splitlines()
        lines += ["", "**G" + first[1:] + "**", *(f"- {x.strip()}" for x in rest)]
    if report.negative_flips:
        lines += ["", "## Negative flips (right before, wrong after)", *flip_lines(report, markdown=True)]
    return "\n".join(lines) + "\n"
