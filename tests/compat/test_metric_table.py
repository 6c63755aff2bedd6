"""A new metric is one row of `compat.metric_table` (issue 88.1): added to the table, the gate parses it in its unit,
decides it by the test its row names (checked against scipy's binomial test), leaves it out on churn tasks when it
is about flips, and the report marks its column; removed, the gate refuses it."""

import pytest
from scipy.stats import binomtest

from adaptguard.compat import metric_table
from adaptguard.compat.gate import GateError, Threshold, check_gate
from adaptguard.compat.metric_table import ONE_RUN, Metric, Unit
from adaptguard.compat.render.report import table_rows
from adaptguard.compat.verdicts import Decision


def _report(both_wrong: float, churn: bool = False) -> dict:
    """One task of 200 items, one run per side, carrying a metric the table does not know yet."""
    entry = {"task": "t", "filter": "none", "metric": "acc", "n": 200, "old_acc": 0.6, "new_acc": 0.55,
             "nfr": 0.1, "pfr": 0.05, "btc": 80 / 120, "n_negative_flips": 20, "n_positive_flips": 10,
             "both_wrong": both_wrong, "churn": {"churn": churn}}
    return {"old": "a", "new": "b", "alpha": 0.05, "tasks": {"t": entry}}


@pytest.fixture
def both_wrong_row(monkeypatch):
    """The one row: a share of the items, a rise is worse, about flips, tested on one run, shown as PFR's column."""
    row = Metric("both_wrong", Unit.RATE, True, about_flips=True, tests=frozenset({ONE_RUN}),
                 counts=lambda e: (round(e["both_wrong"] * e["n"]), e["n"]), column="PFR %")
    monkeypatch.setitem(metric_table.METRICS, "both_wrong", row)
    return row


def test_a_metric_the_table_lacks_is_refused():
    with pytest.raises(GateError, match="unknown metric 'both_wrong'"):
        Threshold.parse("both_wrong>20%")


@pytest.mark.parametrize("k, op, decision", [(60, ">", Decision.BREACH), (20, ">", Decision.CLEAR),
                                             (44, ">", Decision.UNDECIDED), (20, "<", Decision.BREACH)])
def test_one_row_makes_a_metric_gated_by_its_test(both_wrong_row, k, op, decision):
    t = Threshold.parse(f"both_wrong{op}20%")
    gate = check_gate(_report(k / 200), [t], significance=0.05)
    d = gate.decisions[0]
    alternative = "greater" if op == ">" else "less"
    p = binomtest(k, 200, 0.2, alternative=alternative).pvalue  # the exact binomial test, by scipy
    assert d.p_value == pytest.approx(p, rel=1e-9)
    assert d.decision is decision and gate.status is decision


def test_the_row_sets_the_unit_and_the_churn_rule(both_wrong_row):
    with pytest.raises(GateError, match="both_wrong is a rate"):
        Threshold.parse("both_wrong>20")  # a rate slip: 20 % or 0.2
    gate = check_gate(_report(0.3, churn=True), [Threshold.parse("both_wrong>20%")], significance=0.05)
    assert not gate.decisions and gate.left_out[0].reason == "churn"


def test_the_report_marks_the_rows_column_on_a_breach(both_wrong_row):
    report = _report(0.3)
    from adaptguard.compat.comparison import Comparison

    report = Comparison.of(report)
    report.gate = check_gate(report, [Threshold.parse("both_wrong>20%")], significance=0.05)
    header, rows = table_rows(report)
    assert rows[0][header.index("PFR %")].endswith("(!)")
