"""Second implementations of the decisions' numbers, for the tests that hold the program to them (issue 95): written
from the papers with scipy and the standard library alone — never calling adaptguard — so a test comparing the two
fails when either is wrong.

- the group design (`group_decision`): the rate boundaries by a plain recursion over the counts (`boundaries`), the
  score boundaries by O'Brien–Fleming-type spending solved with scipy's quadrature (`z_bounds`), Tango's score,
  deterministic curtailment and the fixed-n test on all items, every step of `group_sequential`'s docstring again;
- the anytime design: the beta-binomial mixture e-value by numerical integration (`mixture_e_value`), the betting
  wealths by an explicit loop over the items (`grid_wealth`, `agrapa_wealth`).
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from scipy import integrate
from scipy.optimize import brentq, minimize_scalar
from scipy.special import gammaln
from scipy.stats import binom, binomtest, norm


# ------------------------------------------------------------------------------------------ the fixed-n tests
def rate_p(k: int, n: int, theta: float, greater: bool) -> float:
    """The one-sided exact binomial test of a rate on k of n items; at k = 1 with nθ < 1 (a single success), the
    largest chance of a success over every way the n items' rates can average θ is nθ, above the binomial's, so the
    test claims no less (issue 94)."""
    p = binomtest(k, n, theta, alternative="greater" if greater else "less").pvalue
    if greater and k == 1 and n * theta < 1:
        p = max(p, n * theta)
    return float(p)


def mcnemar_p(b: int, c: int, greater: bool) -> float:
    """The exact McNemar test of "the drop (b − c)/n > 0" (or "< 0"): b of the b + c changed items ~ Binom(·, ½)."""
    if b + c == 0:
        return 1.0
    return float(binomtest(b if greater else c, b + c, 0.5, alternative="greater").pvalue)


# ---------------------------------------------------------------------------------- the group design, rates
def share(t: float, alpha: float) -> float:
    """The O'Brien–Fleming-type share of α spent by information time t (Lan & DeMets 1983), capped at 1."""
    return min(1.0, 2 * (1 - norm.cdf(norm.ppf(1 - alpha / 2) / math.sqrt(min(1.0, t)))) / alpha)


@cache  # a linear scan of binomial tests; the same design recurs across runs
def first_cut(offset: int, n_final: int, theta: float, alpha: float, pool: int):
    """The first pool count at which the fixed-n test (offset + count of n_final) rejects; None where none does."""
    return next((k for k in range(pool + 1) if rate_p(offset + k, n_final, theta, True) < alpha), None)


def boundaries(looks, pool, q0, cut, alpha):
    """Each look's early-stop count: the smallest b whose reversal mass (cross here first, end below the cut) keeps
    the running total within (α − α0)·share(t); with the distribution of the paths still running after each look."""
    if cut is None:
        return [math.inf] * len(looks), []
    slack = max(0.0, alpha - float(binom.sf(cut - 1, pool, q0)))
    running, done, spent, out, history = np.array([1.0]), 0, 0.0, [], []  # running[k]: P(count k, not stopped)
    for n in looks:
        if n >= pool:
            out.append(float(cut))
            continue
        step = binom.pmf(np.arange(n - done + 1), n - done, q0)
        grown = np.zeros(n + 1)  # P(count k at this look, no earlier stop): every (k so far, j new) pair
        for k, p in enumerate(running):
            grown[k: k + len(step)] += p * step
        done = n
        counts = np.arange(n + 1)
        reversal = grown * np.where(cut - counts > 0, binom.cdf(cut - counts - 1, pool - n, q0), 0.0)
        allowed = slack * share(n / pool, alpha) - spent
        b = next((b for b in range(n + 2) if reversal[b:].sum() <= allowed + 1e-15), n + 1)
        history.append(dict(enumerate(grown)))
        if b > n:
            out.append(math.inf)
            running = grown
            continue
        spent += float(reversal[b:].sum())
        running = np.where(counts < b, grown, 0.0)
        out.append(float(b))
    return out, history


def rate_design(metric: str, greater: bool, big_n: int, m_r: int, m_w: int, theta: float):
    """A rate threshold's side as a count over one stratum (`group_sequential`'s docstring, written out): (stratum,
    the count at a look, offset, items of the fixed-n test, θ′)."""
    return {
        ("nfr", True): ("R", lambda x: x["b"], 0, big_n, theta),  # flips among the old-right
        ("nfr", False): ("R", lambda x: x["n_r"] - x["b"], big_n - m_r, big_n, 1 - theta),  # kept, + the old-wrong
        ("pfr", True): ("W", lambda x: x["c"], 0, big_n, theta),
        ("pfr", False): ("W", lambda x: x["n_w"] - x["c"], big_n - m_w, big_n, 1 - theta),
        ("btc", True): ("R", lambda x: x["n_r"] - x["b"], 0, m_r, theta),  # btc over the old-right: kept
        ("btc", False): ("R", lambda x: x["b"], 0, m_r, 1 - theta),
    }[metric, greater]


def rate_side(looks, big_n, m_r, m_w, metric, theta, greater, alpha):
    """(index of the look where the side crosses or None, its p-value): the stagewise p where it crosses, else the
    nominal p of the stratum's last look, never below α."""
    stratum, count, offset, n_final, th = rate_design(metric, greater, big_n, m_r, m_w, theta)
    pool, done = (m_r, "n_r") if stratum == "R" else (m_w, "n_w")
    mine = []  # the looks at which the stratum advanced, short of its end
    for i, x in enumerate(looks):
        if x[done] < pool and x[done] > (looks[mine[-1]][done] if mine else 0):
            mine.append(i)
    if not mine:
        return None, 1.0
    q0 = (th * n_final - offset) / pool
    cut = first_cut(offset, n_final, th, alpha, pool)
    seen = [looks[i][done] for i in mine]
    bounds, history = boundaries(seen, pool, q0, cut, alpha)
    for j, i in enumerate(mine):
        k = count(looks[i])
        if k >= bounds[j]:
            earlier = sum(p for h in range(j) if math.isfinite(bounds[h]) for c, p in history[h].items()
                          if c >= bounds[h])
            return i, min(alpha, earlier + sum(p for c, p in history[j].items() if c >= k))
    return None, max(alpha, float(binom.sf(count(looks[mine[-1]]) - 1, seen[-1], q0)))


# ---------------------------------------------------------------------------------- the group design, scores
@cache  # the same looks recur across a test's runs
def z_bounds(times: tuple, eps: float) -> tuple[float, ...]:
    """One-sided O'Brien–Fleming-type boundaries of a standardised score at information times `times` (one to
    three looks), each look spending share(t)·ε − share(t_prev)·ε: P(Z_1 < h_1, …, Z_j ≥ h_j) solved for h_j, the
    probability by quadrature over the Brownian path S(t) = Z√t."""
    hs = []
    for j, t in enumerate(times):
        target = eps * (share(t, eps) - (share(times[j - 1], eps) if j else 0.0))
        if j == 0:
            hs.append(float(norm.isf(target)))
            continue

        def crossing_here(h, j=j, t=t):
            last = times[j - 1]
            if j == 1:  # ∫_{s1 < h1√t1} φ_t1(s1) P(S_t ≥ h√t | s1) ds1
                f = lambda s1: norm.pdf(s1, scale=math.sqrt(last)) * norm.sf(h * math.sqrt(t), s1, math.sqrt(t - last))
                return integrate.quad(f, -12 * math.sqrt(last), hs[0] * math.sqrt(last), epsabs=1e-14, limit=200)[0]
            t1 = times[0]
            f = lambda s2, s1: (norm.pdf(s1, scale=math.sqrt(t1)) * norm.pdf(s2, s1, math.sqrt(last - t1))
                                * norm.sf(h * math.sqrt(t), s2, math.sqrt(t - last)))
            return integrate.dblquad(f, -12 * math.sqrt(t1), hs[0] * math.sqrt(t1), -12 * math.sqrt(last),
                                     hs[1] * math.sqrt(last), epsabs=1e-13)[0]

        hs.append(float(brentq(lambda h, target=target: crossing_here(h) - target, -4.0, 12.0, xtol=1e-6)))
    return tuple(hs)


def tango_z(b: int, c: int, n: int, margin: float) -> float:
    """Tango's (1998) score statistic of the drop (b − c)/n against `margin`: the restricted MLE of the wrong → right
    rate is the root of A q² + B q + C = 0, A = 2n, B = −b − c + margin(2n − b + c), C = −c·margin(1 − margin)."""
    a, bb, cc = 2 * n, -b - c + margin * (2 * n - b + c), -c * margin * (1 - margin)
    q = (-bb + math.sqrt(max(0.0, bb * bb - 4 * a * cc))) / (2 * a)
    var = (2 * q + margin * (1 - margin)) / n
    return ((b - c) / n - margin) / math.sqrt(var) if var > 0 else math.nan


def tango_z_array(b, c, n: int, margin: float):
    """`tango_z` over arrays of counts (the same closed form, numpy)."""
    b, c = np.asarray(b, float), np.asarray(c, float)
    a, bb, cc = 2 * n, -b - c + margin * (2 * n - b + c), -c * margin * (1 - margin)
    q = (-bb + np.sqrt(np.maximum(0.0, bb * bb - 4 * a * cc))) / (2 * a)
    var = (2 * q + margin * (1 - margin)) / n
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(var > 0, ((b - c) / n - margin) / np.sqrt(np.where(var > 0, var, 1.0)), np.nan)


def margin_p(b: int, c: int, n: int, margin: float, greater: bool, points: int = 2001) -> float:
    """The exact unconditional p by brute force, independently of `_margin_tail`: the extreme region from Tango's z
    on every table (b′, c′); its probability under the trinomial (ν + margin, ν, rest) directly from the log-pmf of
    every table for n ≤ 300, and for larger n summed per number of changed items m (the trinomial factored as
    Binom(m; n, 2ν + margin) · Binom(b′; m, (ν + margin)/(2ν + margin))); the sup over ν on a fine grid, then refined
    by a bounded search around every local maximum of the grid."""
    z_obs = float(tango_z_array(b, c, n, margin))
    tol = 1e-9 * max(1.0, abs(z_obs))
    lo, hi = max(0.0, -margin), (1 - margin) / 2
    if n <= 300:
        x, y = (a.ravel() for a in np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij"))
        x, y = x[x + y <= n], y[x + y <= n]
        z = tango_z_array(x, y, n, margin)
        keep = z >= z_obs - tol if greater else z <= z_obs + tol
        x, y = x[keep].astype(float), y[keep].astype(float)
        r = n - x - y
        log_coef = gammaln(n + 1) - gammaln(x + 1) - gammaln(y + 1) - gammaln(r + 1)

        def tail(nu):
            nu = np.atleast_1d(np.asarray(nu, dtype=float))[:, None]
            with np.errstate(divide="ignore", invalid="ignore"):
                terms = (log_coef + np.where(x > 0, x * np.log(nu + margin), 0.0) + np.where(y > 0, y * np.log(nu), 0.0)
                         + np.where(r > 0, r * np.log(np.maximum(1 - 2 * nu - margin, 0.0)), 0.0))
            return np.exp(terms).sum(1)
    else:
        m = np.arange(n + 1)
        first = np.empty(n + 1, dtype=int)  # per m, the region's b′: greater, b′ ≥ first; less, b′ < first
        for k in range(n + 1):
            bs = np.arange(k + 1)
            z = tango_z_array(bs, k - bs, n, margin)
            inside = z >= z_obs - tol if greater else z <= z_obs + tol
            first[k] = (bs[inside].min() if inside.any() else k + 1) if greater else \
                (bs[inside].max() + 1 if inside.any() else 0)

        def tail(nu):
            nu = np.atleast_1d(np.asarray(nu, dtype=float))[:, None]
            s = np.clip(2 * nu + margin, 0.0, 1.0)
            with np.errstate(divide="ignore", invalid="ignore"):
                pi = np.where(s > 0, np.clip((nu + margin) / s, 0.0, 1.0), 1.0)
            inner = binom.sf(first - 1, m, pi) if greater else binom.cdf(first - 1, m, pi)
            return (binom.pmf(m, n, s) * inner).sum(1)

    grid = np.linspace(lo, hi, points)
    values = np.concatenate([tail(chunk) for chunk in np.array_split(grid, max(1, points // 100))])
    best = float(values.max())
    peaks = [i for i in range(points) if values[i] >= values[max(i - 1, 0)] and values[i] >= values[min(i + 1, points - 1)]]
    for i in peaks:
        found = minimize_scalar(lambda nu: -float(tail(nu)[0]), bounds=(grid[max(i - 1, 0)], grid[min(i + 1, points - 1)]),
                                method="bounded", options={"xatol": 1e-13})
        best = max(best, -found.fun)
    return best


def fixed_n_p(metric: str, b: int, c: int, big_n: int, m_r: int, theta: float, greater: bool) -> float:
    """The fixed-n test on all N items (the items left out counting no flip): new_acc's binomial test, acc_drop's
    exact McNemar (margin 0) or exact unconditional test (`margin_p`), the rates'."""
    if metric == "acc_drop":
        if abs(theta) >= 1:  # no drop exceeds 1 or falls below −1
            return (1.0 if greater else float(b == big_n)) if theta >= 1 else (float(c == big_n) if greater else 1.0)
        return mcnemar_p(b, c, greater) if theta == 0 else margin_p(b, c, big_n, theta, greater)
    k, n = {"new_acc": (m_r - b + c, big_n), "nfr": (b, big_n), "pfr": (c, big_n), "btc": (m_r - b, m_r),
            "old_acc": (m_r, big_n), "flip_rate": (b + c, big_n)}[metric]
    return rate_p(k, n, theta, greater)


def score_side(looks, big_n, m_r, m_w, metric, theta, greater, alpha, tolerance=(0.0, 0.0)):
    """(index of the look where the side stops or None, its p-value) for acc_drop or new_acc: the score against the
    boundaries of ε = α/5, or the fixed-n test certain to reject whatever the items left hold. `tolerance` (below,
    above): a score that close to a boundary raises Ambiguous (the program finds its boundaries on a grid)."""
    where = [i for i, x in enumerate(looks) if x["n"] > 0 and (x["n_r"] < m_r or x["n_w"] < m_w)]
    if not where:
        return None, 1.0
    eps = alpha / 5
    times = tuple(looks[i]["n"] / big_n for i in where)
    hs = z_bounds(times, eps)
    z = None
    for j, i in enumerate(where):
        x = looks[i]
        if metric == "acc_drop":
            z = tango_z(x["b"], x["c"], x["n"], theta)
        else:  # a rate of all items: new_acc, or the share of items whose answer changed (flip_rate)
            k = x["b"] + x["c"] if metric == "flip_rate" else x["n_r"] - x["b"] + x["c"]
            z = (k / x["n"] - theta) / math.sqrt(theta * (1 - theta) / x["n"]) if 0 < theta < 1 else 0.0
        z = (z if greater else -z) if math.isfinite(z) else 0.0
        if hs[j] - tolerance[0] <= z < hs[j] + tolerance[1]:
            raise Ambiguous(f"score {z:.4f} at the boundary {hs[j]:.4f}")
        if z >= hs[j]:
            return i, eps * share(times[j], eps)
        # certain: the fixed-n test rejects whatever the items left hold (their least favourable answers)
        left_r, left_w = m_r - x["n_r"], m_w - x["n_w"]
        low_drop, high_drop = (x["b"], x["c"] + left_w), (x["b"] + left_r, x["c"])
        if metric == "acc_drop":  # "drop > θ" must hold at the lowest final drop, "drop < θ" at the highest
            b, c = low_drop if greater else high_drop
        elif metric == "flip_rate":  # "> θ" must hold if no item left flips, "< θ" if every one does
            b, c = (x["b"], x["c"]) if greater else (x["b"] + left_r, x["c"] + left_w)
        else:  # "new_acc > θ" at the lowest final accuracy (the highest drop), "< θ" at the highest
            b, c = high_drop if greater else low_drop
        v = (b - c) / big_n if metric == "acc_drop" else (b + c) / big_n if metric == "flip_rate" else \
            (m_r - b + c) / big_n
        if (v > theta if greater else v < theta) and fixed_n_p(metric, b, c, big_n, m_r, theta, greater) < alpha:
            return i, alpha
    return None, max(alpha, float(norm.sf(z)))


class Ambiguous(Exception):
    """A score within the program's grid resolution of a boundary: no exact decision to hold it to."""


def look_counts(old, new, looks) -> list[dict]:
    """Per look: items done, of them old-right and old-wrong, right → wrong flips (b) and wrong → right (c)."""
    out = []
    for n in looks:
        pairs = list(zip(old[:n], new[:n]))
        n_r = sum(1 for o, _ in pairs if o)
        out.append({"n": n, "n_r": n_r, "n_w": n - n_r, "b": sum(1 for o, w in pairs if o and not w),
                    "c": sum(1 for o, w in pairs if not o and w)})
    return out


NEEDS = {"nfr": "R", "btc": "R", "pfr": "W", "acc_drop": "RW", "new_acc": "RW", "old_acc": "", "flip_rate": "RW"}


def group_decision(old, new, looks, big_n, m_r, m_w, metric, theta, op, alpha, tolerance=(0.0, 0.0)) -> dict:
    """Where a group-sequential (task, threshold) stops (`group_sequential`'s docstring): the earliest look where a
    side crosses (a breach before a clear at one look); else, once the strata the metric needs are done, the fixed-n
    test on all N items; else undecided. Returns decision, the deciding look's index, p_value and p_within."""
    counts = look_counts(old, new, looks)
    need = NEEDS[metric]
    if metric == "btc" and m_r == 0:
        return {"decision": "undecided", "at": None, "p_value": 1.0, "p_within": 1.0}
    done = [i for i, x in enumerate(counts) if ("R" not in need or x["n_r"] == m_r) and
            ("W" not in need or x["n_w"] == m_w)]
    complete = None if not need else done[0] if done else -1  # None: nothing to evaluate; -1: not yet
    early = [] if complete is None else counts if complete == -1 else counts[:complete]
    side = rate_side if need in ("R", "W") else score_side
    extra = {} if side is rate_side else {"tolerance": tolerance}
    sides = [side(early, big_n, m_r, m_w, metric, theta, greater, alpha, **extra) if early else (None, 1.0)
             for greater in (op == ">", op != ">")]
    crossed = [(sides[s][0], s) for s in (0, 1) if sides[s][0] is not None]
    if crossed:
        at, s = min(crossed)
        return {"decision": ("breach", "clear")[s], "at": at, "p_value": sides[0][1], "p_within": sides[1][1]}
    if complete == -1:
        return {"decision": "undecided", "at": None, "p_value": sides[0][1], "p_within": sides[1][1]}
    last = counts[complete] if complete is not None else {"b": 0, "c": 0}
    p = fixed_n_p(metric, last["b"], last["c"], big_n, m_r, theta, op == ">")
    p_within = fixed_n_p(metric, last["b"], last["c"], big_n, m_r, theta, op != ">")
    decision = "breach" if p < alpha else "clear" if p_within < alpha else "undecided"
    return {"decision": decision, "at": complete, "p_value": p, "p_within": p_within}


# --------------------------------------------------------------------------------------- the anytime design
def mixture_e_value(k: int, n: int, rate: float, greater: bool) -> float:
    """Robbins' mixture: ∫ over the alternative of L(p)/L(rate) under the Beta(1, b0) prior restricted to it,
    b0 = max(1, (1 − rate)/rate), by quadrature (`anytime.rate_e_value`'s definition)."""
    return math.exp(min(log_mixture_e_value(k, n, rate, greater), 700.0))


def log_mixture_e_value(k: int, n: int, rate: float, greater: bool) -> float:
    """log of `mixture_e_value`: the likelihood ratio scaled by its largest value on the alternative before the
    quadrature, so that extreme rates neither overflow nor underflow."""
    if n == 0 or (greater and rate >= 1) or (not greater and rate <= 0):
        return 0.0
    b0 = max(1.0, (1 - rate) / rate)
    lo, hi = (rate, 1.0) if greater else (0.0, rate)

    def log_ratio(p):  # log L(p) / L(rate)
        return (k * math.log(p / rate) if k else 0.0) + ((n - k) * math.log((1 - p) / (1 - rate)) if n - k else 0.0)

    top = log_ratio(min(max(k / n, lo), hi))  # its largest value: the ratio is log-concave, peaked at k/n
    # the Beta(1, b0) prior written out: density b0 (1 − p)^(b0 − 1), cdf 1 − (1 − p)^b0
    mass = (1 - lo) ** b0 - (1 - hi) ** b0
    points = [x for x in (k / n,) if lo < x < hi]

    def integrand(p):
        return math.exp(log_ratio(p) - top + math.log(b0) + (b0 - 1) * math.log1p(-p)) if 0 < p < 1 else 0.0

    num = integrate.quad(integrand, lo, hi, points=points or None, limit=200, epsrel=1e-9, epsabs=0)[0]
    return top + math.log(num / mass) if num > 0 else -math.inf


def grid_wealth(x, margin: float, greater: bool, bets: int = 24) -> list[float]:
    """The average over `bets` constant bets λ (geometric from 0.001 to 0.9 of the bet that could empty the wealth,
    1/(1 ± margin)) of Π (1 ± λ (x_i − margin)), after each item: an explicit loop."""
    sign = 1.0 if greater else -1.0
    reach = 1 / (1 + margin) if greater else 1 / (1 - margin)
    lams = [reach * 1e-3 * (0.9 / 1e-3) ** (i / (bets - 1)) for i in range(bets)]
    wealth, out = [1.0] * bets, []
    for xi in x:
        wealth = [w * (1 + lam * sign * (xi - margin)) for w, lam in zip(wealth, lams)]
        out.append(sum(wealth) / bets)
    return out


def agrapa_wealth(x, margin: float, greater: bool) -> list[float]:
    """aGRAPA (Waudby-Smith & Ramdas 2024, §B.2): λ_i = (μ̂ − m)/(σ̂² + (μ̂ − m)²) on the side tested, from the items
    before i (mean with one pseudo-item at 0, variance with one of ¼, floored at 1e-4), cut to [0, 0.9/(1 ± m)]."""
    sign = 1.0 if greater else -1.0
    reach = 1 / (1 + margin) if greater else 1 / (1 - margin)
    wealth, total, squares, out = 1.0, 0.0, 0.0, []
    for i, xi in enumerate(x, start=1):
        mean = total / i
        var = max((0.25 + squares - (i - 1) * mean * mean) / i, 1e-4)
        edge = sign * (mean - margin)
        lam = min(max(edge / (var + edge * edge), 0.0), 0.9 * reach)
        wealth *= 1 + lam * sign * (xi - margin)
        total, squares = total + xi, squares + xi * xi
        out.append(wealth)
    return out


# ------------------------------------------------------------------------------------------------ replicates
def per_item_flips(old, new):
    """Per item, by loops over the runs: the cross NFR (the mean over every (old run, new run) pair of "right, then
    wrong") and the noise floor (the same over every ordered pair of two distinct runs of one side, both sides pooled;
    None where no side has two runs). old: (R_o, N), new: (R_n, N) 0/1."""
    old, new = np.asarray(old, int), np.asarray(new, int)
    n = old.shape[1]
    cross = [sum(o[i] * (1 - w[i]) for o in old for w in new) / (len(old) * len(new)) for i in range(n)]
    pairs = [(a, b) for side in (old, new) for x, a in enumerate(side) for y, b in enumerate(side) if x != y]
    floor = [sum(a[i] * (1 - b[i]) for a, b in pairs) / len(pairs) for i in range(n)] if pairs else None
    return np.array(cross), None if floor is None else np.array(floor)


def replicate_se(old, new, statistic: str) -> tuple[float, float]:
    """(standard error, degrees of freedom) of the mean over items of `statistic` ("nfr": the cross NFR, "excess":
    cross − floor) for a crossed runs × items design: V = V_items + max(0, V_runs − V_churn), V_items = var(g)/N, and
    per side with ≥ 2 runs the jackknife of deleting each run in turn, recomputed from the runs left (V_runs: of the
    mean; V_churn: item by item, over N); for "excess" a side whose deletions leave no floor is skipped.
    Satterthwaite's df over the three mean squares, at least 1."""
    def values(o, w):
        cross, floor = per_item_flips(o, w)
        if statistic == "nfr":
            return cross
        return None if floor is None else cross - floor

    old, new = np.asarray(old, int), np.asarray(new, int)
    g = values(old, new)
    n = len(g)
    v_items = float(np.var(g, ddof=1) / n) if n > 1 else 0.0
    v_runs = v_churn = 0.0
    df_runs = 0
    for side in ("old", "new"):
        runs = old if side == "old" else new
        k = len(runs)
        if k < 2:
            continue
        left = [values(np.delete(old, j, 0), new) if side == "old" else values(old, np.delete(new, j, 0))
                for j in range(k)]
        if any(v is None for v in left):
            continue
        left = np.array(left)  # (k, N)
        v_runs += (k - 1) / k * sum((left[j].mean() - left.mean()) ** 2 for j in range(k))
        v_churn += (k - 1) / k * sum(((left[j] - left.mean(0)) ** 2).mean() for j in range(k)) / n
        df_runs += k - 1
    variance = v_items + max(0.0, v_runs - v_churn)
    terms = v_items ** 2 / max(n - 1, 1) + ((v_runs ** 2 / df_runs + v_churn ** 2 / (df_runs * max(n - 1, 1)))
                                            if df_runs else 0.0)
    return math.sqrt(variance), (max(1.0, variance ** 2 / terms) if terms > 0 else math.inf)
