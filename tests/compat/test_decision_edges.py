"""Decisions exactly at their edges, with values written out by hand or computed by scipy and the standard library
(issue 95: the survivors of the mutation run): the churn rule at p = α, the anytime interval and e-values where
nothing has been evaluated or rejected, and the spread of a side's runs."""

import statistics

import numpy as np
import pytest

from adaptguard.compat.decide import churn_rule
from adaptguard.compat.stats.anytime import anytime_bounds, anytime_e_values
from adaptguard.compat.stats.replicates import replicate_flips


@pytest.mark.parametrize("p, churn", [((0.05, 0.05, 0.05), True), ((0.0499, 0.05, 0.05), False),
                                      ((0.05, 0.0499, 0.05), False), ((0.05, 0.05, 0.0499), False)])
def test_churn_is_no_test_rejecting_and_p_equal_to_alpha_does_not_reject(p, churn):
    """Each of the three tests rejects at p < α only (as every test of the gate): at p = α exactly none has, so the
    task is churn; any one of them just below α and it is not."""
    entry = churn_rule(0.25, 0.3, 0.28, 0.27, p, 0.05)
    assert entry == {"chance": 0.25, "guess_rate": 0.3, "old_acc": 0.28, "new_acc": 0.27, "p_above_chance": p[0],
                     "p_new_below_chance": p[1], "p_flips_beyond_guessing": p[2], "churn": churn}


def entry(old, new, looks):
    return {"sequential": {"old": old, "new": new, "looks": looks}}


def test_an_interval_nothing_has_narrowed_is_all_rates_and_a_look_of_no_item_bets_nothing():
    """Before any item (or with too few to reject any θ at α) the anytime interval is [0, 1] exactly; a look of 0
    items has e-value 1 (no wealth won or lost), for a rate and for acc_drop's bet."""
    assert anytime_bounds(entry([], [], [0]), "nfr", 0.05) == (0.0, 1.0)
    assert anytime_bounds(entry([True], [False], [1]), "nfr", 0.05) == (0.0, 1.0)  # one flip rejects no θ at 5 %
    assert anytime_e_values(entry([], [], [0]), "nfr", 0.05, ">") == [1.0]
    for bet in (None, "agrapa"):
        s = entry([True, True], [False, True], [0, 2])
        s["sequential"]["bet"] = bet
        assert anytime_e_values(s, "acc_drop", 0.0, ">")[0] == 1.0


def test_the_spread_of_three_runs_is_their_sample_standard_deviation():
    """`spread_new`: the NFR of each new run against every old run, summarised by min, max and the sample standard
    deviation (n − 1), as `statistics.stdev` computes it."""
    rng = np.random.default_rng(3)
    old = rng.random((2, 40)) < 0.7
    new = rng.random((3, 40)) < 0.6
    per_new = [statistics.mean(float(np.mean(o & ~w)) for o in old) for w in new]
    spread = replicate_flips(old, new)["spread_new"]
    assert spread["min"] == pytest.approx(min(per_new)) and spread["max"] == pytest.approx(max(per_new))
    assert spread["sd"] == pytest.approx(statistics.stdev(per_new))
    assert "spread_old" not in replicate_flips(old, new)  # two old runs: no spread


def test_overall_with_significance_off_is_the_pooled_drop_against_its_margin():
    """`overall:acc_drop>θ` with the significance off: the pooled drop (old − new accuracy over every item of every
    task, counted here) against θ, breach when beyond it — and the record says it is the pooled drop that was
    compared (`Across(shows=pooled)`), with no test's p-values."""
    from adaptguard.compat.decide import decide_across, pooled_entry
    from adaptguard.compat.gate import Threshold
    from adaptguard.compat.verdicts import Across, Shows

    olds = [np.array([[1, 1, 1, 1, 0]], bool), np.array([[1, 1, 0]], bool)]
    news = [np.array([[1, 0, 1, 1, 0]], bool), np.array([[1, 1, 1]], bool)]
    pooled = pooled_entry(olds, news)
    entries = [pooled_entry([o], [n]) for o, n in zip(olds, news)]
    drop = (6 - 6) / 8  # 6 of 8 right on each side
    for expr, decision in (("overall:acc_drop>0", "clear"), ("overall:acc_drop<1%", "breach")):
        got = decide_across("overall", ["a", "b"], entries, pooled, Threshold.parse(expr), None)
        assert (got.value, got.decision.value, got.across) == (drop, decision, Across(Shows.POOLED))
        assert got.across.to_json() == {"shows": "pooled", "worst_task": None}


def test_one_success_where_n_times_rate_is_one_or_more_is_the_plain_binomial_p():
    """The one-success rule (p = n·θ where n·θ < 1, the rates on one item) stops at n·θ = 1: from there the binomial
    p itself, P(X ≥ 1) = 1 − (1 − θ)^n, written out; below it n·θ."""
    from adaptguard.compat.stats.metrics import binomial_p

    assert binomial_p(1, 30, 0.05, True) == pytest.approx(1 - 0.95 ** 30, rel=1e-12)  # n·θ = 1.5
    assert binomial_p(1, 20, 0.05, True) == pytest.approx(1 - 0.95 ** 20, rel=1e-12)  # n·θ = 1
    assert binomial_p(1, 10, 0.05, True) == pytest.approx(0.5, rel=1e-12)  # n·θ = 0.5 > 1 − 0.95^10 = 0.40


def test_rate_intervals_of_no_item_and_the_bootstrap_one():
    """No item: no interval (nan, nan), both ends. The bootstrap interval of the NFR (`interval="bootstrap"`) is the
    percentile interval of Binomial(N, p̂)/N draws from the seeded generator, at the level asked: recomputed here."""
    import math

    from adaptguard.compat.stats.metrics import exact_rate_ci, flip_metrics

    assert all(math.isnan(x) for x in exact_rate_ci(0, 0, 0.9))
    old = np.array([True] * 3000 + [False] * 1000)
    new = old.copy()
    new[:450] = False
    got = flip_metrics(old, new, n_boot=200, level=0.9, seed=7, interval="bootstrap")["nfr_ci"]
    draws = np.random.default_rng(7).binomial(4000, 450 / 4000, size=200) / 4000  # fine enough that the seed shows
    assert got == (pytest.approx(float(np.quantile(draws, 0.05))), pytest.approx(float(np.quantile(draws, 0.95))))
    assert got[0] < 450 / 4000 < got[1]


def test_a_group_entry_without_an_old_right_item_leaves_btc_undecided():
    """btc is not defined without an item the old model got right: undecided, p = 1 on both sides, and the decision
    names its task."""
    from adaptguard.compat.decide import decide_threshold
    from adaptguard.compat.gate import Threshold

    old = [0] * 40
    entry = {"sequential": {"design": "group", "items": 40, "strata": {"R": 0, "W": 40}, "old": old,
                            "new": [1, 0] * 20, "looks": [20, 40]}}
    got = decide_threshold("my_task", entry, Threshold.parse("btc<90%"), 0.05)
    assert (got.task, got.decision.value, got.p_value, got.p_within) == ("my_task", "undecided", 1.0, 1.0)


def test_a_group_estimate_is_exact_where_its_counts_are():
    """An estimate is computed from the counts exactly and rounded once: 1 right → wrong among 5 old-right items
    evaluated of 7 gives BTC = 1 − (1/5 · 7)/7 = 4/5 exactly, so `btc<80%` with the significance off is at its
    threshold (not beyond it), as compare's raw comparison says of an exact 80 %."""
    from fractions import Fraction

    from adaptguard.compat.decide import decide_threshold
    from adaptguard.compat.gate import Threshold
    from adaptguard.compat.reading.records import group_view
    from adaptguard.compat.verdicts import Decision, Reason

    seq = {"design": "group", "old": [1] * 5, "new": [0, 1, 1, 1, 1], "looks": [5], "items": 8,
           "strata": {"R": 7, "W": 1}}
    entry = {"sequential": seq, **group_view(seq)}
    assert entry["btc"] == float(1 - Fraction(1, 5)) == 0.8
    assert entry["nfr"] == float(Fraction(1 * 7, 5 * 8))  # 7/40
    d = decide_threshold("t", entry, Threshold.parse("btc<80%"), None)
    assert (d.decision, d.reason) == (Decision.CLEAR, Reason.AT_THRESHOLD_RAW)
