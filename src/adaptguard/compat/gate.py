"""The regression gate of `adaptguard compare --fail-on`: thresholds over a compatibility report's metrics, an
optional significance test per breach, and a verdict a CI pipeline can act on (exit 1 on a regression).

An expression is `[TASKGLOB:]METRIC>VALUE` or `[TASKGLOB:]METRIC<VALUE`, e.g. `nfr>0.02`, `btc<0.95`,
`mmlu_*:acc_drop>0.01`. With a significance level α a breach counts only when the data support it:

- rates of items (`nfr`, `pfr`, `nfr_mc`, `old_acc`, `new_acc`, `smooth_nfr`, `smooth_pfr`) and `btc` (a rate
  over the items the old model got right): an exact one-sided binomial test of H0 "rate ≤ VALUE" (for `>`) or
  "rate ≥ VALUE" (for `<`) on the item counts, rejected at p < α;
- `acc_drop` (= old_acc − new_acc): the report's exact McNemar test, p < α (the accuracies really differ).
Metrics without a test (`m_g`, `m_r`, `mean_delta`, the Δ-metrics of `--compatible`) cannot be gated with α.
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass

from .metrics import DELTA_KEYS

RATE_METRICS = ("nfr", "pfr", "nfr_mc", "old_acc", "new_acc", "btc", "smooth_nfr", "smooth_pfr")
GATE_METRICS = (*RATE_METRICS, "acc_drop", "m_g", "m_r", "mean_delta",
                *(f"delta_{k}{pct}" for k in DELTA_KEYS for pct in ("", "_pct")))
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
        if metric not in GATE_METRICS:
            raise GateError(f"--fail-on {expr!r}: unknown metric {metric!r}; known: {', '.join(GATE_METRICS)}")
        try:
            value = float(m["value"])
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise GateError(f"--fail-on {expr!r}: the threshold {m['value']!r} is not a finite number")
        return cls(expr=expr, metric=metric, op=m["op"], value=value, tasks=(m["tasks"] or "*").strip())


def _value(entry: dict, metric: str) -> float | None:
    if metric == "acc_drop":
        old, new = entry.get("old_acc"), entry.get("new_acc")
        return None if old is None or new is None else old - new
    value = entry.get(metric)
    return None if value is None or not math.isfinite(value) else float(value)


def _counts(entry: dict, metric: str) -> tuple[int, int]:
    """(successes, trials) behind a rate metric of a report entry."""
    n = entry["n"]
    if metric == "btc":  # over the items the old model got right; both right = old right − negative flips
        old_right = round(entry["old_acc"] * n)
        return old_right - entry["n_negative_flips"], old_right
    if metric in ("nfr", "pfr"):
        return entry[f"n_{'negative' if metric == 'nfr' else 'positive'}_flips"], n
    return round(entry[metric] * n), n


def breach_p_value(entry: dict, threshold: Threshold) -> float:
    """p-value of the breach `threshold` on a report entry (see the module docstring for the tests)."""
    from scipy.stats import binomtest

    if threshold.metric == "acc_drop":
        return float(entry["mcnemar_p"])
    k, n = _counts(entry, threshold.metric)
    if n == 0:
        return 1.0
    p0 = min(max(threshold.value, 0.0), 1.0)
    return float(binomtest(k, n, p0, alternative="greater" if threshold.op == ">" else "less").pvalue)


def check_gate(report: dict, thresholds: list[Threshold], significance: float | None = None) -> dict:
    """Apply the thresholds to every matching task of a `compare_runs` report.

    Returns `{"passed", "significance", "thresholds", "breaches": [{task, metric, value, op, threshold, expr,
    p_value}], "not_applicable": [...]}`; a task whose metric is undefined (e.g. `btc` when the old model was
    never right) is listed under `not_applicable`, not breached. Raises `GateError` when an expression matches no
    task, names a metric that no matched task reports, or has no test although `significance` is given.
    """
    if significance is not None and not 0 < significance < 1:
        raise GateError(f"--significance {significance}: must be in (0, 1), e.g. 0.05")
    breaches, not_applicable = [], []
    for t in thresholds:
        if significance is not None and t.metric not in (*RATE_METRICS, "acc_drop"):
            raise GateError(f"--fail-on {t.expr!r}: {t.metric} has no significance test; gate it without "
                            f"--significance or use one of {', '.join((*RATE_METRICS, 'acc_drop'))}")
        tasks = [name for name in report["tasks"] if fnmatch.fnmatchcase(name, t.tasks)]
        if not tasks:
            raise GateError(f"--fail-on {t.expr!r}: no task matches {t.tasks!r}; tasks: {', '.join(report['tasks'])}")
        if not any(t.metric in report["tasks"][name] or (t.metric == "acc_drop" and "old_acc" in report["tasks"][name])
                   for name in tasks):
            raise GateError(f"--fail-on {t.expr!r}: no matched task reports {t.metric} (a generation task needs "
                            f"--similarity for smooth_*; nfr_mc needs predictions; delta_* needs --compatible)")
        for name in tasks:
            entry = report["tasks"][name]
            value = _value(entry, t.metric)
            if value is None:
                not_applicable.append({"task": name, "expr": t.expr})
                continue
            if not (value > t.value if t.op == ">" else value < t.value):
                continue
            p = breach_p_value(entry, t) if significance is not None else None
            if p is None or p < significance:
                breaches.append({"task": name, "metric": t.metric, "value": value, "op": t.op, "threshold": t.value,
                                 "expr": t.expr, "p_value": p})
    return {"passed": not breaches, "significance": significance, "thresholds": [t.expr for t in thresholds],
            "breaches": breaches, "not_applicable": not_applicable}


def describe(gate: dict) -> str:
    """One line per breach, for the terminal."""
    if gate["passed"]:
        return f"gate: passed ({len(gate['thresholds'])} threshold(s))"
    lines = [f"gate: FAILED, {len(gate['breaches'])} regression(s):"]
    for b in gate["breaches"]:
        p = "" if b["p_value"] is None else f" (p = {b['p_value']:.3g} < {gate['significance']})"
        lines.append(f"  {b['task']}: {b['metric']} = {b['value']:.4g} {b['op']} {b['threshold']:g}{p}  [{b['expr']}]")
    return "\n".join(lines)
