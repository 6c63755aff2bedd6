"""The group-sequential design of `adaptguard evaluate` (issue 87): its boundaries and sizes against independent
calculations (scipy's binomial test, brute-force enumeration of every answer sequence, the bivariate normal), the
stratum each metric evaluates, and the last look deciding as `compare`'s fixed-n test on all items."""

import itertools
import math

import numpy as np
import pytest
from scipy.stats import binomtest, multivariate_normal, norm

from adaptguard.compat.decide import decide_threshold
from adaptguard.compat.evidence import GroupSequential
from adaptguard.compat.gate import Threshold
from adaptguard.compat.reading.records import group_plan
from adaptguard.compat.stats import group_sequential as gs
from adaptguard.compat.stats.metrics import flip_metrics

ALPHA = 0.05


@pytest.mark.parametrize("offset, n_final, theta, pool", [(0, 40, 0.05, 12), (0, 400, 0.02, 198), (28, 40, 0.9, 12),
                                                          (0, 12, 0.3, 12)])
def test_the_final_cut_is_where_scipys_binomial_test_first_rejects(offset, n_final, theta, pool):
    first = next((k for k in range(pool + 1)
                  if binomtest(offset + k, n_final, theta, alternative="greater").pvalue < ALPHA), None)
    assert gs.final_cut(offset, n_final, theta, ALPHA, pool) == first


@pytest.mark.parametrize("big_n, pool, theta, looks", [(30, 12, 0.1, [3, 6, 9, 12]), (20, 11, 0.15, [4, 5, 9, 11]),
                                                       (12, 12, 0.2, [2, 7, 12])])
def test_the_rate_designs_size_by_enumerating_every_answer_sequence(big_n, pool, theta, looks):
    """Every 0/1 sequence of the stratum's items, weighted by its probability at H0's boundary (each item a flip
    with q0 = θN/M): the chance of an early stop with a breach, or of the fixed-n breach at the end, is ≤ α; the
    recursion's size is that sum; and the early stops that the fixed-n test would not take (reversals) stay
    within α − α0, where α0 is the fixed-n test's own size."""
    q0 = theta * big_n / pool
    cut = gs.final_cut(0, big_n, theta, ALPHA, pool)
    bounds = gs.rate_boundaries(looks, pool, q0, cut, ALPHA)
    size = reversal = alone = 0.0
    rejects = [binomtest(k, big_n, theta, alternative="greater").pvalue < ALPHA for k in range(pool + 1)]
    for seq in itertools.product((0, 1), repeat=pool):
        k = sum(seq)
        weight = q0 ** k * (1 - q0) ** (pool - k)
        early = any(sum(seq[:n]) >= b for n, b in zip(looks, bounds) if n < pool)
        final = rejects[k]
        size += weight * (early or final)
        reversal += weight * (early and not final)
        alone += weight * final
    assert size <= ALPHA
    assert gs.rate_size(looks, pool, q0, cut, bounds) == pytest.approx(size, abs=1e-12)
    assert reversal <= ALPHA - alone + 1e-12
    assert any(math.isfinite(b) and b < cut for b, n in zip(bounds, looks) if n < pool), bounds  # it can stop early


def test_the_score_boundaries_spend_what_the_spending_function_says():
    """Two looks at t = 0.4 and 0.7: P(Z1 ≥ h1) is the α spent by 0.4 and P(Z1 ≥ h1 or Z2 ≥ h2) that by 0.7,
    by the bivariate normal (correlation √(t1/t2)), to the grid's accuracy."""
    eps, t = 0.01, (0.4, 0.7)
    h1, h2 = gs.z_boundaries(t, eps)
    def spent(t):  # Lan–DeMets O'Brien–Fleming: 2 − 2Φ(z_{1−ε/2}/√t)
        return 2 * norm.sf(norm.isf(eps / 2) / math.sqrt(t))

    assert norm.sf(h1) == pytest.approx(spent(0.4), rel=0.05)
    rho = math.sqrt(t[0] / t[1])
    stay = multivariate_normal([0, 0], [[1, rho], [rho, 1]]).cdf([h1, h2])
    assert 1 - stay == pytest.approx(spent(0.7), rel=0.05)
    assert gs.obf_spent(0.4, eps) == pytest.approx(spent(0.4), rel=1e-12)
    assert gs.obf_spent(1.0, eps) == pytest.approx(eps) and gs.obf_spent(0.0, eps) == 0.0


OLD_RIGHT = {d: d % 3 != 0 for d in range(60)}  # 40 right, 20 wrong


@pytest.mark.parametrize("metrics, evaluated", [(["nfr"], "R"), (["btc"], "R"), (["pfr"], "W"),
                                                (["acc_drop"], "RW"), (["nfr", "pfr"], "RW"), (["old_acc"], "RW")])
def test_each_metric_evaluates_only_the_items_that_can_change_it(metrics, evaluated):
    plan = group_plan(OLD_RIGHT, metrics, 0, "t")
    right = {d for d, r in OLD_RIGHT.items() if r}
    want = ({d for d in OLD_RIGHT if d in right} if "R" in evaluated else set()) | \
        ({d for d in OLD_RIGHT if d not in right} if "W" in evaluated else set())
    assert set(plan["order"]) == want and len(plan["order"]) == len(want)
    assert {d for x in plan["not_evaluated"] for d in x["docs"]} == set(OLD_RIGHT) - want
    assert plan["strata"] == {"R": 40, "W": 20} and plan["items"] == 60
    if evaluated == "RW":  # proportionally: after any n items each stratum has had its share, to within one item
        for n in range(1, 61):
            assert abs(sum(d in right for d in plan["order"][:n]) - n * 40 / 60) <= 1
    if evaluated == "R":
        assert "cannot flip right → wrong" in plan["not_evaluated"][0]["why"]


def _entry(old, new, order, looks):
    return {"sequential": {"design": "group", "items": len(old), "strata": {"R": int(old.sum()),
                                                                           "W": int((~old).sum())},
                           "old": old[order].astype(int).tolist(), "new": new[order].astype(int).tolist(),
                           "looks": looks}}


@pytest.mark.parametrize("expr", ["nfr>5%", "nfr>20%", "nfr<30%", "pfr>10%", "btc<80%", "acc_drop>1%",
                                  "acc_drop>10%", "new_acc>40%"])
def test_with_every_item_that_can_change_it_done_the_decision_is_compares_on_all_items(expr):
    """Random answers on 150 items, the order evaluate would use; looked at only once every item that can change the
    threshold is done, the decision (and its p-values) is the fixed-n gate's on all 150 items (`compare`'s entry),
    and a look before that never takes the opposite one."""
    t = Threshold.parse(expr)
    rng = np.random.default_rng(len(expr))
    for _ in range(6):
        old = rng.random(150) < rng.uniform(0.3, 0.8)
        new = np.where(old, rng.random(150) >= rng.uniform(0, 0.35), rng.random(150) < rng.uniform(0, 0.3))
        plan = group_plan(dict(enumerate(old.tolist())), [t.metric], int(rng.integers(100)), "t")
        order = np.array(plan["order"])
        fixed = decide_threshold("t", flip_metrics(old, new, interval="exact"), t, ALPHA)
        decision, _, ps = GroupSequential(_entry(old, new, order, [len(order)])).stop(t, ALPHA)
        assert (decision, ps["p_value"], ps["p_within"]) == (fixed["decision"], fixed["p_value"], fixed["p_within"])
        looks = list(range(20, len(order), 20)) + [len(order)]
        early, _, _ = GroupSequential(_entry(old, new, order, looks)).stop(t, ALPHA)
        assert {early, fixed["decision"]} != {"breach", "clear"}


def test_the_agrapa_bet_uses_only_the_items_before_it():
    """The aGRAPA wealth against a plain loop: each bet from the items before it (mean and variance shrunk by one
    pseudo-item), cut to [0, 0.9 / (1 ± m)]; an item's answer never changes its own bet."""
    from adaptguard.compat.stats.anytime import agrapa_e_process

    rng = np.random.default_rng(3)
    x = rng.choice([-1, 0, 1], size=150, p=[0.05, 0.8, 0.15]).astype(float)
    for margin, greater in ((0.01, True), (0.02, False)):
        sign, reach = (1, 1 / (1 + margin)) if greater else (-1, 1 / (1 - margin))
        wealth, out = 1.0, []
        for i, v in enumerate(x):
            past = x[:i]
            mean = past.sum() / (i + 1)
            var = max((0.25 + (past ** 2).sum() - i * mean ** 2) / (i + 1), 1e-4)
            edge = sign * (mean - margin)
            lam = min(max(edge / (var + edge ** 2), 0.0), 0.9 * reach)
            wealth *= 1 + lam * sign * (v - margin)
            out.append(wealth)
        assert np.allclose(agrapa_e_process(x, margin, greater), out, rtol=1e-9)
        changed = x.copy()
        changed[-1] = -changed[-1] if changed[-1] else 1.0
        assert agrapa_e_process(changed, margin, greater)[-2] == pytest.approx(out[-2], rel=1e-12)


def _obf_share(t: float, alpha: float) -> float:
    """Lan–DeMets O'Brien–Fleming-type spending, written out: the share of α spent by information time t."""
    return 2 * (1 - norm.cdf(norm.ppf(1 - alpha / 2) / math.sqrt(t))) / alpha


def test_nfr_5pct_boundaries_worked_out_independently_and_decided_exactly_at_them():
    """Issue 95.1: `nfr>5%` on 400 items, 200 old-right, a look every 50 of them. Worked out here with scipy alone:
    the fixed-n cut c (the first count binomtest rejects on 400 items), its size α0 = P(Binom(200, 0.1) ≥ c), and
    for the first two looks the smallest count b_j whose reversal probability (cross at look j first, end below c)
    fits (α − α0) × the O'Brien–Fleming share by t_j, less what look 1 spent. The module's boundaries are these; a
    run with exactly b₁ flips among the first 50 old-right items breaches at the first look, one with b₁ − 1 does
    not (and likewise at b₂ for a run that did not cross at look 1)."""
    from scipy.stats import binom

    big_n, pool, theta, looks = 400, 200, 0.05, [50, 100, 150, 200]
    q0 = theta * big_n / pool  # 0.1: each old-right item flips at this rate on H0's boundary
    cut = next(k for k in range(pool + 1) if binomtest(k, big_n, theta, alternative="greater").pvalue < ALPHA)
    alpha0 = float(binom.sf(cut - 1, pool, q0))
    slack = ALPHA - alpha0
    assert 0 < alpha0 < ALPHA

    k1 = np.arange(51)
    reversal1 = binom.pmf(k1, 50, q0) * binom.cdf(cut - k1 - 1, pool - 50, q0)
    budget1 = slack * _obf_share(50 / pool, ALPHA)
    b1 = next(b for b in range(51) if reversal1[b:].sum() <= budget1)
    spent1 = reversal1[b1:].sum()
    # look 2: the paths still running (fewer than b1 flips at look 1), then 50 more items
    k2 = np.arange(101)
    running = np.array([sum(binom.pmf(j, 50, q0) * binom.pmf(k - j, 50, q0) for j in range(min(b1, k + 1)))
                        for k in k2])
    reversal2 = running * binom.cdf(cut - k2 - 1, pool - 100, q0)
    budget2 = slack * _obf_share(100 / pool, ALPHA) - spent1
    b2 = next(b for b in range(101) if reversal2[b:].sum() <= budget2)
    # written out: c = 28 (binomtest's p for 28 of 400 at 5 % is below 0.05, for 27 above), α0 = 4.34 %, so the
    # early looks share 0.66 % between them: b₁ = 16 of 50, b₂ = 20 of 100
    assert (cut, b1, b2) == (28, 16, 20) and alpha0 == pytest.approx(0.0434285, abs=1e-6)

    bounds = gs.rate_boundaries(looks, pool, q0, gs.final_cut(0, big_n, theta, ALPHA, pool), ALPHA)
    assert bounds[:2] == [b1, b2] and bounds[-1] == cut

    t = Threshold.parse("nfr>5%")
    old = np.arange(big_n) < pool  # 200 right, 200 wrong
    order = np.array(group_plan(dict(enumerate(old.tolist())), ["nfr"], 0, "t")["order"])
    assert set(order) == set(range(pool))  # only the old-right items are evaluated

    def run(flips_by_look: list[int]):
        new = old.copy()
        done = 0
        for look, flips in zip(looks, flips_by_look):
            chunk = order[done:look]
            new[chunk[:flips]] = False  # right → wrong
            done = look
        return GroupSequential(_entry(old, new, order, looks[: len(flips_by_look)])).stop(t, ALPHA)

    assert run([b1])[:2] == ("breach", 0)
    assert run([b1 - 1])[0] == "undecided"
    assert run([b1 - 1, b2 - (b1 - 1)])[:2] == ("breach", 1)
    assert run([b1 - 1, b2 - b1])[0] == "undecided"
