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


def tango_z(n_negative, n_positive, n: int, margin: float):
    """Tango's (1998) score statistic of the accuracy drop d = (b − c) / n against `margin` (b = right → wrong,
    c = wrong → right; arrays broadcast): z = (d − margin) / sqrt((2 q + margin (1 − margin)) / n), with q the
    restricted maximum-likelihood rate of wrong → right under d = margin, the root of
    2n q² + (b + c − margin (2n − b + c)) · (−q) − c · margin (1 − margin) = 0. At margin 0 it is McNemar's
    (b − c) / sqrt(b + c)."""
    b, c = np.asarray(n_negative, dtype=float), np.asarray(n_positive, dtype=float)
    big_b = -(b + c) + margin * (2 * n - b + c)
    q = (np.sqrt(np.maximum(0.0, big_b ** 2 + 8 * n * c * margin * (1 - margin))) - big_b) / (4 * n)
    with np.errstate(divide="ignore", invalid="ignore"):
        return ((b - c) / n - margin) / np.sqrt((2 * q + margin * (1 - margin)) / n)


def _margin_tail(b: int, c: int, n: int, margin: float, greater: bool) -> float:
    """The exact unconditional p-value of Tango's z against a margin ≠ 0: the largest probability, over the
    nuisance rate ν of wrong → right on the boundary (right → wrong = ν + margin), of a z at least as extreme as the
    observed one (Berger & Boos 1994; Suissa & Shuster 1991 for margin 0). For each number m of changed items the
    extreme region R is b′ ≥ b*(m) (z rises with b′ at fixed m), so a probability is P(ν) = Σ_m Binom(m; n, 2ν +
    margin) · P(Binom(m, (ν + margin)/(2ν + margin)) beyond b*(m)): O(n) per ν (the m within 12 sd of the mean, plus
    as a bound the binomial mass of the others; every m where that mass is not negligible).

    P(ν) can have several peaks, so the sup is taken by branch and bound: intervals [a, b] of ν (width h), each with an
    upper bound of P on it, those whose bound exceeds the best P seen by more than a relative 1e-8 split in two. What
    is returned is the largest bound left (times 1 + 1e-11 for the rounding of the sums): never below the sup, and
    within 1e-8 · p of it. With f_t the trinomial pmf of a table t = (x, y, r) = (X₁, X₂, X₃) at p = (ν + margin, ν,
    1 − 2ν − margin), P = Σ_R f_t, and two bounds:

    - curvature: with p′ = (1, 1, −2), f_t″ = f_t [Σ_i X_i (X_i − 1) p_i′²/p_i² + Σ_i≠j X_i X_j p_i′ p_j′/(p_i p_j)],
      whose only negative terms pair the unchanged count r with x or y, so −P″ ≤ Σ_R f_t · 4r (x/p₁ + y/p₂)/p₃ ≤
      8n(n − 1) (its mean over all tables). Also f_t″ = f_t (g_t² + g_t′), g_t = x/p₁ + y/p₂ − 2r/p₃ the score and
      g_t′ ≤ 0, so −P″ ≤ Σ_R f_t |g_t′| ≤ E|g′| = I(ν) = n (1/p₁ + 1/p₂ + 4/p₃), the Fisher information; and since
      Σ_all f_t″ = 0, −P″ = Σ_not R f_t (g_t² + g_t′) ≤ sqrt((1 − P) · E g⁴) (Cauchy–Schwarz; E g⁴ = n E u⁴ + 3n(n − 1)
      (E u²)², u one item's score), where on [a, b] 1 − P ≤ 1 − min(P(a), P(b)) + I h²/8 (P″ ≤ Σ_R f_t g_t² ≤ I).
      I and E g⁴ are convex in ν, so their largest values on [a, b] are at its ends. With K the smallest of the
      three, P lies below its chord plus K (ν − a)(b − ν)/2, whose max is the bound: no further evaluation, an error
      of K h²/8.
    - envelope, where P < 0.01 and an absolute error is too coarse: log f_t is concave in ν, so it lies below its
      tangent at a, f_t(a + s) ≤ f_t(a) e^{s g_t(a)} (log ρ ≤ ρ − 1), and Σ_R f_t(a) e^{s g_t(a)} is a sum of
      exponentials of s, convex, largest on [0, h] at s = 0 (P(a)) or s = h, where it is Σ_R n!/(x! y! r!) w₁^x w₂^y
      w₃^r with w_i = p_i e^{h p_i′/p_i}: O(n) like P. Likewise from b backwards; an error relative to P, about I h²/2.
    """
    from scipy.stats import binom

    z_obs = float(tango_z(b, c, n, margin))
    m = np.arange(n + 1)
    # the first b′ (per m) whose z is at least as extreme: a vectorised bisection over b′ ∈ [0, m + 1]
    lo, hi = np.zeros(n + 1, dtype=np.int64), m + 1
    tol = 1e-9 * max(1.0, abs(z_obs))
    while np.any(lo < hi):
        mid = (lo + hi) // 2
        z = tango_z(np.minimum(mid, m), m - np.minimum(mid, m), n, margin)
        beyond = (z >= z_obs - tol) if greater else (z > z_obs + tol)
        hi, lo = np.where(beyond & (lo < hi), mid, hi), np.where(~beyond & (lo < hi), mid + 1, lo)
    first = lo  # greater: region b′ ≥ first; less: region b′ < first (z ≤ z_obs)
    rtol = 1e-8  # the bound returned is at most (1 + rtol) · the largest P seen

    def mass(w) -> tuple[np.ndarray, np.ndarray]:
        """(G, 3) nonnegative weights → Σ_R n!/(x! y! r!) w₁^x w₂^y w₃^r (G,), as a lower and an upper value: summed
        over the m within 12 sd of the mean (wider for the rows where the mass left out is not negligible), and with
        the binomial mass of the m left out added."""
        total = w.sum(1)
        q = w / total[:, None]
        s = np.clip(q[:, 0] + q[:, 1], 0.0, 1.0)
        pi = np.where(s > 0, np.clip(q[:, 0] / np.where(s > 0, s, 1.0), 0.0, 1.0), 0.5)
        width = min(n + 1, 2 * (int(np.ceil(12 * np.sqrt(n * (s * (1 - s)).max()))) + 20) + 1)
        start = np.clip(np.round(n * s).astype(np.int64) - width // 2, 0, n + 1 - width)
        low, left_out = np.zeros(len(s)), np.zeros(len(s))

        def window(rows, wide):
            mm = start[rows, None] + np.arange(wide)
            inner = binom.sf(first[mm] - 1, mm, pi[rows, None]) if greater else binom.cdf(first[mm] - 1, mm, pi[rows, None])
            low[rows] = (binom.pmf(mm, n, s[rows, None]) * inner).sum(1)
            left_out[rows] = binom.cdf(start[rows] - 1, n, s[rows]) + binom.sf(start[rows] + wide - 1, n, s[rows])

        window(np.ones(len(s), dtype=bool), width)
        for _ in range(2):  # where the mass left out is not negligible: the m between the binomial's quantiles, then all
            wide = left_out > 1e-3 * rtol * low
            if width == n + 1 or not wide.any():
                break
            eps = 1e-4 * rtol * low[wide]
            ends = binom.ppf(eps, n, s[wide]) - 1, binom.isf(eps, n, s[wide]) + 1
            width = n + 1 if _ else min(n + 1, int(np.nan_to_num(ends[1] - ends[0], nan=n).max()) + 1)
            start[wide] = np.clip(np.nan_to_num(ends[0], nan=0.0).astype(np.int64), 0, n + 1 - width)
            window(wide, width)
        scale = np.exp(n * np.log(total))
        return low * scale, (low + left_out) * scale

    def probs(nu) -> np.ndarray:  # (G,) → (G, 3): right → wrong, wrong → right, unchanged
        return np.clip(np.stack([nu + margin, nu, 1 - 2 * nu - margin], 1), 0.0, 1.0)

    def tail(nu):
        p = probs(nu)
        return mass(p / p.sum(1)[:, None])

    slope = np.array([1.0, 1.0, -2.0])  # dp/dν

    def envelope(nu, h) -> np.ndarray:  # the envelope from nu to nu + h (h < 0: backwards); inf where unusable
        p, out = probs(nu), np.full(len(nu), np.inf)
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            w = p * np.exp(slope * h[:, None] / p)
            log_total = np.log(w.sum(1))
        ok = (p > 0).all(1) & np.isfinite(log_total) & (n * log_total <= 20)  # S^n ≤ e^20: no underflow matters
        if ok.any():
            out[ok] = mass(w[ok])[1]
        return out

    def at(nu) -> np.ndarray:  # (G,) → (G, 4): P's upper and lower value, I = E g², E g⁴ (g the score of n items)
        p = probs(nu)
        low, high = tail(nu)
        with np.errstate(divide="ignore", invalid="ignore"):  # inf at the ends of the range (nan for n = 1: unused)
            i1, m4 = 1 / p[:, 0] + 1 / p[:, 1] + 4 / p[:, 2], 1 / p[:, 0] ** 3 + 1 / p[:, 1] ** 3 + 16 / p[:, 2] ** 3
            return np.stack([high, low, n * i1, n * m4 + 3 * n * (n - 1) * i1 ** 2], 1)

    lo_nu, hi_nu = max(0.0, -margin), (1 - margin) / 2
    x = np.linspace(lo_nu, hi_nu, 65)
    ends = at(x)
    best, settled = float(ends[:, 1].max()), 0.0
    a, z_, ea, ez = x[:-1], x[1:], ends[:-1], ends[1:]
    for level in range(60):
        h, pa, pz = z_ - a, ea[:, 0], ez[:, 0]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            info = np.maximum(ea[:, 2], ez[:, 2])
            q_max = np.clip(1 - np.minimum(ea[:, 1], ez[:, 1]) + info * h ** 2 / 8, 0.0, 1.0)
            # −P″ ≤ 8n(n − 1), ≤ I, and ≤ sqrt(Q · E g⁴) with Q = 1 − P ≤ 1 − min(P(a), P(b)) + I h²/8 (docstring)
            curve = np.fmin(np.minimum(info, 8.0 * n * (n - 1)), np.sqrt(np.maximum(ea[:, 3], ez[:, 3]) * q_max))
            t = np.clip(h / 2 + (pz - pa) / h / curve, 0.0, h)  # where the chord plus the parabola peaks
            t = np.where(np.isnan(t), h / 2, t)
            bound = np.where(np.isfinite(curve), pa + (pz - pa) * t / h + curve * t * (h - t) / 2, np.inf)
        bound = np.minimum(1.0, np.maximum(bound, np.maximum(pa, pz)))
        again = (bound > best * (1 + rtol)) & (np.maximum(pa, pz) < 0.01)  # small p: the envelope too
        if again.any():
            env = np.minimum(np.maximum(pa[again], envelope(a[again], h[again])),
                             np.maximum(pz[again], envelope(z_[again], -h[again])))
            bound[again] = np.minimum(bound[again], env)
        live = (bound > best * (1 + rtol)) & (level < 59)
        settled = max(settled, float(bound[~live].max(initial=0.0)))
        if not live.any():
            break
        a, z_, ea, ez = a[live], z_[live], ea[live], ez[live]
        mid = (a + z_) / 2
        em = at(mid)
        best = max(best, float(em[:, 1].max()))
        a, z_ = np.concatenate([a, mid]), np.concatenate([mid, z_])
        ea, ez = np.concatenate([ea, em]), np.concatenate([em, ez])
    return float(min(1.0, max(best, settled) * (1 + 1e-11)))


def paired_drop_p(n_negative: int, n_positive: int, n: int, margin: float = 0.0,
                  alternative: str = "greater") -> float:
    """One-sided test of the accuracy drop d = (b − c) / n of two models on the same n items (b = right → wrong,
    c = wrong → right) against `margin`: H0 "d ≤ margin" for `alternative="greater"`, "d ≥ margin" for "less".

    At margin 0 it is the exact McNemar test (b ~ Binomial(b + c, 1/2) given b + c). Elsewhere the exact
    unconditional test ordered by Tango's score statistic (`tango_z`; the sup over the nuisance rate,
    `_margin_tail`): its size is ≤ α at every n, where Tango's normal approximation breaches a 2 % margin 8 % of the
    time at n = 300 when the new model only breaks items. At the edges: no drop exceeds 1 or falls below −1, so
    "d > 1" and "d < −1" are never supported (p = 1), and "d < 1" is shown unless every item broke (b = n), "d > −1"
    unless every item was fixed (c = n).
    """
    from scipy.stats import binomtest

    if alternative not in ("greater", "less"):
        raise ValueError(f"alternative must be 'greater' or 'less', got {alternative!r}")
    b, c, n = int(n_negative), int(n_positive), int(n)
    if n <= 0 or b < 0 or c < 0 or b + c > n:
        raise ValueError(f"paired_drop_p: need 0 ≤ b + c ≤ n with n > 0, got b={b}, c={c}, n={n}")
    if not math.isfinite(margin):
        raise ValueError(f"paired_drop_p: the margin must be a finite number, got {margin}")
    greater = alternative == "greater"
    if margin >= 1:  # H0 "d ≤ 1" always holds; "d ≥ 1" only when every item broke
        return 1.0 if greater else float(b == n)
    if margin <= -1:
        return float(c == n) if greater else 1.0
    if margin == 0:
        return 1.0 if b + c == 0 else float(binomtest(b, b + c, 0.5, alternative=alternative).pvalue)
    return _margin_tail(b, c, n, margin, greater)


def combined_drop_p(p_values) -> dict[str, float]:
    """Two of Kübler et al.'s (2026) ways to combine K tasks' one-sided p-values into one test of "no task got
    worse" (the third, pooling every item into one test, needs the counts): `max_drop`, the smallest p with
    Šidák's correction 1 − (1 − min p)^K (exact for independent tasks: their items differ); `fisher`,
    −2 Σ log p ~ χ²(2K) (scipy's `combine_pvalues`). Both are valid (conservative) for discrete p-values."""
    from scipy.stats import combine_pvalues

    p = np.clip(np.asarray(p_values, dtype=float), 1e-300, 1.0)
    if p.ndim != 1 or p.size == 0:
        raise ValueError("combined_drop_p needs a non-empty list of p-values")
    return {"max_drop": float(-np.expm1(p.size * np.log1p(-min(p.min(), 1 - 1e-16)))),
            "fisher": float(combine_pvalues(p, method="fisher").pvalue)}


def flip_indicators(old_correct, new_correct, old_pred=None, new_pred=None) -> dict[str, np.ndarray]:
    """Per-item flips (Echterhoff et al. §3.1), the one implementation behind `flip_metrics`, `compare` and the
    in-harness `compat_*` tasks.

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
    out = {"nfr": old & ~new, "pfr": ~old & new}
    if (old_pred is None) != (new_pred is None):
        raise ValueError("give both old_pred and new_pred, or neither")
    if old_pred is not None:
        if len(old_pred) != len(old) or len(new_pred) != len(old):
            raise ValueError(f"old_pred/new_pred must have {len(old)} items, like old_correct")
        differ = np.array([a != b for a, b in zip(old_pred, new_pred)], dtype=bool)
        out["inconsistency_flips"] = ~new & differ
    return out


def btc(old_correct, new_correct) -> float | None:
    """BTC = #{old right ∧ new right} / #{old right}; None when the old model is never right."""
    old = _as_bool("old_correct", old_correct)
    new = _as_bool("new_correct", new_correct)
    n_old_right = int(old.sum())
    return float((old & new).sum() / n_old_right) if n_old_right else None


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
