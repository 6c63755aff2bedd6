"""Every decision `compare` states, in one module: per (task, threshold) breach / clear / undecided, per task whether
its flips are churn and whether the data support a regression, and across tasks Kübler et al.'s (2026) verdict. The
rendering (terminal, table, Markdown, page) only reads these decisions, so no sentence can say more than a test did.

Each metric has one one-sided test, so the same test says whether a threshold is breached (the data support
"metric > θ") or clear (they support "metric < θ"):

- one run per side: rates of items (`nfr`, `pfr`, `inconsistency_flips`, `old_acc`, `new_acc`, `smooth_nfr`,
  `smooth_pfr`) and `btc` (a rate over the items the old model got right): the exact binomial test on the item
  counts; `acc_drop` (= old_acc − new_acc): the exact McNemar test against 0, the exact unconditional score test
  against a margin (`metrics.paired_drop_p`); sizes ≤ α at every n (docs/compat.md's tables, by enumeration);
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

from .metric_table import METRICS, REPLICATES, is_rate, tested
from .metrics import _EPS, binomial_p  # noqa: F401  (binomial_p: the fixed-n rate test, used here and by callers)
from .verdicts import Across, Decision, Evidence, Reason, ThresholdDecision, beyond

ACROSS_METHODS = ("pooled", "max_drop", "fisher")
DECISIONS = tuple(Decision)  # breach, undecided, clear: the one vocabulary of every output (`verdicts`)


def evidence_kind(entry: Mapping) -> Evidence:
    """The kind of evidence an entry holds (`verdicts.Evidence`)."""
    if "sequential" in entry:
        return Evidence.GROUP if entry["sequential"].get("design") == "group" else Evidence.ANYTIME
    return Evidence.REPLICATES if replicated(entry) else Evidence.ONE_RUN


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
    if metric in ("nfr", "pfr", "btc"):
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
        r = entry["replicates"]
        return {"nfr": r["nfr"], "excess_nfr": r["excess_nfr"], "acc_drop": r["old_acc"] - r["new_acc"]}[metric]
    return value(entry, metric)


def counts(entry: Mapping, metric: str) -> tuple[float, int]:
    """(successes, trials) behind a rate metric; with replicates the successes are a sum of per-item means over run
    pairs (not always whole). Where they come from is the metric's row (`metric_table`)."""
    return METRICS[metric].counts(entry)


def rate_bounds(k: float, n: int, alpha: float) -> tuple[float, float]:
    """The one-sided Clopper–Pearson bounds at 1 − α each (the exact binomial test inverted): "rate > θ" is
    supported at α exactly when the lower bound exceeds θ, "rate < θ" when the upper bound is below it."""
    from scipy.stats import beta

    lo_k, hi_k = math.floor(k + _EPS), math.ceil(k - _EPS)
    lo = 0.0 if lo_k <= 0 else float(beta.ppf(alpha, lo_k, n - lo_k + 1))
    hi = 1.0 if hi_k >= n else float(beta.isf(alpha, hi_k + 1, n - hi_k))
    return lo, hi


def _run_level(entry: Mapping, metric: str) -> tuple[float, float, float]:
    """(estimate, standard error, degrees of freedom) of a metric tested over runs and items."""
    r = entry["replicates"]
    return {"nfr": (r["nfr"], r["nfr_se"], r["nfr_df"]), "excess_nfr": (r["excess_nfr"], r["se"], r["df"]),
            "acc_drop": (-r["acc_diff"], r["acc_diff_se"], r["acc_diff_df"])}[metric]


def _item_level_p(entry: Mapping, metric: str, threshold: float, greater: bool) -> float:
    """The item-level exact test of a replicated entry: its per-item means over run pairs, summed, as one run's
    counts (rounded toward H0), the noise floor taken as known for `excess_nfr`. Identical reruns give exactly one
    run's exact test."""
    from .metrics import paired_drop_p

    r, n = entry["replicates"], entry["n"]
    b, c = r["nfr"] * n, r["pfr"] * n
    if metric == "acc_drop":
        b, c = (math.floor(b + _EPS), math.ceil(c - _EPS)) if greater else (math.ceil(b - _EPS), math.floor(c + _EPS))
        return paired_drop_p(b, min(c, n - b), n, threshold, "greater" if greater else "less")
    shift = r["noise_floor"] if metric == "excess_nfr" else 0.0
    return binomial_p(b, n, threshold + shift, greater)


def p_beyond(entry: Mapping, metric: str, threshold: float, op: str) -> float:
    """p-value of H0 "metric ≤ threshold" against "metric > threshold" (`op` ">"), or of "≥" against "<" (`op` "<"),
    by the metric's test (module docstring)."""
    from .metrics import paired_drop_p
    from .replicates import t_sf

    greater = op == ">"
    if "sequential" in entry:  # evaluated until decided: valid at every look, not only at a fixed n
        if entry["sequential"].get("design") == "group":
            return _group_p(entry, metric, threshold, op)
        return anytime_p(entry, metric, threshold, op)
    if replicated(entry):
        estimate, se, df = _run_level(entry, metric)
        z = estimate - threshold if greater else threshold - estimate
        if se > 0:
            p_runs = t_sf(z / se, df)
        else:  # no spread: H0 holds exactly when the value is not beyond the threshold (compared exactly)
            rel = relation(entry, metric, threshold)
            p_runs = float(rel <= 0 if greater else rel >= 0)
        return max(p_runs, _item_level_p(entry, metric, threshold, greater))
    if metric == "acc_drop":
        return paired_drop_p(entry["n_negative_flips"], entry["n_positive_flips"], entry["n"], threshold,
                             "greater" if greater else "less")
    k, n = counts(entry, metric)
    return binomial_p(k, n, threshold, greater)


def interval(entry: Mapping, metric: str, alpha: float) -> tuple[float, float] | None:
    """The interval a decision on `metric` uses (module docstring): its lower end above θ is a breach of "> θ", its
    upper end below θ a clear. None for `acc_drop` of one run (its test has no closed-form inverse: the decision
    shows p-values) and for metrics without a test."""
    from .replicates import t_quantile

    if "sequential" in entry:
        return None if entry["sequential"].get("design") == "group" else anytime_bounds(entry, metric, alpha)
    if replicated(entry):
        if not tested(metric, REPLICATES) or metric == "acc_drop":
            return None
        estimate, se, df = _run_level(entry, metric)
        half = t_quantile(1 - alpha, df) * se
        r, n = entry["replicates"], entry["n"]
        lo, hi = rate_bounds(r["nfr"] * n, n, alpha)
        shift = r["noise_floor"] if metric == "excess_nfr" else 0.0
        # cut to the metric's range: an NFR lies in [0, 1], the excess NFR (a difference of rates) in [−1, 1]
        low = -1.0 if metric == "excess_nfr" else 0.0
        return max(low, min(estimate - half, lo - shift)), min(1.0, max(estimate + half, hi - shift))
    if not is_rate(metric):
        return None
    k, n = counts(entry, metric)
    return rate_bounds(k, n, alpha) if n else None


ITEMS_CAP = 10_000_000  # items_needed plans up to this many items


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


def mde(entry: Mapping, metric: str, alpha: float, power: float = 0.8) -> float | None:
    """The smallest true change from none (0) that the metric's one-sided test at `alpha` detects with `power`: from
    the run-level standard error with replicates, and for a single run's `acc_drop` from the spread of the per-item
    differences, (z_{1−α} + z_power) · sd / √n (the paired normal test). None for rates of one run (`items_needed`
    plans those) and where no spread was seen (no item changed: nothing to plan from, the MDE is undefined, not 0)."""
    from scipy.stats import norm

    from .replicates import min_detectable_effect

    if replicated(entry) and tested(metric, REPLICATES):
        _, se, df = _run_level(entry, metric)
        return min_detectable_effect(se, df, 2 * alpha, power) if se > 0 else None  # two-sided at 2α = one-sided α
    if metric == "acc_drop" and not replicated(entry):
        n, d = entry["n"], entry["old_acc"] - entry["new_acc"]
        var = max(0.0, (entry["n_negative_flips"] + entry["n_positive_flips"]) / n - d * d) / n
        return float((norm.ppf(1 - alpha) + norm.ppf(power)) * math.sqrt(var)) if var > 0 else None
    return None


def test_name(entry: Mapping, metric: str, threshold: float = 0.0) -> str:
    if "sequential" in entry:
        bet = " (aGRAPA bet)" if entry["sequential"].get("bet") == "agrapa" else ""
        return (f"anytime-valid betting e-process{bet}" if metric == "acc_drop" else
                "anytime-valid beta-binomial mixture e-process") + f" over {(k := len(entry['sequential']['looks']))} " \
            + ("look" if k == 1 else "looks")
    if replicated(entry):
        return "one-sided t-test over runs and items, and the item-level exact test"
    if metric == "acc_drop":
        return "exact one-sided McNemar" if threshold == 0 else "exact unconditional score test against the margin"
    return "exact one-sided binomial on the item counts"


def decide_threshold(name: str, entry: Mapping, t, alpha: float | None) -> ThresholdDecision:
    """One (task, threshold) decided (module docstring): its `decision` and `reason`, `p_value` (of the breach test),
    `p_within` (of the clear test), `interval` and `level` (the decision's), `mde` / `items_needed` (how far the data
    reach, where undecided), `test`. With `alpha` None, raw values compared (no test)."""
    if alpha is not None and (entry.get("sequential") or {}).get("design") == "group":
        return decide_group(name, entry, t, alpha)
    base = {"task": name, "expr": t.expr, "metric": t.metric, "op": t.op, "threshold": t.value,
            "value": value(entry, t.metric)}
    side = relation(entry, t.metric, _exact(t))
    if alpha is None:
        return ThresholdDecision(**base, decision=Decision.BREACH if beyond(side, t.op) else Decision.CLEAR,
                                 reason=Reason.untested(side, t.op))
    flip = "<" if t.op == ">" else ">"
    p, p_within = p_beyond(entry, t.metric, t.value, t.op), p_beyond(entry, t.metric, t.value, flip)
    decision, reason = _decided(p, p_within, alpha, side, t.op)
    undecided = decision is Decision.UNDECIDED
    return ThresholdDecision(**base, decision=decision, reason=reason, p_value=p, p_within=p_within,
                             evidence=evidence_kind(entry),
                             test=test_name(entry, t.metric, t.value), interval=interval(entry, t.metric, alpha),
                             level=1 - 2 * alpha, mde=mde(entry, t.metric, alpha),
                             items_needed=items_needed(entry, t.metric, _exact(t), t.op, alpha) if undecided else None)


def _decided(p: float, p_within: float, alpha: float, side: int, op: str) -> tuple[Decision, Reason]:
    """The decision of a threshold's two one-sided tests at α (the breach test first)."""
    if p < alpha:
        return Decision.BREACH, Reason.SUPPORTED
    if p_within < alpha:
        return Decision.CLEAR, Reason.SHOWN_WITHIN
    return Decision.UNDECIDED, Reason.undecided(side, op)


def _exact(t) -> Fraction:
    exact = getattr(t, "exact", None)
    return as_fraction(t.value) if exact is None else exact


# ------------------------------------------------------------------------------------------------- churn
def churn(old_correct: float, new_correct: float, negative_flips: float, n: int, chance: float, guess_rate: float,
          alpha: float) -> dict:
    """Are a multiple-choice task's flips churn (both models possibly guessing), to be left out of the flip metrics?
    Only when nothing shows otherwise: the old model not shown above `chance` (what answering without the ability
    scores: `replicates.chance_rate`), the new model not shown below `guess_rate` (a uniform guess, mean 1/#choices:
    no guessing scores less, so below it the new model avoids the right answers), and the right → wrong flips not
    shown above what two independent guessers make, chance · (1 − guess_rate). One-sided exact binomial tests at
    `alpha`; absence of evidence never hides a flip the data support."""
    p_old = binomial_p(old_correct, n, chance, greater=True)
    p_new = binomial_p(new_correct, n, guess_rate, greater=False)
    p_flips = binomial_p(negative_flips, n, chance * (1 - guess_rate), greater=True)
    return {"chance": chance, "guess_rate": guess_rate, "old_acc": old_correct / n, "new_acc": new_correct / n,
            "p_above_chance": p_old, "p_new_below_chance": p_new, "p_flips_beyond_guessing": p_flips,
            "churn": p_old >= alpha and p_new >= alpha and p_flips >= alpha}


def is_churn(entry: Mapping) -> bool:
    return bool((entry.get("churn") or {}).get("churn"))


# -------------------------------------------------------------------------------------- regressions, per task
def regression_p(entry: Mapping) -> float:
    """The per-task test of "a regression" with no threshold given: one run per side, the accuracy drop above 0
    (exact McNemar); with replicates, the excess NFR above 0 (runs and items, and the item-level exact test)."""
    return p_beyond(entry, "excess_nfr" if replicated(entry) else "acc_drop", 0.0, ">")


def flag_regressions(tasks: Mapping[str, Mapping], alpha: float, include_churn: bool) -> dict[str, dict]:
    """Benjamini–Hochberg over the tasks' regression tests (`regression_p`; churn tasks left out unless
    `include_churn`): per tested task, its `regression` = {tested, p, p_bh, flagged}."""
    from .replicates import benjamini_hochberg

    names = [k for k, e in tasks.items() if "replicates" in e and (include_churn or not is_churn(e))]
    ps = [regression_p(tasks[k]) for k in names]
    flagged, adjusted = benjamini_hochberg(ps, alpha)
    return {name: {"tested": "excess_nfr" if replicated(tasks[name]) else "acc_drop", "p": p, "p_bh": p_adj,
                   "flagged": bool(f)} for name, f, p, p_adj in zip(names, flagged, ps, adjusted)}


# ---------------------------------------------------------------------------------------------- across tasks
def pooled_entry(olds, news) -> dict:
    """One entry for the items of several tasks pooled (the tasks' (runs, items) answers side by side), for the
    pooled test across tasks: counts with one run per side, the run-level statistics with replicates."""
    import numpy as np

    from .metrics import flip_metrics
    from .replicates import replicate_flips

    o, n = np.concatenate(olds, 1), np.concatenate(news, 1)
    if len(o) == 1 and len(n) == 1:
        return flip_metrics(o[0], n[0], interval="exact")  # Clopper–Pearson, as every per-task entry of compare
    rep = replicate_flips(o, n)
    return {"n": o.shape[1], "old_acc": rep["old_acc"], "new_acc": rep["new_acc"], "nfr": rep["nfr"],
            "pfr": rep["pfr"], "replicates": rep}


def across_tasks(entries: list[Mapping], pooled: dict, margin: float = 0.0, op: str = ">") -> dict[str, float]:
    """Kübler et al.'s three tests of "the new model is worse by more than `margin`" across K tasks, each a p-value:
    `pooled` (every item of every task in one test), `max_drop` and `fisher` (the tasks' one-sided p-values combined,
    `metrics.combined_drop_p`). A verdict splits α across the three (Bonferroni, α/3 each)."""
    from .metrics import combined_drop_p

    per_task = [p_beyond(e, "acc_drop", margin, op) for e in entries]
    return {"pooled": p_beyond(pooled, "acc_drop", margin, op), **combined_drop_p(per_task)}


def decide_across(name: str, names: list[str], entries: list[Mapping], pooled: dict, t, alpha: float | None
                  ) -> ThresholdDecision:
    """`overall:acc_drop>θ` (or `<θ`) decided across tasks, stating exactly what its test shows: a breach of the
    pooled drop (the pooled test at α/3), or — named as such, with the task — "some task dropped more than θ" (the
    max-drop or Fisher test at α/3; the task is the one with the smallest p); clear when the pooled test shows the
    pooled drop within θ at α and neither other test rejects; else undecided."""
    base = {"task": name, "expr": t.expr, "metric": t.metric, "op": t.op, "threshold": t.value,
            "value": pooled["old_acc"] - pooled["new_acc"]}
    side = relation(pooled, "acc_drop", _exact(t))  # the pooled drop against θ, exactly
    if alpha is None:
        return ThresholdDecision(**base, decision=Decision.BREACH if beyond(side, t.op) else Decision.CLEAR,
                                 reason=Reason.untested(side, t.op), across=Across("pooled"))
    if all("sequential" in e for e in entries):
        return _across_sequential(base, names, entries, t, alpha, side)
    split = alpha / len(ACROSS_METHODS)
    towards = across_tasks(entries, pooled, t.value, t.op)
    within = p_beyond(pooled, "acc_drop", t.value, "<" if t.op == ">" else ">")
    per_task = [p_beyond(e, "acc_drop", t.value, t.op) for e in entries]
    worst = min(range(len(entries)), key=per_task.__getitem__)
    tested = {**base, "p_value": min(1.0, len(ACROSS_METHODS) * min(towards.values())), "p_within": within,
              "test": f"pooled, max-drop and Fisher tests, each at α/3 = {split:.3g}"}
    if towards["pooled"] < split:
        return ThresholdDecision(**tested, decision=Decision.BREACH, reason=Reason.SUPPORTED,
                                 across=Across("pooled", p_methods=towards))
    if min(towards["max_drop"], towards["fisher"]) < split:
        e = entries[worst]
        return ThresholdDecision(**{**tested, "value": e["old_acc"] - e["new_acc"]}, decision=Decision.BREACH,
                                 reason=Reason.SOME_TASK, across=Across("some_task", names[worst], towards))
    if within < alpha:
        return ThresholdDecision(**tested, decision=Decision.CLEAR, reason=Reason.SHOWN_WITHIN,
                                 across=Across("pooled", p_methods=towards))
    return ThresholdDecision(**tested, decision=Decision.UNDECIDED, reason=Reason.undecided(side, t.op),
                             mde=mde(pooled, "acc_drop", alpha), across=Across("pooled", p_methods=towards))


def _across_sequential(base: dict, names: list[str], entries: list[Mapping], t, alpha: float, side: int
                       ) -> ThresholdDecision:
    """`overall:acc_drop>θ` evaluated until decided: a breach ("some task dropped more than θ") when the product of
    the tasks' betting e-processes (independent tasks: a product is an e-process) reaches 1/α at some round of looks
    (a stopped task's wealth held); clear when every task's drop is shown below θ at α/K (then so is the pooled
    drop); else undecided."""
    import numpy as np

    towards = [anytime_e_values(e, "acc_drop", t.value, t.op) for e in entries]
    rounds = max(len(w) for w in towards)
    product = [float(np.prod([w[min(r, len(w) - 1)] if w else 1.0 for w in towards])) for r in range(rounds)]
    p = min(1.0, 1 / max(product, default=1.0))
    within = [anytime_p(e, "acc_drop", t.value, "<" if t.op == ">" else ">") for e in entries]
    worst = int(np.argmax([w[-1] if w else 1.0 for w in towards]))
    tested = {**base, "p_value": p, "p_within": min(1.0, len(entries) * max(within)),
              "test": f"anytime-valid betting e-processes, their product across {len(entries)} tasks"}
    if p < alpha:
        e = entries[worst]
        return ThresholdDecision(**{**tested, "value": e["old_acc"] - e["new_acc"]}, decision=Decision.BREACH,
                                 reason=Reason.SOME_TASK, across=Across("some_task", names[worst]))
    if max(within) < alpha / len(entries):
        return ThresholdDecision(**tested, decision=Decision.CLEAR, reason=Reason.SHOWN_WITHIN,
                                 across=Across("pooled"))
    return ThresholdDecision(**tested, decision=Decision.UNDECIDED, reason=Reason.undecided(side, t.op),
                             across=Across("pooled"))


def across_verdict(names: list[str], entries: list[Mapping], pooled: dict, alpha: float) -> dict:
    """With no threshold: does the data support an accuracy drop across the tasks (any of the three tests at α/3)?"""
    p = across_tasks(entries, pooled)
    return {"p": p, "alpha_each": alpha / len(p), "regression": bool(min(p.values()) < alpha / len(p))}


# ------------------------------------------------------------------------- anytime-valid: evaluate until decided
# Tests valid at every look (peeking allowed): an e-process E_t, a nonnegative supermartingale of mean ≤ 1 under H0,
# rejects H0 the first time it reaches 1/α (Ville's inequality: P(sup_t E_t ≥ 1/α) ≤ α), so a run may stop as soon
# as it does. The anytime-valid p-value is min(1, 1 / max over the looks so far of E).


def rate_e_value(k: int, n: int, rate: float, greater: bool) -> float:
    """The beta-binomial mixture e-value of H0 "p ≤ `rate`" (`greater`) or "p ≥ `rate`" after k successes in n
    Bernoulli trials (Robbins' mixture martingale): ∫ L(p) π(dp) / L(rate), with π a Beta(1, b0) prior,
    b0 = max(1, (1 − rate)/rate) (mean ≈ rate for small rates, so its mass sits at the threshold's scale instead of
    spreading to 1; uniform from rates of ½ up), restricted to the alternative ((rate, 1] or [0, rate)). For every p
    in H0 each factor's ratio has mean ≤ 1, so it is an e-process at every n; it depends on (k, n) only, not on the
    order."""
    from scipy.special import betaln
    from scipy.stats import beta

    if n == 0:
        return 1.0
    if greater and rate >= 1 or not greater and rate <= 0:
        return 1.0  # H0 holds whatever the data: nothing to reject
    if greater and rate <= 0:
        return math.inf if k > 0 else 1.0
    if not greater and rate >= 1:
        return math.inf if k < n else 1.0
    b0 = max(1.0, (1 - rate) / rate)  # the prior Beta(1, b0): mean ≈ rate for small rates, uniform from ½ up
    a, b = k + 1, n - k + b0
    if greater:
        tail, prior = beta.logsf(rate, a, b), beta.logsf(rate, 1, b0)
    else:
        tail, prior = beta.logcdf(rate, a, b), beta.logcdf(rate, 1, b0)
    log_e = betaln(a, b) + tail - betaln(1, b0) - prior - k * math.log(rate) - (n - k) * math.log1p(-rate)
    return math.exp(min(log_e, 700.0))


def drop_e_process(x, margin: float, greater: bool, bets: int = 24):
    """The betting e-process (Waudby-Smith & Ramdas 2024) of H0 "E[x] ≤ `margin`" (`greater`) or "≥" for paired
    accuracy changes x_i ∈ {−1, 0, 1} (1: right → wrong) in the order evaluated: the average, over a fixed grid of
    `bets` constant bets λ (geometric, up to 90 % of the bet that could empty the wealth), of the wealths
    Π_i (1 ± λ (x_i − margin)) — each a nonnegative martingale of mean ≤ 1 under H0, so their average is too (a
    mixture of bets: within a log factor of the best constant bet in hindsight, with no tuning on the data).
    Returns the wealth after each item, (n,)."""
    import numpy as np

    x = np.asarray(x, dtype=float)
    if margin >= 1 or margin <= -1:  # "drop > 1" never holds, "drop < 1" holds unless every item broke (and back)
        if greater == (margin >= 1):
            return np.ones(len(x))
        refuted = np.cumsum(x != (1.0 if margin >= 1 else -1.0)) > 0
        return np.where(refuted, np.inf, 1.0)
    sign = 1.0 if greater else -1.0
    reach = 1 / (1 + margin) if greater else 1 / (1 - margin)  # the bet that could empty the wealth
    lam = np.geomspace(1e-3, 0.9, bets) * reach
    log_wealth = np.cumsum(np.log1p(np.outer(sign * (x - margin), lam)), axis=0)  # (n, bets)
    top = log_wealth.max(1, keepdims=True)
    return np.exp(np.minimum(top[:, 0] + np.log(np.exp(log_wealth - top).mean(1)), 700.0))


def agrapa_e_process(x, margin: float, greater: bool):
    """The betting e-process of `drop_e_process` with one adaptive bet instead of the grid: aGRAPA (Waudby-Smith &
    Ramdas 2024, §B.2), λ_i = (μ̂ − m)/(σ̂² + (μ̂ − m)²) on the side tested, from the items before i only (a
    predictable bet: the wealth stays a nonnegative martingale of mean ≤ 1 under H0), cut to [0, 0.9 / (1 ± m)].
    Returns the wealth after each item, (n,)."""
    import numpy as np

    x = np.asarray(x, dtype=float)
    if abs(margin) >= 1:
        return drop_e_process(x, margin, greater)
    sign = 1.0 if greater else -1.0
    reach = 1 / (1 + margin) if greater else 1 / (1 - margin)
    t = np.arange(1, len(x) + 1)
    past = np.concatenate([[0.0], np.cumsum(x)[:-1]])
    past_sq = np.concatenate([[0.0], np.cumsum(x * x)[:-1]])
    mean = past / t  # the items before i, shrunk toward 0 by one pseudo-item
    var = np.maximum((0.25 + past_sq - (t - 1) * mean ** 2) / t, 1e-4)
    edge = sign * (mean - margin)
    lam = np.clip(edge / (var + edge ** 2), 0.0, 0.9 * reach)
    return np.exp(np.minimum(np.cumsum(np.log1p(lam * sign * (x - margin))), 700.0))


def _sequences(entry: Mapping, metric: str) -> tuple[list[int], list[int]]:
    """(successes, trials) of `metric` after each look of a sequential entry."""
    import numpy as np

    s = entry["sequential"]
    old, new = np.asarray(s["old"], bool), np.asarray(s["new"], bool)
    ks, ns = [], []
    for n in s["looks"]:
        o, w = old[:n], new[:n]
        k, m = {"nfr": ((o & ~w).sum(), n), "pfr": ((~o & w).sum(), n), "btc": ((o & w).sum(), o.sum()),
                "old_acc": (o.sum(), n), "new_acc": (w.sum(), n)}[metric]
        ks.append(int(k)), ns.append(int(m))
    return ks, ns


def anytime_e_values(entry: Mapping, metric: str, threshold: float, op: str) -> list[float]:
    """The e-value of "metric > θ" (`op` ">") or "< θ" at each look of a sequential entry (`entry["sequential"]`:
    the old and new answers in the order evaluated, and the number of items at each look)."""
    import numpy as np

    greater = op == ">"
    if metric == "acc_drop":
        s = entry["sequential"]
        x = np.asarray(s["old"], float) - np.asarray(s["new"], float)
        # runs made before the aGRAPA bet (their records name no bet) keep the grid of constant bets
        bet = agrapa_e_process if s.get("bet") == "agrapa" else drop_e_process
        wealth = bet(x, threshold, greater)
        return [float(wealth[n - 1]) if n else 1.0 for n in s["looks"]]
    return [rate_e_value(k, n, threshold, greater) for k, n in zip(*_sequences(entry, metric))]


def anytime_p(entry: Mapping, metric: str, threshold: float, op: str) -> float:
    """min(1, 1 / the largest e-value over the looks): valid at every look (Ville)."""
    return min(1.0, 1.0 / max(anytime_e_values(entry, metric, threshold, op), default=1.0))


def anytime_bounds(entry: Mapping, metric: str, alpha: float) -> tuple[float, float] | None:
    """The confidence sequence of a rate at the last look: the θ that no look's mixture e-value has rejected, each
    side at α ("> θ" is supported exactly when θ is below the lower end, "< θ" when above the upper end) — the
    interval the sequential decision uses. None for `acc_drop` (its bets depend on the margin)."""
    if metric == "acc_drop":
        return None
    lo, hi = 0.0, 1.0
    for k, n in zip(*_sequences(entry, metric)):
        if n == 0:
            continue
        for greater in (True, False):  # bisection on θ: the breach e-value falls as θ rises, the clear one rises
            a, b = (0.0, k / n) if greater else (k / n, 1.0)
            if (rate_e_value(k, n, a if greater else b, greater) < 1 / alpha):
                continue  # even the far end is not rejected
            for _ in range(50):
                mid = (a + b) / 2
                rejected = rate_e_value(k, n, mid, greater) >= 1 / alpha
                a, b = (mid, b) if rejected == greater else (a, mid)
            if greater:
                lo = max(lo, a)
            else:
                hi = min(hi, b)
    return lo, hi


# ---------------------------------------------------------------- group-sequential over the known pool (evaluate)
def _group_looks(entry: Mapping) -> list[dict]:
    """Per look of a group-sequential entry: items done (n), of them old-right (n_r) and old-wrong (n_w), the
    right → wrong flips among the first (b) and the wrong → right among the second (c)."""
    import numpy as np

    s = entry["sequential"]
    old, new = np.asarray(s["old"], bool), np.asarray(s["new"], bool)
    out = []
    for n in s["looks"]:
        o, w = old[:n], new[:n]
        out.append({"n": n, "n_r": int(o.sum()), "n_w": int(n - o.sum()), "b": int((o & ~w).sum()),
                    "c": int((~o & w).sum())})
    return out


def _rate_pool(metric: str, greater: bool, big_n: int, m_r: int, m_w: int, theta: float):
    """A rate threshold's side as a "count > θ′" test over one stratum: (stratum, count at a look, offset, items of
    the fixed-n test, θ′) — the fixed-n test rejects for offset + count of the stratum large (`group_sequential`)."""
    if metric == "nfr":
        return ("R", lambda x: x["b"], 0, big_n, theta) if greater else \
            ("R", lambda x: x["n_r"] - x["b"], big_n - m_r, big_n, 1 - theta)
    if metric == "pfr":
        return ("W", lambda x: x["c"], 0, big_n, theta) if greater else \
            ("W", lambda x: x["n_w"] - x["c"], big_n - m_w, big_n, 1 - theta)
    # btc: over the items the old model got right
    return ("R", lambda x: x["n_r"] - x["b"], 0, m_r, theta) if greater else ("R", lambda x: x["b"], 0, m_r, 1 - theta)


def _full_entry(entry: Mapping, last: dict) -> dict:
    """The fixed-n entry of all N items once the strata a metric needs are done: the items left out count what they
    must (no right → wrong flip among the old-wrong ones, no wrong → right among the old-right ones); the counts of a
    stratum not evaluated are None."""
    s = entry["sequential"]
    big_n, m_r, m_w = s["items"], s["strata"]["R"], s["strata"]["W"]
    b = last["b"] if last["n_r"] == m_r else None
    c = last["c"] if last["n_w"] == m_w else None
    new_acc = None if b is None or c is None else (m_r - b + c) / big_n
    return {"n": big_n, "old_acc": m_r / big_n, "new_acc": new_acc, "n_negative_flips": b, "n_positive_flips": c,
            "nfr": None if b is None else b / big_n, "pfr": None if c is None else c / big_n,
            "btc": None if b is None or not m_r else (m_r - b) / m_r}


def group_estimate(entry: Mapping, metric: str) -> float | None:
    """The metric over all N items as estimated at the last look (each stratum's rate so far times its known size;
    exact once the strata it needs are done); None where a stratum it needs has no item yet."""
    s = entry["sequential"]
    big_n, m_r, m_w = s["items"], s["strata"]["R"], s["strata"]["W"]
    x = _group_looks(entry)[-1] if s["looks"] else {"n": 0, "n_r": 0, "n_w": 0, "b": 0, "c": 0}
    flips = x["b"] / x["n_r"] * m_r if x["n_r"] else (0.0 if m_r == 0 else None)
    fixes = x["c"] / x["n_w"] * m_w if x["n_w"] else (0.0 if m_w == 0 else None)
    if metric == "old_acc":
        return m_r / big_n
    if metric in ("nfr", "btc"):
        return None if flips is None else (flips / big_n if metric == "nfr" else (1 - flips / m_r if m_r else None))
    if metric == "pfr":
        return None if fixes is None else fixes / big_n
    if flips is None or fixes is None:
        return None
    return (flips - fixes) / big_n if metric == "acc_drop" else (m_r - flips + fixes) / big_n


def _rate_side(entry: Mapping, metric: str, theta: float, greater: bool, alpha: float, looks: list[dict]):
    """The first look (index) at which the rate design's side crosses, its stagewise p there (else the smallest
    nominal p seen, never below α), and the stratum's looks."""
    from scipy.stats import binom

    from .group_sequential import final_cut, rate_boundaries, rate_size

    s = entry["sequential"]
    big_n, m_r, m_w = s["items"], s["strata"]["R"], s["strata"]["W"]
    stratum, count, offset, n_final, th = _rate_pool(metric, greater, big_n, m_r, m_w, theta)
    pool = m_r if stratum == "R" else m_w
    done = "n_r" if stratum == "R" else "n_w"
    seen, counts, where = [], [], []
    for i, x in enumerate(looks):  # the stratum's own looks: where it advanced
        if x[done] > (seen[-1] if seen else 0) and x[done] < pool:
            seen.append(x[done])
            counts.append(count(x))
            where.append(i)
    if not seen:
        return None, 1.0
    q0 = (th * n_final - offset) / pool
    cut = final_cut(offset, n_final, th, alpha, pool)
    bounds = rate_boundaries(seen, pool, q0, cut, alpha)
    for j, (k, b) in enumerate(zip(counts, bounds)):
        if k >= b:  # stagewise p: an earlier crossing, or this look's count or more
            before = rate_size(seen[:j], pool, q0, None, bounds[:j])
            return where[j], min(alpha, before + _first_passage_tail(seen[: j + 1], bounds[:j], q0, k))
    nominal = binom.sf(counts[-1] - 1, seen[-1], min(1.0, max(0.0, q0)))
    return None, max(alpha, float(nominal))


def _first_passage_tail(looks: list[int], bounds: list[float], q0: float, k: int) -> float:
    """P(no crossing at looks[:-1], count ≥ k at looks[-1]) for i.i.d. Bernoulli(q0) items."""
    import numpy as np
    from scipy.stats import binom

    dist, done = np.array([1.0]), 0
    for n, b in zip(looks[:-1], bounds):
        dist = np.convolve(dist, binom.pmf(np.arange(n - done + 1), n - done, min(1.0, max(0.0, q0))))[: n + 1]
        done = n
        if math.isfinite(b):
            dist[int(b):] = 0.0
    n = looks[-1]
    dist = np.convolve(dist, binom.pmf(np.arange(n - done + 1), n - done, min(1.0, max(0.0, q0))))[: n + 1]
    return float(dist[k:].sum())


def _score_side(entry: Mapping, metric: str, theta: float, greater: bool, alpha: float, looks: list[dict]):
    """The first early look at which the score test's side crosses its O'Brien–Fleming boundary (ε = α/5 spent),
    and the α spent by then (else the smallest nominal p seen, never below α)."""
    from scipy.stats import norm

    from .group_sequential import EARLY_SHARE, obf_spent, z_boundaries
    from .metrics import tango_z

    s = entry["sequential"]
    big_n, m_r, m_w = s["items"], s["strata"]["R"], s["strata"]["W"]
    where = [i for i, x in enumerate(looks) if 0 < x["n"] and (x["n_r"] < m_r or x["n_w"] < m_w)]
    early = [looks[i] for i in where]
    if not early:
        return None, 1.0
    eps = EARLY_SHARE * alpha
    times = tuple(x["n"] / big_n for x in early)
    bounds = z_boundaries(times, eps)
    zs = []
    for x in early:
        if metric == "acc_drop":
            z = float(tango_z(x["b"], x["c"], x["n"], theta))
        else:  # new_acc: the binomial score of the items so far
            k = x["n_r"] - x["b"] + x["c"]
            z = (k / x["n"] - theta) / math.sqrt(theta * (1 - theta) / x["n"]) if 0 < theta < 1 else 0.0
        zs.append((z if greater else -z) if math.isfinite(z) else 0.0)
    for j, (z, h) in enumerate(zip(zs, bounds)):
        if z >= h:
            return where[j], obf_spent(times[j], eps)
        if _certain(entry, metric, theta, greater, alpha, early[j]):
            return where[j], alpha
    return None, max(alpha, float(norm.sf(zs[-1])))


def _certain(entry: Mapping, metric: str, theta: float, greater: bool, alpha: float, x: dict) -> bool:
    """Deterministic curtailment: whether `compare`'s fixed-n test on all N items rejects on this side whatever the
    items not yet evaluated hold (their least favourable answers: every old-right item left kept, every old-wrong
    one fixed, for a breach of "> θ"). It adds nothing to the size."""
    s = entry["sequential"]
    big_n, m_r, m_w = s["items"], s["strata"]["R"], s["strata"]["W"]
    left_r, left_w = m_r - x["n_r"], m_w - x["n_w"]
    low_drop = (x["b"], x["c"] + left_w)  # the smallest final drop (the highest new accuracy), and the largest:
    high_drop = (x["b"] + left_r, x["c"])
    b, c = low_drop if greater == (metric == "acc_drop") else high_drop
    worst = {"n": big_n, "old_acc": m_r / big_n, "new_acc": (m_r - b + c) / big_n, "n_negative_flips": b,
             "n_positive_flips": c}
    v = value(worst, metric)
    if not (v > theta if greater else v < theta):  # not even beyond θ: no test rejects (the exact call skipped)
        return False
    return p_beyond(worst, metric, theta, ">" if greater else "<") < alpha


def group_stop(entry: Mapping, t, alpha: float) -> tuple[Decision, int | None, dict]:
    """Where a group-sequential entry's (task, threshold) stops: (decision, the index of the look that decided it or
    None, the sides' p-values). A side whose early boundary a look crossed decides at the first such look (it stays
    so, whatever later looks add: the run stopped there); else, once the strata the metric needs are done,
    `compare`'s fixed-n decision on all N items (the items left out counting what they must); else undecided."""
    s = entry["sequential"]
    looks = _group_looks(entry)
    m_r, m_w = s["strata"]["R"], s["strata"]["W"]
    need = {"nfr": "R", "btc": "R", "pfr": "W", "old_acc": ""}.get(t.metric, "RW")
    complete = [i for i, x in enumerate(looks) if all(x["n_" + k.lower()] == (m_r if k == "R" else m_w) for k in need)]
    if not need:
        complete = [None]  # old_acc: the baseline alone decides it
    if t.metric == "btc" and m_r == 0:  # btc is not defined without an item the old model got right
        return Decision.UNDECIDED, None, {"p_value": 1.0, "p_within": 1.0}
    early = looks[: complete[0]] if complete and complete[0] is not None else looks
    flip = "<" if t.op == ">" else ">"
    side = _rate_side if need in ("R", "W") else _score_side
    towards = side(entry, t.metric, float(t.value), t.op == ">", alpha, early) if early else (None, 1.0)
    within = side(entry, t.metric, float(t.value), flip == ">", alpha, early) if early else (None, 1.0)
    ps = {"p_value": towards[1], "p_within": within[1]}
    first = [(j, d) for (j, _), d in ((towards, Decision.BREACH), (within, Decision.CLEAR)) if j is not None]
    if first:
        j, decision = min(first, key=lambda x: (x[0], x[1] is not Decision.BREACH))
        return decision, j, ps
    if complete:
        last = looks[complete[0]] if complete[0] is not None else {"n": 0, "n_r": 0, "n_w": 0, "b": 0, "c": 0}
        full = decide_threshold("", _full_entry(entry, last), t, alpha)
        return full.decision, complete[0], {"p_value": full.p_value, "p_within": full.p_within, "full": full}
    return Decision.UNDECIDED, None, ps


def decide_group(name: str, entry: Mapping, t, alpha: float) -> ThresholdDecision:
    """One (task, threshold) of a group-sequential entry (`group_sequential`'s design; where it stops: `group_stop`)."""
    from dataclasses import replace

    s = entry["sequential"]
    big_n = s["items"]
    decision, _, ps = group_stop(entry, t, alpha)
    if "full" in ps:
        full = ps["full"]
        return replace(full, task=name, evidence=Evidence.GROUP,
                       test=f"{full.test} on all {big_n} items, once the items that can change it were done")
    need = {"nfr": "R", "btc": "R", "pfr": "W"}.get(t.metric, "RW")
    kind = "exact binomial boundaries" if need in ("R", "W") else "score boundaries, O'Brien–Fleming α/5"
    k = len(s["looks"])
    test = (f"group-sequential over the {big_n} items ({kind} at {k} {'look' if k == 1 else 'looks'}; at the last, "
            "compare's fixed-n test)")
    v = group_estimate(entry, t.metric)
    side = 0 if v is None else (v > float(t.value)) - (v < float(t.value))
    reason = {Decision.BREACH: Reason.SUPPORTED, Decision.CLEAR: Reason.SHOWN_WITHIN}.get(
        decision, Reason.undecided(side, t.op))
    return ThresholdDecision(task=name, expr=t.expr, metric=t.metric, op=t.op, threshold=t.value, value=v,
                             decision=decision, reason=reason, p_value=ps["p_value"], p_within=ps["p_within"],
                             test=test, evidence=Evidence.GROUP)


def _group_p(entry: Mapping, metric: str, threshold: float, op: str) -> float:
    """A group-sequential entry's p-value outside its thresholds' decisions (the regression flag, the tests across
    tasks): the fixed-n test on all N items once the strata `metric` needs are done, else 1 (no claim)."""
    s = entry["sequential"]
    looks = _group_looks(entry)
    if not looks:
        return 1.0
    last = looks[-1]
    need = {"nfr": "R", "btc": "R", "pfr": "W", "old_acc": ""}.get(metric, "RW")
    if any(last["n_" + x.lower()] < s["strata"][x] for x in need):
        return 1.0
    return p_beyond(_full_entry(entry, last), metric, threshold, op)
