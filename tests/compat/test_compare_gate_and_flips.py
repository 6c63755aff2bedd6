"""`adaptguard compare`: the regression gate (--fail-on), the flipped documents (--show-flips, --flips-out) and several
new runs in one table; on real lm-eval runs and on hand-made reports."""

import json
import math

import numpy as np
import pytest
from in_process import run_cli
from test_compat import independent_flips

from adaptguard.compat.evidence import p_beyond
from adaptguard.compat.gate import GateError, Threshold, check_gate


def breach_p_value(entry, threshold):
    return p_beyond(entry, threshold.metric, threshold.value, threshold.op)


def upper_tail(k, n, p):
    """P(X >= k), X ~ Binomial(n, p), summed by hand."""
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1))


def entry(n, old_right, neg, pos):
    """A compare entry with the fields the gate reads."""
    from adaptguard.compat.stats.metrics import mcnemar_exact_p

    return {"n": n, "old_acc": old_right / n, "new_acc": (old_right - neg + pos) / n, "nfr": neg / n, "pfr": pos / n,
            "n_negative_flips": neg, "n_positive_flips": pos, "btc": (old_right - neg) / old_right,
            "mcnemar_p": mcnemar_exact_p(neg, pos), "inconsistency_flips": None}


def test_parse_expressions():
    t = Threshold.parse("mmlu_*:nfr>0.02")
    assert (t.tasks, t.metric, t.op, t.value) == ("mmlu_*", "nfr", ">", 0.02)
    t = Threshold.parse("btc < 0.95")
    assert (t.tasks, t.metric, t.op, t.value) == ("*", "btc", "<", 0.95)
    for bad, message in (("nfr=0.02", "expected"), ("nfr>", "expected"), ("accuracy>0.1", "unknown metric"),
                         ("nfr>nan", "not a finite number"), ("nfr>abc", "not a finite number")):
        with pytest.raises(GateError, match=message):
            Threshold.parse(bad)


def test_breach_p_values_match_hand_binomials():
    e = entry(n=40, old_right=20, neg=5, pos=1)
    # nfr: 5 of 40 items, H0 rate <= 0.02
    assert breach_p_value(e, Threshold.parse("nfr>0.02")) == pytest.approx(upper_tail(5, 40, 0.02))
    # btc: 15 of the 20 old-right items stay right, H0 btc >= 0.95: P(X <= 15), X ~ Bin(20, 0.95)
    want = 1 - upper_tail(16, 20, 0.95)
    assert breach_p_value(e, Threshold.parse("btc<0.95")) == pytest.approx(want)
    # acc_drop: McNemar on 5 negative vs 1 positive flips, one-sided (a drop): P(X >= 5), X ~ Bin(6, 1/2)
    assert breach_p_value(e, Threshold.parse("acc_drop>0")) == pytest.approx(7 / 64)


def test_significance_keeps_only_supported_breaches():
    report = {"tasks": {"small": entry(n=10, old_right=5, neg=1, pos=0),  # nfr .10, p = 1 - .98^10 = .18
                        "large": entry(n=40, old_right=20, neg=5, pos=1),  # nfr .125, p ≈ .0012
                        "clean": entry(n=40, old_right=20, neg=0, pos=3)}}
    plain = check_gate(report, [Threshold.parse("nfr>0.02")])
    assert not plain["passed"] and sorted(b["task"] for b in plain["breaches"]) == ["large", "small"]
    tested = check_gate(report, [Threshold.parse("nfr>0.02")], significance=0.05)
    assert [b["task"] for b in tested["breaches"]] == ["large"]
    assert tested["breaches"][0]["p_value"] == pytest.approx(upper_tail(5, 40, 0.02))
    strict = check_gate(report, [Threshold.parse("nfr>0.02")], significance=0.001)
    # no breach at 0.001, but not passed either: 0 of 40 items cannot show an NFR below 2 % (0.98^40 = 0.45)
    assert not strict["breaches"] and strict["status"] == "undecided" and not strict["passed"]
    only_small = check_gate(report, [Threshold.parse("sm*:nfr>0.02")])
    assert [b["task"] for b in only_small["breaches"]] == ["small"]


def test_gate_bad_thresholds():
    report = {"tasks": {"t": entry(n=10, old_right=5, neg=1, pos=0)}}
    with pytest.raises(GateError, match="no task matches 'mmlu'"):
        check_gate(report, [Threshold.parse("mmlu:nfr>0.02")])
    with pytest.raises(GateError, match="m_g has no significance test"):
        check_gate(report, [Threshold.parse("m_g<0.1")], significance=0.05)
    with pytest.raises(GateError, match="no matched task reports smooth_nfr"):
        check_gate(report, [Threshold.parse("smooth_nfr>0.1")])
    with pytest.raises(GateError, match="must be in"):
        check_gate(report, [Threshold.parse("nfr>0.1")], significance=1.5)
    # inconsistency_flips undefined (no predictions): left out, not a breach, and with nothing else to decide the gate
    # cannot pass
    gate = check_gate(report, [Threshold.parse("inconsistency_flips>0")])
    assert not gate["breaches"] and gate["status"] == "undecided" and gate["nothing_decided"]
    assert gate["left_out"] == [{"task": "t", "expr": "inconsistency_flips>0",
                                 "why": "inconsistency_flips is not defined on this task", "why_code": "undefined"}]


def test_compare_gate_on_real_runs(lm_runs, tmp_path):
    from lm_eval_runs import samples_file

    want = {task: independent_flips(samples_file(lm_runs / "old", task), samples_file(lm_runs / "new", task), metric)
            for task, metric in (("t_piqa", "acc"), ("t_gsm", "exact_match"))}
    worst = max(w["nfr"] for w in want.values())
    assert worst > 0  # the fixture's aggressive fine-tune broke something (see test_compare_cli_end_to_end)
    threshold = worst / 2
    out = tmp_path / "gate"
    # raw values over every task (churn included), the gate as it compares numbers
    proc = run_cli("compare", lm_runs / "old", lm_runs / "new", "--fail-on", f"nfr>{threshold}",
                   "--fail-on", "btc<0", "--json", out / "g.json", "--markdown", out / "g.md", "--significance", "off",
                   "--include-churn")
    assert proc.returncode == 1, proc.stderr[-2000:]
    breached = sorted(t for t, w in want.items() if w["nfr"] > threshold)
    gate = json.loads((out / "g.json").read_text())["gate"]
    assert not gate["passed"] and sorted(b["task"] for b in gate["breaches"]) == breached
    for b in gate["breaches"]:
        assert b["value"] == pytest.approx(want[b["task"]]["nfr"]) and b["threshold"] == threshold
        assert b["task"] in proc.stderr and f"nfr = {100 * b['value']:.2f}% > {100 * threshold:.2f}%" in proc.stderr
    assert "Gate: FAILED" in (out / "g.md").read_text() and "(!)" in (out / "g.md").read_text()

    # a rate of 1 is written with its unit (`nfr>1` alone is refused: 1 % or 100 %?)
    proc = run_cli("compare", lm_runs / "old", lm_runs / "new", "--fail-on", f"nfr>{worst}" if worst < 1 else "nfr>100%",
                   "--fail-on",
                   f"acc_drop>{drop}" if (drop := max(w['old_acc'] - w['new_acc'] for w in want.values())) < 1
                   else "acc_drop>100%", "--significance", "off",
                   "--include-churn")
    assert proc.returncode == 0 and "gate: passed" in proc.stdout, proc.stderr[-2000:]


@pytest.mark.parametrize("args, message", [
    (["--fail-on", "nfr=0.1"], "expected [TASKGLOB:]METRIC>VALUE"),
    (["--fail-on", "flips>0.1"], "unknown metric 'flips'"),
    (["--fail-on", "mmlu_*:nfr>0.1"], "no task matches 'mmlu_*'"),
    (["--fail-on", "m_r>0.1", "--significance", "0.05"], "m_r has no significance test"),
    (["--fail-on", "nfr>2"], "nfr is a rate (the table prints it in %): write 2% or 0.02"),
    (["--fail-on", "m_r>2%"], "m_r is not a rate"),
    (["--significance", "2"], "expected a level in (0, 1)"),
    (["--fail-on", "excess_nfr>0.01"], "excess_nfr needs replicate runs"),
])
def test_compare_gate_bad_input_exits_2_and_writes_nothing(lm_runs, tmp_path, args, message):
    proc = run_cli("compare", lm_runs / "old", lm_runs / "new", *args, "--json", tmp_path / "x.json")
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "x.json").exists()


def test_show_flips_and_flips_out_on_real_runs(lm_runs, tmp_path):
    """Every flipped document, read independently from the raw sample lines: the choice texts for multiple choice,
    the generation for the generation task; negative flips first in --show-flips."""
    from lm_eval_runs import samples_file

    out = tmp_path / "f"
    proc = run_cli("compare", lm_runs / "old", lm_runs / "new", "--show-flips", "2", "--flips-out", out / "flips.jsonl",
                   "--json", out / "c.json", "--markdown", out / "c.md")
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = [json.loads(line) for line in (out / "flips.jsonl").read_text().splitlines()]
    want = []
    for task, metric in (("t_piqa", "acc"), ("t_gsm", "exact_match")):
        old = {r["doc_id"]: r for r in map(json.loads, samples_file(lm_runs / "old", task).open())}
        new = {r["doc_id"]: r for r in map(json.loads, samples_file(lm_runs / "new", task).open())}
        for doc_id in sorted(old):
            o, n = old[doc_id], new[doc_id]
            if o[metric] == n[metric]:
                continue
            args = [o["arguments"][f"gen_args_{i}"] for i in range(len(o["arguments"]))]
            if task == "t_piqa":  # the choice with the largest log-likelihood
                choices = [a["arg_1"] for a in args]
                old_ans, new_ans = (choices[int(np.argmax([float(r[0]) for r in rec["filtered_resps"]]))]
                                    for rec in (o, n))
                gold = choices[int(o["target"])]
            else:
                old_ans, new_ans, gold = o["filtered_resps"][0], n["filtered_resps"][0], o["target"]
            want.append({"task": task, "doc_id": doc_id, "kind": "negative" if o[metric] else "positive",
                         "prompt": args[0]["arg_0"], "gold": gold, "old": old_ans, "new": new_ans})
    key = lambda f: (f["task"], f["doc_id"])  # noqa: E731
    assert sorted(got, key=key) == sorted(want, key=key) and want
    shown = json.loads((out / "c.json").read_text())["negative_flips"]
    for task in ("t_piqa", "t_gsm"):
        negatives = [f for f in got if f["task"] == task and f["kind"] == "negative"]
        assert [f["doc_id"] for f in shown[task]] == [f["doc_id"] for f in negatives][:2]
        assert f"{task}: {len(shown[task])} negative flip(s) shown" in proc.stdout
    md = (out / "c.md").read_text()
    assert "## Negative flips" in md and "| doc_id | prompt | gold | old | new |" in md


def test_compare_several_new_runs_in_one_table(lm_runs, tmp_path):
    """OLD NEW1 NEW2: each new run against the old one, named `task [run]`, equal to the pairwise comparisons;
    the gate and its task globs apply to every row."""
    import shutil

    second = tmp_path / "again"
    shutil.copytree(lm_runs / "old", second)  # the old model evaluated again: no flips at all
    # the rerun flips nothing: with 18-20 items that shows an NFR below 20 % (0.8^18 < 0.05), never below 0 (exit 3)
    proc = run_cli("compare", lm_runs / "old", lm_runs / "new", second, "--json", tmp_path / "m.json",
                   "--markdown", tmp_path / "m.md", "--fail-on", "*again*:nfr>20%")
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc0 = run_cli("compare", lm_runs / "old", second, "--fail-on", "nfr>0")
    assert proc0.returncode == 3 and "gate: UNDECIDED" in proc0.stderr, proc0.stderr[-2000:]
    many = json.loads((tmp_path / "m.json").read_text())
    assert many["new"] == [str(lm_runs / "new"), str(second)]
    assert sorted(many["tasks"]) == ["t_gsm [again]", "t_gsm [new]", "t_piqa [again]", "t_piqa [new]"]
    proc = run_cli("compare", lm_runs / "old", lm_runs / "new", "--json", tmp_path / "p.json")
    pair = json.loads((tmp_path / "p.json").read_text())["tasks"]
    for task in ("t_gsm", "t_piqa"):
        assert many["tasks"][f"{task} [new]"] == pair[task]
        assert many["tasks"][f"{task} [again]"]["nfr"] == 0 and many["tasks"][f"{task} [again]"]["btc"] == 1
    assert "| t_gsm [again] |" in (tmp_path / "m.md").read_text()
    proc = run_cli("compare", lm_runs / "old", lm_runs / "new", second, "--fail-on", "*new*:nfr>0", "--json",
                   tmp_path / "g.json")
    breaches = json.loads((tmp_path / "g.json").read_text())["gate"]["breaches"]
    assert proc.returncode == 1 and breaches and all(b["task"].endswith(" [new]") for b in breaches)
