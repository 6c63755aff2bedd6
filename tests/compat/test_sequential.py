"""The anytime-valid tests of `adaptguard evaluate` (issue 75): each e-value against an independent computation,
validity under peeking by simulation, the confidence sequence deciding exactly as the test, and docs/compat.md's
tables against the committed replay."""

import importlib.util
import json
import math

import numpy as np
import pytest
from conftest import ROOT
from scipy.integrate import quad
from scipy.stats import beta

from adaptguard.compat.stats.anytime import anytime_bounds, anytime_e_values, drop_e_process, rate_e_value


@pytest.mark.parametrize("k, n, rate, greater", [(3, 50, 0.02, True), (0, 300, 0.02, False), (20, 100, 0.1, True),
                                                 (5, 100, 0.1, False), (40, 60, 0.6, True), (1, 1, 0.5, False)])
def test_the_mixture_e_value_is_the_integral_it_names(k, n, rate, greater):
    """∫ L(p) π(dp) / L(rate) with π the Beta(1, max(1, (1 − rate)/rate)) prior restricted to the alternative, by
    quadrature."""
    b0 = max(1.0, (1 - rate) / rate)
    lo, hi = (rate, 1.0) if greater else (0.0, rate)
    mass = beta.sf(rate, 1, b0) if greater else beta.cdf(rate, 1, b0)
    num = quad(lambda p: p ** k * (1 - p) ** (n - k) * beta.pdf(p, 1, b0), lo, hi, points=[k / n], limit=200)[0]
    assert rate_e_value(k, n, rate, greater) == pytest.approx(num / mass / (rate ** k * (1 - rate) ** (n - k)),
                                                              rel=1e-6)


def test_the_betting_e_process_is_the_average_of_its_constant_bets():
    rng = np.random.default_rng(0)
    x = rng.choice([-1, 0, 1], size=200, p=[0.05, 0.85, 0.10])
    for margin, greater in ((0.01, True), (0.02, False), (-0.3, True)):
        reach = 1 / (1 + margin) if greater else 1 / (1 - margin)
        sign = 1 if greater else -1
        wealth = [np.prod([1 + lam * reach * sign * (v - margin) for v in x]) for lam in np.geomspace(1e-3, 0.9, 24)]
        assert drop_e_process(x, margin, greater)[-1] == pytest.approx(np.mean(wealth), rel=1e-9)
    assert np.all(drop_e_process(x, 1.0, True) == 1.0)  # "drop > 100 %" never holds
    assert np.isinf(drop_e_process(x, 1.0, False)[-1])  # "drop < 100 %": refuted by the first item that did not break


def test_peeking_after_every_chunk_keeps_alpha():
    """A look every 20 items up to 600, at the null boundary: a rate at exactly θ, and a drop of exactly the margin
    with 5 % of the items fixed; the share of runs that ever reject stays ≤ α (plus simulation error)."""
    rng = np.random.default_rng(11)
    sims, looks = 300, list(range(20, 601, 20))
    rates = [0, 0]
    drops = [0, 0]
    for _ in range(sims):
        k = np.cumsum(rng.random(600) < 0.05)
        rates[0] += any(rate_e_value(int(k[n - 1]), n, 0.05, True) >= 20 for n in looks)
        rates[1] += any(rate_e_value(int(k[n - 1]), n, 0.05, False) >= 20 for n in looks)
        u = rng.random(600)
        x = np.where(u < 0.07, 1, np.where(u < 0.12, -1, 0))  # drop 0.02 = 0.07 − 0.05
        drops[0] += drop_e_process(x, 0.02, True)[np.array(looks) - 1].max() >= 20
        drops[1] += drop_e_process(x, 0.02, False)[np.array(looks) - 1].max() >= 20
    bound = 0.05 + 3 * math.sqrt(0.05 * 0.95 / sims)
    assert max(rates + drops) / sims <= bound, (rates, drops)


def test_the_confidence_sequence_decides_exactly_as_the_test():
    rng = np.random.default_rng(2)
    for _ in range(40):
        n = int(rng.integers(20, 300))
        old = np.ones(n, bool)
        new = rng.random(n) >= rng.uniform(0, 0.3)
        looks = sorted(set(list(range(25, n, 25)) + [n]))
        entry = {"sequential": {"old": old.astype(int).tolist(), "new": new.astype(int).tolist(), "looks": looks}}
        lo, hi = anytime_bounds(entry, "nfr", 0.05)
        for theta in (0.01, 0.03, 0.05, 0.1, 0.2):
            breach = max(anytime_e_values(entry, "nfr", theta, ">")) >= 20
            clear = max(anytime_e_values(entry, "nfr", theta, "<")) >= 20
            if abs(theta - lo) > 1e-6:
                assert breach == (theta < lo), (n, theta, lo)
            if abs(theta - hi) > 1e-6:
                assert clear == (theta > hi), (n, theta, hi)


def test_the_replay_file_holds_alpha_never_contradicts_and_is_the_docs_table():
    out = json.loads((ROOT / "studies/results/sequential.json").read_text())
    for row in out["size_under_peeking"]:
        bound = out["alpha"] + 3 * math.sqrt(out["alpha"] * (1 - out["alpha"]) / row["sims"])
        assert row["breach"] <= bound and row.get("clear", 0) <= bound, row
    assert all(r["opposite_decision"] == 0 for r in out["replay"].values())
    for expr, r in out["replay"].items():  # the summary recomputed from the rows
        rows = [x for x in out["rows"] if x["expr"] == expr]
        assert r["same_decision"] == sum(x["sequential"] == x["fixed_n"] for x in rows)
        decided = [x["share"] for x in rows if x["fixed_n"] != "undecided"]
        assert r["median_share_where_fixed_n_decided"] == pytest.approx(float(np.median(decided)))
    spec = importlib.util.spec_from_file_location("sequential_replay", ROOT / "studies/sequential_replay.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = (ROOT / "docs/compat.md").read_text()
    assert text.split("<!-- sequential:start -->\n")[1].split("<!-- sequential:end -->")[0] == module.markdown(out)


def test_issue_87s_arms_and_sizes_in_the_replay_file():
    """The group design's rows (studies/results/sequential.json, arms A1, A2, A0g): the summaries recomputed from the
    rows, no opposite decision in any arm, the group design never undecided where the fixed-n gate decides (its last
    look is that gate), every exact size of the rate tests ≤ α, the simulated ones within simulation error of α."""
    out = json.loads((ROOT / "studies/results/sequential.json").read_text())
    for arm, per in out["arms"].items():
        for expr, r in per.items():
            rows = [x for x in out["arm_rows"] if x["arm"] == arm and x["expr"] == expr]
            decided = [x["share"] for x in rows if x["fixed_n"] != "undecided"]
            assert r["median_share_where_fixed_n_decided"] == pytest.approx(float(np.median(decided)))
            assert r["mean_share_where_fixed_n_decided"] == pytest.approx(float(np.mean(decided)))
            assert r["opposite_decision"] == 0 == sum({x["sequential"], x["fixed_n"]} == {"breach", "clear"}
                                                      for x in rows)
            if arm == "A2":
                assert r["sequential_undecided_where_fixed_n_decided"] == 0
    for row in out["group_size_rates"]:
        assert row["breach"] <= out["alpha"] and row["clear"] <= out["alpha"], row
    for row in out["group_size_margin"]:
        bound = out["alpha"] + 3 * math.sqrt(out["alpha"] * (1 - out["alpha"]) / row["sims"])
        assert row["breach"] <= bound and row["clear"] <= bound, row


def test_the_betting_e_processes_at_margins_of_plus_and_minus_one():
    """No drop exceeds 1 or falls below −1: "drop > 1" and "drop < −1" never hold (wealth 1 throughout); "drop < 1"
    is refuted (wealth ∞) from the first item that did not break, "drop > −1" from the first that was not fixed —
    for the grid of bets and for aGRAPA alike; a run with no look yet has p = 1."""
    from adaptguard.compat.stats.anytime import agrapa_e_process, anytime_p

    x = [1, 1, 0, -1, 1]
    for bet in (drop_e_process, agrapa_e_process):
        assert list(bet(x, 1.0, True)) == [1.0] * 5 and list(bet(x, -1.0, False)) == [1.0] * 5
        assert list(bet(x, 1.0, False)) == [1.0, 1.0, math.inf, math.inf, math.inf]
        assert list(bet(x, -1.0, True)) == [math.inf] * 5
        assert list(bet([-1, -1, 0], -1.0, True)) == [1.0, 1.0, math.inf]
    empty = {"sequential": {"old": [], "new": [], "looks": []}}
    assert anytime_p(empty, "nfr", 0.05, ">") == 1.0 and anytime_p(empty, "acc_drop", 0.0, ">") == 1.0
