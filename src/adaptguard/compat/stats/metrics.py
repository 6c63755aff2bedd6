"""Backward-compatibility metrics for model updates (Echterhoff et al. §3.1–3.2), pure maths (numpy, scipy).

For an old model M1 and a new model M2 on the same N items:

- NFR = (1/N) Σ 1[M1 right ∧ M2 wrong]; PFR = (1/N) Σ 1[M1 wrong ∧ M2 right]
- inconsistency flips = (1/N) Σ 1[M2 wrong ∧ M1(x) ≠ M2(x)] (inconsistency flips; needs predictions)
- BTC = #{M1 right ∧ M2 right} / #{M1 right}
- generative: D(x) = S(M2(x), y) − S(M1(x), y); smooth PFR/NFR = (1/N) Σ 1[D > 0] / 1[D < 0];
  m_g = mean D over D > 0, m_r = mean |D| over D < 0.

Beyond the paper: an exact McNemar test on the discordant pairs and bootstrap intervals.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from ..metric_table import METRICS

# S(predictions (N,), references (N lists)) -> N floats, higher = more similar
Similarity = Callable[[list[str], list[list[str]]], Sequence[float]]


def _as_bool(name: str, values) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if arr.dtype != bool:
        if not np.isin(arr, [0, 1]).all():
            raise ValueError(f"{name} must hold booleans or 0/1 values")
        arr = arr.astype(bool)
    return arr


def mcnemar_exact_p(n_negative: int, n_positive: int) -> float:
    """Exact two-sided McNemar test: under H0 the discordant pairs split Binomial(b + c, 1/2)."""
    from scipy.stats import binomtest

    total = n_negative + n_positive
    return 1.0 if total == 0 else float(binomtest(n_negative, total, 0.5).pvalue)


def bootstrap_rate_ci(indicator: np.ndarray, n_boot: int = 2000, level: float = 0.95,
                      seed: int | None = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of a 0/1 indicator (items resampled with replacement).

    Resampling N Bernoulli indicators is exactly a Binomial(N, p̂) draw, so it is sampled as one.
    """
    n = len(indicator)
    if n == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    rates = rng.binomial(n, indicator.mean(), size=n_boot) / n
    alpha = (1 - level) / 2
    lo, hi = np.quantile(rates, [alpha, 1 - alpha])
    return (float(lo), float(hi))


_EPS = 1e-9  # per-item means over run pairs summed: counts to within rounding


def binomial_p(k: float, n: int, rate: float, greater: bool) -> float:
    """Exact one-sided binomial p of H0 "rate ≤ `rate`" (`greater`) or "≥" on k successes of n, any `rate`: beyond
    [0, 1] H0 holds or fails for sure; a count that is not whole is rounded toward H0 (a per-item mean over runs).

    The items need not share one rate: the count is a sum of n independent Bernoullis whose mean is n·rate under H0's
    boundary (only the old-right items can flip right → wrong, each at its own rate). Hoeffding (1956) bounds every
    such sum's upper tail by the binomial's from k ≥ n·rate + 1; below that the binomial p is ≥ 1/4 except at k = 1,
    n·rate < 1 (a single success rejects), where the largest P(sum ≥ 1) puts the whole rate on one item: n·rate,
    above the binomial's 1 − (1 − rate)^n, so that is the p there (size ≤ α, tests/compat/test_gate_sizes.py). The
    lower tail needs no such care: P(sum ≤ k) is largest at equal rates (Hoeffding's other bound) wherever its
    binomial p is below 1/4."""
    from scipy.stats import binomtest

    k = math.floor(k + _EPS) if greater else math.ceil(k - _EPS)
    if n == 0:
        return 1.0
    if greater:
        if rate >= 1:
            return 1.0
        if rate <= 0:  # H0 "rate ≤ 0": one success refutes it
            return 0.0 if k > 0 else 1.0
        p = float(binomtest(k, n, rate, alternative="greater").pvalue)
        return max(p, n * rate) if k == 1 and n * rate < 1 else p
    if rate <= 0:
        return 1.0
    if rate >= 1:
        return 1.0 if k >= n else 0.0
    return float(binomtest(k, n, rate, alternative="less").pvalue)


def exact_rate_ci(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Clopper–Pearson (exact binomial) interval of a rate of `k` in `n` items: never outside [0, 1], and not
    [0, 0] at k = 0 (at 0 of 18 the upper end is 18.5 %), where a bootstrap of the items collapses."""
    from scipy.stats import binomtest

    if n == 0:
        return (float("nan"), float("nan"))
    ci = binomtest(int(k), int(n)).proportion_ci(confidence_level=level, method="exact")
    return (float(ci.low), float(ci.high))


def flip_indicators(old_correct, new_correct, old_pred=None, new_pred=None) -> dict[str, np.ndarray]:
    """Per-item flips (Echterhoff et al. §3.1) for `flip_metrics` and the in-harness `compat_*` tasks: NFR's and PFR's
    by their rows' `per_item` (`metric_table`, the one formula of each, which `compare` and `evaluate` read too).

    Args:
        old_correct, new_correct: (N,) booleans, whether each model got item i right.
        old_pred, new_pred: optional (N,) predictions (any values comparable with `!=`).
    Returns:
        `{"nfr": old ∧ ¬new, "pfr": ¬old ∧ new}` as (N,) bool arrays, plus `"inconsistency_flips": ¬new ∧ (old_pred ≠
        new_pred)` (an inconsistency flip) when predictions are given.
    """
    old = _as_bool("old_correct", old_correct)
    new = _as_bool("new_correct", new_correct)
    if len(old) != len(new):
        raise ValueError(f"old_correct has {len(old)} items but new_correct has {len(new)}")
    out = {k: np.asarray(METRICS[k].per_item(old, new), bool) for k in ("nfr", "pfr")}
    if (old_pred is None) != (new_pred is None):
        raise ValueError("give both old_pred and new_pred, or neither")
    if old_pred is not None:
        if len(old_pred) != len(old) or len(new_pred) != len(old):
            raise ValueError(f"old_pred/new_pred must have {len(old)} items, like old_correct")
        differ = np.array([a != b for a, b in zip(old_pred, new_pred)], dtype=bool)
        out["inconsistency_flips"] = ~new & differ
    return out


def btc(old_correct, new_correct) -> float | None:
    """BTC = #{old right ∧ new right} / #{old right}; None when the old model is never right (its row's formula,
    `metric_table`)."""
    return METRICS["btc"].value_of(_as_bool("old_correct", old_correct), _as_bool("new_correct", new_correct))


def flip_metrics(old_correct, new_correct, old_pred=None, new_pred=None, *, n_boot: int = 2000,
                 level: float = 0.95, seed: int | None = 0, interval: str = "bootstrap") -> dict:
    """Flip metrics of an update from an old to a new model on the same items.

    Args:
        old_correct, new_correct: (N,) booleans, whether each model got item i right.
        old_pred, new_pred: optional (N,) predictions (any comparable values) for `inconsistency_flips`.
        n_boot, level, seed: bootstrap settings of `nfr_ci` / `pfr_ci`.
        interval: "bootstrap" (the items resampled; kept for the experiments' records) or "exact" (Clopper–Pearson,
            `exact_rate_ci`: right at 0 and at N flips, what `compare` reports).
    Returns:
        dict with `n`, `old_acc`, `new_acc`, `nfr`, `pfr`, `inconsistency_flips` (None without predictions), `btc`
        (None when the old model is never right), `n_negative_flips`, `n_positive_flips`,
        `mcnemar_p`, `nfr_ci`, `pfr_ci`.
    """
    flips = flip_indicators(old_correct, new_correct, old_pred, new_pred)
    old, new = _as_bool("old_correct", old_correct), _as_bool("new_correct", new_correct)
    n = len(old)
    if n == 0:
        raise ValueError("flip_metrics needs at least one item")
    negative, positive = flips["nfr"], flips["pfr"]
    if interval not in ("bootstrap", "exact"):
        raise ValueError(f"interval must be 'bootstrap' or 'exact', got {interval!r}")
    exact = interval == "exact"
    return {
        "n": n,
        "old_acc": float(old.mean()),
        "new_acc": float(new.mean()),
        "nfr": float(negative.mean()),
        "pfr": float(positive.mean()),
        "inconsistency_flips": float(flips["inconsistency_flips"].mean()) if "inconsistency_flips" in flips else None,
        "btc": btc(old, new),
        "n_negative_flips": int(negative.sum()),
        "n_positive_flips": int(positive.sum()),
        "mcnemar_p": mcnemar_exact_p(int(negative.sum()), int(positive.sum())),
        "nfr_ci": exact_rate_ci(int(negative.sum()), n, level) if exact else bootstrap_rate_ci(negative, n_boot, level, seed),
        "pfr_ci": exact_rate_ci(int(positive.sum()), n, level) if exact else
        bootstrap_rate_ci(positive, n_boot, level, None if seed is None else seed + 1),
    }


def mean_gain(delta) -> float | None:
    """m_g: mean D over the items with D > 0; None when there is none."""
    d = np.asarray(delta, dtype=float)
    return float(d[d > 0].mean()) if (d > 0).any() else None


def mean_regression(delta) -> float | None:
    """m_r: mean |D| over the items with D < 0; None when there is none."""
    d = np.asarray(delta, dtype=float)
    return float(-d[d < 0].mean()) if (d < 0).any() else None


def smooth_flip_metrics(delta, *, n_boot: int = 2000, level: float = 0.95, seed: int | None = 0,
                        interval: str = "bootstrap") -> dict:
    """Smooth gain/regression of a generative update from per-item `D(x) = S(new) − S(old)` (N,).

    Returns `n`, `smooth_pfr`, `smooth_nfr`, `m_g` (mean D over D > 0; None if none), `m_r` (mean |D|
    over D < 0; None if none), `mean_delta`, `smooth_nfr_ci`, `smooth_pfr_ci`.
    """
    d = np.asarray(delta, dtype=float)
    if d.ndim != 1 or len(d) == 0:
        raise ValueError("delta must be a non-empty one-dimensional array")
    if not np.isfinite(d).all():
        raise ValueError("delta has NaN or infinite values")
    gain, loss = d > 0, d < 0
    return {
        "n": len(d),
        "smooth_pfr": float(gain.mean()),
        "smooth_nfr": float(loss.mean()),
        "m_g": mean_gain(d),
        "m_r": mean_regression(d),
        "mean_delta": float(d.mean()),
        "smooth_nfr_ci": exact_rate_ci(int(loss.sum()), len(d), level) if interval == "exact"
        else bootstrap_rate_ci(loss, n_boot, level, seed),
        "smooth_pfr_ci": exact_rate_ci(int(gain.sum()), len(d), level) if interval == "exact"
        else bootstrap_rate_ci(gain, n_boot, level, None if seed is None else seed + 1),
    }


DELTA_KEYS = ("nfr", "pfr", "inconsistency_flips", "smooth_nfr", "smooth_pfr", "m_g", "m_r")


def bootstrap_mean_ci(values, *, n_boot: int = 2000, level: float = 0.95, seed: int | None = 0
                      ) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of per-item values (items resampled with replacement).

    Args:
        values: (N,) floats, one per item (e.g. a per-item difference, or an item's mean over seeds).
    """
    values = np.asarray(values, dtype=float)
    if values.ndim != 1 or len(values) == 0:
        raise ValueError(f"bootstrap_mean_ci needs a non-empty one-dimensional array, got shape {values.shape}")
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(n_boot, len(values)))].mean(1)
    alpha = (1 - level) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return float(lo), float(hi)


def paired_seeds_difference(a, b, *, n_boot: int = 2000, level: float = 0.95, seed: int | None = 0) -> dict:
    """Two arms' 0/1 indicators on the same items over the same seeds (e.g. each arm's negative flips against v1,
    one row per training seed), compared item by item.

    Args:
        a, b: (S, N) booleans: S seeds (runs) of each arm on the same N items.
    Returns:
        `diff` = mean(a) − mean(b) over seeds and items; `ci`, its percentile bootstrap interval over items (an
        item's S seeds resampled together, so the interval counts item variation, not S·N independent draws);
        `per_seed`: for each seed, the discordant items `n_a_only` / `n_b_only` and the exact McNemar `mcnemar_p`.
    """
    a, b = (np.asarray(x) for x in (a, b))
    if a.ndim != 2 or a.shape != b.shape or a.size == 0:
        raise ValueError(f"paired_seeds_difference needs two equally shaped, non-empty (seeds, items) indicators "
                         f"({a.shape}, {b.shape})")
    a = np.array([_as_bool("a", row) for row in a])
    b = np.array([_as_bool("b", row) for row in b])
    d = (a.astype(float) - b.astype(float)).mean(0)  # (N,): the item's difference, averaged over seeds
    per_seed = []
    for x, y in zip(a, b):
        a_only, b_only = int((x & ~y).sum()), int((y & ~x).sum())
        per_seed.append({"n_a_only": a_only, "n_b_only": b_only, "mcnemar_p": mcnemar_exact_p(a_only, b_only)})
    return {"diff": float(d.mean()), "ci": bootstrap_mean_ci(d, n_boot=n_boot, level=level, seed=seed),
            "per_seed": per_seed}


def paired_rate_difference(a, b, *, n_boot: int = 2000, level: float = 0.95, seed: int | None = 0) -> dict:
    """Two arms' 0/1 indicators on the same items (e.g. each arm's negative flips against v1), compared item by item.

    Args:
        a, b: (N,) booleans.
    Returns:
        `diff` = mean(a) − mean(b); `ci`, its percentile bootstrap interval (items resampled with replacement, the
        pairs kept together); `n_a_only` / `n_b_only`, the discordant items; `mcnemar_p`, the exact McNemar test
        on them.
    """
    a, b = _as_bool("a", a), _as_bool("b", b)
    if len(a) != len(b) or len(a) == 0:
        raise ValueError(f"paired_rate_difference needs two equally long, non-empty indicators ({len(a)}, {len(b)})")
    out = paired_seeds_difference(a[None], b[None], n_boot=n_boot, level=level, seed=seed)
    return {"diff": out["diff"], "ci": out["ci"], **out["per_seed"][0]}


def delta_metrics(reference: dict, compatible: dict) -> dict:
    """Echterhoff et al.'s Δ-versions for a compatible model M_c against the plain update M2 (both from M1):
    `delta_<k> = k(M1→M_c) − k(M1→M2)` and `delta_<k>_pct = 100 · delta_<k> / k(M1→M2)` for the keys
    present in both (ΔNFR_c, Δ%NFR_c, ...). The percentage is None when the reference value is 0."""
    out = {}
    for key in DELTA_KEYS:
        a, b = reference.get(key), compatible.get(key)
        if a is None or b is None:
            continue
        out[f"delta_{key}"] = b - a
        out[f"delta_{key}_pct"] = 100.0 * (b - a) / a if a else None
    return out


def similarity_deltas(old_outputs: Sequence[str], new_outputs: Sequence[str],
                      references: Sequence[str | Sequence[str]], similarity: Similarity) -> np.ndarray:
    """`D(x_i) = S(new_i, refs_i) − S(old_i, refs_i)` (N,) with S = `similarity(predictions, references)`
    (a similarity function; `adaptguard.plugins.get_similarity` resolves a name such as "rouge1"). Each
    item may have several references; S is the best score over them."""
    if not len(old_outputs) == len(new_outputs) == len(references):
        raise ValueError(f"old_outputs ({len(old_outputs)}), new_outputs ({len(new_outputs)}) and references "
                         f"({len(references)}) must have the same length")
    refs = [[r] if isinstance(r, str) else list(r) for r in references]
    old_s = np.asarray(similarity(list(old_outputs), refs), dtype=float)
    new_s = np.asarray(similarity(list(new_outputs), refs), dtype=float)
    return new_s - old_s


# ------------------------------------------------------------------ lm-eval aggregations (per-sample items)
def btc_aggregation(items: list[tuple[float, float]]) -> float:
    """BTC from per-sample (old_right, new_right) pairs (NaN when the old model is never right)."""
    value = btc([o for o, _ in items], [n for _, n in items]) if items else None
    return float("nan") if value is None else value


def mean_positive(items: list[float]) -> float:
    """m_g over per-sample D values (NaN when none is positive)."""
    value = mean_gain(items)
    return float("nan") if value is None else value


def mean_negative_abs(items: list[float]) -> float:
    """m_r over per-sample D values (NaN when none is negative)."""
    value = mean_regression(items)
    return float("nan") if value is None else value
