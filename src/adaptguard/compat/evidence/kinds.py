"""The kinds of evidence of a finished run: `OneRun` (exact tests on the item counts), `Replicates` (tests over runs
and items) and `Anytime` (the e-processes of a run evaluated until decided). Each answers the same questions of a
metric, and `decide` answers a threshold with them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction

from ..metric_table import REPLICATES, is_rate, tested
from ..stats.metrics import _EPS, binomial_p
from ..verdicts import Decision, Evidence, Reason, beyond
from .values import ITEMS_CAP, _run_level, as_fraction, counts, items_needed, rate_bounds, relation, value


def exact_threshold(t) -> Fraction:
    """A threshold's value exactly: the fraction `gate.Threshold` parsed from its text, else its float's decimal."""
    exact = getattr(t, "exact", None)
    return as_fraction(t.value) if exact is None else exact


class OneRun:
    """One run per side: the exact tests on the item counts."""

    kind = Evidence.ONE_RUN

    def __init__(self, entry: Mapping):
        self.entry = entry

    def decide(self, t, alpha: float | None) -> dict:
        """The threshold `t` (metric, op, value) decided on this evidence: the fields of its `ThresholdDecision` but
        the task's and the expression's — its `decision` and `reason`, `p_value` (of the breach test), `p_within` (of
        the clear test), `interval` and `level` (the decision's), `mde` / `items_needed` (how far the data reach,
        where undecided), `test`. With `alpha` None, the raw value compared (no test)."""
        side = relation(self.entry, t.metric, exact_threshold(t))
        base = {"metric": t.metric, "value": value(self.entry, t.metric)}
        if alpha is None:
            return {**base, "decision": Decision.BREACH if beyond(side, t.op) else Decision.CLEAR,
                    "reason": Reason.untested(side, t.op)}
        flip = "<" if t.op == ">" else ">"
        p, p_within = self.p(t.metric, t.value, t.op), self.p(t.metric, t.value, flip)
        if p < alpha:
            decision, reason = Decision.BREACH, Reason.SUPPORTED
        elif p_within < alpha:
            decision, reason = Decision.CLEAR, Reason.SHOWN_WITHIN
        else:
            decision, reason = Decision.UNDECIDED, Reason.undecided(side, t.op)
        undecided = decision is Decision.UNDECIDED
        return {**base, "decision": decision, "reason": reason, "p_value": p, "p_within": p_within,
                "test": self.test_name(t.metric, t.value), "interval": self.interval(t.metric, alpha),
                "level": 1 - 2 * alpha, "mde": self.mde(t.metric, alpha),
                "items_needed": self.items_needed(t.metric, exact_threshold(t), t.op, alpha) if undecided else None,
                "evidence": self.kind}

    def p(self, metric: str, threshold: float, op: str) -> float:
        """p-value of H0 "metric ≤ threshold" against "metric > threshold" (`op` ">"), or of "≥" against "<"."""
        from ..stats.paired_drop import paired_drop_p

        e = self.entry
        if metric == "acc_drop":
            return paired_drop_p(e["n_negative_flips"], e["n_positive_flips"], e["n"], threshold,
                                 "greater" if op == ">" else "less")
        k, n = counts(e, metric)
        return binomial_p(k, n, threshold, op == ">")

    def interval(self, metric: str, alpha: float) -> tuple[float, float] | None:
        """Clopper–Pearson's one-sided bounds of a rate; None for `acc_drop` (its test has no closed-form inverse:
        the decision shows p-values) and for metrics without a test."""
        if not is_rate(metric):
            return None
        k, n = counts(self.entry, metric)
        return rate_bounds(k, n, alpha) if n else None

    def mde(self, metric: str, alpha: float, power: float = 0.8) -> float | None:
        """`acc_drop`'s smallest true drop from 0 its one-sided test at `alpha` detects with `power`, from the spread
        of the per-item differences, (z_{1−α} + z_power) · sd / √n (the paired normal test); None for rates
        (`items_needed` plans those) and where no item changed (nothing to plan from: undefined, not 0)."""
        from scipy.stats import norm

        if metric != "acc_drop":
            return None
        e = self.entry
        n, d = e["n"], e["old_acc"] - e["new_acc"]
        var = max(0.0, (e["n_negative_flips"] + e["n_positive_flips"]) / n - d * d) / n
        return float((norm.ppf(1 - alpha) + norm.ppf(power)) * math.sqrt(var)) if var > 0 else None

    def items_needed(self, metric: str, threshold, op: str, alpha: float, cap: int = ITEMS_CAP) -> int | None:
        return items_needed(self.entry, metric, threshold, op, alpha, cap)

    def test_name(self, metric: str, threshold: float = 0.0) -> str:
        if metric == "acc_drop":
            return "exact one-sided McNemar" if threshold == 0 else "exact unconditional score test against the margin"
        return "exact one-sided binomial on the item counts"


class Replicates(OneRun):
    """Replicate runs on a side: a t-test over runs and items, never claiming more than the item-level exact test."""

    kind = Evidence.REPLICATES

    def p(self, metric: str, threshold: float, op: str) -> float:
        from ..stats.replicates import t_sf

        greater = op == ">"
        estimate, se, df = _run_level(self.entry, metric)
        z = estimate - threshold if greater else threshold - estimate
        if se > 0:
            p_runs = t_sf(z / se, df)
        else:  # no spread: H0 holds exactly when the value is not beyond the threshold (compared exactly)
            rel = relation(self.entry, metric, threshold)
            p_runs = float(rel <= 0 if greater else rel >= 0)
        return max(p_runs, self._item_level_p(metric, threshold, greater))

    def _item_level_p(self, metric: str, threshold: float, greater: bool) -> float:
        """The item-level exact test: the per-item means over run pairs, summed, as one run's counts (rounded toward
        H0), the noise floor taken as known for `excess_nfr`. Identical reruns give exactly one run's exact test."""
        from ..stats.paired_drop import paired_drop_p

        r, n = self.entry["replicates"], self.entry["n"]
        b, c = r["nfr"] * n, r["pfr"] * n
        if metric == "acc_drop":
            b, c = (math.floor(b + _EPS), math.ceil(c - _EPS)) if greater else \
                (math.ceil(b - _EPS), math.floor(c + _EPS))
            return paired_drop_p(b, min(c, n - b), n, threshold, "greater" if greater else "less")
        shift = r["noise_floor"] if metric == "excess_nfr" else 0.0
        return binomial_p(b, n, threshold + shift, greater)

    def interval(self, metric: str, alpha: float) -> tuple[float, float] | None:
        """The t interval over runs, never narrower than the items' exact one; None for `acc_drop` and metrics with
        no run-level test."""
        from ..stats.replicates import t_quantile

        if not tested(metric, REPLICATES) or metric == "acc_drop":
            return None
        estimate, se, df = _run_level(self.entry, metric)
        half = t_quantile(1 - alpha, df) * se
        r, n = self.entry["replicates"], self.entry["n"]
        lo, hi = rate_bounds(r["nfr"] * n, n, alpha)
        shift = r["noise_floor"] if metric == "excess_nfr" else 0.0
        # cut to the metric's range: an NFR lies in [0, 1], the excess NFR (a difference of rates) in [−1, 1]
        low = -1.0 if metric == "excess_nfr" else 0.0
        return max(low, min(estimate - half, lo - shift)), min(1.0, max(estimate + half, hi - shift))

    def mde(self, metric: str, alpha: float, power: float = 0.8) -> float | None:
        """From the run-level standard error (None where no spread was seen)."""
        from ..stats.replicates import min_detectable_effect

        if not tested(metric, REPLICATES):
            return None
        _, se, df = _run_level(self.entry, metric)
        return min_detectable_effect(se, df, 2 * alpha, power) if se > 0 else None  # two-sided at 2α = one-sided α

    def items_needed(self, metric: str, threshold, op: str, alpha: float, cap: int = ITEMS_CAP) -> None:
        return None

    def test_name(self, metric: str, threshold: float = 0.0) -> str:
        return "one-sided t-test over runs and items, and the item-level exact test"


class Anytime(OneRun):
    """Evaluated until decided: the anytime-valid e-processes (`anytime`), valid at every look."""

    kind = Evidence.ANYTIME

    def p(self, metric: str, threshold: float, op: str) -> float:
        from ..stats.anytime import anytime_p

        return anytime_p(self.entry, metric, threshold, op)

    def interval(self, metric: str, alpha: float) -> tuple[float, float] | None:
        from ..stats.anytime import anytime_bounds

        return anytime_bounds(self.entry, metric, alpha)

    def items_needed(self, metric: str, threshold, op: str, alpha: float, cap: int = ITEMS_CAP) -> None:
        return None

    def test_name(self, metric: str, threshold: float = 0.0) -> str:
        s = self.entry["sequential"]
        bet = " (aGRAPA bet)" if s.get("bet") == "agrapa" else ""
        k = len(s["looks"])
        return (f"anytime-valid betting e-process{bet}" if metric == "acc_drop" else
                "anytime-valid beta-binomial mixture e-process") + f" over {k} " + ("look" if k == 1 else "looks")
