"""The regression gate of `adaptguard compare --fail-on`: thresholds over a compatibility report's metrics, and for
every (task, threshold) a decision a CI pipeline can act on.

An expression is `[TASKGLOB:]METRIC>VALUE` or `[TASKGLOB:]METRIC<VALUE`, e.g. `nfr>2%`, `excess_nfr>0.02`,
`btc<0.95`, `mmlu_*:acc_drop>1%`, `overall:acc_drop>0.5%`. Rates are fractions (0.02) or percentages (2%, the unit
the table prints); a rate threshold outside [0, 1] without `%` is refused, as `nfr>2` most likely meant 2 %.

With a significance level α, each (task, threshold) is decided by the metric's one-sided test (`evidence`, `decide`):
- **breach**: the test of "metric ≤ VALUE" (for `>`) rejects at α — the data support the regression;
- **clear**: the opposite test ("metric ≥ VALUE") rejects at α — the data show the metric within the threshold;
- **undecided**: neither: the observed value is beyond the threshold without support, or within it without the
  items (and runs) to show it.
Exit status 1 on any breach, else 3 on any undecided, else 0; a gate left with nothing to decide (every matched
task churn, or the metric undefined on each) exits 3 and says why. Tasks where the old model is not above chance
(`churn`) leave the flip metrics (`metric_table`: about_flips), never the accuracy tests (`acc_drop`, `old_acc`,
`new_acc`). `overall:acc_drop>VALUE` decides the tasks together, as Kübler et al. (2026) do: a breach when any of
the pooled, max-drop and Fisher tests rejects at α/3; clear when the pooled test shows the drop below VALUE.
`--significance off` compares raw values: breach when beyond the threshold, clear otherwise (no test).

A value is compared with its threshold exactly: the threshold as the decimal it was written in (`0.7%` is 7/1000,
not 0.7 / 100 = 0.006999999999999999 in floats), the value as the counts behind it (`evidence.relation`), so a value
at its threshold is neither beyond nor within it — not a breach of `>` (nor of `<`), and with the tests undecided
unless a test decides it.
"""

from __future__ import annotations

import difflib
import fnmatch
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from .comparison import Comparison
from .decide import decide_across, decide_threshold, is_churn
from .evidence import evidence_of, value
from .metric_table import METRICS, ONE_RUN, REPLICATES, about_flips, in_rate_units, names
from .verdicts import OUTCOMES, Evidence, Gate, LeftOut, ThresholdDecision

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
    value: float  # the nearest float to `exact`, for display and the tests' rates
    tasks: str = "*"
    exact: Fraction | None = field(default=None, compare=False, repr=False)  # the threshold as written, exactly

    def __post_init__(self):
        if self.exact is None:  # made from a float: the decimal its shortest repr writes (0.007 is 7/1000)
            object.__setattr__(self, "exact", Fraction(Decimal(repr(float(self.value)))))

    @classmethod
    def parse(cls, expr: str) -> Threshold:
        m = _EXPR.match(expr.strip())
        if m is None:
            raise GateError(f"--fail-on {expr!r}: expected [TASKGLOB:]METRIC>VALUE or [TASKGLOB:]METRIC<VALUE, "
                            f"e.g. 'nfr>0.02' or 'mmlu_*:btc<0.95'")
        metric = m["metric"]
        if metric not in METRICS:
            near = [metric.lower()] if metric.lower() in METRICS else difflib.get_close_matches(metric.lower(), names(),
                                                                                               n=3, cutoff=0.4)
            raise GateError(f"--fail-on {expr!r}: unknown metric {metric!r}; "
                            + (f"did you mean {', '.join(near)}? (all: {', '.join(names())})" if near
                               else f"known: {', '.join(names())}"))
        text = m["value"]
        percent = text.endswith("%")
        try:  # the decimal as written, exactly: `0.7%` is 7/1000, where 0.7 / 100 in floats is below it
            exact = Fraction(Decimal(text[:-1] if percent else text))
        except (InvalidOperation, ValueError, OverflowError):  # not a number, NaN or infinite
            raise GateError(f"--fail-on {expr!r}: the threshold {text!r} is not a finite number") from None
        if percent:
            if not in_rate_units(metric):
                raise GateError(f"--fail-on {expr!r}: {metric} is not a rate; give its threshold without %")
            exact /= 100
        try:
            value = float(exact)
        except OverflowError:
            value = math.inf
        if not math.isfinite(value):
            raise GateError(f"--fail-on {expr!r}: the threshold {text!r} is not a finite number")
        # in rate units (a fraction, or a difference of fractions), a threshold beyond ±1 is a unit slip
        if not percent and in_rate_units(metric) and abs(exact) >= 1:  # `1` is 1 % or 100 %: say which
            raise GateError(f"--fail-on {expr!r}: {metric} is a rate (the table prints it in %): write " + (
                f"{text}% or {value * 100:g}% (1 alone could mean either)" if abs(exact) == 1 else
                f"{text}% or {value / 100:g}"))
        low = METRICS[metric].low  # a rate lies in [0, 1]; a difference of rates in [−1, 1]
        if in_rate_units(metric) and not low <= exact <= 1:
            raise GateError(f"--fail-on {expr!r}: {metric} lies between {100 * low:g}% and 100%; a threshold of "
                            f"{100 * value:g}% would decide nothing")
        return cls(expr=expr, metric=metric, op=m["op"], value=value, tasks=(m["tasks"] or "*").strip(), exact=exact)


def _check(t: Threshold, entries: list[Mapping], significance: float | None) -> None:
    """Refuse a threshold that cannot be applied to the matched entries (GateError, exit status 2)."""
    kinds = {evidence_of(e).kind for e in entries}
    is_replicated = Evidence.REPLICATES in kinds
    if t.metric == "excess_nfr" and not is_replicated:
        raise GateError(f"--fail-on {t.expr!r}: excess_nfr needs replicate runs on a side (OLD or NEW as "
                        f"RUN1,RUN2,...): with one run each, nothing measures the noise floor of reruns")
    if significance is not None:
        evidence = REPLICATES if is_replicated else ONE_RUN
        testable = names(lambda m: evidence in m.tests)
        if t.metric not in testable:
            raise GateError(f"--fail-on {t.expr!r}: {t.metric} has no significance test"
                            + (" over replicate runs" if is_replicated else "")
                            + f"; use one of {', '.join(testable)}, or gate it with --significance off")
        for kind in sorted(kinds & {Evidence.ANYTIME, Evidence.GROUP}):  # evaluated until decided: its design's tests
            tested_here = names(lambda m, kind=kind: kind in m.tests)
            if t.metric not in tested_here:
                raise GateError(f"--fail-on {t.expr!r}: {t.metric} has no {kind} test on a run evaluated until "
                                f"decided; use one of {', '.join(tested_here)}")
    if not any(value(e, t.metric) is not None or t.metric in e or (t.metric == "acc_drop" and "old_acc" in e)
               for e in entries):
        raise GateError(f"--fail-on {t.expr!r}: no matched task reports {t.metric} (excess_nfr needs replicate "
                        f"runs: OLD or NEW as run1,run2; a generation task needs --similarity for smooth_*; "
                        f"inconsistency_flips needs predictions; delta_* needs --compatible)")


def _across(report: Comparison, t: Threshold, significance: float | None) -> list[ThresholdDecision]:
    """`overall:acc_drop>VALUE`: one decision per candidate, the tasks' accuracy tests combined (`decide_across`)."""
    if t.metric != "acc_drop":
        raise GateError(f"--fail-on {t.expr!r}: across tasks only acc_drop is combined (Kübler et al.'s pooled, "
                        f"max-drop and Fisher tests); gate {t.metric} per task, e.g. '{t.metric}{t.op}...'")
    across = report.across_tasks
    if not across:
        raise GateError(f"--fail-on {t.expr!r}: no task with a 0/1 metric to combine")
    return [decide_across(ACROSS if len(across) == 1 else f"{ACROSS} [{label}]", a["tasks"],
                          [report.tasks[k] for k in a["tasks"]], a["pooled"], t, significance)
            for label, a in across.items()]


def check_gate(report: Comparison | Mapping, thresholds: list[Threshold], significance: float | None = None) -> Gate:
    """Decide every (task, threshold) of a `compare_runs` report (module docstring; a mapping shaped as `report.json`
    is read as one, `Comparison.of`): the `Gate`, its decisions and what was left out of them. Raises `GateError`
    when an expression matches no task, names a metric that no matched task reports, or has no test although
    `significance` is given.
    """
    if significance is not None and not 0 < significance < 1:
        raise GateError(f"--significance {significance}: must be in (0, 1), e.g. 0.05")
    report = Comparison.of(report)
    decisions, left_out = [], []
    churn = {name for name, e in report.tasks.items() if is_churn(e) and not report.include_churn}
    for t in thresholds:
        if t.tasks == ACROSS:
            decisions += _across(report, t, significance)
            continue
        tasks = [name for name in report.tasks if fnmatch.fnmatchcase(name, t.tasks)]
        if not tasks:
            raise GateError(f"--fail-on {t.expr!r}: no task matches {t.tasks!r}; tasks: {', '.join(report.tasks)}")
        entries = [report.tasks[name] for name in tasks]
        _check(t, entries, significance)
        for name, entry in zip(tasks, entries):
            if name in churn and about_flips(t.metric):
                left_out.append(LeftOut.churn(name, t.expr))
            elif value(entry, t.metric) is None:
                left_out.append(LeftOut.undefined(name, t.expr, t.metric))
            else:
                decisions.append(decide_threshold(name, entry, t, significance))
    return Gate(significance=significance, thresholds=[t.expr for t in thresholds], decisions=decisions,
                left_out=left_out, churn_left_out=sorted(churn))


def exit_status(gate: Gate | Mapping) -> int:
    """1: a breach the data support; 3: none, but a threshold left undecided (or nothing to decide); 0: all clear."""
    return OUTCOMES[Gate.of(gate).status].exit_code
