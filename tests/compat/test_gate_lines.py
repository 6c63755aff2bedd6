"""The gate's sentences against lines written out by hand (issue 95): every branch of `decision_line` (breach, clear,
undecided beyond / within / at the threshold, raw values, "some task"), every way `_reach` says how far the data
reach, thresholds as written (`0.799%`), `headline`'s and `describe`'s whole text and the exit status of each
outcome. The decisions are built here field by field, so the expected text depends on nothing the program computed."""

from fractions import Fraction

import pytest

from adaptguard.compat.gate import exit_status
from adaptguard.compat.render.decisions import decision_line, describe, headline
from adaptguard.compat.verdicts import Across, Decision, Evidence, Gate, LeftOut, Reason, Shows, ThresholdDecision

B, U, C = Decision.BREACH, Decision.UNDECIDED, Decision.CLEAR
TEST = "exact binomial test"


def nfr(decision, reason, value, **kw):
    return ThresholdDecision(task="arc", expr="nfr>2%", metric="nfr", op=">", threshold=0.02, value=value,
                             decision=decision, reason=reason, **kw)


LINES = [
    (nfr(B, Reason.SUPPORTED, 0.031, p_value=0.012345, p_within=0.99, test=TEST, interval=(0.021, 0.045), level=0.9),
     "arc: nfr = 3.10% > 2.00% (p = 0.0123, exact binomial test; 90 % interval 2.10% to 4.50%)  [nfr>2%]"),
    (nfr(C, Reason.SHOWN_WITHIN, 0.005, p_value=0.999, p_within=0.00321, test=TEST, interval=(0.001, 0.012),
         level=0.9),
     "arc: nfr = 0.50% < 2.00% shown (p = 0.00321, exact binomial test; 90 % interval 0.10% to 1.20%)  [nfr>2%]"),
    (nfr(U, Reason.BEYOND_NOT_SIGNIFICANT, 0.024, p_value=0.2134, p_within=0.9, test=TEST, mde=0.015),
     "arc: nfr = 2.40% > 2.00% but not significantly (p = 0.213 ≥ α, exact binomial test; the data detect a change "
     "of 1.50% at 80 % power: add items or runs)  [nfr>2%]"),
    (ThresholdDecision(task="mmlu", expr="mmlu:btc<95%", metric="btc", op="<", threshold=0.95, value=0.97,
                       decision=U, reason=Reason.WITHIN_NOT_SHOWN, p_value=0.95, p_within=0.08, test=TEST,
                       items_needed=12345),
     "mmlu: btc = 97.00% ≥ 95.00% but not shown above it (p = 0.08 ≥ α, exact binomial test; at the rate seen, "
     "about 12,345 items would decide it)  [mmlu:btc<95%]"),
    (nfr(U, Reason.AT_THRESHOLD, 0.02, p_value=0.52, p_within=0.61, test=TEST, evidence=Evidence.ONE_RUN),
     "arc: nfr = 2.00%, exactly the threshold: not beyond it, nor shown below it (p = 0.52 beyond, 0.61 below, both "
     "≥ α, exact binomial test; the value seen equals the threshold: no number of items decides it at this value)"
     "  [nfr>2%]"),
    (nfr(U, Reason.AT_THRESHOLD, 0.02, p_value=0.52, p_within=0.61, test=TEST, mde=0.0312),
     "arc: nfr = 2.00%, exactly the threshold: not beyond it, nor shown below it (p = 0.52 beyond, 0.61 below, both "
     "≥ α, exact binomial test; the data detect a change of 3.12% at 80 % power, but at the value seen no number of "
     "items or runs decides it)  [nfr>2%]"),
    (nfr(U, Reason.BEYOND_NOT_SIGNIFICANT, 0.021, p_value=0.4, p_within=0.7, test=TEST, evidence=Evidence.ONE_RUN),
     "arc: nfr = 2.10% > 2.00% but not significantly (p = 0.4 ≥ α, exact binomial test; at the rate seen, more than "
     "10,000,000 items would be needed to decide it)  [nfr>2%]"),
    (nfr(U, Reason.WITHIN_NOT_SHOWN, 0.0, p_value=1.0, p_within=0.3, test="group", evidence=Evidence.GROUP),
     "arc: nfr = 0.00% ≤ 2.00% but not shown below it (p = 0.3 ≥ α, group; no change was seen to plan from: add "
     "items or runs)  [nfr>2%]"),
    (nfr(U, Reason.WITHIN_NOT_SHOWN, 0.01, p_value=1.0, p_within=0.3, test="group", evidence=Evidence.GROUP),
     "arc: nfr = 1.00% ≤ 2.00% but not shown below it (p = 0.3 ≥ α, group; add items or runs to decide it)"
     "  [nfr>2%]"),
    (ThresholdDecision(task="mmlu", expr="btc<95%", metric="btc", op="<", threshold=0.95, value=0.99,
                       decision=C, reason=Reason.SHOWN_WITHIN, p_value=1.0, p_within=0.002, test=TEST),
     "mmlu: btc = 99.00% > 95.00% shown (p = 0.002, exact binomial test)  [btc<95%]"),
    # --significance off: raw values
    (nfr(B, Reason.BEYOND, 0.031), "arc: nfr = 3.10% > 2.00%  [nfr>2%]"),
    (nfr(C, Reason.WITHIN, 0.01), "arc: nfr = 1.00% ≤ 2.00%  [nfr>2%]"),
    (nfr(C, Reason.AT_THRESHOLD_RAW, 0.02), "arc: nfr = 2.00%, exactly the threshold: not beyond it  [nfr>2%]"),
    (ThresholdDecision(task="arc", expr="acc_drop<-1%", metric="acc_drop", op="<", threshold=-0.01, value=0.0,
                       decision=C, reason=Reason.WITHIN), "arc: acc_drop = 0.00% ≥ -1.00%  [acc_drop<-1%]"),
    # thresholds as written: more decimals where they have them
    (ThresholdDecision(task="arc", expr="nfr>0.799%", metric="nfr", op=">", threshold=0.00799, value=0.0081,
                       decision=B, reason=Reason.BEYOND), "arc: nfr = 0.81% > 0.799%  [nfr>0.799%]"),
    (ThresholdDecision(task="arc", expr="nfr>12.3456%", metric="nfr", op=">", threshold=0.123456, value=0.123456,
                       decision=C, reason=Reason.AT_THRESHOLD_RAW),
     "arc: nfr = 12.3456%, exactly the threshold: not beyond it  [nfr>12.3456%]"),
    # a metric not in rate units: four significant digits, no %
    (ThresholdDecision(task="gen", expr="m_r>0.5", metric="m_r", op=">", threshold=0.5, value=0.123456,
                       decision=C, reason=Reason.SHOWN_WITHIN, p_value=0.9, p_within=0.001, test="t test"),
     "gen: m_r = 0.1235 < 0.5 shown (p = 0.001, t test)  [m_r>0.5]"),
    # across tasks: the pooled drop, or some task
    (ThresholdDecision(task="overall", expr="overall:acc_drop>0.5%", metric="acc_drop", op=">", threshold=0.005,
                       value=0.031, decision=B, reason=Reason.SOME_TASK, p_value=0.004, p_within=0.9,
                       test="pooled, max-drop and Fisher tests", across=Across(Shows.SOME_TASK, "mmlu_x")),
     "overall: some task dropped more than 0.50% (most: mmlu_x, acc_drop = 3.10%) (max-drop/Fisher p = 0.004, "
     "pooled, max-drop and Fisher tests)  [overall:acc_drop>0.5%]"),
    (ThresholdDecision(task="overall", expr="overall:acc_drop>0.5%", metric="acc_drop", op=">", threshold=0.005,
                       value=0.012, decision=B, reason=Reason.SUPPORTED, p_value=0.004, p_within=0.9,
                       test="pooled test", across=Across(Shows.POOLED)),
     "overall: acc_drop = 1.20% > 0.50% (p = 0.004, pooled test)  [overall:acc_drop>0.5%]"),
]


@pytest.mark.parametrize("decision, line", LINES, ids=[f"{i}-{d.decision.value}-{d.reason.value}" for i, (d, _) in
                                                        enumerate(LINES)])  # ASCII ids: mutmut runs tests by id
def test_each_decision_reads_as_written_by_hand(decision, line):
    assert decision_line(decision) == line
    assert decision_line(dict(decision)) == line  # as report.json holds it


def test_headline_describe_and_exit_status_of_each_outcome():
    breach, clear, undecided = LINES[0][0], LINES[1][0], LINES[2][0]
    churn = LeftOut.churn("hard", "nfr>2%")
    gate = Gate(0.05, ["nfr>2%"], [breach, undecided, clear], [churn], ["hard"])
    assert describe(gate) == (
        "gate: FAILED, a breach the data support (1 breach, 1 undecided, 1 clear; 1 (task, threshold) pair left out);"
        " breach: its one-sided test at p < 0.05; clear: the opposite test at p < 0.05:\n"
        f"  breach: {LINES[0][1]}\n"
        f"  undecided: {LINES[2][1]}\n"
        "  left out: hard (churn: nothing shows either model above guessing, nor flips beyond what guessing makes "
        "(--include-churn counts them))")
    assert exit_status(gate) == 1
    gate = Gate(0.05, ["nfr>2%"], [undecided, clear])
    assert describe(gate) == (
        "gate: UNDECIDED, no breach but not every threshold could be decided (0 breach, 1 undecided, 1 clear); "
        "breach: its one-sided test at p < 0.05; clear: the opposite test at p < 0.05:\n"
        f"  undecided: {LINES[2][1]}")
    assert exit_status(gate) == 3
    gate = Gate(0.05, ["nfr>2%"], [clear])
    assert describe(gate) == ("gate: passed, every threshold clear (0 breach, 0 undecided, 1 clear); breach: its "
                              "one-sided test at p < 0.05; clear: the opposite test at p < 0.05")
    assert exit_status(gate) == 0
    gate = Gate(0.05, ["nfr>2%"], [clear], [LeftOut.undefined("gen", "nfr>2%", "nfr")])
    assert headline(gate) == ("gate: passed, every threshold decided is clear (0 breach, 0 undecided, 1 clear; "
                              "1 (task, threshold) pair left out)")
    assert exit_status(gate) == 0
    # nothing left to decide: undecided, and the reasons said once
    gate = Gate(0.05, ["nfr>2%"], [], [churn, LeftOut.undefined("gen", "nfr>2%", "nfr"),
                                       LeftOut.undefined("gen2", "nfr>2%", "nfr")])
    assert describe(gate) == (
        "gate: UNDECIDED, no breach but not every threshold could be decided (0 breach, 0 undecided, 0 clear; "
        "3 (task, threshold) pairs left out); breach: its one-sided test at p < 0.05; clear: the opposite test at "
        "p < 0.05:\n"
        "  no (task, threshold) was left to decide: gen2: nfr is not defined on this task; gen: nfr is not defined on "
        "this task; hard: churn: nothing shows either model above guessing, nor flips beyond what guessing makes "
        "(--include-churn counts them)")
    assert exit_status(gate) == 3


def test_raw_values_never_say_the_data_support_anything():
    beyond, within = LINES[10][0], LINES[11][0]
    gate = Gate(None, ["nfr>2%"], [beyond, within])
    assert describe(gate) == (
        "gate: FAILED, a value beyond its threshold (raw values, no test; 1 breach, 0 undecided, 1 clear); "
        "--significance off: breach where a value is beyond its threshold, clear otherwise:\n"
        f"  breach: {LINES[10][1]}")
    assert exit_status(gate) == 1
    assert headline(Gate(None, ["nfr>2%"], [within])) == (
        "gate: passed, no value beyond its threshold (raw values, no test; 0 breach, 0 undecided, 1 clear)")
    assert headline(Gate(None, ["nfr>2%"], [within], [LeftOut.undefined("gen", "nfr>2%", "nfr")])) == (
        "gate: passed, no value decided is beyond its threshold (raw values, no test; 0 breach, 0 undecided, 1 clear; "
        "1 (task, threshold) pair left out)")


def test_reasons_are_codes_with_their_sentence_beside_and_old_reports_still_read():
    """report.json writes each reason as a stable code (`why_code`) beside its sentence (`why`); a decision or a
    left-out pair read back takes the code (a reworded sentence changes nothing), and a report written before the
    codes is read by its sentence."""
    from adaptguard.compat.verdicts import LeftOutReason, decision_of

    codes = {"supported", "some_task", "shown_within", "beyond_not_significant", "within_not_shown", "at_threshold",
             "beyond", "within", "at_threshold_raw"}
    assert {r.value for r in Reason} == codes and len({r.sentence for r in Reason}) == len(codes)
    for d, _ in LINES:
        written = dict(d)
        assert (written["why_code"], written["why"]) == (d.reason.value, d.reason.sentence)
        assert decision_of({**written, "why": "reworded"}).reason is d.reason
        old = {k: v for k, v in written.items() if k != "why_code"}
        assert decision_of(old).reason is d.reason
    churn, undefined = LeftOut.churn("hard", "nfr>2%"), LeftOut.undefined("gen", "nfr>2%", "nfr")
    gate = Gate(0.05, ["nfr>2%"], [], [churn, undefined])
    written = [dict(x) for x in gate.left_out]
    assert [x["why_code"] for x in written] == ["churn", "undefined"]
    for left in (written, [{k: v for k, v in x.items() if k != "why_code"} for x in written]):
        back = Gate.of({"significance": 0.05, "thresholds": ["nfr>2%"], "decisions": [], "left_out": left})
        assert [x.reason for x in back.left_out] == [LeftOutReason.CHURN, LeftOutReason.UNDEFINED]
        assert describe(back) == describe(gate)


ALL = ("nfr, pfr, btc, inconsistency_flips, old_acc, new_acc, smooth_nfr, smooth_pfr, acc_drop, excess_nfr, m_g, m_r, "
       "mean_delta, delta_nfr, delta_nfr_pct, delta_pfr, delta_pfr_pct, delta_inconsistency_flips, "
       "delta_inconsistency_flips_pct, delta_smooth_nfr, delta_smooth_nfr_pct, delta_smooth_pfr, delta_smooth_pfr_pct, "
       "delta_m_g, delta_m_g_pct, delta_m_r, delta_m_r_pct")


@pytest.mark.parametrize("expr, message", [
    ("nfr", "expected [TASKGLOB:]METRIC>VALUE or [TASKGLOB:]METRIC<VALUE, e.g. 'nfr>0.02' or 'mmlu_*:btc<0.95'"),
    ("mmlu:nfr=2%", "expected [TASKGLOB:]METRIC>VALUE or [TASKGLOB:]METRIC<VALUE, e.g. 'nfr>0.02' or "
                    "'mmlu_*:btc<0.95'"),
    ("NFR>2%", f"unknown metric 'NFR'; did you mean nfr? (all: {ALL})"),
    ("nrf>2%", f"unknown metric 'nrf'; did you mean nfr? (all: {ALL})"),
    ("zzz>2%", f"unknown metric 'zzz'; known: {ALL}"),
    ("nfr>abc", "the threshold 'abc' is not a finite number"),
    ("nfr>nan", "the threshold 'nan' is not a finite number"),
    ("nfr>inf%", "the threshold 'inf%' is not a finite number"),
    ("nfr>1e999", "the threshold '1e999' is not a finite number"),
    ("m_r>2%", "m_r is not a rate; give its threshold without %"),
    ("nfr>1", "nfr is a rate (the table prints it in %): write 1% or 100% (1 alone could mean either)"),
    ("acc_drop<-1", "acc_drop is a rate (the table prints it in %): write -1% or -100% (1 alone could mean either)"),
    ("nfr>2", "nfr is a rate (the table prints it in %): write 2% or 0.02"),
    ("nfr>-5%", "nfr lies between 0% and 100%; a threshold of -5% would decide nothing"),
    ("btc<100.5%", "btc lies between 0% and 100%; a threshold of 100.5% would decide nothing"),
    ("acc_drop>-101%", "acc_drop lies between -100% and 100%; a threshold of -101% would decide nothing"),
], ids=lambda x: x if len(x) < 20 else "message")
def test_each_refused_threshold_says_why_in_its_own_words(expr, message):
    from adaptguard.compat.gate import GateError, Threshold

    with pytest.raises(GateError) as err:
        Threshold.parse(expr)
    assert str(err.value) == f"--fail-on {expr!r}: {message}"


@pytest.mark.parametrize("expr, fields", [
    ("nfr>0.7%", ("nfr", ">", "*", Fraction(7, 1000))),  # the decimal as written: 0.7 / 100 in floats is below it
    (" mmlu_*:btc<95% ", ("btc", "<", "mmlu_*", Fraction(19, 20))),
    ("overall:acc_drop>-2.5%", ("acc_drop", ">", "overall", Fraction(-1, 40))),
    ("m_r>0.125", ("m_r", ">", "*", Fraction(1, 8))),
    ("t :nfr < 0%", ("nfr", "<", "t", Fraction(0))),
], ids=["percent", "glob", "overall", "score", "spaces"])
def test_a_threshold_is_kept_exactly_as_written(expr, fields):
    from adaptguard.compat.gate import Threshold

    t = Threshold.parse(expr)
    assert (t.metric, t.op, t.tasks, t.exact) == fields and t.expr == expr and t.value == float(fields[3])
    # made from a float (the API's way), the threshold is the decimal its shortest repr writes
    made = Threshold(expr="x", metric=t.metric, op=t.op, value=float(fields[3]))
    assert made.exact == Fraction(repr(float(fields[3])))
    assert Threshold(expr="x", metric="nfr", op=">", value=0.007).exact == Fraction(7, 1000)


ONE = {"n": 100, "old_acc": 0.6, "new_acc": 0.5, "n_negative_flips": 12, "n_positive_flips": 2, "nfr": 0.12,
       "pfr": 0.02, "btc": 0.8, "inconsistency_flips": None}


def _replicated():
    import numpy as np

    from adaptguard.compat.stats.replicates import replicate_flips

    rng = np.random.default_rng(0)
    r = replicate_flips(rng.random((2, 50)) < 0.7, rng.random((2, 50)) < 0.6, level=0.9)
    return {"n": 50, "old_acc": r["old_acc"], "new_acc": r["new_acc"], "nfr": r["nfr"], "pfr": r["pfr"],
            "replicates": r}


@pytest.mark.parametrize("expr, significance, message", [
    ("excess_nfr>1%", 0.05, "--fail-on 'excess_nfr>1%': excess_nfr needs replicate runs on a side (OLD or NEW as "
                            "RUN1,RUN2,...): with one run each, nothing measures the noise floor of reruns"),
    ("m_g>0.1", 0.05, "--fail-on 'm_g>0.1': m_g has no significance test; use one of nfr, pfr, btc, "
                      "inconsistency_flips, old_acc, new_acc, smooth_nfr, smooth_pfr, acc_drop, or gate it with "
                      "--significance off"),
    ("smooth_nfr>2%", None, "--fail-on 'smooth_nfr>2%': no matched task reports smooth_nfr (excess_nfr needs "
                            "replicate runs: OLD or NEW as run1,run2; a generation task needs --similarity for "
                            "smooth_*; inconsistency_flips needs predictions; delta_* needs --compatible)"),
    ("overall:nfr>2%", 0.05, "--fail-on 'overall:nfr>2%': across tasks only acc_drop is combined (Kübler et al.'s "
                             "pooled, max-drop and Fisher tests); gate nfr per task, e.g. 'nfr>...'"),
    ("zz*:nfr>2%", 0.05, "--fail-on 'zz*:nfr>2%': no task matches 'zz*'; tasks: t"),
    ("nfr>2%", 1.5, "--significance 1.5: must be in (0, 1), e.g. 0.05"),
    ("nfr>2%", 0.0, "--significance 0.0: must be in (0, 1), e.g. 0.05"),
    ("nfr>2%", 1.0, "--significance 1.0: must be in (0, 1), e.g. 0.05"),
    ("pfr>2%", "replicates", "--fail-on 'pfr>2%': pfr has no significance test over replicate runs; use one of nfr, "
                             "acc_drop, excess_nfr, or gate it with --significance off"),
], ids=["excess_nfr", "m_g", "smooth_nfr", "overall_nfr", "no_task", "alpha_1.5", "alpha_0", "alpha_1", "replicates"])
def test_each_threshold_the_report_cannot_take_is_refused_in_its_words(expr, significance, message):
    from adaptguard.compat.gate import GateError, Threshold, check_gate

    entry = _replicated() if significance == "replicates" else ONE
    with pytest.raises(GateError) as err:
        check_gate({"tasks": {"t": entry}}, [Threshold.parse(expr)], 0.05 if significance == "replicates" else
                   significance)
    assert str(err.value) == message


def test_a_metric_a_task_lacks_is_left_out_and_with_no_test_raw_values_pass_the_refusal():
    from adaptguard.compat.gate import Threshold, check_gate

    gate = check_gate({"tasks": {"t": ONE}}, [Threshold.parse("inconsistency_flips>1%")], 0.05)
    assert gate.decisions == [] and [dict(x) for x in gate.left_out] == [
        {"task": "t", "expr": "inconsistency_flips>1%", "why": "inconsistency_flips is not defined on this task",
         "why_code": "undefined"}]
    gate = check_gate({"tasks": {"t": {**ONE, "m_g": 0.3}}}, [Threshold.parse("m_g>0.1")], None)  # off: raw values
    assert [(d.decision.value, d.reason.value) for d in gate.decisions] == [("breach", "beyond")]
