"""The kinds of evidence behind a task's entry, as types: `OneRun` (one run per side: exact tests on the item
counts), `Replicates` (replicate runs on a side: tests over runs and items), `Anytime` (evaluated until decided:
e-processes valid at every look) and `GroupSequential` (evaluated over the known pool: group-sequential boundaries).
Each answers the same questions of a metric — the p-value of "beyond θ" (`p`), the interval a decision uses, the
minimum detectable effect, the items a one-run rate would need, the test's name — so `decide` asks them without
knowing which kind it holds. `evidence_of` picks the kind once per entry (`TaskComparison.evidence`).

Each metric has one one-sided test per kind, so the same test says whether a threshold is breached (the data support
"metric > θ") or clear (they support "metric < θ"):

- one run per side: rates of items (`nfr`, `pfr`, `btc`, the accuracies, ...: `metric_table`) by the exact binomial
  test on the item counts; `acc_drop` (= old_acc − new_acc) by the exact McNemar test against 0 and the exact
  unconditional score test against a margin (`metrics.paired_drop_p`); sizes ≤ α at every n (docs/compat.md);
- replicate runs on a side: `nfr`, `excess_nfr` (NFR beyond the noise floor of reruns) and `acc_drop` by a t-test on
  the run-level standard error (runs and items, `replicates.replicate_flips`), and never more than the item-level
  exact test on the same items claims (the per-item means over run pairs, counted toward the null): identical reruns
  are one run, not a standard error of 0; other rates have no run-level test.

The interval printed beside a decision is the one it uses: the one-sided bounds at 1 − α each (a two-sided 1 − 2α
interval), so a breach of "> θ" is exactly "the lower bound is above θ", and a clear "the upper bound is below θ".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal
from fractions import Fraction

from .metric_table import METRICS, REPLICATES, is_rate, strata, tested
from .stats.metrics import _EPS, binomial_p
from .verdicts import Evidence

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


class OneRun:
    """One run per side: the exact tests on the item counts."""

    kind = Evidence.ONE_RUN

    def __init__(self, entry: Mapping):
        self.entry = entry

    def p(self, metric: str, threshold: float, op: str) -> float:
        """p-value of H0 "metric ≤ threshold" against "metric > threshold" (`op` ">"), or of "≥" against "<"."""
        from .stats.metrics import paired_drop_p

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
        from .stats.replicates import t_sf

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
        from .stats.metrics import paired_drop_p

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
        from .stats.replicates import t_quantile

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
        from .stats.replicates import min_detectable_effect

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
        from .stats.anytime import anytime_p

        return anytime_p(self.entry, metric, threshold, op)

    def interval(self, metric: str, alpha: float) -> tuple[float, float] | None:
        from .stats.anytime import anytime_bounds

        return anytime_bounds(self.entry, metric, alpha)

    def items_needed(self, metric: str, threshold, op: str, alpha: float, cap: int = ITEMS_CAP) -> None:
        return None

    def test_name(self, metric: str, threshold: float = 0.0) -> str:
        s = self.entry["sequential"]
        bet = " (aGRAPA bet)" if s.get("bet") == "agrapa" else ""
        k = len(s["looks"])
        return (f"anytime-valid betting e-process{bet}" if metric == "acc_drop" else
                "anytime-valid beta-binomial mixture e-process") + f" over {k} " + ("look" if k == 1 else "looks")


class GroupSequential(OneRun):
    """Evaluated over the known pool (`group_sequential`): its thresholds are decided where the run stopped
    (`decide.group_stop`); outside them (the regression flag, the tests across tasks) the fixed-n test on all N items
    once the strata the metric needs are done, else no claim (p = 1)."""

    kind = Evidence.GROUP

    def p(self, metric: str, threshold: float, op: str) -> float:
        from .stats.group_sequential import full_entry, group_looks

        s = self.entry["sequential"]
        looks = group_looks(self.entry)
        if not looks:
            return 1.0
        last = looks[-1]
        if any(last["n_" + x.lower()] < s["strata"][x] for x in strata(metric)):
            return 1.0
        return OneRun(full_entry(self.entry, last)).p(metric, threshold, op)

    def interval(self, metric: str, alpha: float) -> None:
        return None

    def mde(self, metric: str, alpha: float, power: float = 0.8) -> None:
        return None

    def items_needed(self, metric: str, threshold, op: str, alpha: float, cap: int = ITEMS_CAP) -> None:
        return None

    def test_name(self, metric: str, threshold: float = 0.0) -> str:
        s = self.entry["sequential"]
        kind = ("exact binomial boundaries" if strata(metric) in ("R", "W") else
                "score boundaries, O'Brien–Fleming α/5")
        k = len(s["looks"])
        return (f"group-sequential over the {s['items']} items ({kind} at {k} {'look' if k == 1 else 'looks'}; at the "
                "last, compare's fixed-n test)")


def evidence_of(entry: Mapping) -> OneRun:
    """The kind of evidence `entry` holds, as its type."""
    if "sequential" in entry:
        return GroupSequential(entry) if entry["sequential"].get("design") == "group" else Anytime(entry)
    return Replicates(entry) if replicated(entry) else OneRun(entry)


def p_beyond(entry: Mapping, metric: str, threshold: float, op: str) -> float:
    """p-value of H0 "metric ≤ threshold" against "metric > threshold" (`op` ">"), or of "≥" against "<" (`op` "<"),
    by the test of the entry's kind of evidence (module docstring)."""
    return evidence_of(entry).p(metric, threshold, op)


def interval(entry: Mapping, metric: str, alpha: float) -> tuple[float, float] | None:
    """The interval a decision on `metric` uses (module docstring): its lower end above θ is a breach of "> θ", its
    upper end below θ a clear."""
    return evidence_of(entry).interval(metric, alpha)


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
