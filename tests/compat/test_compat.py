import json
import math
import shutil

import numpy as np
import pytest
from conftest import ROOT
from in_process import run_cli

from adaptguard.compat.stats.metrics import (
    bootstrap_rate_ci,
    delta_metrics,
    flip_metrics,
    mcnemar_exact_p,
    similarity_deltas,
    smooth_flip_metrics,
)


def test_flip_metrics_hand_worked():
    old_correct = [1, 1, 1, 0, 0, 1]
    new_correct = [1, 0, 0, 1, 0, 1]
    old_pred = ["a", "b", "c", "d", "x", "f"]
    new_pred = ["a", "z", "c2", "d", "y", "f"]
    m = flip_metrics(old_correct, new_correct, old_pred, new_pred)
    assert m["n"] == 6
    assert m["old_acc"] == pytest.approx(4 / 6) and m["new_acc"] == pytest.approx(3 / 6)
    assert m["nfr"] == pytest.approx(2 / 6)  # items 1, 2
    assert m["pfr"] == pytest.approx(1 / 6)  # item 3
    # new wrong and predictions differ: items 1, 2, 4 (both wrong but x -> y)
    assert m["inconsistency_flips"] == pytest.approx(3 / 6)
    assert m["btc"] == pytest.approx(2 / 4)
    assert (m["n_negative_flips"], m["n_positive_flips"]) == (2, 1)
    # exact McNemar: b=2, c=1 -> two-sided binomial p = 1.0
    assert m["mcnemar_p"] == pytest.approx(1.0)


def test_mcnemar_matches_hand_binomial():
    # b = 6, c = 0: p = 2 * 0.5**6
    assert mcnemar_exact_p(6, 0) == pytest.approx(2 * 0.5 ** 6)
    # b = 8, c = 2: p = 2 * P(X <= 2), X ~ Bin(10, 1/2)
    from math import comb

    assert mcnemar_exact_p(8, 2) == pytest.approx(2 * sum(comb(10, k) for k in range(3)) / 2 ** 10)
    assert mcnemar_exact_p(0, 0) == 1.0


def test_bootstrap_ci_agrees_with_index_resampling():
    rng = np.random.default_rng(5)
    indicator = rng.random(400) < 0.1
    lo, hi = bootstrap_rate_ci(indicator, n_boot=4000, seed=1)
    # independent: resample item indices
    idx = np.random.default_rng(2).integers(0, len(indicator), size=(4000, len(indicator)))
    rates = indicator[idx].mean(1)
    ref_lo, ref_hi = np.quantile(rates, [0.025, 0.975])
    assert lo == pytest.approx(ref_lo, abs=0.01) and hi == pytest.approx(ref_hi, abs=0.01)
    assert lo < indicator.mean() < hi
    assert bootstrap_rate_ci(indicator, seed=3) == bootstrap_rate_ci(indicator, seed=3)


def test_flip_metrics_bad_input():
    with pytest.raises(ValueError, match="4 items but new_correct has 3"):
        flip_metrics([1, 0, 1, 1], [1, 0, 1])
    with pytest.raises(ValueError, match="0/1"):
        flip_metrics([1, 2], [1, 0])
    with pytest.raises(ValueError, match="both old_pred and new_pred"):
        flip_metrics([1], [0], old_pred=["a"])
    with pytest.raises(ValueError, match="at least one"):
        flip_metrics([], [])
    assert flip_metrics([0, 0], [1, 0])["btc"] is None  # old never right: BTC undefined, not NaN


def test_smooth_metrics_hand_worked():
    m = smooth_flip_metrics([0.5, -0.25, 0.0, 0.1])
    assert m["smooth_pfr"] == 0.5 and m["smooth_nfr"] == 0.25
    assert m["m_g"] == pytest.approx(0.3) and m["m_r"] == pytest.approx(0.25)
    assert smooth_flip_metrics([0.0, 0.0])["m_g"] is None
    with pytest.raises(ValueError, match="NaN"):
        smooth_flip_metrics([0.1, float("nan")])


def test_delta_metrics_match_paper_definition():
    d = delta_metrics({"nfr": 0.20, "pfr": 0.10}, {"nfr": 0.15, "pfr": 0.12})
    assert d["delta_nfr"] == pytest.approx(-0.05)
    assert d["delta_nfr_pct"] == pytest.approx(-25.0)
    assert d["delta_pfr"] == pytest.approx(0.02)
    assert delta_metrics({"nfr": 0.0}, {"nfr": 0.1})["delta_nfr_pct"] is None


def test_builtin_similarities():
    from adaptguard.plugins import get_similarity

    rouge1 = get_similarity("rouge1")
    # P = 3/3, R = 3/4 -> F = 6/7
    assert rouge1(["the cat sat"], [["the cat sat down"]])[0] == pytest.approx(6 / 7)
    # several references: the best one counts
    assert rouge1(["a dog"], [["the cat", "a dog"]])[0] == pytest.approx(1.0)
    assert get_similarity("exact_match")([" 42 ", "41"], [["42"], ["42"]]) == [1.0, 0.0]
    assert get_similarity("bleu")(["the quick brown fox jumps"], [["the quick brown fox jumps"]])[0] == \
        pytest.approx(1.0)
    assert get_similarity("rougeL")(["b a"], [["a b"]])[0] == pytest.approx(0.5)
    d = similarity_deltas(["the cat", "a dog"], ["the cat sat", "dog"], ["the cat sat", ["a dog"]], rouge1)
    np.testing.assert_allclose(d, [1.0 - 0.8, (2 / 3) - 1.0])


def test_unknown_similarity_lists_known():
    from adaptguard.plugins import get_similarity

    with pytest.raises(ValueError, match=r"known similarities: bleu, .*exact_match, rouge1, rouge2, rougeL"):
        get_similarity("bertscore")


# ---------------------------------------------------------------- between saved runs (real lm_eval)
def independent_flips(old_file, new_file, metric):
    """Recompute from the raw JSON lines: correctness from the metric, MC prediction = argmax ll."""
    def load(path):
        return {json.loads(line)["doc_id"]: json.loads(line) for line in open(path)}

    old, new = load(old_file), load(new_file)
    ids = sorted(old)

    def pred(rec):
        resp = rec["filtered_resps"]
        return max(range(len(resp)), key=lambda i: float(resp[i][0])) if isinstance(resp[0], list) else resp[0]

    o = np.array([old[i][metric] for i in ids]) == 1
    n = np.array([new[i][metric] for i in ids]) == 1
    differ = np.array([pred(old[i]) != pred(new[i]) for i in ids])
    return {"nfr": (o & ~n).mean(), "pfr": (~o & n).mean(), "inconsistency_flips": (~n & differ).mean(),
            "btc": (o & n).sum() / o.sum(), "old_acc": o.mean(), "new_acc": n.mean(), "n": len(ids)}


def test_compare_cli_end_to_end(lm_runs, tmp_path):
    from lm_eval_runs import samples_file

    out = tmp_path / "report"
    proc = run_cli("compare", lm_runs / "old", lm_runs / "new", "--json", out / "c.json", "--markdown",
                   out / "c.md", "--plot", out / "c.png")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "t_piqa" in proc.stdout and "NFR" in proc.stdout
    report = json.loads((out / "c.json").read_text())
    for task, metric in (("t_piqa", "acc"), ("t_gsm", "exact_match")):
        got = report["tasks"][task]
        want = independent_flips(samples_file(lm_runs / "old", task), samples_file(lm_runs / "new", task), metric)
        for key, value in want.items():
            assert got[key] == pytest.approx(value), (task, key)
        assert got["metric"] == metric
        lo, hi = got["nfr_ci"]
        assert lo <= got["nfr"] <= hi
    # the aggressive fine-tune must have broken something the old model got right
    assert report["tasks"]["t_gsm"]["nfr"] > 0 or report["tasks"]["t_piqa"]["nfr"] > 0
    assert "| t_piqa |" in (out / "c.md").read_text()
    assert (out / "c.png").stat().st_size > 5000


def test_compare_samples_files_and_similarity(lm_runs, tmp_path):
    from lm_eval_runs import samples_file

    old, new = samples_file(lm_runs / "old", "t_gsm"), samples_file(lm_runs / "new", "t_gsm")
    proc = run_cli("compare", old, new, "--similarity", "rouge1", "--json", tmp_path / "s.json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    entry = json.loads((tmp_path / "s.json").read_text())["tasks"]["t_gsm"]
    recs_o = [json.loads(line) for line in open(old)]
    recs_n = {json.loads(line)["doc_id"]: json.loads(line) for line in open(new)}
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1"], use_stemmer=True)
    d = np.array([scorer.score(r["target"], recs_n[r["doc_id"]]["filtered_resps"][0])["rouge1"].fmeasure
                  - scorer.score(r["target"], r["filtered_resps"][0])["rouge1"].fmeasure for r in recs_o])
    assert entry["smooth_nfr"] == pytest.approx((d < 0).mean())
    assert entry["smooth_pfr"] == pytest.approx((d > 0).mean())


def test_compare_with_compatible_run_adds_deltas(lm_runs, tmp_path):
    # the old run as the "compatible" model: it never regresses against itself
    proc = run_cli("compare", lm_runs / "old", lm_runs / "new", "--compatible", lm_runs / "old", "--json",
                   tmp_path / "d.json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    entry = json.loads((tmp_path / "d.json").read_text())["tasks"]["t_piqa"]
    assert entry["compatible"]["nfr"] == 0.0
    assert entry["delta_nfr"] == pytest.approx(-entry["nfr"])


def copy_run(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_refuses_different_documents(lm_runs, tmp_path, embedded_path):
    from lm_eval_runs import run_lm_eval

    limited = tmp_path / "limited"
    run_lm_eval(embedded_path, lm_runs / "tasks", limited, "--limit", "5")
    proc = run_cli("compare", lm_runs / "old", limited, "--json", tmp_path / "x.json")
    assert proc.returncode == 2
    assert "different documents" in proc.stderr and "t_" in proc.stderr
    assert not (tmp_path / "x.json").exists()


def test_refuses_changed_document_and_fewshot(lm_runs, tmp_path):
    from lm_eval_runs import samples_file

    run = copy_run(lm_runs / "new", tmp_path / "tampered")
    f = samples_file(run, "t_piqa")
    lines = f.read_text().splitlines()
    rec = json.loads(lines[3])
    rec["doc_hash"] = "0" * 64
    lines[3] = json.dumps(rec)
    f.write_text("\n".join(lines) + "\n")
    proc = run_cli("compare", lm_runs / "old", run, "--json", tmp_path / "x.json")
    assert proc.returncode == 2 and "t_piqa" in proc.stderr and "doc_id 3" in proc.stderr
    assert not (tmp_path / "x.json").exists()

    run2 = copy_run(lm_runs / "new", tmp_path / "fewshot")
    (results,) = run2.rglob("results_*.json")
    data = json.loads(results.read_text())
    data["n-shot"]["t_gsm"] = 5
    results.write_text(json.dumps(data))
    proc = run_cli("compare", lm_runs / "old", run2)
    assert proc.returncode == 2 and "t_gsm" in proc.stderr and "few-shot" in proc.stderr


def test_bad_input_messages(lm_runs, tmp_path):
    from lm_eval_runs import samples_file

    run = copy_run(lm_runs / "new", tmp_path / "corrupt")
    f = samples_file(run, "t_gsm")
    lines = f.read_text().splitlines()
    lines[2] = lines[2][:40]
    f.write_text("\n".join(lines) + "\n")
    proc = run_cli("compare", lm_runs / "old", run)
    assert proc.returncode == 2 and f"{f}:3" in proc.stderr

    lines[2] = lines[3]  # a whole record again, but with bytes that are not UTF-8 in it
    f.write_bytes("\n".join(lines).encode().replace(b'"filter"', b'"\xff\xfefilter"', 1) + b"\n")
    proc = run_cli("compare", lm_runs / "old", run)
    assert proc.returncode == 2 and f"{f}:1: not valid JSON" in proc.stderr, proc.stderr[-2000:]

    empty = tmp_path / "empty"
    empty.mkdir()
    proc = run_cli("compare", lm_runs / "old", empty)
    assert proc.returncode == 2 and "--log_samples" in proc.stderr

    proc = run_cli("compare", lm_runs / "old", tmp_path / "nowhere")
    assert proc.returncode == 2 and "no such file" in proc.stderr

    proc = run_cli("compare", lm_runs / "old", lm_runs / "new", "--similarity", "nope")
    assert proc.returncode == 2 and "known similarities" in proc.stderr

    one_task = tmp_path / "one"
    one_task.mkdir()
    shutil.copy(samples_file(lm_runs / "new", "t_gsm"), one_task)
    proc = run_cli("compare", lm_runs / "old", one_task)
    assert proc.returncode == 2 and "different tasks" in proc.stderr and "t_piqa" in proc.stderr


@pytest.mark.parametrize("task, edit, message", [
    ("t_piqa", lambda rec: rec["filtered_resps"][0].__setitem__(0, "NaN"), "log-likelihood 'NaN' in filtered_resps"),
    ("t_piqa", lambda rec: rec["filtered_resps"][1].__setitem__(0, -math.inf), "log-likelihood -inf in filtered_resps"),
    ("t_piqa", lambda rec: rec.__setitem__("acc", float("nan")), "metric 'acc' is nan, not a finite number"),
    ("t_piqa", lambda rec: rec.__setitem__("acc", "yes"), "metric 'acc' is 'yes', not a number"),
])
def test_compare_refuses_non_finite_scores(lm_runs, tmp_path, task, edit, message):
    """A NaN log-likelihood or a non-numeric/NaN correctness score is bad input: exit 2 naming file and line."""
    from lm_eval_runs import samples_file

    run = copy_run(lm_runs / "new", tmp_path / "bad")
    f = samples_file(run, task)
    lines = f.read_text().splitlines()
    rec = json.loads(lines[4])
    edit(rec)
    lines[4] = json.dumps(rec)  # json writes NaN as the token NaN, as Python's json.dumps does for lm-eval
    f.write_text("\n".join(lines) + "\n")
    proc = run_cli("compare", lm_runs / "old", run, "--json", tmp_path / "x.json")
    assert proc.returncode == 2 and f"{f}:5: {message}" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("last", ["nan", "blank", "plain"])
def test_fast_reader_equals_the_general_path(tmp_path, monkeypatch, last):
    """`read_task_run` builds most lines through a typed per-file decoder; every kind of line must give the same Sample as
    the general path (`samples_from_records` on the fully parsed record): multiple choice with logged strings and with
    numbers, a generation, an empty response, a line with other metrics or a metric missing, a non-numeric metric, a
    bool; and, last, the NaN token of Python's json (which the typed decoder refuses), or a blank line before a plain
    record (line numbers must not slip)."""
    from adaptguard.compat.reading import runs
    from adaptguard.compat.reading.runs import read_task_run, samples_from_records

    typed_lines = []
    typed = runs._add_typed_sample

    def spy(samples, where, *args):
        typed_lines.append(where)
        return typed(samples, where, *args)

    monkeypatch.setattr(runs, "_add_typed_sample", spy)

    def rec(i, resps, **metrics):
        return {"doc_id": i, "doc": {"q": f"question {i}"}, "arguments": {"gen_args_0": {"arg_0": "Q", "arg_1": " a"}},
                "filtered_resps": resps, "filter": "none", "metrics": list(metrics or {"acc": 0}), "doc_hash": f"h{i}",
                "prompt_hash": "p", "target_hash": "t", "target": i % 3, **metrics}

    records = [rec(0, [["-2.5", "False"], ["-1.25", "False"], ["-1.25", "True"]], acc=1.0),
               rec(1, [[-3, False], [-4.5, True]], acc=0),
               rec(2, ["a generated answer"], acc=1),
               rec(3, [], acc=0.0),
               rec(4, [["-1", "False"]], acc=True),
               rec(5, [["-1", "False"], ["-2", "False"]], acc=1.0, exact_match=0.0),  # other metrics listed
               {**rec(6, [["-7", "False"], ["-3", "False"]], acc=1.0), "acc": [1.0, 0.0]},  # not a number
               {k: v for k, v in rec(7, [["-7", "False"], ["-3", "False"]], acc=1.0).items() if k != "acc"},
               rec(8, [[-1.5, "False"], [-0.5, "False"]], acc=float("nan") if last == "nan" else 1.0)]
    f = tmp_path / "samples_t_2026-11-24T00-00-00.000000.jsonl"
    lines = [json.dumps(r) for r in records]
    if last == "blank":
        lines.insert(8, "  ")
    f.write_text("\n".join(lines))  # no newline after the last line
    fast = read_task_run("t", f).samples
    general = samples_from_records((f"{f}:{i + 1}", json.loads(line)) for i, line in
                                   enumerate(f.read_text().splitlines()) if line.strip())
    assert list(fast) == list(general) and len(fast) == 9
    assert fast[("none", 8)].where.endswith(":10" if last == "blank" else ":9")
    # the first line teaches the decoder the metric names; line 6 (other metrics) takes the general path, and so
    # does the NaN token's line
    assert [int(w.rsplit(":", 1)[1]) for w in typed_lines] == [2, 3, 4, 5, 7, 8] + {"nan": [], "blank": [10],
                                                                                     "plain": [9]}[last]
    for key in general:
        a, b = fast[key], general[key]
        assert repr(a) == repr(b), key  # NaN != NaN: compare the printed fields
    assert [fast[("none", i)].answer for i in range(4)] == [1, 0, "a generated answer", ""]


def test_loglikelihood_task_has_no_inconsistency_flips():
    """A loglikelihood task (one continuation, acc = is_greedy; logged as one (ll, is_greedy) pair per document) has
    no answer to disagree on: inconsistency_flips is None, not a comparison of choice indices that are always 0; nfr/pfr as
    usual."""
    from pathlib import Path

    from adaptguard.compat.compare import compare_task
    from adaptguard.compat.reading.runs import TaskRun, samples_from_records

    def run(accs, lls):
        records = ((f"line {i}", {"doc_id": i, "doc_hash": str(i), "target_hash": "t", "prompt_hash": "p", "target": " x",
                                  "filtered_resps": [[str(ll), str(bool(a))]], "metrics": ["acc"], "acc": float(a)})
                   for i, (a, ll) in enumerate(zip(accs, lls)))
        return TaskRun(task="lambada_like", path=Path("x"), samples=samples_from_records(records),
                       config={"output_type": "loglikelihood"})

    (entry,) = compare_task(run([1, 1, 0, 0], [-1, -2, -3, -4]), run([1, 0, 1, 0], [-1.5, -2.5, -3.5, -4.5]),
                            n_boot=10).values()
    assert entry["inconsistency_flips"] is None and entry["nfr"] == 0.25 and entry["pfr"] == 0.25


def test_paired_rate_difference_against_hand_counts_and_normal_theory():
    import numpy as np
    from scipy.stats import binomtest

    from adaptguard.compat.stats.metrics import paired_rate_difference

    out = paired_rate_difference([1, 1, 0, 0, 1], [0, 1, 1, 0, 0])
    assert out["diff"] == pytest.approx(0.2) and (out["n_a_only"], out["n_b_only"]) == (2, 1)
    assert out["mcnemar_p"] == pytest.approx(binomtest(2, 3).pvalue)
    rng = np.random.default_rng(3)
    a, b = rng.random(4000) < 0.2, rng.random(4000) < 0.15  # the pairs are kept together when resampling
    big = paired_rate_difference(a, b, n_boot=4000)
    d = a.astype(float) - b.astype(float)
    half = 1.96 * d.std(ddof=1) / np.sqrt(len(d))
    assert big["ci"][0] == pytest.approx(d.mean() - half, abs=0.15 * half)
    assert big["ci"][1] == pytest.approx(d.mean() + half, abs=0.15 * half)
    with pytest.raises(ValueError, match="equally long"):
        paired_rate_difference([1, 0], [1])


def test_paired_seeds_difference_resamples_an_items_seeds_together():
    import numpy as np
    from scipy.stats import binomtest

    from adaptguard.compat.stats.metrics import paired_seeds_difference

    a = [[1, 1, 0, 0, 1], [1, 0, 0, 0, 1]]
    b = [[0, 1, 1, 0, 0], [0, 0, 0, 1, 0]]
    out = paired_seeds_difference(a, b)
    assert out["diff"] == pytest.approx((3 - 2 + 2 - 1) / 10)
    assert [(s["n_a_only"], s["n_b_only"]) for s in out["per_seed"]] == [(2, 1), (2, 1)]
    assert out["per_seed"][0]["mcnemar_p"] == pytest.approx(binomtest(2, 3).pvalue)
    # three seeds that agree item by item: the interval is that of one seed's items (N items, not 3N draws)
    rng = np.random.default_rng(5)
    x, y = rng.random(3000) < 0.25, rng.random(3000) < 0.2
    out = paired_seeds_difference([x, x, x], [y, y, y], n_boot=4000)
    d = x.astype(float) - y.astype(float)
    half = 1.96 * d.std(ddof=1) / np.sqrt(len(d))
    assert out["ci"][0] == pytest.approx(d.mean() - half, abs=0.15 * half)
    assert out["ci"][1] == pytest.approx(d.mean() + half, abs=0.15 * half)
    with pytest.raises(ValueError, match=r"\(seeds, items\)"):
        paired_seeds_difference([1, 0], [1, 0])
    with pytest.raises(ValueError, match="0/1 values"):
        paired_seeds_difference([[2, 0]], [[1, 0]])


def test_lm_eval_skips_its_own_index_only_when_every_task_is_in_the_given_folders():
    from lm_eval.tasks import TaskManager

    from adaptguard.compat.harness.callback import _defined_in

    index = TaskManager(include_path=[str(ROOT / "lm_eval_tasks")], include_defaults=False).task_index
    assert _defined_in(index, ["compat_gsm8k"]) and _defined_in(index, ["compose_logic"])  # a task; a group
    assert not _defined_in(index, ["compat_gsm8k", "hellaswag"])  # one of lm-eval's own: index everything
    group = index["compose_logic"]
    broken = {"compose_logic": group.__class__(**{**vars(group), "cfg": {**group.cfg, "task": ["hellaswag"]}})}
    assert not _defined_in(broken, ["compose_logic"])  # a group whose member lives in lm-eval's library
