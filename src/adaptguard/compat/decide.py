"""The tests behind every decision `compare` states, on the entries of a `compare_runs` report: one per metric, each
one-sided, so that the same test says whether a threshold is breached (the data support "metric > θ") or clear (they
support "metric < θ"), and the tasks' accuracy tests combined into one verdict across tasks (Kübler et al. 2026).

- one run per side: rates of items (`nfr`, `pfr`, `inconsistency_flips`, `old_acc`, `new_acc`, `smooth_nfr`,
  `smooth_pfr`) and `btc` (a rate over the items the old model got right): the exact binomial test on the item
  counts; `acc_drop` (= old_acc − new_acc): the exact McNemar test against 0, Tango's score test against a margin
  (`metrics.paired_drop_p`);
- replicate runs on a side: `nfr`, `excess_nfr` (NFR beyond the noise floor of reruns) and `acc_drop` by a t-test on
  the run-level standard error (runs and items, `replicates.replicate_flips`); other rates have no run-level test.
"""

from __future__ import annotations

import math

RATE_METRICS = ("nfr", "pfr", "inconsistency_flips", "old_acc", "new_acc", "btc", "smooth_nfr", "smooth_pfr")
RUN_LEVEL_METRICS = ("nfr", "excess_nfr", "acc_drop")  # with a run-level test when a side has replicates
# metrics about which answers flipped: on a task where the old model is at chance they measure churn, not the update
FLIP_METRICS = ("nfr", "pfr", "btc", "inconsistency_flips", "excess_nfr", "smooth_nfr", "smooth_pfr")
ACROSS_METHODS = ("pooled", "max_drop", "fisher")


def replicated(entry: dict) -> bool:
    return not (entry.get("replicates") or {"runs_fixed": True})["runs_fixed"]


def value(entry: dict, metric: str) -> float | None:
    """The entry's value of `metric` (None where it is not defined on the task)."""
    if metric == "excess_nfr":
        return (entry.get("replicates") or {}).get("excess_nfr")
    if metric == "acc_drop":
        old, new = entry.get("old_acc"), entry.get("new_acc")
        return None if old is None or new is None else old - new
    v = entry.get(metric)
    return None if v is None or not math.isfinite(v) else float(v)


def counts(entry: dict, metric: str) -> tuple[int, int]:
    """(successes, trials) behind a rate metric of a single-run entry."""
    n = entry["n"]
    if metric == "btc":  # over the items the old model got right; both right = old right − negative flips
        old_right = round(entry["old_acc"] * n)
        return old_right - entry["n_negative_flips"], old_right
    if metric in ("nfr", "pfr"):
        return entry[f"n_{'negative' if metric == 'nfr' else 'positive'}_flips"], n
    return round(entry[metric] * n), n


def _run_level(entry: dict, metric: str) -> tuple[float, float, float]:
    """(estimate, standard error, degrees of freedom) of a metric tested over runs and items."""
    r = entry["replicates"]
    return {"nfr": (r["nfr"], r["nfr_se"], r["nfr_df"]), "excess_nfr": (r["excess_nfr"], r["se"], r["df"]),
            "acc_drop": (-r["acc_diff"], r["acc_diff_se"], r["acc_diff_df"])}[metric]


def p_beyond(entry: dict, metric: str, threshold: float, op: str) -> float:
    """p-value of H0 "metric ≤ threshold" against "metric > threshold" (`op` ">"), or of "≥" against "<" (`op` "<"),
    by the metric's test (module docstring)."""
    from scipy.stats import binomtest

    from .metrics import paired_drop_p
    from .replicates import t_sf

    if replicated(entry):
        estimate, se, df = _run_level(entry, metric)
        z = estimate - threshold if op == ">" else threshold - estimate
        return t_sf(z / se, df) if se > 0 else float(z <= 0)
    if metric == "acc_drop":
        return paired_drop_p(entry["n_negative_flips"], entry["n_positive_flips"], entry["n"], threshold,
                             "greater" if op == ">" else "less")
    k, n = counts(entry, metric)
    if n == 0:
        return 1.0
    p0 = min(max(threshold, 0.0), 1.0)
    return float(binomtest(k, n, p0, alternative="greater" if op == ">" else "less").pvalue)


def mde(entry: dict, metric: str, alpha: float, power: float = 0.8) -> float | None:
    """The smallest true change from none (0) that the metric's one-sided test at `alpha` detects with `power`: from
    the run-level standard error with replicates, and for a single run's `acc_drop` from the spread of the per-item
    differences, (z_{1−α} + z_power) · sd / √n (the paired normal test). None for rates of one run: their binomial
    test has no spread to plan from (the decision says how far the data reach instead)."""
    from scipy.stats import norm

    from .replicates import min_detectable_effect

    # no spread seen (no item changed): nothing to plan from, the MDE is undefined, not 0
    if replicated(entry) and metric in RUN_LEVEL_METRICS:
        _, se, df = _run_level(entry, metric)
        return min_detectable_effect(se, df, 2 * alpha, power) if se > 0 else None  # two-sided at 2α = one-sided α
    if metric == "acc_drop" and not replicated(entry):
        n, d = entry["n"], entry["old_acc"] - entry["new_acc"]
        var = max(0.0, (entry["n_negative_flips"] + entry["n_positive_flips"]) / n - d * d) / n
        return float((norm.ppf(1 - alpha) + norm.ppf(power)) * math.sqrt(var)) if var > 0 else None
    return None


def test_name(entry: dict, metric: str, threshold: float = 0.0) -> str:
    if replicated(entry):
        return "one-sided t-test over runs and items"
    if metric == "acc_drop":
        return "exact one-sided McNemar" if threshold == 0 else "Tango's score test against the margin"
    return "exact one-sided binomial on the item counts"


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
    return {"n": o.shape[1], "old_acc": rep["old_acc"], "new_acc": rep["new_acc"], "replicates": rep}


def across_tasks(entries: list[dict], pooled: dict, margin: float = 0.0, op: str = ">") -> dict[str, float]:
    """Kübler et al.'s three tests of "the new model is worse by more than `margin`" across K tasks, each a p-value:
    `pooled` (every item of every task in one test), `max_drop` and `fisher` (the tasks' one-sided p-values combined,
    `metrics.combined_drop_p`). A verdict splits α across the three (Bonferroni, α/3 each)."""
    from .metrics import combined_drop_p

    per_task = [p_beyond(e, "acc_drop", margin, op) for e in entries]
    return {"pooled": p_beyond(pooled, "acc_drop", margin, op), **combined_drop_p(per_task)}
