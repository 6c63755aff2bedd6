"""Every group-sequential decision against a second implementation (issue 95): random runs of each shipped metric on
both sides — boundaries crossed early, runs curtailed, the fixed-n test once the strata are done, runs still going —
decided by the gate (`decide_threshold`) and by `independent.group_decision`, written from the design's docstring with
scipy alone. The decision, the look that made it, both p-values and the estimate must agree; each kind of outcome must
occur, so a bug in any branch shows."""

import math
from collections import Counter

import numpy as np
import pytest
from independent import (
    Ambiguous,
    agrapa_wealth,
    fixed_n_p,
    grid_wealth,
    group_decision,
    look_counts,
    mcnemar_p,
    mixture_e_value,
    share,
    z_bounds,
)
from scipy.stats import binomtest, norm

from adaptguard.compat.decide import decide_across, decide_threshold
from adaptguard.compat.evidence import GroupSequential
from adaptguard.compat.gate import Threshold
from adaptguard.compat.stats.group_sequential import z_boundaries

ALPHA = 0.05
# the program finds a score boundary on a grid: within (0.01 below, 0.035 above) the exact one (measured against
# `z_bounds` at t ≥ 0.2); a score that close to it has no exact decision to hold the program to
GRID = (0.01, 0.035)


def entry_of(old, new, looks, big_n):
    m_r = int(np.sum(old))
    return {"sequential": {"design": "group", "items": big_n, "strata": {"R": m_r, "W": big_n - m_r},
                           "old": [int(v) for v in old], "new": [int(v) for v in new], "looks": list(looks)}}


def run(rng, big_n, m_r, flip_rate, fix_rate, every, r_first):
    """A run of N items (m_r of them old-right) in random order, or the old-right first; each old-right item flips
    with `flip_rate`, each old-wrong one is fixed with `fix_rate`; looks every `every` items, the run stopped after a
    random number of them (after all of them where the old-right come first, so a stratum is done before the end)."""
    old = np.array([True] * m_r + [False] * (big_n - m_r))
    if not r_first:
        rng.shuffle(old)
    u = rng.random(big_n)
    new = np.where(old, u >= flip_rate, u < fix_rate)
    looks = list(range(every, big_n, every)) + [big_n]
    return old, new, looks if r_first else looks[: rng.integers(1, len(looks) + 1)]


def estimate(old, new, looks, big_n, metric):
    """The metric over all N items from the last look, each stratum's rate times its size (by hand)."""
    m_r = int(np.sum(old))
    x = look_counts(old, new, looks)[-1]
    flips = x["b"] / x["n_r"] * m_r if x["n_r"] else (0.0 if m_r == 0 else None)
    fixes = x["c"] / x["n_w"] * (big_n - m_r) if x["n_w"] else (0.0 if m_r == big_n else None)
    if metric == "old_acc":
        return m_r / big_n
    if metric in ("nfr", "btc"):
        return None if flips is None else flips / big_n if metric == "nfr" else 1 - flips / m_r
    if metric == "pfr":
        return None if fixes is None else fixes / big_n
    if flips is None or fixes is None:
        return None
    return (flips - fixes) / big_n if metric == "acc_drop" else (m_r - flips + fixes) / big_n


FIXED_N_TEST = {"acc_drop": "exact unconditional score test against the margin"}  # (at margin 0: McNemar)

CASES = [  # (threshold, N, M_R, rates of flips and fixes to draw from, look every, runs)
    ("nfr>5%", 400, 200, [(0.0, 0.1), (0.05, 0.1), (0.1, 0.1), (0.2, 0.1), (0.35, 0.1)], 50, 150),
    ("nfr<5%", 400, 200, [(0.0, 0.1), (0.02, 0.1), (0.1, 0.1), (0.2, 0.1)], 50, 150),
    ("nfr>3%", 300, 120, [(0.0, 0.1), (0.06, 0.1), (0.1, 0.1), (0.2, 0.1), (0.4, 0.1)], 30, 150),
    ("pfr>5%", 300, 100, [(0.0, 0.0), (0.05, 0.05), (0.1, 0.1), (0.25, 0.25)], 50, 150),
    ("pfr<10%", 300, 100, [(0.0, 0.0), (0.05, 0.05), (0.15, 0.15), (0.3, 0.3)], 50, 150),
    ("btc<90%", 300, 200, [(0.0, 0.1), (0.05, 0.1), (0.1, 0.1), (0.25, 0.1)], 40, 150),
    ("btc>80%", 300, 200, [(0.0, 0.1), (0.1, 0.1), (0.2, 0.1), (0.4, 0.1)], 40, 150),
    ("acc_drop>0", 300, 180, [(0.0, 0.2), (0.05, 0.05), (0.2, 0.05), (0.4, 0.0)], 100, 150),
    ("acc_drop<0", 300, 180, [(0.0, 0.2), (0.0, 0.5), (0.05, 0.05), (0.2, 0.05)], 100, 150),
    ("acc_drop>5%", 100, 60, [(0.0, 0.2), (0.1, 0.05), (0.2, 0.05), (0.4, 0.0)], 34, 60),  # the exact unconditional
    ("acc_drop<-5%", 100, 60, [(0.0, 0.3), (0.0, 0.5), (0.05, 0.1), (0.2, 0.05)], 34, 60),  # test at the end
    ("new_acc>50%", 300, 150, [(0.0, 0.3), (0.05, 0.1), (0.3, 0.0), (0.1, 0.6)], 100, 150),
    ("new_acc<70%", 300, 180, [(0.0, 0.3), (0.05, 0.1), (0.3, 0.0), (0.1, 0.6)], 100, 150),
]


@pytest.mark.parametrize("expr, big_n, m_r, rates, every, n_runs", CASES, ids=[c[0] for c in CASES])
def test_each_decision_equals_the_second_implementation(expr, big_n, m_r, rates, every, n_runs):
    t = Threshold.parse(expr)
    rng = np.random.default_rng(95)
    seen = Counter()
    for i in range(n_runs):
        flip_rate, fix_rate = rates[i % len(rates)]
        old, new, looks = run(rng, big_n, m_r, flip_rate, fix_rate, every, r_first=i % 3 == 2)
        entry = entry_of(old, new, looks, big_n)
        try:
            want = group_decision(old, new, looks, big_n, m_r, big_n - m_r, t.metric, float(t.value), t.op, ALPHA,
                                  tolerance=GRID)
        except Ambiguous:
            seen["ambiguous"] += 1
            continue
        got = decide_threshold("task", entry, t, ALPHA)
        where = f"run {i}: looks {looks}, counts {look_counts(old, new, looks)}"
        assert got.decision.value == want["decision"], where
        assert GroupSequential(entry).stop(t, ALPHA)[1] == want["at"], where
        assert got.p_value == pytest.approx(want["p_value"], rel=1e-7, abs=1e-12), where
        assert got.p_within == pytest.approx(want["p_within"], rel=1e-7, abs=1e-12), where
        v = estimate(old, new, looks, big_n, t.metric)
        assert got.value == (None if v is None else pytest.approx(v, abs=1e-12)), where
        assert got.evidence.value == "group", where
        fixed_n = want["at"] is not None and _strata_done(old, looks[want["at"]], t.metric)
        if fixed_n:  # compare's decision on all N items, its test and interval named as such
            x = look_counts(old, new, looks)[want["at"]]
            name = FIXED_N_TEST.get(t.metric, "exact one-sided binomial on the item counts") if t.value else \
                "exact one-sided McNemar"
            assert got.test == f"{name} on all {big_n} items, once the items that can change it were done", where
            k, n = {"nfr": (x["b"], big_n), "pfr": (x["c"], big_n), "btc": (m_r - x["b"], m_r),
                    "new_acc": (m_r - x["b"] + x["c"], big_n), "acc_drop": (None, None)}[t.metric]
            if k is not None:  # a rate's Clopper–Pearson interval at 1 − 2α
                ci = binomtest(k, n).proportion_ci(1 - 2 * ALPHA, method="exact")
                assert got.interval == (pytest.approx(ci.low, abs=1e-9), pytest.approx(ci.high, abs=1e-9)), where
        else:  # the group design's own decision: no interval, its boundaries named
            kind = "score boundaries, O'Brien–Fleming α/5" if t.metric in ("acc_drop", "new_acc") else \
                "exact binomial boundaries"
            assert got.test == (f"group-sequential over the {big_n} items ({kind} at {len(looks)} "
                                f"{'look' if len(looks) == 1 else 'looks'}; at the last, compare's fixed-n test)"), where
            assert (got.interval, got.mde, got.items_needed) == (None, None, None), where
            side = 0 if v is None else (v > float(t.value)) - (v < float(t.value))
            assert got.reason.sentence == {
                "breach": "the data support it", "clear": "the data show it within the threshold",
                "undecided": "at the threshold: neither beyond it nor shown within it" if side == 0 else
                "beyond the threshold, but not significantly" if (side > 0) == (t.op == ">") else
                "within the threshold, but the data cannot show it"}[want["decision"]], where
        seen[("early " if want["at"] is not None and looks[want["at"]] < big_n and
              (want["decision"] != "undecided") and not _strata_done(old, looks[want["at"]], t.metric) else "")
             + want["decision"]] += 1
    assert seen["ambiguous"] <= n_runs // 5, seen  # the comparison is not emptied by the grid
    # every kind of outcome occurs: a bug in any branch shows
    outcomes = set(seen) - {"ambiguous"}
    assert {"early breach", "early clear"} <= outcomes, seen
    assert {"breach", "clear"} & outcomes, seen  # decided by the fixed-n test on all items
    assert "undecided" in outcomes, seen


def _strata_done(old, n, metric):
    need = {"nfr": "R", "btc": "R", "pfr": "W", "acc_drop": "RW", "new_acc": "RW", "old_acc": ""}[metric]
    o = np.asarray(old)
    return all((o[:n] == (k == "R")).sum() == (o == (k == "R")).sum() for k in need)


def test_old_acc_is_decided_by_the_baseline_alone():
    """old_acc does not move with the new model's answers: a group entry decides it by the fixed-n binomial test of
    the old model's accuracy on all N items, whatever the looks hold (a bug decided it from the new model's scores)."""
    rng = np.random.default_rng(7)
    old = np.array([True] * 150 + [False] * 150)
    rng.shuffle(old)
    new = rng.random(300) < 0.9  # the new model far above 50 %
    entry = entry_of(old, new, [100], 300)
    for expr, p in [("old_acc>50%", binomtest(150, 300, 0.5, alternative="greater").pvalue),
                    ("old_acc>40%", binomtest(150, 300, 0.4, alternative="greater").pvalue),
                    ("old_acc<60%", binomtest(150, 300, 0.6, alternative="less").pvalue)]:
        got = decide_threshold("task", entry, Threshold.parse(expr), ALPHA)
        assert got.p_value == pytest.approx(p, rel=1e-9), expr
        assert got.decision.value == ("breach" if p < ALPHA else "undecided"), expr
        assert got.value == 0.5
    assert decide_threshold("task", entry, Threshold.parse("old_acc>50%"), ALPHA).decision.value == "undecided"


@pytest.mark.parametrize("times", [(0.25,), (0.5,), (1 / 3, 2 / 3), (0.25, 0.5), (0.4, 0.8), (0.2, 0.9)])
@pytest.mark.parametrize("eps", [0.01, 0.002])
def test_the_score_boundaries_against_quadrature(times, eps):
    """The grid's boundaries within GRID of the ones solved by quadrature, never below them by more than 0.01 (a
    boundary too low spends more than ε)."""
    want, got = z_bounds(times, eps), z_boundaries(times, eps)
    for h, g in zip(want, got):
        assert h - GRID[0] <= g <= h + GRID[1], (want, got)
    # the first boundary is the normal quantile of the share spent by then, exactly
    assert want[0] == pytest.approx(norm.isf(eps * share(times[0], eps)), rel=1e-12)


def test_a_run_is_curtailed_where_the_items_left_cannot_save_it():
    """acc_drop>0 on 300 items (180 old-right), one look at 295 (3 old-right and 2 old-wrong left), every count of
    flips and fixes near the boundary: the run stops when the score crosses its boundary (p = the α spent by then), or
    when McNemar's test on all items rejects even if the 2 old-wrong items left are fixed (p = α), else it goes on.
    Each of the three happens, and the gate agrees with `group_decision` on every count."""
    old = np.array(([True] * 3 + [False] * 2) * 60)
    r, w = np.nonzero(old[:295])[0], np.nonzero(~old[:295])[0]
    t = Threshold.parse("acc_drop>0")
    h = z_bounds((295 / 300,), ALPHA / 5)[0]
    found = Counter()
    for b in range(40, 80):
        for c in range(15, 50, 3):
            new = old.copy()
            new[r[:b]], new[w[:c]] = False, True
            z = (b - c) / math.sqrt(b + c)  # Tango's score at margin 0
            if h - GRID[0] <= z < h + GRID[1]:
                continue
            decision, at, ps = GroupSequential(entry_of(old, new, [295], 300)).stop(t, ALPHA)
            crosses, certain = z >= h, b - c - 2 > 0 and mcnemar_p(b, c + 2, True) < ALPHA
            if crosses:
                assert (decision.value, at, ps["p_value"]) == ("breach", 0, pytest.approx(
                    ALPHA / 5 * share(295 / 300, ALPHA / 5), rel=1e-9)), (b, c)
            elif certain:
                assert (decision.value, at, ps["p_value"]) == ("breach", 0, ALPHA), (b, c)
            else:
                assert at is None or decision.value == "clear", (b, c)
                assert ps["p_value"] == pytest.approx(max(ALPHA, norm.sf(z)), rel=1e-9), (b, c)
            found["crosses" if crosses else "curtailed" if certain else "goes on"] += 1
    assert set(found) == {"crosses", "curtailed", "goes on"}, found


# ------------------------------------------------------------------------------------------ the anytime design
def anytime_entry(old, new, looks, bet=None):
    n = len(old)
    b, c = int(np.sum(old & ~new)), int(np.sum(~old & new))
    s = {"old": [int(v) for v in old], "new": [int(v) for v in new], "looks": list(looks)}
    if bet:
        s["bet"] = bet
    return {"n": n, "old_acc": float(np.mean(old)), "new_acc": float(np.mean(new)), "n_negative_flips": b,
            "n_positive_flips": c, "nfr": b / n, "pfr": c / n, "btc": 1 - b / int(np.sum(old)), "sequential": s}


def e_values_by_hand(old, new, looks, metric, theta, greater, bet):
    """Each look's e-value: the mixture by quadrature for a rate, the betting wealth by a loop for acc_drop."""
    if metric == "acc_drop":
        x = old.astype(float) - new.astype(float)
        wealth = (agrapa_wealth if bet == "agrapa" else grid_wealth)(x, theta, greater)
        return [wealth[n - 1] for n in looks]
    out = []
    for n in looks:
        o, w = old[:n], new[:n]
        k, m = {"nfr": ((o & ~w).sum(), n), "pfr": ((~o & w).sum(), n), "btc": ((o & w).sum(), o.sum()),
                "old_acc": (o.sum(), n), "new_acc": (w.sum(), n)}[metric]
        out.append(mixture_e_value(int(k), int(m), theta, greater))
    return out


ANYTIME = [("nfr>5%", 0.6, 0.08), ("nfr<10%", 0.6, 0.12), ("pfr>5%", 0.5, 0.1), ("btc<90%", 0.7, 0.15),
           ("btc>80%", 0.7, 0.1), ("new_acc>50%", 0.5, 0.1), ("old_acc<70%", 0.55, 0.1), ("acc_drop>0", 0.6, 0.1),
           ("acc_drop<2%", 0.6, 0.02), ("acc_drop>-5%", 0.6, 0.2)]


FLIPS = [0, 0, 0.2, 0.5, 1, 1.5, 2, 3, 4, 5]  # × flip_rate: from no flip to far above the threshold's scale
FIXES = [2, 0.5, 2, 1, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]


@pytest.mark.parametrize("expr, old_rate, flip_rate, bet", [
    a + (bet,) for a in ANYTIME for bet in ((None, "agrapa") if a[0].startswith("acc_drop") else (None,))])
def test_an_anytime_decision_is_the_largest_e_value_by_hand(expr, old_rate, flip_rate, bet):
    """p = min(1, 1/max e over the looks) on each side, breach when p < α, clear when the other side's is; a rate's
    interval ends where the e-values by quadrature say: just inside, no look rejects; just outside, one does."""
    t = Threshold.parse(expr)
    theta = float(t.value)
    rng = np.random.default_rng(sum(map(ord, expr)))
    seen = Counter()
    for i, (flips, fixes) in enumerate(zip(FLIPS, FIXES)):
        n = int(rng.integers(100, 300))
        old = rng.random(n) < old_rate
        u = rng.random(n)
        new = np.where(old, u >= flip_rate * flips, u < flip_rate * fixes)
        looks = sorted(set(range(40, n, 40)) | {n})
        got = decide_threshold("task", anytime_entry(old, new, looks, bet), t, ALPHA)
        ps = [min(1.0, 1 / max(e_values_by_hand(old, new, looks, t.metric, theta, greater, bet)))
              for greater in (t.op == ">", t.op != ">")]
        assert got.p_value == pytest.approx(ps[0], rel=1e-5), (i, n)
        assert got.p_within == pytest.approx(ps[1], rel=1e-5), (i, n)
        want = "breach" if ps[0] < ALPHA else "clear" if ps[1] < ALPHA else "undecided"
        if min(abs(math.log(p / ALPHA)) for p in ps) > 1e-4:  # not at α to quadrature precision
            assert got.decision.value == want, (i, n, ps)
        seen[want] += 1
        if t.metric != "acc_drop":
            lo, hi = got.interval
            for end, greater in ((lo, True), (hi, False)):
                if 1e-5 < end < 1 - 1e-5:
                    inside, outside = (end + 1e-5, end - 1e-5) if greater else (end - 1e-5, end + 1e-5)
                    assert max(e_values_by_hand(old, new, looks, t.metric, inside, greater, None)) < 1 / ALPHA
                    assert max(e_values_by_hand(old, new, looks, t.metric, outside, greater, None)) >= 1 / ALPHA
    assert {"breach", "clear", "undecided"} <= set(seen) or t.metric == "old_acc", seen




ACROSS = [  # (threshold, per task: (n, old-right rate, flip rate, fix rate), bet)
    ("overall:acc_drop>0", [(200, 0.6, 0.1, 0.05), (150, 0.5, 0.08, 0.1), (120, 0.7, 0.12, 0.05)], None),
    ("overall:acc_drop>0", [(200, 0.6, 0.02, 0.05), (150, 0.5, 0.05, 0.1), (120, 0.7, 0.04, 0.1)], "agrapa"),
    ("overall:acc_drop>5%", [(300, 0.6, 0.0, 0.1), (250, 0.5, 0.01, 0.2), (300, 0.7, 0.0, 0.1)], None),
    ("overall:acc_drop<5%", [(300, 0.6, 0.0, 0.1), (250, 0.5, 0.01, 0.2), (300, 0.7, 0.0, 0.1)], "agrapa"),
    ("overall:acc_drop>2%", [(100, 0.6, 0.03, 0.02), (80, 0.5, 0.05, 0.05)], None),
]


def test_each_anytime_verdict_across_tasks_by_hand():
    """Each outcome occurs over the cases; each case below."""
    assert {across_case(*case) for case in ACROSS} == {"breach", "clear", "undecided"}


def across_case(expr, tasks, bet):
    """Across K anytime tasks: the product of the tasks' wealths (a stopped task's held) at each round of looks,
    breach ("some task", the task of the largest wealth) when its largest value reaches 1/α; clear when every task is
    shown within θ at α/K; p_within = min(1, K × the largest within-p); else undecided. Each outcome occurs."""
    t = Threshold.parse(expr)
    theta, greater = float(t.value), t.op == ">"
    rng = np.random.default_rng(len(expr) + len(tasks))
    entries, wealth, within = [], [], []
    for n, old_rate, flip, fix in tasks:
        old = rng.random(n) < old_rate
        u = rng.random(n)
        new = np.where(old, u >= flip, u < fix)
        looks = sorted(set(range(50, n, 50)) | {n})
        entries.append(anytime_entry(old, new, looks, bet))
        bets = agrapa_wealth if bet == "agrapa" else grid_wealth
        x = old.astype(float) - new.astype(float)
        wealth.append([bets(x, theta, greater)[m - 1] for m in looks])
        within.append(min(1.0, 1 / max(bets(x, theta, not greater)[m - 1] for m in looks)))
    rounds = max(map(len, wealth))
    product = [math.prod(w[min(r, len(w) - 1)] for w in wealth) for r in range(rounds)]
    p, k = min(1.0, 1 / max(product)), len(tasks)
    worst = max(range(k), key=lambda i: wealth[i][-1])
    names = [f"task{i}" for i in range(k)]
    olds = np.concatenate([e["sequential"]["old"] for e in entries])
    news = np.concatenate([e["sequential"]["new"] for e in entries])
    pooled = {"n": len(olds), "old_acc": olds.mean(), "new_acc": news.mean(),
              "n_negative_flips": int(np.sum((olds == 1) & (news == 0))),
              "n_positive_flips": int(np.sum((olds == 0) & (news == 1)))}
    got = decide_across("overall", names, entries, pooled, t, ALPHA)
    assert got.p_value == pytest.approx(p, rel=1e-9)
    assert got.p_within == pytest.approx(min(1.0, k * max(within)), rel=1e-9)
    want = "breach" if p < ALPHA else "clear" if max(within) < ALPHA / k else "undecided"
    assert got.decision.value == want
    if want == "breach":
        assert (got.across.shows, got.across.worst_task, got.value) == ("some_task", names[worst], pytest.approx(
            entries[worst]["old_acc"] - entries[worst]["new_acc"]))
    else:
        assert (got.across.shows, got.value) == ("pooled", pytest.approx(olds.mean() - news.mean()))
    return want


def test_a_group_entry_outside_its_thresholds_is_the_fixed_n_test_once_its_strata_are_done():
    """The regression flag and the tests across tasks read a group entry's p (`p_beyond`): compare's fixed-n test on
    all N items once the strata the metric needs are done at the last look, else no claim (p = 1)."""
    from adaptguard.compat.evidence import p_beyond

    rng = np.random.default_rng(5)
    seen = Counter()
    for i in range(40):
        old, new, looks = run(rng, 200, 120, [0.0, 0.1, 0.3][i % 3], 0.2, 50, r_first=i % 2 == 1)
        entry = entry_of(old, new, looks, 200)
        x = look_counts(old, new, looks)[-1]
        for metric, theta, op in (("nfr", 0.05, ">"), ("acc_drop", 0.0, ">"), ("pfr", 0.1, "<"), ("btc", 0.9, "<")):
            done = _strata_done(old, looks[-1], metric)
            want = fixed_n_p(metric, x["b"], x["c"], 200, 120, theta, op == ">") if done else 1.0
            assert p_beyond(entry, metric, theta, op) == pytest.approx(want, rel=1e-9), (i, metric, looks)
            seen[done] += 1
    assert set(seen) == {True, False}
    empty = entry_of(np.ones(10, bool), np.ones(10, bool), [], 10)
    assert p_beyond(empty, "nfr", 0.05, ">") == 1.0


def test_a_group_entry_before_its_first_look_decides_nothing():
    """No look yet (a run killed before its first chunk): no estimate where a stratum has no item yet, the baseline's
    accuracy known, every threshold undecided with p = 1 on both sides — except old_acc, decided by the baseline."""
    old = np.array([True] * 30 + [False] * 20)
    entry = entry_of(old, old, [], 50)
    for expr in ("nfr>5%", "nfr<5%", "pfr>5%", "btc<90%", "acc_drop>0", "new_acc>50%"):
        got = decide_threshold("task", entry, Threshold.parse(expr), ALPHA)
        assert (got.value, got.decision.value, got.p_value, got.p_within) == (None, "undecided", 1.0, 1.0), expr
    got = decide_threshold("task", entry, Threshold.parse("old_acc>40%"), ALPHA)
    assert (got.value, got.p_value) == (0.6, pytest.approx(binomtest(30, 50, 0.4, alternative="greater").pvalue))
    # with an empty stratum its rate is known: no old-wrong item, so nothing to fix (pfr 0), whatever the looks
    full = entry_of(np.ones(50, bool), np.ones(50, bool), [], 50)
    assert decide_threshold("task", full, Threshold.parse("pfr>5%"), ALPHA).value == 0.0


def test_anytime_test_names_and_a_task_with_no_look_across_tasks():
    """The anytime decision names its test (the bet where acc_drop's is aGRAPA; "look" or "looks"); across tasks a
    task with no look yet adds nothing to the product of wealths (its wealth is 1)."""
    rng = np.random.default_rng(3)
    old, new = rng.random(60) < 0.7, rng.random(60) < 0.5
    one = decide_threshold("t", anytime_entry(old, new, [60], "agrapa"), Threshold.parse("acc_drop>0"), ALPHA)
    assert one.test == "anytime-valid betting e-process (aGRAPA bet) over 1 look"
    two = decide_threshold("t", anytime_entry(old, new, [30, 60]), Threshold.parse("nfr>5%"), ALPHA)
    assert two.test == "anytime-valid beta-binomial mixture e-process over 2 looks"
    t = Threshold.parse("overall:acc_drop>0")
    full = anytime_entry(old, new, [30, 60])
    none = {"n": 0, "old_acc": 0.5, "new_acc": 0.5, "sequential": {"old": [], "new": [], "looks": []}}
    pooled = {"n": 60, "old_acc": float(old.mean()), "new_acc": float(new.mean()),
              "n_negative_flips": int(np.sum(old & ~new)), "n_positive_flips": int(np.sum(~old & new))}
    alone = decide_across("overall", ["a"], [full], pooled, t, ALPHA)
    both = decide_across("overall", ["a", "b"], [full, none], pooled, t, ALPHA)
    assert both.p_value == pytest.approx(alone.p_value, rel=1e-12)


def test_a_look_where_nothing_changed_at_margin_zero_is_no_evidence_either_way():
    """acc_drop>0 with no item changed after the first look: Tango's score is 0/0 (no variance at margin 0), which
    counts as a score of 0 on both sides — no boundary crossed, each side's p the normal tail at 0 (0.5), as the
    second implementation computes it; undecided, to be decided by later looks."""
    old = np.array([True, False] * 150)
    entry = entry_of(old, old, [60], 300)
    want = group_decision(old, old, [60], 300, 150, 150, "acc_drop", 0.0, ">", ALPHA)
    got = decide_threshold("task", entry, Threshold.parse("acc_drop>0"), ALPHA)
    assert (got.decision.value, got.p_value, got.p_within) == (want["decision"], want["p_value"], want["p_within"]) \
        == ("undecided", norm.sf(0.0), norm.sf(0.0))
