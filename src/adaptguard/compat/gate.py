"""The regression gate of `adaptguard compare --fail-on`: thresholds over a compatibility report's metrics, a
significance test per breach, and a verdict a CI pipeline can act on.

An expression is `[TASKGLOB:]METRIC>VALUE` or `[TASKGLOB:]METRIC<VALUE`, e.g. `nfr>2%`, `excess_nfr>0.02`,
`btc<0.95`, `mmlu_*:acc_drop>1%`. Rates are fractions (0.02) or percentages (2%, the unit the table prints); a rate
threshold outside [0, 1] without `%` is refused, as `nfr>2` most likely meant 2 %. With a significance level α a
breach counts only when the data support it:

- one run per side: rates of items (`nfr`, `pfr`, `inconsistency_flips`, `old_acc`, `new_acc`, `smooth_nfr`, `smooth_pfr`) and
  `btc` (a rate over the items the old model got right): an exact one-sided binomial test of H0 "rate ≤ VALUE"
  (for `>`) or "rate ≥ VALUE" (for `<`) on the item counts, rejected at p < α; `acc_drop` (= old_acc − new_acc):
  the exact McNemar test;
- replicate runs on a side (`replicates.replicate_flips`): `nfr`, `excess_nfr` (NFR beyond the noise floor of
  reruns) and `acc_drop` by a one-sided t-test on the run-level standard error (runs and items); other rates have
  no run-level test and are refused with α.
Metrics without a test (`m_g`, `m_r`, `mean_delta`, the Δ-metrics of `--compatible`) cannot be gated with α.

Tasks where the old model is not above chance (`churn`) are left out unless the report includes churn. A threshold
that no task breaches, on a task whose minimum detectable effect exceeds it (`excess_nfr`, `acc_drop`), is listed as
`undetectable`: the gate passed, but the data could not have seen a regression of that size (exit status 3).
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass

from .metrics import DELTA_KEYS

RATE_METRICS = ("nfr", "pfr", "inconsistency_flips", "old_acc", "new_acc", "btc", "smooth_nfr", "smooth_pfr")
RUN_LEVEL_METRICS = ("nfr", "excess_nfr", "acc_drop")  # with a run-level test when a side has replicates
GATE_METRICS = (*RATE_METRICS, "acc_drop", "excess_nfr", "m_g", "m_r", "mean_delta",
                *(f"delta_{k}{pct}" for k in DELTA_KEYS for pct in ("", "_pct")))
# metrics in rate units (a fraction, or a difference of fractions): a threshold beyond ±1 is a unit slip
IN_RATE_UNITS = (*RATE_METRICS, "acc_drop", "excess_nfr", *(f"delta_{k}" for k in DELTA_KEYS))
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


def _replicated(entry: dict) -> bool:
    return not (entry.get("replicates") or {"runs_fixed": True})["runs_fixed"]


def _value(entry: dict, metric: str) -> float | None:
    if metric == "excess_nfr":
        return (entry.get("replicates") or {}).get("excess_nfr")
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

    from .replicates import t_sf

    if _replicated(entry):
        r = entry["replicates"]
        value, se, df = {"nfr": (r["nfr"], r["nfr_se"], r["nfr_df"]),
                         "excess_nfr": (r["excess_nfr"], r["se"], r["df"]),
                         "acc_drop": (-r["acc_diff"], r["acc_diff_se"], r["acc_diff_df"])}[threshold.metric]
        z = (value - threshold.value) if threshold.op == ">" else (threshold.value - value)
        return t_sf(z / se, df) if se > 0 else float(z <= 0)
    if threshold.metric == "acc_drop":
        return float(entry["mcnemar_p"])
    k, n = _counts(entry, threshold.metric)
    if n == 0:
        return 1.0
    p0 = min(max(threshold.value, 0.0), 1.0)
    return float(binomtest(k, n, p0, alternative="greater" if threshold.op == ">" else "less").pvalue)


def _mde(entry: dict, metric: str) -> float | None:
    """The smallest true `metric` the task's data detect at 80 % power (None where not defined)."""
    r = entry.get("replicates")
    if r is None:
        return None
    if metric == "excess_nfr":
        return None if r["runs_fixed"] else r["mde"]
    return r["acc_diff_mde"] if metric == "acc_drop" else None


def _test_name(entry: dict, metric: str) -> str:
    if _replicated(entry):
        return "one-sided t-test over runs and items"
    return "exact McNemar" if metric == "acc_drop" else "exact one-sided binomial on the item counts"


def check_gate(report: dict, thresholds: list[Threshold], significance: float | None = None) -> dict:
    """Apply the thresholds to every matching task of a `compare_runs` report.

    Returns `{"passed", "significance", "thresholds", "breaches": [{task, metric, value, op, threshold, expr,
    p_value, test}], "not_applicable": [...], "undetectable": [{task, expr, mde}], "churn_skipped": [...]}`; a task
    whose metric is undefined (e.g. `btc` when the old model was never right) is listed under `not_applicable`, not
    breached. Raises `GateError` when an expression matches no task, names a metric that no matched task reports,
    or has no test although `significance` is given.
    """
    if significance is not None and not 0 < significance < 1:
        raise GateError(f"--significance {significance}: must be in (0, 1), e.g. 0.05")
    breaches, not_applicable, undetectable = [], [], []
    churn = {name for name, e in report["tasks"].items()
             if (e.get("churn") or {}).get("churn") and not report.get("include_churn")}
    for t in thresholds:
        tasks = [name for name in report["tasks"] if fnmatch.fnmatchcase(name, t.tasks)]
        if not tasks:
            raise GateError(f"--fail-on {t.expr!r}: no task matches {t.tasks!r}; tasks: {', '.join(report['tasks'])}")
        entries = [report["tasks"][name] for name in tasks]
        if t.metric == "excess_nfr" and not any(_replicated(e) for e in entries):
            raise GateError(f"--fail-on {t.expr!r}: excess_nfr needs replicate runs on a side (OLD or NEW as "
                            f"RUN1,RUN2,...): with one run each, nothing measures the noise floor of reruns")
        if significance is not None:
            replicated = any(_replicated(e) for e in entries)
            testable = RUN_LEVEL_METRICS if replicated else (*RATE_METRICS, "acc_drop")
            if t.metric not in testable:
                raise GateError(f"--fail-on {t.expr!r}: {t.metric} has no significance test"
                                + (" over replicate runs" if replicated else "")
                                + f"; use one of {', '.join(testable)}, or gate it with --significance off")
        if not any(_value(e, t.metric) is not None or t.metric in e or (t.metric == "acc_drop" and "old_acc" in e)
                   for e in entries):
            raise GateError(f"--fail-on {t.expr!r}: no matched task reports {t.metric} (excess_nfr needs replicate "
                            f"runs: OLD or NEW as run1,run2; a generation task needs --similarity for smooth_*; "
                            f"inconsistency_flips needs predictions; delta_* needs --compatible)")
        for name, entry in zip(tasks, entries):
            if name in churn:
                continue
            value = _value(entry, t.metric)
            if value is None:
                not_applicable.append({"task": name, "expr": t.expr})
                continue
            breached = value > t.value if t.op == ">" else value < t.value
            p = breach_p_value(entry, t) if significance is not None and breached else None
            if breached and (p is None or p < significance):
                breaches.append({"task": name, "metric": t.metric, "value": value, "op": t.op, "threshold": t.value,
                                 "expr": t.expr, "p_value": p,
                                 "test": None if p is None else _test_name(entry, t.metric)})
            elif t.op == ">" and (mde := _mde(entry, t.metric)) is not None and mde > t.value:
                undetectable.append({"task": name, "expr": t.expr, "mde": mde})
    return {"passed": not breaches, "significance": significance, "thresholds": [t.expr for t in thresholds],
            "breaches": breaches, "not_applicable": not_applicable, "undetectable": undetectable,
            "churn_skipped": sorted(churn)}


EXIT_PASSED, EXIT_REGRESSION, EXIT_BAD_INPUT, EXIT_UNDETECTABLE = 0, 1, 2, 3


def exit_status(gate: dict) -> int:
    """1: a regression the data support; 3: none, but a threshold below what the data could detect; 0: passed."""
    if gate["breaches"]:
        return EXIT_REGRESSION
    return EXIT_UNDETECTABLE if gate.get("undetectable") else EXIT_PASSED


def _rate(metric: str, value: float) -> str:
    return f"{100 * value:.2f}%" if metric in IN_RATE_UNITS else f"{value:.4g}"


def describe(gate: dict) -> str:
    """The gate's decision for the terminal: the test it used, one line per breach or undetectable threshold."""
    how = (f"a breach counts when its test gives p < {gate['significance']:g}" if gate["significance"] is not None
           else "raw values compared, no test (--significance off)")
    skipped = (f"; churn tasks left out: {', '.join(gate['churn_skipped'])}" if gate.get("churn_skipped") else "")
    if gate["breaches"]:
        lines = [f"gate: FAILED, {len(gate['breaches'])} regression(s) ({how}{skipped}):"]
        for b in gate["breaches"]:
            p = "" if b["p_value"] is None else f" (p = {b['p_value']:.3g}, {b['test']})"
            lines.append(f"  {b['task']}: {b['metric']} = {_rate(b['metric'], b['value'])} {b['op']} "
                         f"{_rate(b['metric'], b['threshold'])}{p}  [{b['expr']}]")
        return "\n".join(lines)
    lines = [f"gate: passed ({len(gate['thresholds'])} threshold(s); {how}{skipped})"]
    for u in gate.get("undetectable", []):
        lines.append(f"  but {u['task']}: the data detect {u['expr'].split(':')[-1].split('>')[0].strip()} only from "
                     f"{100 * u['mde']:.2f}% (80 % power), above the threshold [{u['expr']}]: add items or runs")
    return "\n".join(lines)
