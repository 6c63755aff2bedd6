"""The regression gate of `adaptguard compare --fail-on`: thresholds over a compatibility report's metrics, and for
every (task, threshold) a decision a CI pipeline can act on.

An expression is `[TASKGLOB:]METRIC>VALUE` or `[TASKGLOB:]METRIC<VALUE`, e.g. `nfr>2%`, `excess_nfr>0.02`,
`btc<0.95`, `mmlu_*:acc_drop>1%`, `overall:acc_drop>0.5%`. Rates are fractions (0.02) or percentages (2%, the unit
the table prints); a rate threshold outside [0, 1] without `%` is refused, as `nfr>2` most likely meant 2 %.

With a significance level α, each (task, threshold) is decided by the metric's one-sided test (`decide`):
- **breach**: the test of "metric ≤ VALUE" (for `>`) rejects at α — the data support the regression;
- **clear**: the opposite test ("metric ≥ VALUE") rejects at α — the data show the metric within the threshold;
- **undecided**: neither: the observed value is beyond the threshold without support, or within it without the
  items (and runs) to show it.
Exit status 1 on any breach, else 3 on any undecided, else 0; a gate left with nothing to decide (every matched
task churn, or the metric undefined on each) exits 3 and says why. Tasks where the old model is not above chance
(`churn`) leave the flip metrics (`decide.FLIP_METRICS`), never the accuracy tests (`acc_drop`, `old_acc`,
`new_acc`). `overall:acc_drop>VALUE` decides the tasks together, as Kübler et al. (2026) do: a breach when any of
the pooled, max-drop and Fisher tests rejects at α/3; clear when the pooled test shows the drop below VALUE.
`--significance off` compares raw values: breach when beyond the threshold, clear otherwise (no test).
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass

from .decide import (
    ACROSS_METHODS,
    FLIP_METRICS,
    RATE_METRICS,
    RUN_LEVEL_METRICS,
    across_tasks,
    mde,
    p_beyond,
    replicated,
    test_name,
    value,
)
from .metrics import DELTA_KEYS

GATE_METRICS = (*RATE_METRICS, "acc_drop", "excess_nfr", "m_g", "m_r", "mean_delta",
                *(f"delta_{k}{pct}" for k in DELTA_KEYS for pct in ("", "_pct")))
# metrics in rate units (a fraction, or a difference of fractions): a threshold beyond ±1 is a unit slip
IN_RATE_UNITS = (*RATE_METRICS, "acc_drop", "excess_nfr", *(f"delta_{k}" for k in DELTA_KEYS))
ACROSS = "overall"  # the task glob of a threshold on every task together
_EXPR = re.compile(r"^(?:(?P<tasks>[^:<>]+):)?(?P<metric>[A-Za-z_]+)\s*(?P<op>[<>])\s*(?P<value>\S+)$")


class GateError(ValueError):
    """A malformed threshold, or one that cannot be applied to the report (exit status 2)."""


@dataclass(frozen=True)
class Threshold:
    """One `--fail-on` expression: the gate fails when `METRIC OP VALUE` holds for a task matching `tasks`."""

    expr: str
    metric: str
    op: str  # ">" or "<"
    value: float
    tasks: str = "*"

    @classmethod
    def parse(cls, expr: str) -> Threshold:
        m = _EXPR.match(expr.strip())
        if m is None:
            raise GateError(f"--fail-on {expr!r}: expected [TASKGLOB:]METRIC>VALUE or [TASKGLOB:]METRIC<VALUE, "
                            f"e.g. 'nfr>0.02' or 'mmlu_*:btc<0.95'")
        metric = m["metric"]
        if metric == "nfr_mc":  # renamed before any release
            raise GateError(f"--fail-on {expr!r}: nfr_mc was renamed inconsistency_flips (what it counts: wrong "
                            "answers that changed)")
        if metric not in GATE_METRICS:
            raise GateError(f"--fail-on {expr!r}: unknown metric {metric!r}; known: {', '.join(GATE_METRICS)}")
        text = m["value"]
        percent = text.endswith("%")
        try:
            value = float(text[:-1] if percent else text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise GateError(f"--fail-on {expr!r}: the threshold {text!r} is not a finite number")
        if percent:
            if metric not in IN_RATE_UNITS:
                raise GateError(f"--fail-on {expr!r}: {metric} is not a rate; give its threshold without %")
            value /= 100
        elif metric in IN_RATE_UNITS and abs(value) > 1:
            raise GateError(f"--fail-on {expr!r}: {metric} is a rate (the table prints it in %): write "
                            f"{text}% or {value / 100:g}")
        return cls(expr=expr, metric=metric, op=m["op"], value=value, tasks=(m["tasks"] or "*").strip())


def _decision(name: str, t: Threshold, v: float, p: float | None, p_within: float | None, alpha: float | None,
              test: str | None, mde_value: float | None = None) -> dict:
    if alpha is None:
        beyond = v > t.value if t.op == ">" else v < t.value
        decision, why = ("breach", "beyond the threshold") if beyond else ("clear", "within the threshold")
    elif p < alpha:
        decision, why = "breach", "the data support it"
    elif p_within < alpha:
        decision, why = "clear", "the data show it within the threshold"
    elif (v > t.value if t.op == ">" else v < t.value):
        decision, why = "undecided", "beyond the threshold, but not significantly"
    else:
        decision, why = "undecided", "within the threshold, but the data cannot show it"
    return {"task": name, "expr": t.expr, "metric": t.metric, "op": t.op, "threshold": t.value, "value": v,
            "decision": decision, "why": why, "p_value": p, "p_within": p_within, "test": test, "mde": mde_value}


def _check(t: Threshold, entries: list[dict], significance: float | None) -> None:
    """Refuse a threshold that cannot be applied to the matched entries (GateError, exit status 2)."""
    if t.metric == "excess_nfr" and not any(replicated(e) for e in entries):
        raise GateError(f"--fail-on {t.expr!r}: excess_nfr needs replicate runs on a side (OLD or NEW as "
                        f"RUN1,RUN2,...): with one run each, nothing measures the noise floor of reruns")
    if significance is not None:
        is_replicated = any(replicated(e) for e in entries)
        testable = RUN_LEVEL_METRICS if is_replicated else (*RATE_METRICS, "acc_drop")
        if t.metric not in testable:
            raise GateError(f"--fail-on {t.expr!r}: {t.metric} has no significance test"
                            + (" over replicate runs" if is_replicated else "")
                            + f"; use one of {', '.join(testable)}, or gate it with --significance off")
    if not any(value(e, t.metric) is not None or t.metric in e or (t.metric == "acc_drop" and "old_acc" in e)
               for e in entries):
        raise GateError(f"--fail-on {t.expr!r}: no matched task reports {t.metric} (excess_nfr needs replicate "
                        f"runs: OLD or NEW as run1,run2; a generation task needs --similarity for smooth_*; "
                        f"inconsistency_flips needs predictions; delta_* needs --compatible)")


def _across(report: dict, t: Threshold, significance: float | None) -> list[dict]:
    """`overall:acc_drop>VALUE`: one decision per candidate, the tasks' accuracy tests combined."""
    if t.metric != "acc_drop":
        raise GateError(f"--fail-on {t.expr!r}: across tasks only acc_drop is combined (Kübler et al.'s pooled, "
                        f"max-drop and Fisher tests); gate {t.metric} per task, e.g. '{t.metric}{t.op}...'")
    across = report.get("across_tasks") or {}
    if not across:
        raise GateError(f"--fail-on {t.expr!r}: no task with a 0/1 metric to combine")
    out = []
    for label, a in across.items():
        name = ACROSS if len(across) == 1 else f"{ACROSS} [{label}]"
        entries = [report["tasks"][k] for k in a["tasks"]]
        drop = a["pooled"]["old_acc"] - a["pooled"]["new_acc"]
        if significance is None:
            out.append(_decision(name, t, drop, None, None, None, None))
            continue
        towards = across_tasks(entries, a["pooled"], t.value, t.op)
        within = across_tasks(entries, a["pooled"], t.value, "<" if t.op == ">" else ">")["pooled"]
        split = significance / len(ACROSS_METHODS)
        # a breach when any of the three tests rejects at α/3 (Bonferroni): report the smallest p scaled back to α
        p = min(1.0, len(ACROSS_METHODS) * min(towards.values()))
        d = _decision(name, t, drop, p, within, significance,
                      f"pooled, max-drop and Fisher tests, each at α/3 = {split:.3g}")
        d["p_methods"] = towards
        out.append(d)
    return out


def check_gate(report: dict, thresholds: list[Threshold], significance: float | None = None) -> dict:
    """Decide every (task, threshold) of a `compare_runs` report (module docstring).

    Returns `{"status": "breach" | "undecided" | "clear", "passed", "significance", "thresholds", "decisions":
    [{task, expr, metric, op, threshold, value, decision, why, p_value, p_within, test, mde}], "breaches",
    "undecided" (the decisions of each kind), "left_out": [{task, expr, why}], "nothing_decided": a sentence or
    None}`. Raises `GateError` when an expression matches no task, names a metric that no matched task reports, or
    has no test although `significance` is given.
    """
    if significance is not None and not 0 < significance < 1:
        raise GateError(f"--significance {significance}: must be in (0, 1), e.g. 0.05")
    decisions, left_out = [], []
    churn = {name for name, e in report["tasks"].items()
             if (e.get("churn") or {}).get("churn") and not report.get("include_churn")}
    for t in thresholds:
        if t.tasks == ACROSS:
            decisions += _across(report, t, significance)
            continue
        tasks = [name for name in report["tasks"] if fnmatch.fnmatchcase(name, t.tasks)]
        if not tasks:
            raise GateError(f"--fail-on {t.expr!r}: no task matches {t.tasks!r}; tasks: {', '.join(report['tasks'])}")
        entries = [report["tasks"][name] for name in tasks]
        _check(t, entries, significance)
        for name, entry in zip(tasks, entries):
            if name in churn and t.metric in FLIP_METRICS:
                left_out.append({"task": name, "expr": t.expr, "why": "churn: the old model is not above chance, so "
                                 "its flips are noise (--include-churn counts them)"})
                continue
            v = value(entry, t.metric)
            if v is None:
                left_out.append({"task": name, "expr": t.expr, "why": f"{t.metric} is not defined on this task"})
                continue
            if significance is None:
                decisions.append(_decision(name, t, v, None, None, None, None))
                continue
            flip = "<" if t.op == ">" else ">"
            decisions.append(_decision(name, t, v, p_beyond(entry, t.metric, t.value, t.op),
                                       p_beyond(entry, t.metric, t.value, flip), significance,
                                       test_name(entry, t.metric, t.value), mde(entry, t.metric, significance)))
    kinds = {k: [d for d in decisions if d["decision"] == k] for k in ("breach", "undecided", "clear")}
    status = "breach" if kinds["breach"] else "undecided" if kinds["undecided"] or not decisions else "clear"
    nothing = None
    if not decisions:
        nothing = ("no (task, threshold) was left to decide: " + "; ".join(sorted({f"{x['task']}: {x['why']}"
                                                                                   for x in left_out})))
    return {"status": status, "passed": status == "clear", "significance": significance,
            "thresholds": [t.expr for t in thresholds], "decisions": decisions, "breaches": kinds["breach"],
            "undecided": kinds["undecided"], "left_out": left_out, "nothing_decided": nothing,
            "churn_left_out": sorted(churn)}


EXIT_PASSED, EXIT_REGRESSION, EXIT_BAD_INPUT, EXIT_UNDECIDED = 0, 1, 2, 3


def exit_status(gate: dict) -> int:
    """1: a breach the data support; 3: none, but a threshold left undecided (or nothing to decide); 0: all clear."""
    return {"breach": EXIT_REGRESSION, "undecided": EXIT_UNDECIDED, "clear": EXIT_PASSED}[gate["status"]]


def _rate(metric: str, value: float) -> str:
    return f"{100 * value:.2f}%" if metric in IN_RATE_UNITS else f"{value:.4g}"


def decision_line(d: dict) -> str:
    """One decision in words: the value, the threshold, the decision and the test's p."""
    metric = d["metric"]
    where = "≤" if d["op"] == ">" else "≥"
    head = f"{d['task']}: {metric} = {_rate(metric, d['value'])}"
    if d["p_value"] is None:
        return f"{head} {d['op'] if d['decision'] == 'breach' else where} {_rate(metric, d['threshold'])}  [{d['expr']}]"
    if d["decision"] == "breach":
        body = f"{d['op']} {_rate(metric, d['threshold'])} (p = {d['p_value']:.3g}, {d['test']})"
    elif d["decision"] == "clear":
        body = f"{'<' if d['op'] == '>' else '>'} {_rate(metric, d['threshold'])} shown (p = {d['p_within']:.3g}, {d['test']})"
    else:
        if d["why"].startswith("beyond"):
            body = f"{d['op']} {_rate(metric, d['threshold'])} but not significantly (p = {d['p_value']:.3g} ≥ α"
        else:
            body = (f"{where} {_rate(metric, d['threshold'])} but not shown {'below' if d['op'] == '>' else 'above'} "
                    f"it (p = {d['p_within']:.3g} ≥ α")
        body += f", {d['test']}"
        body += (f"; the data detect a change of {_rate(metric, d['mde'])} at 80 % power: add items or runs)"
                 if d.get("mde") is not None else "): add items or runs")
    return f"{head} {body}  [{d['expr']}]"


def describe(gate: dict) -> str:
    """The gate's decision for the terminal: one line per breach and undecided threshold, what was left out."""
    alpha = gate["significance"]
    how = (f"breach: its one-sided test at p < {alpha:g}; clear: the opposite test at p < {alpha:g}"
           if alpha is not None else "raw values compared, no test (--significance off)")
    kinds = {k: len([d for d in gate["decisions"] if d["decision"] == k]) for k in ("breach", "undecided", "clear")}
    counts = ", ".join(f"{n} {k}" for k, n in kinds.items())
    if gate["status"] == "breach":
        lines = [f"gate: FAILED ({counts}; {how}):"]
    elif gate["status"] == "undecided":
        lines = [f"gate: UNDECIDED, no breach but not every threshold could be decided ({counts}; {how}):"]
    else:
        lines = [f"gate: passed, every threshold clear ({counts}; {how})"]
    if gate.get("nothing_decided"):
        lines.append(f"  {gate['nothing_decided']}")
    for kind in ("breach", "undecided"):
        lines += [f"  {kind}: {decision_line(d)}" for d in gate["decisions"] if d["decision"] == kind]
    left = sorted({x["task"] for x in gate["left_out"] if x["why"].startswith("churn")})
    if left and not gate.get("nothing_decided"):
        lines.append(f"  churn tasks left out: {', '.join(left)} (of the flip metrics; their accuracy tests stay)")
    return "\n".join(lines)
