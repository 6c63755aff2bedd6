"""The gate checked at every edge (issue 73): each run below once got an exit code its data did not support. Small
synthetic `--log_samples` runs, compared as a user would (`adaptguard compare`, in-process), each exit code and
every output held to the decision the data support; the exact tests checked against scipy."""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT
from in_process import run_lm_eval_cli
from independent import margin_p, per_item_flips, replicate_se
from scipy.stats import binom, binomtest

from adaptguard.cli.main import main
from adaptguard.compat.evidence import p_beyond
from adaptguard.compat.gate import GateError, Threshold
from adaptguard.compat.stats.replicates import replicate_flips

TS = "2026-11-27T00-00-00.000000"


def write_mc(folder: Path, task: str, correct, n_choices: int = 4) -> Path:
    """A multiple-choice task's `--log_samples` run: item i's gold is choice i mod n_choices, and the model picks it
    where `correct` says so, else the next choice."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"samples_{task}_{TS}.jsonl", "w") as f:
        for i, ok in enumerate(correct):
            gold = i % n_choices
            lls = [-5.0] * n_choices
            lls[gold if ok else (gold + 1) % n_choices] = -1.0
            f.write(json.dumps({"doc_id": i, "target": gold, "filtered_resps": [[str(x), "False"] for x in lls],
                                "filter": "none", "metrics": ["acc"], "doc_hash": f"d{i}", "prompt_hash": f"p{i}",
                                "target_hash": str(gold), "acc": float(ok)}) + "\n")
    _config(folder, task, "multiple_choice")
    return folder


def write_loglikelihood(folder: Path, task: str, correct) -> Path:
    """A lambada-style task: one [log-likelihood, is_greedy] per document, `acc` = is_greedy."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"samples_{task}_{TS}.jsonl", "w") as f:
        for i, ok in enumerate(correct):
            f.write(json.dumps({"doc_id": i, "target": f" word{i}", "filtered_resps": [[str(-2.0 - (not ok)),
                                                                                        str(bool(ok))]],
                                "resps": [[[-2.0 - (not ok), bool(ok)]]], "filter": "none", "metrics": ["acc"],
                                "doc_hash": f"d{i}", "prompt_hash": f"p{i}", "target_hash": f"t{i}",
                                "acc": float(ok)}) + "\n")
    _config(folder, task, "loglikelihood")
    return folder


def _config(folder: Path, task: str, output_type: str) -> None:
    results = folder / f"results_{TS}.json"
    configs = json.loads(results.read_text())["configs"] if results.exists() else {}
    results.write_text(json.dumps({"configs": {**configs, task: {"output_type": output_type}},
                                   "n-shot": {t: 0 for t in [*configs, task]}}))


def compare(capsys, *args) -> tuple[int, dict, str]:
    """`adaptguard compare ARGS --json FILE` in-process: (exit status, the JSON report, everything printed)."""
    out = Path(args[0]).parent / "report.json"
    code = main(["compare", *map(str, args), "--json", str(out)])
    printed = capsys.readouterr()
    return code, json.loads(out.read_text()) if out.exists() else {}, printed.out + printed.err


def decisions(report: dict) -> dict[tuple[str, str], dict]:
    return {(d["task"], d["expr"]): d for d in report["gate"]["decisions"]}


# ------------------------------------------------------------------ 1. deterministic reruns are one run, not certainty
def test_identical_reruns_claim_no_more_than_one_run(tmp_path, capsys):
    """Two old and two new runs, identical copies (a greedy evaluation repeated): 18 items, no flip. One run of the
    same data is undecided; so are the copies, with the same p as the item-level exact test (0.98^18 = 0.695)."""
    right = [True] * 12 + [False] * 6
    for name in ("old0", "old1", "new0", "new1"):
        write_mc(tmp_path / name, "t", right)
    sides = (f"{tmp_path / 'old0'},{tmp_path / 'old1'}", f"{tmp_path / 'new0'},{tmp_path / 'new1'}")
    code, report, printed = compare(capsys, *sides, "--fail-on", "nfr>2%", "--fail-on", "acc_drop>1%",
                                    "--fail-on", "excess_nfr>1%")
    assert code == 3, printed
    got = decisions(report)
    assert all(d["decision"] == "undecided" for d in got.values()), got
    assert got["t", "nfr>2%"]["p_within"] == pytest.approx(0.98 ** 18)
    assert got["t", "excess_nfr>1%"]["p_within"] == pytest.approx(0.99 ** 18)
    code1, report1, _ = compare(capsys, tmp_path / "old0", tmp_path / "new0", "--fail-on", "nfr>2%")
    assert code1 == 3 and report1["gate"]["decisions"][0]["p_within"] == pytest.approx(0.98 ** 18)


@pytest.mark.parametrize("n, broken, expr, p_exact, kind", [
    (20, 20, "nfr>90%", 0.9 ** 20, "p_value"),  # all broke: not support for > 90 % (was: breach at p = 0)
    (60, 1, "nfr>6%", binom.cdf(1, 60, 0.06), "p_within"),  # was: clear at p 0.006
])
def test_identical_reruns_at_the_edges_take_the_exact_test(tmp_path, capsys, n, broken, expr, p_exact, kind):
    old, new = [True] * n, [i >= broken for i in range(n)]
    for r in range(2):
        write_mc(tmp_path / f"old{r}", "t", old), write_mc(tmp_path / f"new{r}", "t", new)
    code, report, printed = compare(capsys, f"{tmp_path / 'old0'},{tmp_path / 'old1'}",
                                    f"{tmp_path / 'new0'},{tmp_path / 'new1'}", "--fail-on", expr)
    (d,) = report["gate"]["decisions"]
    assert code == 3 and d["decision"] == "undecided", printed
    assert d[kind] == pytest.approx(p_exact, rel=1e-9)


def test_the_replicate_test_holds_its_size_near_zero_flips():
    """200 items, 2 + 2 runs, a true NFR of exactly 2 %: the old runs right everywhere, the new model wrong on an item
    with probability 2 % — its two runs the same (a deterministic rerun), or each its own draw. `nfr>2%` must come
    out clear at most α of the time (the run-level t-test alone: 9 % with deterministic reruns). Exact: every
    statistic is a mean over items, so a draw's verdict depends only on how many items each pattern of wrong runs
    has (checked on a shuffled draw); each count pattern of probability ≥ 1e-7 is evaluated once, and the mass left
    out is counted as clear."""
    from scipy.stats import multinomial

    n, q = 200, 0.02
    old = np.ones((2, n), bool)

    def p_clear(new):
        r = replicate_flips(old, new, level=0.9)
        return p_beyond({"n": n, "old_acc": r["old_acc"], "new_acc": r["new_acc"], "replicates": r}, "nfr", 0.02, "<")

    def new_runs(only_first, only_second, both):  # the items of each pattern first, then the right ones
        new = np.ones((2, n), bool)
        new[0, :only_first] = new[1, only_first:only_first + only_second] = False
        new[:, only_first + only_second:only_first + only_second + both] = False
        return new

    drawn = np.random.default_rng(7).random((2, n)) >= 0.1
    counts = [int((~drawn[0] & drawn[1]).sum()), int((drawn[0] & ~drawn[1]).sum()), int((~drawn).all(0).sum())]
    assert p_clear(drawn) == pytest.approx(p_clear(new_runs(*counts)), rel=1e-12)

    deterministic = [(binom.pmf(k, n, q), new_runs(0, 0, k)) for k in range(n + 1) if binom.pmf(k, n, q) >= 1e-7]
    cell = [(1 - q) ** 2, q * (1 - q), (1 - q) * q, q * q]  # right in both runs, wrong in the first, second, both
    independent = [(multinomial.pmf([n - a - b - c, a, b, c], n, cell), new_runs(a, b, c))
                   for a in range(30) for b in range(30) for c in range(6)
                   if multinomial.pmf([n - a - b - c, a, b, c], n, cell) >= 1e-7]
    for rerun, cases in (("deterministic", deterministic), ("independent", independent)):
        left_out = 1 - sum(p for p, _ in cases)
        assert left_out < 1e-4, rerun
        size = sum(p for p, new in cases if p_clear(new) < 0.05) + left_out
        assert size <= 0.05, (rerun, size)


# ------------------------------------------------------------------------- 2. loglikelihood tasks are never churn
def test_a_loglikelihood_task_has_no_chance_level_and_its_flips_are_gated(tmp_path, capsys):
    write_loglikelihood(tmp_path / "old", "lambada_like", [True] * 500)
    write_loglikelihood(tmp_path / "new", "lambada_like", [i >= 200 for i in range(500)])
    write_mc(tmp_path / "old", "clean", [True] * 300), write_mc(tmp_path / "new", "clean", [True] * 300)
    code, report, printed = compare(capsys, tmp_path / "old", tmp_path / "new", "--fail-on", "nfr>2%")
    assert report["tasks"]["lambada_like"]["churn"] is None
    assert decisions(report)["lambada_like", "nfr>2%"]["decision"] == "breach" and code == 1, printed


# ------------------------------------------------------------------ 3. churn never hides flips the data support
def test_a_new_model_below_chance_is_not_churn(tmp_path, capsys):
    """Old 14/40 on four choices (not shown above 25 %: p 0.10), new 0/40 (far below chance: guessing cannot do that):
    its 14 flips are evidence, and `nfr>5%` breaches beside a clean 600-item task."""
    write_mc(tmp_path / "old", "hard", [i < 14 for i in range(40)]), write_mc(tmp_path / "new", "hard", [False] * 40)
    write_mc(tmp_path / "old", "clean", [True] * 600), write_mc(tmp_path / "new", "clean", [True] * 600)
    code, report, printed = compare(capsys, tmp_path / "old", tmp_path / "new", "--fail-on", "nfr>5%")
    churn = report["tasks"]["hard"]["churn"]
    assert churn["p_above_chance"] == pytest.approx(binom.sf(13, 40, 0.25))  # old not shown above chance
    assert churn["p_new_below_chance"] == pytest.approx(0.75 ** 40) and not churn["churn"]
    assert code == 1 and decisions(report)["hard", "nfr>5%"]["decision"] == "breach", printed


def test_flips_beyond_two_guessers_are_not_churn_but_guessing_is():
    from adaptguard.compat.decide import churn

    guessing = churn(10, 10, 8, 40, 0.25, 0.25, 0.05)  # both at chance, 8 flips ≈ 40 · 0.25 · 0.75 = 7.5
    assert guessing["churn"]
    more = churn(10, 10, 18, 40, 0.25, 0.25, 0.05)  # 18 right → wrong: P(X ≥ 18 | 40, 0.1875) < 0.05
    assert more["p_flips_beyond_guessing"] == pytest.approx(binom.sf(17, 40, 0.1875)) and not more["churn"]


# ------------------------------------------------------------------------- 4. rate thresholds outside [0, 1]
@pytest.mark.parametrize("expr, message", [
    ("nfr>1", "write 1% or 100% \\(1 alone"), ("nfr>2", "write 2% or 0.02"), ("nfr>-5%", "lies between 0% and 100%"),
    ("nfr>101%", "lies between 0% and 100%"), ("btc<-0.1", "lies between 0% and 100%"),
    ("acc_drop>1.0", "write 1.0% or 100%"), ("acc_drop>-101%", "lies between -100% and 100%"),
], ids=lambda x: x if "%" not in x or len(x) < 16 else "message")  # plain ids: mutmut runs tests by id
def test_rate_thresholds_outside_their_range_or_without_a_unit_are_refused(expr, message):
    with pytest.raises(GateError, match=message):
        Threshold.parse(expr)


@pytest.mark.parametrize("expr, value", [("nfr>100%", 1.0), ("nfr>0%", 0.0), ("acc_drop>-100%", -1.0),
                                         ("acc_drop>0.5", 0.5), ("nfr>0.999", 0.999)])
def test_thresholds_at_the_ends_of_the_range_are_kept(expr, value):
    assert Threshold.parse(expr).value == pytest.approx(value)


# ------------------------------------------------------------------------------------- 5. margins at ±100 %
def test_accuracy_margins_at_plus_and_minus_100_percent(tmp_path, capsys):
    write_mc(tmp_path / "old", "t", [True] * 200), write_mc(tmp_path / "same", "t", [True] * 200)
    code, report, printed = compare(capsys, tmp_path / "old", tmp_path / "same", "--fail-on", "acc_drop>100%")
    assert code == 0 and report["gate"]["decisions"][0]["decision"] == "clear", printed  # no drop exceeds 100 %
    write_mc(tmp_path / "broken", "t", [i >= 80 for i in range(200)])
    code, report, printed = compare(capsys, tmp_path / "old", tmp_path / "broken", "--fail-on", "acc_drop>-100%")
    assert code == 1 and report["gate"]["decisions"][0]["decision"] == "breach", printed


# ------------------------------------------------------------------------- 6. overall: says what its test shows
def test_overall_names_the_task_when_only_some_task_dropped(tmp_path, capsys):
    """One task loses 60 of 300, five each gain 30 of 300: the pooled accuracy rose 5 points (shown below 1 %), but
    the max-drop test finds the one task: the breach names it and never prints "acc_drop = -5.00% > 1.00%"."""
    write_mc(tmp_path / "old", "lost", [True] * 300), write_mc(tmp_path / "new", "lost", [i >= 60 for i in range(300)])
    for k in range(5):
        write_mc(tmp_path / "old", f"gain{k}", [i >= 30 for i in range(300)])
        write_mc(tmp_path / "new", f"gain{k}", [True] * 300)
    code, report, printed = compare(capsys, tmp_path / "old", tmp_path / "new", "--fail-on", "overall:acc_drop>1%")
    (d,) = report["gate"]["decisions"]
    assert code == 1 and d["decision"] == "breach" and d["shows"] == "some_task" and d["worst_task"] == "lost"
    assert d["value"] == pytest.approx(0.2)
    assert "some task dropped more than 1.00% (most: lost, acc_drop = 20.00%)" in printed
    assert "-5.00% > 1.00%" not in printed


def test_overall_breach_on_the_pooled_drop_says_pooled(tmp_path, capsys):
    for k in range(3):
        write_mc(tmp_path / "old", f"t{k}", [True] * 300)
        write_mc(tmp_path / "new", f"t{k}", [i >= 15 for i in range(300)])  # 5 % lost on every task
    code, report, printed = compare(capsys, tmp_path / "old", tmp_path / "new", "--fail-on", "overall:acc_drop>1%")
    (d,) = report["gate"]["decisions"]
    assert code == 1 and d["shows"] == "pooled" and d["value"] == pytest.approx(0.05)
    assert "overall: acc_drop = 5.00% > 1.00%" in printed


# --------------------------------------------------------------------- 8. the interval printed is the one decided on
def test_the_printed_interval_is_the_decisions_and_they_agree(tmp_path, capsys):
    """8 of 200 broke: `nfr>2%` breaches at p 0.049; the interval printed beside it (and in the table) is the
    one-sided bounds at 95 % each, whose lower end is above 2 % (a two-sided 95 % interval would hold 2 %)."""
    write_mc(tmp_path / "old", "t", [True] * 200), write_mc(tmp_path / "new", "t", [i >= 8 for i in range(200)])
    code, report, printed = compare(capsys, tmp_path / "old", tmp_path / "new", "--fail-on", "nfr>2%")
    (d,) = report["gate"]["decisions"]
    assert code == 1 and d["decision"] == "breach" and d["p_value"] == pytest.approx(binom.sf(7, 200, 0.02))
    lo, hi = d["interval"]
    assert lo > 0.02 and d["level"] == pytest.approx(0.9)
    assert binom.sf(7, 200, lo) == pytest.approx(0.05, rel=1e-6)  # the bound inverts the test exactly
    assert f"90 % interval {100 * lo:.2f}% to {100 * hi:.2f}%" in printed
    assert f"[{100 * lo:.1f}, {100 * hi:.1f}]" in printed and "NFR 90% CI" in printed  # the table's column


# ------------------------------------------------------------------- 9. a value exactly at its threshold is not beyond it
def _undecided_line(printed: str) -> str:
    (line,) = [x for x in printed.splitlines() if x.startswith("  undecided: ")]
    return line


@pytest.mark.parametrize("expr", ["nfr>0.7%", "nfr>0.007"])
def test_a_rate_exactly_at_its_threshold_is_not_beyond_it(tmp_path, capsys, expr):
    """1,000 items, 7 broke: the NFR is exactly 0.7 %, and `nfr>0.7%` is `nfr>0.007` (0.7 / 100 is
    0.006999999999999999 in floats, which 7 / 1000 = 0.007 exceeded). Raw values: ">" does not hold at equality, so
    clear (exit 0), never "0.70% > 0.70%". Tested: undecided, and the line says the value is the threshold itself,
    with both exact binomial p-values and the Clopper–Pearson bounds (scipy), not "no change was seen"."""
    from scipy.stats import beta

    write_mc(tmp_path / "old", "t", [True] * 1000), write_mc(tmp_path / "new", "t", [i >= 7 for i in range(1000)])
    code, report, printed = compare(capsys, tmp_path / "old", tmp_path / "new", "--fail-on", expr,
                                    "--significance", "off")
    (d,) = report["gate"]["decisions"]
    assert code == 0 and d["decision"] == "clear" and d["value"] == 7 / 1000 and d["threshold"] == 0.007, printed
    assert "0.70% > 0.70%" not in printed and "gate: passed" in printed
    code, report, printed = compare(capsys, tmp_path / "old", tmp_path / "new", "--fail-on", expr)
    (d,) = report["gate"]["decisions"]
    assert code == 3 and d["decision"] == "undecided" and d["items_needed"] is None, printed
    p, p_below = binom.sf(6, 1000, 0.007), binom.cdf(7, 1000, 0.007)
    assert d["p_value"] == pytest.approx(p, rel=1e-9) and d["p_within"] == pytest.approx(p_below, rel=1e-9)
    lo, hi = beta.ppf(0.05, 7, 994), beta.isf(0.05, 8, 993)
    assert _undecided_line(printed) == (
        f"  undecided: t: nfr = 0.70%, exactly the threshold: not beyond it, nor shown below it (p = {p:.3g} beyond, "
        f"{p_below:.3g} below, both ≥ α, exact one-sided binomial on the item counts; 90 % interval "
        f"{100 * lo:.2f}% to {100 * hi:.2f}%; the value seen equals the threshold: no number of items decides it at "
        f"this value)  [{expr}]")


def test_an_accuracy_drop_exactly_at_its_margin_is_not_beyond_it(tmp_path, capsys):
    """200 items, 4 broke, none fixed: the drop is exactly 2 % (0.75 − 0.73 is 0.020000000000000018 in floats).
    Raw values: `acc_drop>2%`, `acc_drop<2%` and `overall:acc_drop>2%` are all clear. Tested: undecided, the line
    saying the value is the threshold, and how far the data reach from the paired normal MDE (scipy)."""
    from scipy.stats import norm

    write_mc(tmp_path / "old", "t", [i < 150 for i in range(200)])
    write_mc(tmp_path / "new", "t", [i < 150 and i >= 4 for i in range(200)])
    exprs = ["--fail-on", "acc_drop>2%", "--fail-on", "acc_drop<2%", "--fail-on", "overall:acc_drop>2%"]
    code, report, printed = compare(capsys, tmp_path / "old", tmp_path / "new", *exprs, "--significance", "off")
    assert code == 0 and [d["decision"] for d in report["gate"]["decisions"]] == ["clear"] * 3, printed
    assert "2.00% > 2.00%" not in printed and "2.00% < 2.00%" not in printed
    code, report, printed = compare(capsys, tmp_path / "old", tmp_path / "new", "--fail-on", "acc_drop>2%")
    (d,) = report["gate"]["decisions"]
    assert code == 3 and d["decision"] == "undecided" and min(d["p_value"], d["p_within"]) >= 0.05, printed
    mde = (norm.ppf(0.95) + norm.ppf(0.8)) * math.sqrt((4 / 200 - 0.02 ** 2) / 200)
    beyond, below = margin_p(4, 0, 200, 0.02, True), margin_p(4, 0, 200, 0.02, False)  # by brute force
    assert (d["p_value"], d["p_within"]) == (pytest.approx(beyond, rel=1e-6), pytest.approx(below, rel=1e-6))
    assert _undecided_line(printed) == (
        f"  undecided: t: acc_drop = 2.00%, exactly the threshold: not beyond it, nor shown below it "
        f"(p = {beyond:.3g} beyond, {below:.3g} below, both ≥ α, exact unconditional score test against "
        f"the margin; the data detect a change of {100 * mde:.2f}% at 80 % power, but at the value seen no number of "
        f"items or runs decides it)  [acc_drop>2%]")


def test_replicate_means_exactly_at_their_thresholds_are_not_beyond_them(tmp_path, capsys):
    """2 + 2 runs of 1,000 items, one new run wrong on 7 items the other three runs got right: per-item means over
    run pairs, not whole counts. NFR = 7 · ½ / 1000 = 0.35 %, the noise floor 7 · (2² · ¼) / (2 + 2) / 1000 =
    0.175 %, so the excess NFR is 0.175 %, and the drop 0.35 %; each at its threshold is clear with raw values, and
    undecided, said as at the threshold, with the tests."""
    for r in range(2):
        write_mc(tmp_path / f"old{r}", "t", [True] * 1000)
        write_mc(tmp_path / f"new{r}", "t", [r == 1 or i >= 7 for i in range(1000)])
    sides = (f"{tmp_path / 'old0'},{tmp_path / 'old1'}", f"{tmp_path / 'new0'},{tmp_path / 'new1'}")
    exprs = ["nfr>0.35%", "nfr<0.35%", "excess_nfr>0.175%", "acc_drop>0.35%", "acc_drop<0.35%"]
    code, report, printed = compare(capsys, *sides, *(x for e in exprs for x in ("--fail-on", e)),
                                    "--significance", "off")
    assert code == 0 and [d["decision"] for d in report["gate"]["decisions"]] == ["clear"] * 5, printed
    for expr in ("nfr>0.35%", "excess_nfr>0.175%", "acc_drop>0.35%"):
        code, report, printed = compare(capsys, *sides, "--fail-on", expr)
        (d,) = report["gate"]["decisions"]
        assert code == 3 and d["decision"] == "undecided", printed
        assert f"{d['metric']} = {expr.split('>')[1]}, exactly the threshold: not beyond it, nor shown below it" \
            in _undecided_line(printed)
        assert "but at the value seen no number of items or runs decides it" in _undecided_line(printed)


def test_a_rate_too_close_to_its_threshold_to_plan_says_so(tmp_path, capsys):
    """8 of 1,000 broke against `nfr>0.799%`: beyond it, but more than 10,000,000 items would be needed at the rate
    seen — the line says that, not that no change was seen."""
    write_mc(tmp_path / "old", "t", [True] * 1000), write_mc(tmp_path / "new", "t", [i >= 8 for i in range(1000)])
    code, report, printed = compare(capsys, tmp_path / "old", tmp_path / "new", "--fail-on", "nfr>0.799%")
    (d,) = report["gate"]["decisions"]
    assert code == 3 and d["why"].startswith("beyond") and d["items_needed"] is None
    p = binom.sf(7, 1000, 0.00799)
    low, high = binomtest(8, 1000).proportion_ci(0.9, method="exact")  # Clopper–Pearson
    assert d["p_value"] == pytest.approx(p, rel=1e-9)
    assert _undecided_line(printed) == (
        f"  undecided: t: nfr = 0.80% > 0.799% but not significantly (p = {p:.3g} ≥ α, exact one-sided "
        f"binomial on the item counts; 90 % interval {100 * low:.2f}% to {100 * high:.2f}%; "
        f"at the rate seen, more than 10,000,000 items would be needed to decide it)  [nfr>0.799%]")


# ------------------------------------------------------------------- 10. raw values compared are said as raw values
def test_with_significance_off_no_output_says_the_data_support_a_breach(tmp_path, capsys):
    """`--significance off` tests nothing: the terminal, the Markdown and the page say a value is beyond its
    threshold (raw values, no test), never "a breach the data support"."""
    write_mc(tmp_path / "old", "t", [True] * 100), write_mc(tmp_path / "new", "t", [i >= 7 for i in range(100)])
    out = {"--markdown": tmp_path / "gate.md", "--html": tmp_path / "gate.html"}
    for expr, code_wanted, head in (("nfr>5%", 1, "gate: FAILED, a value beyond its threshold (raw values, no test; "
                                                   "1 breach, 0 undecided, 0 clear)"),
                                    ("nfr>10%", 0, "gate: passed, no value beyond its threshold (raw values, no test; "
                                                   "0 breach, 0 undecided, 1 clear)")):
        code, report, printed = compare(capsys, tmp_path / "old", tmp_path / "new", "--fail-on", expr,
                                        "--significance", "off", *(str(x) for kv in out.items() for x in kv))
        assert code == code_wanted, printed
        md, page = out["--markdown"].read_text(), out["--html"].read_text()
        assert f"{head}; --significance off: breach where a value is beyond its threshold, clear otherwise" in printed
        assert f"**G{head[1:]}; --significance off" in md
        assert head in page.split('id="verdict">')[1].split("</div>")[0]
        for text in (printed, md, page):
            assert "data support" not in text


# ---------------------------------------------------------------- 11. a rate's interval over replicates stays a rate
def test_replicate_intervals_stay_in_their_ranges(tmp_path, capsys):
    """2 + 2 runs of 60 items, one new run wrong on 3: the run-level t interval of the NFR reaches below 0
    (2.5 % − t · SE); an NFR lies in [0, 1], so the interval printed, in the line and in the table, starts at 0.00 %,
    its upper end the larger of the t bound and the Clopper–Pearson bound (scipy). The excess NFR, a difference of
    rates, keeps its negative lower end; on tiny runs where the t bounds pass ±1 it is cut to [−1, 1]."""
    from scipy.stats import beta, t

    from adaptguard.compat.evidence import interval

    for r in range(2):
        write_mc(tmp_path / f"old{r}", "t", [True] * 60)
        write_mc(tmp_path / f"new{r}", "t", [r == 1 or i >= 3 for i in range(60)])
    code, report, printed = compare(capsys, f"{tmp_path / 'old0'},{tmp_path / 'old1'}",
                                    f"{tmp_path / 'new0'},{tmp_path / 'new1'}", "--fail-on", "nfr>2%",
                                    "--fail-on", "excess_nfr>1%")
    nfr, excess = report["gate"]["decisions"]
    # the run-level t bounds from the runs themselves (tests/independent.py: the crossed variance by loops)
    old_runs = np.array([[True] * 60] * 2)
    new_runs = np.array([[r == 1 or i >= 3 for i in range(60)] for r in range(2)])
    cross, floor_items = per_item_flips(old_runs, new_runs)
    nfr_hat, excess_hat, floor = cross.mean(), (cross - floor_items).mean(), floor_items.mean()
    se, df = replicate_se(old_runs, new_runs, "nfr")
    t_low = nfr_hat - t.ppf(0.95, df) * se
    # the item-level bounds of 1.5 broken items, rounded outward (1 and 2 of 60)
    upper = max(nfr_hat + t.ppf(0.95, df) * se, beta.isf(0.05, 3, 58))
    assert t_low < 0 and nfr["interval"] == [0.0, pytest.approx(upper, rel=1e-9)], nfr
    (line,) = [x for x in printed.splitlines() if "t: nfr = " in x]
    assert f"90 % interval 0.00% to {100 * upper:.2f}%" in line
    assert f"[0.0, {100 * upper:.1f}]" in printed
    se, df = replicate_se(old_runs, new_runs, "excess")
    e_low = excess_hat - t.ppf(0.95, df) * se
    assert excess["interval"][0] == pytest.approx(min(e_low, beta.ppf(0.05, 1, 60) - floor), rel=1e-9)
    assert excess["interval"][0] < 0
    rng = np.random.default_rng(0)
    wide = 0
    for _ in range(400):  # tiny runs: the t quantile on ~1 degree of freedom passes the ends of the range
        n, r_o, r_n = int(rng.integers(1, 5)), int(rng.integers(2, 4)), int(rng.integers(1, 4))
        old, new = rng.random((r_o, n)) < rng.random(), rng.random((r_n, n)) < rng.random()
        r = replicate_flips(old, new, level=0.9)
        e = {"n": n, "old_acc": r["old_acc"], "new_acc": r["new_acc"], "nfr": r["nfr"], "pfr": r["pfr"],
             "replicates": r}
        lo, hi = interval(e, "nfr", 0.05)
        assert 0.0 <= lo <= r["nfr"] <= hi <= 1.0
        lo, hi = interval(e, "excess_nfr", 0.05)
        assert -1.0 <= lo <= r["excess_nfr"] <= hi <= 1.0
        se, df = replicate_se(old, new, "excess")
        t_half = t.ppf(0.95, df) * se
        wide += r["excess_nfr"] - t_half < -1 or r["excess_nfr"] + t_half > 1
    assert wide > 10  # the cut was needed


# ---------------------------------------------------------------------- every output agrees with the exit code
def test_no_output_contradicts_the_gate(tmp_path, capsys):
    """With a gate, sentences state counts and the gate's decisions only; the across-task line says it is not the
    gate; a churn task counted with --include-churn says so; "passed" says what was left out."""
    rng = np.random.default_rng(1)
    write_mc(tmp_path / "old", "big", [True] * 300), write_mc(tmp_path / "new", "big", [i >= 30 for i in range(300)])
    coin_old, coin_new = rng.random(300) < 0.5, rng.random(300) < 0.5
    write_mc(tmp_path / "old", "coin", coin_old, 2), write_mc(tmp_path / "new", "coin", coin_new, 2)
    code, report, printed = compare(capsys, tmp_path / "old", tmp_path / "new", "--fail-on", "nfr>2%")
    assert code == 1 and report["tasks"]["coin"]["churn"]["churn"]
    assert "not significant" not in printed and "not part of the gate" in printed
    assert "left out of the flip thresholds" in printed
    code, report, printed = compare(capsys, tmp_path / "old", tmp_path / "new", "--fail-on", "nfr>2%",
                                    "--include-churn")
    assert "counted in the gate and the overall row (--include-churn)" in printed
    assert "left out of the flip thresholds" not in printed
    code, report, printed = compare(capsys, tmp_path / "old", tmp_path / "new", "--tasks", "coin",
                                    "--fail-on", "acc_drop>50%", "--fail-on", "nfr>50%")
    assert code == 0 and "gate: passed, every threshold decided is clear" in printed and "left out" in printed


# ----------------------------------------------------------------------------------------- what a newcomer meets
def test_the_page_banner_says_what_was_tested_in_its_colour(tmp_path, capsys):
    """Failed red, undecided amber, passed green, no gate neutral — and with no gate the banner says so, then what the
    data support and the largest NFR (29 % broken is never under a green "no regression")."""
    write_mc(tmp_path / "old", "t", [True] * 100), write_mc(tmp_path / "new", "t", [i >= 29 for i in range(100)])
    write_mc(tmp_path / "old", "u", [True] * 18), write_mc(tmp_path / "new", "u", [True] * 18)
    cases = {"failed": ["--fail-on", "t:nfr>2%"], "undecided": ["--fail-on", "u:nfr>2%"],
             "passed": ["--fail-on", "t:nfr>99%"], "none": []}
    for status, args in cases.items():
        page = tmp_path / f"{status}.html"
        compare(capsys, tmp_path / "old", tmp_path / "new", *args, "--html", page)
        banner = page.read_text().split('id="verdict">')[0].rsplit("<div ", 1)[1]
        assert f'class="verdict {status}"' in banner, (status, banner)
    text = (tmp_path / "none.html").read_text()
    assert "No gate given" in text and "Largest NFR: t, 29.0 %" in text
    from adaptguard.compat.render.html import STYLE

    colours = {k: STYLE.split(f".verdict.{k}{{")[1].split("}")[0] for k in ("failed", "undecided", "passed")}
    assert len(set(colours.values())) == 3 and "e0a526" in colours["undecided"]


def test_an_output_under_a_file_is_refused_and_nothing_is_written(tmp_path, capsys):
    write_mc(tmp_path / "old", "t", [True] * 20), write_mc(tmp_path / "new", "t", [True] * 20)
    (tmp_path / "afile").write_text("x")
    code = main(["compare", str(tmp_path / "old"), str(tmp_path / "new"), "--json", str(tmp_path / "gate.json"),
                 "--markdown", str(tmp_path / "afile" / "gate.md")])
    err = capsys.readouterr().err
    assert code == 2 and "is a file, not a folder" in err and "afile" in err and "File exists" not in err
    assert not (tmp_path / "gate.json").exists()


def test_a_missing_metric_lists_those_there_and_a_graded_score_gets_advice_that_works(tmp_path, capsys):
    write_mc(tmp_path / "old", "t", [True] * 20), write_mc(tmp_path / "new", "t", [True] * 20)
    code = main(["compare", str(tmp_path / "old"), str(tmp_path / "new"), "--metric", "accuracy"])
    err = capsys.readouterr().err
    assert code == 2 and "has no metric 'accuracy'; its samples have: acc" in err
    for side, scores in (("gold", [1.0, 0.5] * 10), ("gnew", [1.0, 0.0] * 10)):  # a graded score on generated text
        folder = tmp_path / side
        folder.mkdir()
        with open(folder / f"samples_gen_{TS}.jsonl", "w") as f:
            for i, v in enumerate(scores):
                f.write(json.dumps({"doc_id": i, "target": f"answer {i}", "filtered_resps": [f"answer {i}" if v else "no"],
                                    "filter": "none", "metrics": ["score"], "score": v, "doc_hash": f"d{i}",
                                    "prompt_hash": f"p{i}", "target_hash": f"t{i}"}) + "\n")
        _config(folder, "gen", "generate_until")
    code = main(["compare", str(tmp_path / "gold"), str(tmp_path / "gnew"), "--metric", "score"])
    err = capsys.readouterr().err
    assert code == 2 and "is not 0/1 (e.g. 0.5)" in err and "--similarity" in err
    code = main(["compare", str(tmp_path / "gold"), str(tmp_path / "gnew"), "--similarity", "exact_match"])
    printed = capsys.readouterr()
    assert code == 0, printed.err  # the advice works: the similarity scores the task


def test_grammar_of_one_fixed_and_one_broken(tmp_path, capsys):
    write_mc(tmp_path / "old", "t", [i != 1 for i in range(30)])
    write_mc(tmp_path / "new", "t", [i != 0 for i in range(30)])
    _, _, printed = compare(capsys, tmp_path / "old", tmp_path / "new")
    assert "1 answer broke" in printed and "1 was fixed" in printed and "1 were" not in printed


@pytest.mark.slow
def test_the_built_wheel_compares_the_shipped_pair(tmp_path):
    """The wheel, not the editable checkout: built, installed into a fresh venv (not editable; its dependencies taken
    from this one), and `adaptguard compare example:fp32 example:int8` run from a folder outside the checkout — the package
    data (the shipped pair, the task folders) must be in it."""
    import subprocess
    import sys
    import sysconfig

    root = ROOT
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(root)], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("adaptguard-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "venv")], check=True)
    python = tmp_path / "venv" / "bin" / "python"
    # this venv's packages as the new one's dependencies: a path on sys.path, whose .pth files (the editable
    # adaptguard's among them) are not run
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True, timeout=300)
    where = subprocess.run([python, "-c", "import adaptguard; print(adaptguard.__file__)"], capture_output=True,
                           text=True, cwd=tmp_path, check=True).stdout
    assert str(tmp_path / "venv") in where and str(root / "src") not in where
    proc = subprocess.run([tmp_path / "venv" / "bin" / "adaptguard", "compare", "example:fp32", "example:int8",
                           "--fail-on", "nfr>10%", "--json", "c.json"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=300)
    assert proc.returncode in (1, 3), proc.stderr[-2000:]
    report = json.loads((tmp_path / "c.json").read_text())
    assert len(report["tasks"]) >= 2 and report["gate"]["decisions"]


# ------------------------------------------------------ every output agrees with the exit code, on four kinds of runs
def assert_outputs_agree(folder: Path, code: int) -> None:
    """The JSON, the Markdown, the page and the exit code of one `compare` say the same: the status, every
    decision in the verdict column, and no verdict word the gate did not reach."""
    from adaptguard.compat.verdicts import EXIT_PASSED, EXIT_REGRESSION, EXIT_UNDECIDED

    report = json.loads((folder / "report.json").read_text())
    gate = report["gate"]
    assert code == {"breach": EXIT_REGRESSION, "undecided": EXIT_UNDECIDED, "clear": EXIT_PASSED}[gate["status"]]
    md, page = (folder / "gate.md").read_text(), (folder / "gate.html").read_text()
    head = {"breach": "FAILED", "undecided": "UNDECIDED", "clear": "passed"}[gate["status"]]
    assert f"**Gate: {head}" in md and f"gate: {head}" in page.split('id="verdict">')[1].split("</div>")[0]
    banner = page.split('id="verdict"')[0].rsplit("<div ", 1)[1]
    assert {"breach": "failed", "undecided": "undecided", "clear": "passed"}[gate["status"]] in banner
    for d in gate["decisions"]:
        word = "BREACH" if d["decision"] == "breach" else d["decision"]
        row = next(line for line in md.splitlines() if line.startswith(f"| {d['task']} |")) \
            if not d["task"].startswith("overall") else None
        assert row is None or f"{word} (" in row and d["expr"] in row.split(f"{word} (")[1].split(")")[0], (d, row)
    for phrase in (r"not significant\b", "REGRESSION", "a drop the data support", "gate: passed, every threshold clear"
                   if gate["left_out"] else "@@"):  # verdicts of their own, beside the gate's
        assert not re.search(phrase, md), phrase


def compare_all(capsys, folder: Path, old, new, *args) -> int:
    code = main(["compare", str(old), str(new), *args, "--json", str(folder / "report.json"), "--markdown",
                 str(folder / "gate.md"), "--html", str(folder / "gate.html")])
    capsys.readouterr()
    return code


LAMBADA_YAML = """task: t_lambada
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: loglikelihood
test_split: test
doc_to_text: "{{{{context}}}}"
doc_to_target: " {{{{word}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


@pytest.mark.slow
def test_outputs_agree_on_a_loglikelihood_task_run_through_lm_eval(tmp_path, capsys, embedded_path, tiny_v2_path):
    """A lambada-style task (one [log-likelihood, is_greedy] per document) evaluated by lm-eval on the embedded model
    and its update: no chance level, never churn, its flips gated; every output says what the exit code says."""
    from lm_eval_runs import ANTONYMS

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    rows = [{"context": f"the opposite of {a} is", "word": b} for a, b in ANTONYMS]
    (tasks / "lambada.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tasks / "t_lambada.yaml").write_text(LAMBADA_YAML.format(data=tasks / "lambada.jsonl"))
    for side, model in (("old", embedded_path), ("new", tiny_v2_path)):
        proc = run_lm_eval_cli("--model", "hf", "--model_args", f"pretrained={model}", "--tasks", "t_lambada",
                               "--include_path", tasks, "--device", "cpu", "--batch_size", "8", "--log_samples",
                               "--output_path", tmp_path / side)
        assert proc.returncode == 0, proc.stderr[-3000:]
    for exprs in (["--fail-on", "nfr>2%"], ["--fail-on", "nfr>90%", "--fail-on", "acc_drop>50%"]):
        code = compare_all(capsys, tmp_path, tmp_path / "old", tmp_path / "new", *exprs)
        report = json.loads((tmp_path / "report.json").read_text())
        entry = report["tasks"]["t_lambada"]
        assert entry["output_type"] == "loglikelihood" and entry["churn"] is None
        assert all(d["task"] == "t_lambada" for d in report["gate"]["decisions"])  # nothing left out as churn
        assert_outputs_agree(tmp_path, code)


def test_outputs_agree_on_the_shipped_pair_a_replicate_set_and_a_churn_set(tmp_path, capsys):
    code = compare_all(capsys, tmp_path, "example:fp32", "example:int8", "--fail-on", "nfr>10%",
                       "--fail-on", "acc_drop>1%", "--fail-on", "overall:acc_drop>1%")
    assert code == 1
    assert_outputs_agree(tmp_path, code)
    rng = np.random.default_rng(3)
    base = rng.random(150) < 0.7
    for r in range(2):  # replicates: reruns that differ a little, the update breaking 10 % of the items
        write_mc(tmp_path / f"old{r}", "t", base ^ (rng.random(150) < 0.03))
        write_mc(tmp_path / f"new{r}", "t", base & (rng.random(150) >= 0.1))
    code = compare_all(capsys, tmp_path, f"{tmp_path / 'old0'},{tmp_path / 'old1'}",
                       f"{tmp_path / 'new0'},{tmp_path / 'new1'}", "--fail-on", "nfr>2%", "--fail-on", "excess_nfr>20%")
    assert code == 1
    assert_outputs_agree(tmp_path, code)
    # both at chance on a binary task, a quarter of the items flipping each way: what two coin tossers do
    write_mc(tmp_path / "cold", "coin", [i % 2 == 0 for i in range(300)], 2)
    write_mc(tmp_path / "cnew", "coin", [i % 4 < 2 for i in range(300)], 2)
    write_mc(tmp_path / "cold", "big", [True] * 400), write_mc(tmp_path / "cnew", "big", [True] * 400)
    code = compare_all(capsys, tmp_path, tmp_path / "cold", tmp_path / "cnew", "--fail-on", "nfr>2%")
    report = json.loads((tmp_path / "report.json").read_text())
    assert code == 0 and report["tasks"]["coin"]["churn"]["churn"] and report["gate"]["left_out"]
    assert_outputs_agree(tmp_path, code)


@pytest.mark.parametrize("expr, greater", [("acc_drop>1%", True), ("acc_drop<10%", False)])
def test_identical_reruns_of_an_accuracy_drop_take_the_margin_test_on_whole_counts(tmp_path, capsys, expr, greater):
    """Identical reruns, 50 items, 5 broken and 3 fixed: the per-item means over run pairs are whole counts (5 and 3,
    up to float rounding), so the item-level test is the margin's exact test on exactly those counts — neither
    direction's rounding toward H0 may move a whole count. Its p by brute force (tests/independent.py)."""
    from independent import margin_p

    old = [True] * 40 + [False] * 10
    new = [i >= 5 for i in range(40)] + [i < 3 for i in range(10)]
    for r in range(2):
        write_mc(tmp_path / f"old{r}", "t", old), write_mc(tmp_path / f"new{r}", "t", new)
    code, report, printed = compare(capsys, f"{tmp_path / 'old0'},{tmp_path / 'old1'}",
                                    f"{tmp_path / 'new0'},{tmp_path / 'new1'}", "--fail-on", expr)
    (d,) = report["gate"]["decisions"]
    margin = 0.01 if greater else 0.10
    assert d["p_value"] == pytest.approx(margin_p(5, 3, 50, margin, greater), rel=1e-6), printed
