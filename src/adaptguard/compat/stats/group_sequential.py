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
  (`paired_drop.tango_z` for the drop, the binomial score for an accuracy) against O'Brien–Fleming boundaries for ε =
  α/5 spent by the same function (`z_boundaries`, Brownian motion at information t = n/N by recursive numerical
  integration; under stratified proportional sampling the unstratified score is conservative), the last look
  `compare`'s exact test at α; size P(fixed-n rejects ∪ an early look crosses) ≤ α is shown by simulation over the
  nuisance grid in `compare`'s own model (studies/sequential_replay.py, studies/results/sequential.json: the early
  looks add ≤ 0.1 point to the fixed-n test's size). A look also stops where the fixed-n test on all N items is
  certain to reject whatever the items left hold (deterministic curtailment: it adds nothing to the size).

Why the last look is the fixed-n test at the full α rather than at the α left over: a run that evaluates every item
that can change a threshold then decides exactly as `compare` on all items does, wherever that decides — the early
looks pay for this by spending only the α the fixed-n test leaves unused at H0's boundary (discreteness, and the
binomial test's conservatism on fewer items), which is why they stop early only on strong evidence.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
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


# ------------------------------------------------------------- a group-sequential entry's looks (`evaluate` records)
def group_looks(entry: Mapping) -> list[dict]:
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


def look_cells(x: Mapping) -> tuple[int, int, int, int]:
    """A look's items in each of `metric_table.CELLS` (old right and new right, old right and new wrong, ...)."""
    return x["n_r"] - x["b"], x["b"], x["c"], x["n_w"] - x["c"]


def rate_pool(metric: str, greater: bool, big_n: int, m_r: int, m_w: int, theta: float):
    """A rate threshold's side as a "count > θ′" test over the one stratum that can change it: (stratum, count at a
    look, offset, items of the fixed-n test, θ′) — the fixed-n test rejects for offset + count of the stratum large
    (`group_sequential`). "> θ" counts the items the rate counts; "< θ" the other items it is over, against 1 − θ.
    The other stratum's items count the same whatever their new answers: the offset."""
    from ..metric_table import METRICS

    row = METRICS[metric]
    stratum, weights = row.can_flip, row.cell_weights()
    share = (lambda v: v) if greater else (lambda v: 1.0 - v)
    mine, other, other_size = ((0, 1), 2, m_w) if stratum == "R" else ((2, 3), 0, m_r)
    value, counted = weights[other]
    offset = round(share(value) * other_size) if counted else 0
    n_final = row.from_cells((m_r, 0, m_w, 0))[1]

    def count(x: Mapping) -> int:
        cells = look_cells(x)
        return round(sum(cells[i] * share(weights[i][0]) for i in mine if weights[i][1]))

    return stratum, count, offset, n_final, theta if greater else 1 - theta


def pool_entry(big_n: int, m_r: int, m_w: int, b: int | None, c: int | None) -> dict:
    """A one-run entry of all N items from the right → wrong flips `b` among the M_R old-right items and the
    wrong → right ones `c` among the M_W old-wrong: every rate of the paired answers (`metric_table`), None where it
    needs a count that is None (a stratum not evaluated)."""
    from ..metric_table import METRICS, Unit

    out = {"n": big_n, "old_acc": m_r / big_n, "n_negative_flips": b, "n_positive_flips": c}
    cells = (m_r - (b or 0), b or 0, c or 0, m_w - (c or 0))
    for row in METRICS.values():
        if row.per_item is None or row.unit is not Unit.RATE or row.name == "old_acc":
            continue
        k, m = row.from_cells(cells)
        unknown = "R" in row.can_flip and b is None or "W" in row.can_flip and c is None
        out[row.name] = None if unknown or not m else k / m
    return out


def full_entry(entry: Mapping, last: dict) -> dict:
    """The fixed-n entry of all N items once the strata a metric needs are done: the items left out count what they
    must (no right → wrong flip among the old-wrong ones, no wrong → right among the old-right ones); the counts of a
    stratum not evaluated are None."""
    s = entry["sequential"]
    big_n, m_r, m_w = s["items"], s["strata"]["R"], s["strata"]["W"]
    b = last["b"] if last["n_r"] == m_r else None
    c = last["c"] if last["n_w"] == m_w else None
    return pool_entry(big_n, m_r, m_w, b, c)


def group_estimate(entry: Mapping, metric: str) -> float | None:
    """The metric over all N items as estimated at the last look (each stratum's rate so far times its known size;
    exact once the strata it needs are done); None where a stratum it needs has no item yet."""
    from fractions import Fraction

    from ..metric_table import METRICS, Unit

    s = entry["sequential"]
    big_n, m_r, m_w = s["items"], s["strata"]["R"], s["strata"]["W"]
    x = group_looks(entry)[-1] if s["looks"] else {"n_r": 0, "n_w": 0, "b": 0, "c": 0}
    # each stratum's flips so far scaled to its size, exactly (the value is rounded once, at the end: an estimate
    # of exactly 80 % is 0.8, so a raw comparison with `btc<80%` finds it at the threshold)
    flips = Fraction(x["b"] * m_r, x["n_r"]) if x["n_r"] else (Fraction(0) if m_r == 0 else None)
    fixes = Fraction(x["c"] * m_w, x["n_w"]) if x["n_w"] else (Fraction(0) if m_w == 0 else None)
    row = METRICS[metric]
    if "R" in row.can_flip and flips is None or "W" in row.can_flip and fixes is None:
        return None
    (tt, counted), (tf, _), (ft, _), (ff, counted_w) = (
        (Fraction(v), over) for v, over in row.cell_weights())
    # every old-right item counts as kept and every old-wrong one as not fixed, then the flips and fixes move them
    k = tt * m_r * counted + ff * m_w * counted_w
    if "R" in row.can_flip:
        k += (tf - tt) * flips
    if "W" in row.can_flip:
        k += (ft - ff) * fixes
    m = row.from_cells((m_r, 0, m_w, 0))[1] if row.unit is Unit.RATE else big_n
    return float(k / m) if m else None


def rate_side(entry: Mapping, metric: str, theta: float, greater: bool, alpha: float, looks: list[dict]):
    """The first look (index) at which the rate design's side crosses, its stagewise p there (else the smallest
    nominal p seen, never below α), and the stratum's looks."""
    from scipy.stats import binom

    s = entry["sequential"]
    big_n, m_r, m_w = s["items"], s["strata"]["R"], s["strata"]["W"]
    stratum, count, offset, n_final, th = rate_pool(metric, greater, big_n, m_r, m_w, theta)
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
            return where[j], min(alpha, before + first_passage_tail(seen[: j + 1], bounds[:j], q0, k))
    nominal = binom.sf(counts[-1] - 1, seen[-1], min(1.0, max(0.0, q0)))
    return None, max(alpha, float(nominal))


def first_passage_tail(looks: list[int], bounds: list[float], q0: float, k: int) -> float:
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
