"""The group design's numbers against a second implementation written here (issue 95: found by mutation testing,
`benchmarks/mutation.sh`): every early boundary of several designs by a plain-Python recursion over the counts
(scipy's binomial pmf and cdf, the O'Brien–Fleming share written out), the stagewise p-value where a run stops, each
threshold's pool as `rate_pool` must set it, and a group entry's values over all items counted by hand."""

import math

import numpy as np
import pytest
from independent import boundaries, first_cut, share

from adaptguard.compat.stats import group_sequential as gs

ALPHA = 0.05


DESIGNS = [  # (metric, greater, N, M_R, M_W, θ, the stratum's looks)
    ("nfr", True, 400, 200, 200, 0.05, [50, 100, 150, 200]),
    ("nfr", True, 300, 120, 180, 0.03, [20, 45, 60, 100, 120]),
    ("nfr", True, 1000, 600, 400, 0.02, [100, 200, 300, 450, 600]),
    ("nfr", True, 80, 40, 40, 0.1, [10, 20, 30]),
    ("nfr", True, 500, 100, 400, 0.01, [25, 50, 75, 100]),
    ("nfr", False, 400, 250, 150, 0.08, [50, 100, 150, 200, 250]),
    ("pfr", True, 300, 100, 200, 0.05, [40, 80, 120, 160, 200]),
    ("btc", False, 300, 200, 100, 0.9, [40, 80, 120, 160, 200]),
    ("btc", True, 300, 200, 100, 0.8, [40, 80, 120, 160, 200]),
]


@pytest.mark.parametrize("metric, greater, big_n, m_r, m_w, theta, looks", DESIGNS)
def test_every_boundary_equals_the_second_implementation(metric, greater, big_n, m_r, m_w, theta, looks):
    stratum, _, offset, n_final, th = gs.rate_pool(metric, greater, big_n, m_r, m_w, theta)
    pool = m_r if stratum == "R" else m_w
    q0 = (th * n_final - offset) / pool
    cut = first_cut(offset, n_final, th, ALPHA, pool)
    assert gs.final_cut(offset, n_final, th, ALPHA, pool) == cut
    want, _ = boundaries(looks, pool, q0, cut, ALPHA)
    got = gs.rate_boundaries(looks, pool, q0, cut, ALPHA)
    assert got == want
    assert sum(math.isfinite(b) for b in got[:-1]) >= 1, got  # each design can stop early somewhere
    assert gs.rate_size(looks, pool, q0, cut, got) <= ALPHA


@pytest.mark.parametrize("metric, greater, big_n, m_r, m_w, theta, looks", DESIGNS[:5])
def test_the_stagewise_p_where_a_run_stops(metric, greater, big_n, m_r, m_w, theta, looks):
    """A run whose count reaches the boundary at the third look (and stayed below it before): it stops there, and
    its p-value is P(a crossing at an earlier look) + P(no earlier crossing, a count ≥ the one seen at this look),
    both from the recursion above."""
    stratum, count_of, offset, n_final, th = gs.rate_pool(metric, greater, big_n, m_r, m_w, theta)
    pool = m_r if stratum == "R" else m_w
    q0 = (th * n_final - offset) / pool
    cut = first_cut(offset, n_final, th, ALPHA, pool)
    bounds, history = boundaries(looks, pool, q0, cut, ALPHA)
    j = next(i for i, b in enumerate(bounds[:-1]) if math.isfinite(b) and i >= 1)
    k = int(bounds[j])
    earlier = sum(p for i in range(j) if math.isfinite(bounds[i]) for c, p in history[i].items() if c >= bounds[i])
    want = min(ALPHA, earlier + sum(p for c, p in history[j].items() if c >= k))

    # a group entry with that count of flips at look j and below every boundary before
    old = np.array([True] * m_r + [False] * m_w)
    order = np.arange(big_n)
    order = np.concatenate([order[old], order[~old]]) if stratum == "R" else np.concatenate([order[~old], order[old]])
    new = old.copy()
    flips_by_look = [0] * j + [k]
    done = 0
    for look, flips in zip(looks, flips_by_look):
        chunk = order[done:look]
        new[chunk[:flips]] = not old[chunk[0]]
        done = look
    n_looks = looks[: j + 1]
    entry = {"sequential": {"design": "group", "items": big_n, "strata": {"R": m_r, "W": m_w},
                            "old": old[order].astype(int).tolist(), "new": new[order].astype(int).tolist(),
                            "looks": n_looks}}
    where, p = gs.rate_side(entry, metric, theta, greater, ALPHA, gs.group_looks(entry))
    assert where == j and p == pytest.approx(want, rel=1e-9)
    assert count_of(gs.group_looks(entry)[j]) == k


@pytest.mark.parametrize("metric, greater, expected", [
    # (stratum, count at the look below, offset, items of the fixed-n test, θ′) for N 100, M_R 60, M_W 40, θ 0.2
    ("nfr", True, ("R", 7, 0, 100, 0.2)),      # right → wrong flips among the old-right
    ("nfr", False, ("R", 23, 40, 100, 0.8)),   # kept among the old-right, plus the 40 old-wrong that cannot flip
    ("pfr", True, ("W", 5, 0, 100, 0.2)),      # wrong → right among the old-wrong
    ("pfr", False, ("W", 15, 60, 100, 0.8)),
    ("btc", True, ("R", 23, 0, 60, 0.2)),      # btc over the old-right: kept
    ("btc", False, ("R", 7, 0, 60, 0.8)),      # and its opposite: broke
])
def test_each_threshold_sides_pool(metric, greater, expected):
    look = {"n": 50, "n_r": 30, "n_w": 20, "b": 7, "c": 5}
    stratum, count, offset, n_final, th = gs.rate_pool(metric, greater, 100, 60, 40, 0.2)
    assert (stratum, count(look), offset, n_final, th) == pytest.approx(expected)


def test_a_group_entrys_values_counted_by_hand():
    """10 items, 6 old-right (R) and 4 old-wrong (W), looked at after 5 of them: R R W R W — 1 flip among 3 R, 1 fix
    among 2 W. Over all items at that look: nfr ≈ (1/3·6)/10, pfr ≈ (1/2·4)/10, btc ≈ 1 − 1/3, and so on; the fixed-n
    entry once R is done (all 6: 2 flips) knows nfr and btc exactly and not new_acc (W not done)."""
    old = [1, 1, 0, 1, 0, 1, 1, 1, 0, 0]
    new = [0, 1, 1, 1, 0, 1, 0, 1, 0, 0]
    entry = {"sequential": {"design": "group", "items": 10, "strata": {"R": 6, "W": 4}, "old": old, "new": new,
                            "looks": [5]}}
    (look,) = gs.group_looks(entry)
    assert look == {"n": 5, "n_r": 3, "n_w": 2, "b": 1, "c": 1}
    est = {m: gs.group_estimate(entry, m) for m in ("old_acc", "nfr", "btc", "pfr", "acc_drop", "new_acc")}
    assert est == pytest.approx({"old_acc": 0.6, "nfr": 0.2, "btc": 2 / 3, "pfr": 0.2, "acc_drop": 0.0,
                                 "new_acc": 0.6})
    empty = {"sequential": {**entry["sequential"], "looks": []}}
    assert gs.group_estimate(empty, "nfr") is None and gs.group_estimate(empty, "old_acc") == 0.6
    only_r = {"sequential": {"design": "group", "items": 10, "strata": {"R": 6, "W": 4}, "old": [1] * 6,
                             "new": [0, 1, 1, 0, 1, 1], "looks": [6]}}
    full = gs.full_entry(only_r, gs.group_looks(only_r)[-1])
    assert full == pytest.approx({"n": 10, "old_acc": 0.6, "new_acc": None, "n_negative_flips": 2,
                                  "n_positive_flips": None, "nfr": 0.2, "pfr": None, "btc": 4 / 6})
    no_r = {"sequential": {"design": "group", "items": 4, "strata": {"R": 0, "W": 4}, "old": [0, 0],
                           "new": [1, 0], "looks": [2]}}
    assert gs.group_estimate(no_r, "nfr") == 0.0 and gs.group_estimate(no_r, "pfr") == pytest.approx(0.5)


def test_the_edges_of_the_fixed_n_cut_and_the_spending():
    # a pool that cannot change the fixed-n decision: the offset alone rejects, so the cut is 0 (also for no pool)
    assert first_cut(30, 40, 0.5, ALPHA, 5) == 0
    assert gs.final_cut(30, 40, 0.5, ALPHA, 5) == 0 and gs.final_cut(30, 40, 0.5, ALPHA, 0) == 0
    assert gs.final_cut(0, 40, 0.5, ALPHA, 0) is None  # no item to count, and no flip rejects
    assert gs.obf_spent(0.0, 0.05) == 0.0 and gs.obf_spent(0.5, 0.0) == 0.0
    assert gs.obf_spent(1.0, 0.05) == pytest.approx(0.05) and gs.obf_spent(1.7, 0.05) == pytest.approx(0.05)
    assert gs.obf_spent(0.25, 0.05) == pytest.approx(ALPHA * share(0.25, ALPHA), rel=1e-12)


def test_the_proportional_order_keeps_each_strata_share_and_its_order():
    right, wrong = [10, 11, 12, 13, 14, 15], [20, 21, 22]
    order = gs.proportional_order(right, wrong)
    assert sorted(order) == sorted(right + wrong)
    assert [d for d in order if d in right] == right and [d for d in order if d in wrong] == wrong
    for n in range(1, 10):
        assert abs(sum(d in right for d in order[:n]) - n * 6 / 9) <= 1
    assert order[0] == 10  # the larger stratum's first item comes first (its key 0.5/6 < 0.5/3)
    assert gs.proportional_order([], wrong) == wrong and gs.proportional_order(right, []) == right
