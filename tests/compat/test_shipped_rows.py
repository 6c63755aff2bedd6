"""The shipped rows of `compat.metric_table` against a table written here (issue 95.3): a wrong direction, count
source, churn rule, stratum or test kind in one row fails a test; each rate row is decided once through the gate on
a hand-made task whose p-values come from scipy's binomtest; the lm-eval task YAMLs' higher_is_better agrees."""

import pytest
import yaml
from conftest import ROOT
from scipy.stats import binomtest

from adaptguard.compat.gate import Threshold, check_gate
from adaptguard.compat.metric_table import METRICS, Unit
from adaptguard.compat.verdicts import Decision, Evidence

O, R, A, G = Evidence.ONE_RUN, Evidence.REPLICATES, Evidence.ANYTIME, Evidence.GROUP
# name: unit, a rise is worse, about flips (left out on churn tasks), which items can flip it, tests, column
TABLE = {
    "nfr": (Unit.RATE, True, True, "R", {O, R, A, G}, "NFR %"),
    "pfr": (Unit.RATE, False, True, "W", {O, A, G}, "PFR %"),
    "btc": (Unit.RATE, False, True, "R", {O, A, G}, "BTC %"),
    "inconsistency_flips": (Unit.RATE, True, True, None, {O}, "incons. %"),
    "old_acc": (Unit.RATE, False, False, "", {O, A, G}, "acc old → new"),
    "new_acc": (Unit.RATE, False, False, "RW", {O, A, G}, "acc old → new"),
    "smooth_nfr": (Unit.RATE, True, True, None, {O}, "smooth NFR %"),
    "smooth_pfr": (Unit.RATE, False, True, None, {O}, "smooth PFR %"),
    "acc_drop": (Unit.DIFFERENCE, True, False, "RW", {O, R, A, G}, "acc old → new"),
    "excess_nfr": (Unit.DIFFERENCE, True, True, None, {R}, "excess NFR %"),
    "m_g": (Unit.SCORE, False, False, None, set(), "m_g"),
    "m_r": (Unit.SCORE, True, False, None, set(), "m_r"),
    "mean_delta": (Unit.SCORE, False, False, None, set(), None),
}
DELTAS = {"nfr": True, "pfr": False, "inconsistency_flips": True, "smooth_nfr": True, "smooth_pfr": False,
          "m_g": False, "m_r": True}

# one task of 200 items: 120 right before (old_acc 60 %), 20 broke (right → wrong), 10 fixed (wrong → right),
# so 110 right after; 12 wrong answers changed; smooth flips on 30 and 8 items
ENTRY = {"task": "t", "filter": "none", "metric": "acc", "n": 200, "old_acc": 0.6, "new_acc": 0.55,
         "n_negative_flips": 20, "n_positive_flips": 10, "nfr": 0.1, "pfr": 0.05, "btc": 100 / 120,
         "inconsistency_flips": 0.06, "smooth_nfr": 0.15, "smooth_pfr": 0.04, "churn": {"churn": False}}
# (successes, trials) of each rate row in ENTRY, counted by hand from the sentence above
COUNTS = {"nfr": (20, 200), "pfr": (10, 200), "btc": (100, 120), "inconsistency_flips": (12, 200),
          "old_acc": (120, 200), "new_acc": (110, 200), "smooth_nfr": (30, 200), "smooth_pfr": (8, 200)}


def test_the_shipped_rows_are_the_table():
    shipped = {name: (m.unit, m.higher_is_worse, m.about_flips, m.can_flip, set(m.tests), m.column)
               for name, m in METRICS.items() if not name.startswith("delta_")}
    assert shipped == TABLE
    for key, worse in DELTAS.items():
        for pct in ("", "_pct"):
            m = METRICS[f"delta_{key}{pct}"]
            assert (m.unit, m.higher_is_worse, m.tests, m.column) == (
                Unit.SCORE if pct else Unit.DIFFERENCE, worse, frozenset(), "ΔNFR_c")
    assert len(METRICS) == len(TABLE) + 2 * len(DELTAS)


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_each_rate_rows_counts(name):
    assert METRICS[name].count(ENTRY) == COUNTS[name]


@pytest.mark.parametrize("name", sorted(COUNTS))
@pytest.mark.parametrize("op", [">", "<"])
def test_each_rate_row_decided_once_through_the_gate(name, op):
    """At a threshold 4 points from the observed rate on the side `op` tests, the decision and its p-value are the
    exact binomial test's on the hand-counted (k, n), with the row's direction deciding which side is a breach."""
    k, n = COUNTS[name]
    rate = k / n
    theta = round(rate - 0.04 if op == ">" else rate + 0.04, 4)
    t = Threshold.parse(f"{name}{op}{theta * 100:g}%")
    report = {"old": "a", "new": "b", "alpha": 0.05, "tasks": {"t": dict(ENTRY)}}
    gate = check_gate(report, [t], significance=0.05)
    (d,) = gate.decisions
    p_beyond = binomtest(k, n, theta, alternative="greater" if op == ">" else "less").pvalue
    p_within = binomtest(k, n, theta, alternative="less" if op == ">" else "greater").pvalue
    assert d.p_value == pytest.approx(p_beyond, rel=1e-9) and d.p_within == pytest.approx(p_within, rel=1e-9)
    expected = Decision.BREACH if p_beyond < 0.05 else Decision.CLEAR if p_within < 0.05 else Decision.UNDECIDED
    assert d.decision is expected


@pytest.mark.parametrize("name", ["nfr", "pfr", "btc", "inconsistency_flips"])
def test_a_flip_row_is_left_out_on_a_churn_task_and_an_accuracy_row_is_not(name):
    report = {"old": "a", "new": "b", "alpha": 0.05, "tasks": {"t": {**ENTRY, "churn": {"churn": True}}}}
    gate = check_gate(report, [Threshold.parse(f"{name}>5%"), Threshold.parse("new_acc<60%")], significance=0.05)
    assert [x.reason for x in gate.left_out] == ["churn"] and [d.expr for d in gate.decisions] == ["new_acc<60%"]


def test_the_lm_eval_tasks_higher_is_better_is_the_rows_direction():
    seen = 0
    for path in sorted((ROOT / "lm_eval_tasks" / "compat").glob("*.yaml")):
        for entry in yaml.safe_load(path.read_text().replace("!function", "")).get("metric_list", []):
            if entry["metric"] in TABLE:
                assert entry["higher_is_better"] is not TABLE[entry["metric"]][1], (path.name, entry["metric"])
                seen += 1
    assert seen >= 8


def test_the_tables_lookups_by_name_including_names_it_lacks():
    """What the readers ask of the table, answered from the literal table above; a name without a row is no rate,
    has no test, is not about flips and needs both strata (evaluate evaluates every item for it)."""
    from adaptguard.compat.metric_table import about_flips, in_rate_units, is_rate, strata, tested

    for name, (unit, _, flips, can_flip, tests, _) in TABLE.items():
        assert strata(name) == ("RW" if can_flip is None else can_flip), name
        assert is_rate(name) is (unit is Unit.RATE) and in_rate_units(name) is (unit is not Unit.SCORE), name
        assert about_flips(name) is flips, name
        assert all(tested(name, kind) is (kind in tests) for kind in Evidence), name
    for missing in ("no_such_metric", "accuracy"):
        assert strata(missing) == "RW" and not is_rate(missing) and not in_rate_units(missing)
        assert not about_flips(missing) and not any(tested(missing, kind) for kind in Evidence)
