"""Anytime-valid tests for `adaptguard evaluate --design anytime`, pure maths (numpy, scipy): tests valid at every
look (peeking allowed). An e-process E_t, a nonnegative supermartingale of mean ≤ 1 under H0, rejects H0 the first
time it reaches 1/α (Ville's inequality: P(sup_t E_t ≥ 1/α) ≤ α), so a run may stop as soon as it does. The
anytime-valid p-value is min(1, 1 / max over the looks so far of E). A sequential entry (`entry["sequential"]`) holds
the old and new answers in the order evaluated and the number of items at each look.
"""

from __future__ import annotations

import math
from collections.abc import Mapping


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


def sequences(entry: Mapping, metric: str) -> tuple[list[int], list[int]]:
    """(successes, trials) of `metric` after each look of a sequential entry."""
    import numpy as np

    from ..metric_table import METRICS, cells_of

    s = entry["sequential"]
    old, new = np.asarray(s["old"], bool), np.asarray(s["new"], bool)
    ks, ns = [], []
    for n in s["looks"]:
        k, m = METRICS[metric].from_cells(cells_of(old[:n], new[:n]))
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
    return [rate_e_value(k, n, threshold, greater) for k, n in zip(*sequences(entry, metric))]


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
    for k, n in zip(*sequences(entry, metric)):
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
