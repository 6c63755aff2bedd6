"""An entry's values as a decision compares them: the value of a metric (`value`), exactly where it has counts
(`exact_value`, `relation`), its counts (`counts`), the one-sided Clopper–Pearson bounds (`rate_bounds`), the run-level
statistics of replicates, and the items a one-run rate would need to decide (`items_needed`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal
from fractions import Fraction

from ..metric_table import METRICS, REPLICATES, is_rate, tested
from ..stats.metrics import _EPS, binomial_p

ITEMS_CAP = 10_000_000  # items_needed plans up to this many items


def replicated(entry: Mapping) -> bool:
    return not (entry.get("replicates") or {"runs_fixed": True})["runs_fixed"]


def value(entry: Mapping, metric: str) -> float | None:
    """The entry's value of `metric` (None where it is not defined on the task)."""
    if metric == "excess_nfr":
        return (entry.get("replicates") or {}).get("excess_nfr")
    if metric == "acc_drop":
        old, new = entry.get("old_acc"), entry.get("new_acc")
        return None if old is None or new is None else old - new
    v = entry.get(metric)
    return None if v is None or not math.isfinite(v) else float(v)


def as_fraction(threshold) -> Fraction:
    """A threshold exactly: a Fraction as it is, a float as the decimal its shortest repr writes (0.007 is 7/1000, the
    number `nfr>0.7%` means; `gate.Threshold` keeps the one parsed from the text)."""
    if isinstance(threshold, Fraction):
        return threshold
    return Fraction(Decimal(repr(float(threshold))))


def _whole(x: float, denominator: int) -> Fraction | None:
    """x as k / `denominator` when x·denominator is a whole number to within float rounding, else None."""
    scaled = float(x) * denominator
    k = round(scaled)
    return Fraction(int(k), int(denominator)) if abs(scaled - k) <= 1e-6 else None


def exact_value(entry: Mapping, metric: str) -> Fraction | None:
    """The metric's value as the exact fraction of the counts behind it, or None where it has none (`m_g`, the
    Δ-metrics, ...). One run: k / n (`btc`: over the items the old model got right; `acc_drop`: (b − c) / n from the
    flip counts). Replicates: the per-item means over run pairs are not whole counts, but the sums behind them are
    whole over R_o · R_n run pairs (the noise floor over W = R_o (R_o − 1) + R_n (R_n − 1) pairs of distinct runs), so
    the value is a whole number over n · R_o · R_n · W."""
    v = _observed(entry, metric)
    n = entry.get("n")
    if v is None or not n or metric not in METRICS or not METRICS[metric].counted:
        return None
    if replicated(entry):
        r = entry["replicates"]
        r_o, r_n = r["runs"]
        if metric == "acc_drop":  # old_acc and new_acc are means over each side's runs and the items
            old, new = _whole(r["old_acc"], n * r_o), _whole(r["new_acc"], n * r_n)
            return None if old is None or new is None else old - new
        return _whole(v, n * r_o * r_n * max(1, r_o * (r_o - 1) + r_n * (r_n - 1)))
    if metric == "acc_drop":
        b, c = (_whole(entry[f"n_{kind}_flips"], 1) for kind in ("negative", "positive"))
        return None if b is None or c is None else (b - c) / n
    if METRICS[metric].counts is not None:  # counted otherwise than its value times n (btc: over the old-right)
        k, m = counts(entry, metric)
        k = _whole(k, 1)
        return None if k is None or not m else k / m
    return _whole(v, n)


def relation(entry: Mapping, metric: str, threshold) -> int:
    """The sign of value − threshold, exactly (`exact_value` against `as_fraction(threshold)`): 1 above, 0 at, −1
    below. A value at its threshold is neither beyond nor within it. Metrics without counts compare as floats."""
    exact = exact_value(entry, metric)
    if exact is not None:
        theta = as_fraction(threshold)
        return (exact > theta) - (exact < theta)
    v, theta = _observed(entry, metric), float(threshold)
    return (v > theta) - (v < theta)


def _observed(entry: Mapping, metric: str) -> float | None:
    """The value a decision compares: with replicates, the run-level estimate its test is about."""
    if replicated(entry) and tested(metric, REPLICATES):
        return _run_level(entry, metric)[0]
    return value(entry, metric)


def counts(entry: Mapping, metric: str) -> tuple[float, int]:
    """(successes, trials) behind a rate metric; with replicates the successes are a sum of per-item means over run
    pairs (not always whole). Where they come from is the metric's row (`metric_table`)."""
    return METRICS[metric].count(entry)


def rate_bounds(k: float, n: int, alpha: float) -> tuple[float, float]:
    """The one-sided Clopper–Pearson bounds at 1 − α each (the exact binomial test inverted): "rate > θ" is
    supported at α exactly when the lower bound exceeds θ, "rate < θ" when the upper bound is below it. At one
    success the test is `binomial_p`'s (the whole rate on one item), so the lower bound is α/n."""
    from scipy.stats import beta

    lo_k, hi_k = math.floor(k + _EPS), math.ceil(k - _EPS)
    lo = 0.0 if lo_k <= 0 else alpha / n if lo_k == 1 else float(beta.ppf(alpha, lo_k, n - lo_k + 1))
    hi = 1.0 if hi_k >= n else float(beta.isf(alpha, hi_k + 1, n - hi_k))
    return lo, hi


def _run_level(entry: Mapping, metric: str) -> tuple[float, float, float]:
    """(estimate, standard error, degrees of freedom) of a metric tested over runs and items."""
    r = entry["replicates"]
    return {"nfr": (r["nfr"], r["nfr_se"], r["nfr_df"]), "excess_nfr": (r["excess_nfr"], r["se"], r["df"]),
            "acc_drop": (-r["acc_diff"], r["acc_diff_se"], r["acc_diff_df"])}[metric]


def items_needed(entry: Mapping, metric: str, threshold: float, op: str, alpha: float, cap: int = ITEMS_CAP
                 ) -> int | None:
    """For an undecided rate of one run: how many items, at the rate observed, its test needs to decide (either
    way); None when no number does (the rate equals the threshold, compared exactly), none up to `cap` does, or the
    metric is not a rate of one run."""
    if replicated(entry) or not is_rate(metric) or "sequential" in entry:
        return None
    k, n = counts(entry, metric)
    if n == 0:
        return None
    rate = k / n
    side = relation(entry, metric, threshold)
    if side == 0:
        return None
    threshold = float(threshold)
    greater = side > 0  # the side the data lean to decides: a breach of ">" or a clear of "<", and back

    def decided(m: int) -> bool:
        return binomial_p(rate * m, m, threshold, greater) < alpha

    lo, hi = n, n
    while not decided(hi):
        lo, hi = hi, hi * 2
        if hi > cap:
            return None
    while hi - lo > max(1, lo // 100):  # to 1 %: a plan, not a promise
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if decided(mid) else (mid, hi)
    return hi
