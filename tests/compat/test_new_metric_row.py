"""A new metric is one row of `compat.metric_table` (issue 96.1). `flip_rate`, the share of items whose answer changed
(right → wrong or wrong → right), is added to the table and to nothing else: `compare` reports it on one run and on
replicate runs (the mean over every pair of runs, counted here by loops), the gate decides it by the exact binomial
test (scipy's), and the report gives it a column. test_evaluate.py runs it through `evaluate` (both designs) and
test_compat_variants.py through the lm-eval variant, with the same row.

Then every row of the paired answers, `flip_rate` included, is checked against every kind of evidence it claims,
with each metric's items counted by hand here (not by the row)."""

import json

import numpy as np
import pytest
from independent import agrapa_wealth, group_decision, mixture_e_value
from scipy.stats import binomtest
from test_replicates import write_run

from adaptguard.cli.main import main
from adaptguard.compat import metric_table
from adaptguard.compat.comparison import Comparison
from adaptguard.compat.decide import decide_threshold
from adaptguard.compat.evidence import Replicates, evidence_of
from adaptguard.compat.gate import Threshold
from adaptguard.compat.metric_table import ANYTIME, GROUP, ONE_RUN, Metric, Unit
from adaptguard.compat.render.report import table_rows
from adaptguard.compat.stats.metrics import flip_metrics
from adaptguard.compat.stats.replicates import replicate_flips
from adaptguard.compat.verdicts import Evidence

FLIP_RATE = Metric("flip_rate", Unit.RATE, True, about_flips=True, tests=frozenset({ONE_RUN, ANYTIME, GROUP}),
                   per_item=lambda old, new: old != new, column="flip %")


@pytest.fixture
def flip_rate_row(monkeypatch):
    """The one edit: the row, in the table."""
    monkeypatch.setitem(metric_table.METRICS, "flip_rate", FLIP_RATE)


# each metric's (successes, trials) counted by hand from the paired answers: old and new are lists of bools
BY_HAND = {
    "nfr": lambda old, new: (sum(o and not w for o, w in zip(old, new)), len(old)),
    "pfr": lambda old, new: (sum(w and not o for o, w in zip(old, new)), len(old)),
    "btc": lambda old, new: (sum(o and w for o, w in zip(old, new)), sum(old)),
    "old_acc": lambda old, new: (sum(old), len(old)),
    "new_acc": lambda old, new: (sum(new), len(old)),
    "flip_rate": lambda old, new: (sum(o != w for o, w in zip(old, new)), len(old)),
}


def answers(seed: int, n: int, old_rate=0.6, new_rate=0.5):
    rng = np.random.default_rng(seed)
    return rng.random(n) < old_rate, rng.random(n) < new_rate


def compared(tmp_path, capsys, olds, news, *fail_on) -> tuple[int, dict | None, str]:
    """`adaptguard compare` of the runs with these answers: (exit status, report.json, what it printed)."""
    for side, runs in (("old", olds), ("new", news)):
        for r, correct in enumerate(runs):
            write_run(tmp_path / f"{side}{r}", "t", correct, 4)
    try:
        code = main(["compare", ",".join(str(tmp_path / f"old{r}") for r in range(len(olds))),
                     ",".join(str(tmp_path / f"new{r}") for r in range(len(news))), "--json",
                     str(tmp_path / "c.json"), *[x for e in fail_on for x in ("--fail-on", e)]])
    except SystemExit as refused:  # argparse refuses a flag before anything runs
        code = refused.code
    printed = capsys.readouterr()
    printed = printed.out + printed.err
    report = json.loads((tmp_path / "c.json").read_text()) if (tmp_path / "c.json").exists() else None
    return code, report, printed


def test_without_the_row_the_metric_is_refused(tmp_path, capsys):
    old, new = answers(0, 200)
    code, report, printed = compared(tmp_path, capsys, [old], [new], "flip_rate>20%")
    assert code == 2 and report is None and "unknown metric 'flip_rate'" in printed


@pytest.mark.parametrize("theta, op, decision", [(0.40, ">", "breach"), (0.60, ">", "clear"), (0.50, "<", "undecided")])
def test_compare_reports_and_gates_the_row_on_one_run(flip_rate_row, tmp_path, capsys, theta, op, decision):
    old, new = answers(1, 400)
    k, n = BY_HAND["flip_rate"](list(old), list(new))
    code, report, printed = compared(tmp_path, capsys, [old], [new], f"flip_rate{op}{100 * theta:g}%")
    entry = report["tasks"]["t"]
    assert entry["flip_rate"] == k / n
    (d,) = report["gate"]["decisions"]
    p = binomtest(k, n, theta, alternative="greater" if op == ">" else "less").pvalue
    assert d["p_value"] == pytest.approx(p, rel=1e-9) and d["decision"] == decision
    assert code == {"breach": 1, "clear": 0, "undecided": 3}[decision]
    header, rows = table_rows(Comparison.of(report))
    cell = rows[0][header.index("flip %")]
    assert cell.startswith(f"{100 * k / n:.1f}") and cell.endswith("(!)") == (decision == "breach")
    assert "flip %" in printed


def test_compare_with_replicates_reports_the_mean_over_every_pair(flip_rate_row, tmp_path, capsys):
    rng = np.random.default_rng(2)
    olds = [rng.random(300) < p for p in (0.5, 0.7)]
    news = [rng.random(300) < p for p in (0.3, 0.5, 0.6)]
    code, report, _ = compared(tmp_path, capsys, olds, news)
    per_pair = []
    for o in olds:
        for w in news:
            k, n = BY_HAND["flip_rate"](list(o), list(w))
            per_pair.append(k / n)
    assert report["runs"] == {"old": 2, "new": [3]}
    assert report["tasks"]["t"]["flip_rate"] == pytest.approx(sum(per_pair) / len(per_pair), rel=1e-12)
    assert abs(per_pair[0] - sum(per_pair) / len(per_pair)) > 0.01  # the first pair's value would be wrong


# ------------------------------------------------------------------ every row against every kind it claims
def _one_run(old, new) -> dict:
    entry = flip_metrics(old, new, interval="exact")
    entry.update({m.name: m.value_of(old, new) for m in metric_table.METRICS.values()
                  if m.per_item is not None and m.unit is Unit.RATE})
    return entry


def _claims():
    rows = {**metric_table.METRICS, "flip_rate": FLIP_RATE}
    # the one-run rates not of the paired answers: the test below
    return [(name, kind) for name, m in rows.items() for kind in sorted(m.tests)
            if m.per_item is not None or kind is not ONE_RUN]


@pytest.mark.parametrize("name", [n for n, m in metric_table.METRICS.items()
                                  if m.per_item is None and ONE_RUN in m.tests])
def test_each_rate_not_of_the_paired_answers_is_tested_on_its_share_of_items(name):
    """inconsistency_flips and the smooth rates come from predictions or similarities, not from right and wrong:
    one run's entry holds the share, and its test is the binomial test on share × n items."""
    entry = {"n": 250, name: 70 / 250}
    assert evidence_of(entry).p(name, 0.2, ">") == pytest.approx(binomtest(70, 250, 0.2, alternative="greater")
                                                                  .pvalue, rel=1e-9)


@pytest.mark.parametrize("name, kind", _claims())
def test_each_row_is_decided_by_each_kind_of_evidence_it_claims(flip_rate_row, name, kind):
    old, new = answers(3, 240, 0.55, 0.5)
    theta = {"acc_drop": 0.02}.get(name, 0.3)
    t = Threshold.parse(f"{name}>{100 * theta:g}%")
    if metric_table.METRICS.get(name, FLIP_RATE).per_item is None:  # the rates above; excess_nfr over replicates:
        assert (name, kind) == ("excess_nfr", Evidence.REPLICATES)  # identical reruns have no noise floor, so it is
        entry = {**_one_run(old, new), "replicates": replicate_flips(np.array([old, old]), np.array([new, new]))}
        assert entry["replicates"]["noise_floor"] == 0  # the NFR, tested as one run's
        assert evidence_of(entry).p(name, 0.05, ">") == pytest.approx(evidence_of(_one_run(old, new)).p(
            "nfr", 0.05, ">"), rel=1e-9)
        return
    if kind is Evidence.ONE_RUN:
        entry = _one_run(old, new)
        if name == "acc_drop":  # the exact unconditional test against the margin: test_gate_sizes checks it
            b, c = entry["n_negative_flips"], entry["n_positive_flips"]
            assert evidence_of(entry).p(name, 0.0, ">") == pytest.approx(
                binomtest(b, b + c, 0.5, alternative="greater").pvalue)
            return
        k, n = BY_HAND[name](list(old), list(new))
        assert evidence_of(entry).p(name, theta, ">") == pytest.approx(
            binomtest(k, n, theta, alternative="greater").pvalue, rel=1e-9)
    elif kind is Evidence.REPLICATES:  # identical reruns: exactly one run's item-level test where the value is beyond θ
        entry = {**_one_run(old, new), "replicates": replicate_flips(np.array([old, old]), np.array([new, new]))}
        entry.update({k: entry["replicates"][k] for k in ("nfr", "pfr", "old_acc", "new_acc")})
        theta = 0.05 if name == "nfr" else -0.1
        assert isinstance(evidence_of(entry), Replicates)
        assert evidence_of(entry).p(name, theta, ">") == pytest.approx(evidence_of(_one_run(old, new)).p(
            name, theta, ">"), rel=1e-9)
    elif kind is Evidence.ANYTIME:
        looks = [60, 120, 240]
        entry = {**_one_run(old, new), "sequential": {"old": old.tolist(), "new": new.tolist(), "looks": looks,
                                                       "design": "anytime", "bet": "agrapa"}}
        if name == "acc_drop":
            wealth = agrapa_wealth(old.astype(float) - new.astype(float), theta, True)
            e = [wealth[n - 1] for n in looks]
        else:
            e = [mixture_e_value(*BY_HAND[name](list(old[:n]), list(new[:n])), theta, True) for n in looks]
        assert evidence_of(entry).p(name, theta, ">") == pytest.approx(min(1.0, 1 / max(e)), rel=1e-6)
    else:
        order = np.random.default_rng(4).permutation(240)
        o, w = old[order], new[order]
        looks = [80, 160, 240]
        entry = {"sequential": {"design": "group", "old": o.tolist(), "new": w.tolist(), "looks": looks,
                                "items": 240, "strata": {"R": int(old.sum()), "W": int((~old).sum())}}}
        got = decide_threshold("t", entry, t, 0.05)
        want = group_decision(o, w, looks, 240, int(old.sum()), int((~old).sum()), name, theta, ">", 0.05)
        assert got.decision.value == want["decision"]
        assert got.p_value == pytest.approx(want["p_value"], rel=1e-6)
        assert got.p_within == pytest.approx(want["p_within"], rel=1e-6)


def test_a_row_claiming_a_sequential_test_without_the_paired_answers_is_refused():
    """evaluate counts a metric from the answers at each look: a row that cannot say how is refused when written."""
    with pytest.raises(ValueError, match="'both_wrong': an anytime or group-sequential test needs"):
        Metric("both_wrong", Unit.RATE, True, tests=frozenset({ONE_RUN, ANYTIME}))
    with pytest.raises(ValueError, match="'gain': an anytime"):
        Metric("gain", Unit.SCORE, False, tests=frozenset({GROUP}), per_item=lambda old, new: new)


def test_a_difference_row_other_than_the_drops_is_refused_with_tests_and_kept_without():
    """A difference's tests are acc_drop's and excess_nfr's own; a new difference claiming one would be tested as a
    rate (a binomial test of a value that can be negative), so it is refused. Reported only (no test), it is a row."""
    gain = dict(per_item=lambda old, new: new.astype(int) - old.astype(int))
    with pytest.raises(ValueError, match="'gain': the tests of a difference are acc_drop's and excess_nfr's"):
        Metric("gain", Unit.DIFFERENCE, False, tests=frozenset({ONE_RUN}), **gain)
    assert Metric("gain", Unit.DIFFERENCE, False, **gain).value_of([1, 0, 0, 1], [1, 1, 1, 0]) == 0.25


def test_two_new_rows_sharing_a_column_fill_one_cell(monkeypatch):
    """Rows may share a column (the Δ-metrics share ΔNFR_c): the table adds the column once and each task one cell,
    the first of the column's metrics it reports."""
    for name in ("changed_right", "changed_wrong"):
        monkeypatch.setitem(metric_table.METRICS, name, Metric(name, Unit.RATE, True, column="changed %"))
    tasks = {"a": {"n": 10, "old_acc": 0.5, "new_acc": 0.5, "changed_right": 0.1},
             "b": {"n": 10, "old_acc": 0.5, "new_acc": 0.5, "changed_wrong": 0.3},
             "c": {"n": 10, "old_acc": 0.5, "new_acc": 0.5, "delta_nfr": 0.01, "delta_nfr_pct": 5.0}}
    header, rows = table_rows({"old": "o", "new": "n", "alpha": 0.05, "tasks": tasks})
    assert header.count("changed %") == 1 and all(len(r) == len(header) for r in rows)
    at = header.index("changed %")
    assert [r[at] for r in rows] == ["10.0", "30.0", "–"]


def test_the_gate_refuses_a_metric_without_a_test_of_the_runs_design():
    """smooth_nfr has a one-run test only: on a run evaluated until decided the gate says so (exit 2), where it
    crashed."""
    from adaptguard.compat.gate import GateError, check_gate

    seq = {"design": "group", "old": [1, 0], "new": [1, 1], "looks": [2], "items": 2, "strata": {"R": 1, "W": 1}}
    report = {"old": "o", "new": "n", "alpha": 0.05, "tasks": {"t": {"sequential": seq, "n": 2, "smooth_nfr": 0.5}}}
    with pytest.raises(GateError, match="smooth_nfr has no group test on a run evaluated until decided; use one of nfr"):
        check_gate(report, [Threshold.parse("smooth_nfr>5%")], significance=0.05)
