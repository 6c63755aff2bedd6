"""The accuracy drop d = (b − c) / n of two models on the same n items (b right → wrong, c wrong → right), tested
against a margin, pure maths (numpy, scipy): Tango's (1998) score statistic, the exact unconditional test it orders
(Berger & Boos 1994; exact McNemar at margin 0), and Kübler et al.'s (2026) ways to combine tasks' p-values."""

from __future__ import annotations

import math

import numpy as np


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
