"""Group-sequential tests over a known pool of items (`adaptguard evaluate`'s default design), pure maths (numpy,
scipy).

`evaluate` knows the whole pool before it starts: the baseline's N items and, for each, whether the old model got it
right. A right → wrong flip needs an item the old model got right, so a threshold on `nfr` or `btc` is decided by the
old-right items alone (stratum R, M_R items) and one on `pfr` by the old-wrong ones (W); the others count 0 flips for
certain, and `compare` on all items takes the same decision once the stratum is done. `acc_drop` and `new_acc` need
both strata, sampled proportionally (a look after n items has ≈ n·M_R/N of R and n·M_W/N of W); `old_acc` needs
none. Within a stratum the items come in a seeded random order.

**The last look is `compare`'s fixed-n test at α on all items**, exactly; the earlier looks may stop only with the
decision that keeps the whole procedure's size ≤ α:

- rates (`nfr`, `pfr`, `btc`), exactly. Under H0's boundary the stratum's items, in any order fixed before their
  answers, are i.i.d. Bernoulli(q0) with q0 the per-item rate at which the metric equals θ (nfr: θ·N/M_R). The
  fixed-n test rejects for a final count K ≥ c (`final_cut`), with size α0 = P(Binom(M, q0) ≥ c) ≤ α (Hoeffding
  1956: the binomial test on N items is conservative for the same mean spread over fewer items). At an early look
  j a count k_j ≥ b_j stops with the same decision; b_j is the smallest count whose **reversal** probability — to
  cross there, first, and end with K < c, P(first cross at j, k_j = k)·P(Binom(M − n_j, q0) < c − k) summed over
  k ≥ b_j, by exact binomial recursion over the looks — keeps the cumulative reversal within (α − α0)·f(t_j),
  f(t) = (2 − 2Φ(z_{1−α/2}/√t))/α the Lan–DeMets O'Brien–Fleming-type spending shape at t = n_j/M. So the
  size P(early cross ∪ K ≥ c) = α0 + Σ reversals ≤ α, exactly, for any looks (a look's boundary depends only on
  the looks before it, so unplanned looks are fine), and a run that reaches the last look decides as `compare`.
  The clear side is the same test of the flipped threshold (each side non-binding: its size holds on the whole path).
- `acc_drop` against a margin and `new_acc` (two strata, a nuisance rate): the score statistic at each early look
  (`metrics.tango_z` for the drop, the binomial score for an accuracy) against O'Brien–Fleming boundaries for ε =
  α/5 spent by the same function (`z_boundaries`, Brownian motion at information t = n/N by recursive numerical
  integration; under stratified proportional sampling the unstratified score is conservative), the last look
  `compare`'s exact test at α; size P(fixed-n rejects ∪ an early look crosses) ≤ α is shown by simulation over the
  nuisance grid in `compare`'s own model (examples/sequential_replay.py, docs/results/sequential.json: the early
  looks add ≤ 0.1 point to the fixed-n test's size). A look also stops where the fixed-n test on all N items is
  certain to reject whatever the items left hold (deterministic curtailment: it adds nothing to the size).

Why the last look is the fixed-n test at the full α rather than at the α left over: a run that evaluates every item
that can change a threshold then decides exactly as `compare` on all items does, wherever that decides — the early
looks pay for this by spending only the α the fixed-n test leaves unused at H0's boundary (discreteness, and the
binomial test's conservatism on fewer items), which is why they stop early only on strong evidence.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

EARLY_SHARE = 0.2  # the share of α the early looks of a two-stratum (score) test may spend


def obf_spent(t: float, eps: float) -> float:
    """Lan–DeMets O'Brien–Fleming-type α spent by information time t ∈ [0, 1]: 2 − 2Φ(z_{1−ε/2}/√t), ε at t = 1."""
    from scipy.stats import norm

    if eps <= 0 or t <= 0:
        return 0.0
    return float(min(eps, 2 * norm.sf(norm.isf(eps / 2) / math.sqrt(min(1.0, t)))))


def final_cut(offset: int, n_final: int, theta: float, alpha: float, pool: int) -> int | None:
    """The smallest pool count K (0..pool) at which `compare`'s one-sided exact binomial test of "rate > θ" on
    offset + K successes of `n_final` items rejects at α; None where no count of the pool does."""
    from .metrics import binomial_p

    def rejects(k: int) -> bool:
        return binomial_p(offset + k, n_final, theta, True) < alpha

    if pool < 0 or not rejects(pool):
        return None
    lo, hi = 0, pool
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if rejects(mid) else (mid + 1, hi)
    return lo


def _pmf(n: int, q: float) -> np.ndarray:
    from scipy.stats import binom

    return binom.pmf(np.arange(n + 1), n, min(1.0, max(0.0, q)))


def _below(need: np.ndarray, n: int, q: float) -> np.ndarray:
    """P(Binom(n, q) < need) per entry of `need` (0 where need ≤ 0)."""
    from scipy.stats import binom

    return np.where(need <= 0, 0.0, binom.cdf(need - 1, n, min(1.0, max(0.0, q))))


def rate_boundaries(looks: list[int], pool: int, q0: float, cut: int | None, alpha: float) -> list[float]:
    """The early-stop counts b_j of the rate design (module docstring) at each look of `looks` (pool items done,
    increasing; a look at the whole pool is the fixed-n test: its entry is `cut`). `math.inf` where no count may stop
    (no final count rejects, or nothing is left to spend)."""
    if cut is None:
        return [math.inf] * len(looks)
    slack = max(0.0, alpha - float(1 - _below(np.array([cut]), pool, q0)[0]))  # α − α0
    dist, done, spent, out = np.array([1.0]), 0, 0.0, []
    for n in looks:
        if n >= pool:
            out.append(float(cut))
            continue
        dist = np.convolve(dist, _pmf(n - done, q0))[: n + 1]
        done = n
        k = np.arange(n + 1)
        reversal = dist * _below(cut - k, pool - n, q0)
        budget = slack * obf_spent(n / pool, alpha) / alpha - spent  # (α − α0)·f(t), f the OBF shape at α
        tails = np.cumsum(reversal[::-1])[::-1]  # Σ_{k' ≥ k}
        ok = np.nonzero(tails <= budget + 1e-15)[0]
        b = int(ok[0]) if len(ok) else n + 1
        if b > n:
            out.append(math.inf)
            continue
        spent += float(tails[b])
        dist = dist.copy()
        dist[b:] = 0.0
        out.append(float(b))
    return out


def rate_size(looks: list[int], pool: int, q0: float, cut: int | None, bounds: list[float]) -> float:
    """P(some early look crosses its bound, or the final count reaches `cut`) for i.i.d. Bernoulli(q0) items: the
    design's exact size at H0's boundary (looks and bounds as `rate_boundaries` gives them)."""
    dist, done, crossed = np.array([1.0]), 0, 0.0
    for n, b in zip(looks, bounds):
        if n >= pool:
            break
        dist = np.convolve(dist, _pmf(n - done, q0))[: n + 1]
        done = n
        if math.isfinite(b):
            crossed += float(dist[int(b):].sum())
            dist = dist.copy()
            dist[int(b):] = 0.0
    if cut is None:
        return crossed
    final = np.convolve(dist, _pmf(pool - done, q0))
    return crossed + float(final[cut:].sum())


@lru_cache(maxsize=256)
def z_boundaries(times: tuple[float, ...], eps: float, grid: int = 801) -> tuple[float, ...]:
    """One-sided O'Brien–Fleming-type boundaries h_j for a standardised score Z_j at information times `times` (< 1,
    increasing): P(∃ j: Z_j ≥ h_j) ≤ ε under H0, spent by `obf_spent` — Brownian motion S(t) = Z√t, the
    sub-density of the paths not yet stopped propagated on a grid (Armitage, McPherson & Rowe 1969; Jennison &
    Turnbull 2000, ch. 19)."""
    from scipy.stats import norm

    out, prev_t, spent = [], 0.0, 0.0
    xs, dens = None, None
    for t in times:
        target = obf_spent(t, eps)
        sd = math.sqrt(t)
        x = np.linspace(-8 * sd, 8 * sd, grid)
        dx = x[1] - x[0]
        if dens is None:
            new = norm.pdf(x, scale=sd)
        else:
            step = math.sqrt(t - prev_t)
            new = (norm.pdf((x[:, None] - xs[None, :]) / step) / step) @ dens * (xs[1] - xs[0])
        mass = np.cumsum(new[::-1])[::-1] * dx  # P(S ≥ x), not yet stopped
        allowed = target - spent
        ok = np.nonzero(mass <= allowed)[0]
        i = int(ok[0]) if len(ok) else len(x) - 1
        h = x[i] / sd
        spent += float(mass[i])
        new = new.copy()
        new[i:] = 0.0
        xs, dens, prev_t = x, new, t
        out.append(float(h))
    return tuple(out)


def proportional_order(right: list[int], wrong: list[int]) -> list[int]:
    """Two strata's items (each already in its random order) merged so that after any n items each stratum has had
    its share n·M/N to within one item."""
    if not right or not wrong:
        return list(right or wrong)
    keyed = [((i + 0.5) / len(right), 0, d) for i, d in enumerate(right)]
    keyed += [((i + 0.5) / len(wrong), 1, d) for i, d in enumerate(wrong)]
    return [d for *_, d in sorted(keyed)]
