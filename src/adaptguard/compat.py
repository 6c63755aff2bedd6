"""Backward-compatibility metrics for model updates (paper 002 §3.1–3.2), pure maths.

For an old model M1 and a new model M2 on the same N items:

- NFR = (1/N) Σ 1[M1 right ∧ M2 wrong]; PFR = (1/N) Σ 1[M1 wrong ∧ M2 right]
- NFR_mc = (1/N) Σ 1[M2 wrong ∧ M1(x) ≠ M2(x)] (inconsistency flips; needs predictions)
- BTC = #{M1 right ∧ M2 right} / #{M1 right}
- generative: D(x) = S(M2(x), y) − S(M1(x), y); smooth PFR/NFR = (1/N) Σ 1[D > 0] / 1[D < 0];
  m_g = mean D over D > 0, m_r = mean |D| over D < 0.

Beyond the paper: an exact McNemar test on the discordant pairs and bootstrap intervals.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


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


def flip_metrics(old_correct, new_correct, old_pred=None, new_pred=None, *, n_boot: int = 2000,
                 level: float = 0.95, seed: int | None = 0) -> dict:
    """Flip metrics of an update from an old to a new model on the same items.

    Args:
        old_correct, new_correct: (N,) booleans, whether each model got item i right.
        old_pred, new_pred: optional (N,) predictions (any comparable values) for `nfr_mc`.
        n_boot, level, seed: bootstrap settings of `nfr_ci` / `pfr_ci`.
    Returns:
        dict with `n`, `old_acc`, `new_acc`, `nfr`, `pfr`, `nfr_mc` (None without predictions), `btc`
        (None when the old model is never right), `n_negative_flips`, `n_positive_flips`,
        `mcnemar_p`, `nfr_ci`, `pfr_ci`.
    """
    old = _as_bool("old_correct", old_correct)
    new = _as_bool("new_correct", new_correct)
    if len(old) != len(new):
        raise ValueError(f"old_correct has {len(old)} items but new_correct has {len(new)}")
    n = len(old)
    if n == 0:
        raise ValueError("flip_metrics needs at least one item")
    negative, positive = old & ~new, ~old & new
    nfr_mc = None
    if (old_pred is None) != (new_pred is None):
        raise ValueError("give both old_pred and new_pred, or neither")
    if old_pred is not None:
        if len(old_pred) != n or len(new_pred) != n:
            raise ValueError(f"old_pred/new_pred must have {n} items, like old_correct")
        differ = np.array([a != b for a, b in zip(old_pred, new_pred)], dtype=bool)
        nfr_mc = float((~new & differ).mean())
    n_old_right = int(old.sum())
    return {
        "n": n,
        "old_acc": float(old.mean()),
        "new_acc": float(new.mean()),
        "nfr": float(negative.mean()),
        "pfr": float(positive.mean()),
        "nfr_mc": nfr_mc,
        "btc": float((old & new).sum() / n_old_right) if n_old_right else None,
        "n_negative_flips": int(negative.sum()),
        "n_positive_flips": int(positive.sum()),
        "mcnemar_p": mcnemar_exact_p(int(negative.sum()), int(positive.sum())),
        "nfr_ci": bootstrap_rate_ci(negative, n_boot, level, seed),
        "pfr_ci": bootstrap_rate_ci(positive, n_boot, level, None if seed is None else seed + 1),
    }


def smooth_flip_metrics(delta, *, n_boot: int = 2000, level: float = 0.95, seed: int | None = 0) -> dict:
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
        "m_g": float(d[gain].mean()) if gain.any() else None,
        "m_r": float(np.abs(d[loss]).mean()) if loss.any() else None,
        "mean_delta": float(d.mean()),
        "smooth_nfr_ci": bootstrap_rate_ci(loss, n_boot, level, seed),
        "smooth_pfr_ci": bootstrap_rate_ci(gain, n_boot, level, None if seed is None else seed + 1),
    }


DELTA_KEYS = ("nfr", "pfr", "nfr_mc", "smooth_nfr", "smooth_pfr", "m_g", "m_r")


def delta_metrics(reference: dict, compatible: dict) -> dict:
    """Paper 002's Δ-versions for a compatible model M_c against the plain update M2 (both from M1):
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
                      references: Sequence[str | Sequence[str]], similarity: str = "rouge1") -> np.ndarray:
    """`D(x_i) = S(new_i, refs_i) − S(old_i, refs_i)` (N,) with S the similarity plugin `similarity`.
    Each item may have several references; S is the best score over them."""
    from .plugins import get_similarity

    if not len(old_outputs) == len(new_outputs) == len(references):
        raise ValueError(f"old_outputs ({len(old_outputs)}), new_outputs ({len(new_outputs)}) and references "
                         f"({len(references)}) must have the same length")
    score = get_similarity(similarity)
    refs = [[r] if isinstance(r, str) else list(r) for r in references]
    old_s = np.asarray(score(list(old_outputs), refs), dtype=float)
    new_s = np.asarray(score(list(new_outputs), refs), dtype=float)
    return new_s - old_s
