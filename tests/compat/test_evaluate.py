"""`adaptguard evaluate` (issue 75): a new model through lm-eval against a baseline run, only until the gate decides
— a stop on breach, a stop on clear, exhaustion undecided, resume after a kill, bad input — and `compare` on its
output takes the same decisions. The baseline is a real lm-eval run of the embedded model whose correctness is then
set by hand (all right, or all wrong), so every decision below is far from any float a CPU can move."""

import json
import random
import re
from pathlib import Path

import numpy as np
import pytest
from in_process import run_lm_eval_cli
from independent import Ambiguous, agrapa_wealth, group_decision, mixture_e_value
from test_new_metric_row import FLIP_RATE

from adaptguard.cli.main import main
from adaptguard.compat import metric_table

pytestmark = pytest.mark.slow
N = 120
WORDS = ["red", "blue", "green", "cat", "dog", "sun", "moon", "tree", "car", "book", "fish", "bird"]


def write_mc_tasks(tasks: Path, n: int, seed: int, shots: dict[str, int | None]) -> None:
    """`n` four-choice items in `tasks/mc.jsonl` (choices drawn with `seed`), and one lm-eval task YAML over them per
    name of `shots`, with that many few-shot examples from the same split (None: no few-shot settings)."""
    rng = random.Random(seed)
    rows = [{"q": f"item {i}: pick", "choices": rng.sample(WORDS, 4), "label": i % 4} for i in range(n)]
    (tasks / "mc.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name, k in shots.items():
        fewshot = "" if k is None else f"fewshot_split: test\nnum_fewshot: {k}\n"
        (tasks / f"{name}.yaml").write_text(f"""task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {tasks / 'mc.jsonl'}
output_type: multiple_choice
test_split: test
{fewshot}doc_to_text: "{{{{q}}}}"
doc_to_target: label
doc_to_choice: "{{{{choices}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
""")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, embedded_path):
    """A 120-item multiple-choice task, the embedded model's lm-eval run of it, and two baselines made from that
    run: the old model right on every item (`right`) and wrong on every item (`wrong`)."""
    root = tmp_path_factory.mktemp("evaluate")
    tasks = root / "tasks"
    tasks.mkdir()
    write_mc_tasks(tasks, N, 0, {"t_mc": None})
    proc = run_lm_eval_cli("--model", "hf", "--model_args", f"pretrained={embedded_path}", "--tasks", "t_mc",
                           "--include_path", tasks, "--device", "cpu", "--batch_size", "32", "--log_samples",
                           "--output_path", root / "run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (samples,) = (root / "run").rglob("samples_t_mc_*.jsonl")
    (results,) = (root / "run").rglob("results_*.json")
    for name, acc in (("right", 1.0), ("wrong", 0.0)):
        folder = root / name
        folder.mkdir()
        lines = [json.loads(x) for x in samples.read_text().splitlines()]
        (folder / samples.name).write_text("".join(json.dumps({**x, "acc": acc}) + "\n" for x in lines))
        (folder / results.name).write_text(results.read_text())
    return root


def evaluate(runs, embedded_path, out, baseline, *exprs, extra=()):
    args = ["evaluate", str(runs / baseline), "--model-args", f"pretrained={embedded_path}", "--output-path", str(out),
            "--include-path", str(runs / "tasks"), "--chunk", "40", "--batch-size", "16", "--device", "cpu", *extra]
    for expr in exprs:
        args += ["--fail-on", expr]
    return main(args)


def record(out):
    return json.loads((Path(out) / "sequential.json").read_text())["tasks"]["t_mc"]


def answers(folder) -> dict[int, bool]:
    (samples,) = Path(folder).glob("samples_t_mc_*.jsonl")
    return {s["doc_id"]: s["acc"] == 1 for s in map(json.loads, samples.read_text().splitlines())}


def parsed(expr: str) -> tuple[str, str, float]:
    metric, op, value = re.fullmatch(r"(\w+)([<>])(-?[\d.]+)%", expr).groups()
    return metric, op, float(value) / 100


def by_hand(baseline, out, expr: str) -> str:
    """The run's decision on `expr` by tests/independent.py from its record and samples alone: the old and new
    answers in the order evaluated and the looks, through the group design's boundaries and fixed-n test written
    there (`--design group`), or the anytime e-values at each look (`--design anytime`: the mixture for a rate, the
    aGRAPA wealth for acc_drop). None where a score lies within the program's grid resolution of its boundary
    (test_sequential_decisions.GRID): no exact decision to hold the run to."""
    data = json.loads((Path(out) / "sequential.json").read_text())
    t = data["tasks"]["t_mc"]
    old_all, new_all = answers(baseline), answers(out)
    order = t["order"][: t["done"]]
    old, new = np.array([old_all[d] for d in order]), np.array([new_all[d] for d in order])
    metric, op, theta = parsed(expr)
    m_r = sum(old_all.values())
    if data["settings"].get("design", "anytime") == "group":
        try:
            return group_decision(old, new, t["looks"], N, m_r, N - m_r, metric, theta, op, 0.05,
                                  tolerance=(0.01, 0.035))["decision"]
        except Ambiguous:
            return None
    p = []
    for greater in (op == ">", op != ">"):
        if metric == "acc_drop":
            wealth = agrapa_wealth(old.astype(float) - new.astype(float), theta, greater)
            e = [wealth[n - 1] for n in t["looks"]]
        else:
            k = {"nfr": lambda n: int(np.sum(old[:n] & ~new[:n])), "pfr": lambda n: int(np.sum(~old[:n] & new[:n])),
                 "flip_rate": lambda n: int(np.sum(old[:n] != new[:n]))}
            e = [mixture_e_value(k[metric](n), n, theta, greater) for n in t["looks"]]
        p.append(min(1.0, 1 / max(e)))
    return "breach" if p[0] < 0.05 else "clear" if p[1] < 0.05 else "undecided"


def exit_of(decisions: dict[str, str]) -> int:
    """evaluate's exit status for its decisions: 1 on a breach, else 3 on an undecided one (or none), else 0."""
    kinds = set(decisions.values())
    return 1 if "breach" in kinds else 3 if "undecided" in kinds or not kinds else 0


def compare_decisions(capsys, baseline, out, *exprs):
    report = Path(out).parent / f"{Path(out).name}.json"
    main(["compare", str(baseline), str(out), *[x for e in exprs for x in ("--fail-on", e)], "--json", str(report)])
    capsys.readouterr()
    return {d["expr"]: d["decision"] for d in json.loads(report.read_text())["gate"]["decisions"]}


def test_a_breach_stops_at_the_first_look_and_compare_agrees(runs, embedded_path, tmp_path, capsys):
    """The old model right everywhere, the embedded model near chance: `nfr>5%` is a breach after 40 items."""
    code = evaluate(runs, embedded_path, tmp_path / "out", "right", "nfr>5%")
    printed = capsys.readouterr().out
    t = record(tmp_path / "out")
    assert code == 1 and t["status"] == "decided" and t["done"] == 40 and t["looks"] == [40]
    assert t["decisions"] == {"nfr>5%": "breach"} and "t_mc: 40/120 items (decided); nfr" in printed
    assert by_hand(runs / "right", tmp_path / "out", "nfr>5%") == "breach"
    (samples,) = (tmp_path / "out").glob("samples_t_mc_*.jsonl")
    docs = [json.loads(x)["doc_id"] for x in samples.read_text().splitlines()]
    assert sorted(docs) == sorted(t["order"][:40])  # an lm-eval run of the documents evaluated, in its format
    assert compare_decisions(capsys, runs / "right", tmp_path / "out", "nfr>5%") == t["decisions"]


def test_a_clear_stops_early_too(runs, embedded_path, tmp_path, capsys):
    """The old model right everywhere, the new one near chance (right on about a quarter): `nfr>98%` is shown clear
    after 40 items; with the old model wrong everywhere (its flips then churn), `acc_drop>50%` is clear as soon."""
    code = evaluate(runs, embedded_path, tmp_path / "out", "right", "nfr>98%")
    t = record(tmp_path / "out")
    assert code == 0 and t["done"] == 40 and t["decisions"] == {"nfr>98%": "clear"}
    assert by_hand(runs / "right", tmp_path / "out", "nfr>98%") == "clear"
    assert compare_decisions(capsys, runs / "right", tmp_path / "out", "nfr>98%") == t["decisions"]
    code = evaluate(runs, embedded_path, tmp_path / "out2", "wrong", "acc_drop>50%")
    t = record(tmp_path / "out2")
    assert code == 0 and t["done"] == 40 and t["decisions"] == {"acc_drop>50%": "clear"}
    assert by_hand(runs / "wrong", tmp_path / "out2", "acc_drop>50%") in ("clear", None)
    assert compare_decisions(capsys, runs / "wrong", tmp_path / "out2", "acc_drop>50%") == t["decisions"]


def test_exhausted_items_leave_the_threshold_undecided(runs, embedded_path, tmp_path, capsys):
    """No positive flip can happen when the old model is right everywhere, yet 120 items cannot show `pfr < 0.5 %`:
    every item is evaluated and the run exits 3."""
    code = evaluate(runs, embedded_path, tmp_path / "out", "right", "pfr>0.5%")
    t = record(tmp_path / "out")
    assert code == 3 and t["status"] == "exhausted" and t["done"] == N and t["looks"] == [40, 80, 120]
    assert t["decisions"] == {"pfr>0.5%": "undecided"} == {"pfr>0.5%": by_hand(runs / "right", tmp_path / "out",
                                                                              "pfr>0.5%")}


def test_a_killed_run_resumes_where_it_stopped(runs, embedded_path, tmp_path, capsys, monkeypatch):
    from lm_eval import evaluator

    real, calls = evaluator.evaluate, []

    def killed_on_the_third(*args, **kwargs):
        calls.append(kwargs["samples"])
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluator, "evaluate", killed_on_the_third)
    assert evaluate(runs, embedded_path, tmp_path / "out", "right", "pfr>0.5%") == 130
    assert record(tmp_path / "out")["done"] == 80
    monkeypatch.setattr(evaluator, "evaluate", real)
    assert evaluate(runs, embedded_path, tmp_path / "out", "right", "pfr>0.5%") == 3
    t = record(tmp_path / "out")
    (samples,) = (tmp_path / "out").glob("samples_t_mc_*.jsonl")
    docs = [json.loads(x)["doc_id"] for x in samples.read_text().splitlines()]
    assert len(docs) == len(set(docs)) == N and t["done"] == N  # nothing evaluated twice, nothing skipped
    assert t["decisions"] == {"pfr>0.5%": by_hand(runs / "right", tmp_path / "out", "pfr>0.5%")} == {
        "pfr>0.5%": "undecided"}
    assert [sorted(c["t_mc"]) for c in calls[:2]] == [sorted(t["order"][:40]), sorted(t["order"][40:80])]
    # the same settings resume; others are refused, naming the folder
    assert evaluate(runs, embedded_path, tmp_path / "out", "right", "nfr>5%") == 2
    assert "holds an evaluate run with other settings" in capsys.readouterr().err


@pytest.mark.parametrize("case, message", [
    ("task", "no task nope in the baseline run (its tasks: t_mc)"),
    ("model", "could not load the model"),
    ("metric", "evaluate decides nfr, pfr, btc, old_acc, new_acc and acc_drop"),
])
def test_bad_input_is_one_line_and_writes_nothing(runs, embedded_path, tmp_path, capsys, case, message):
    out = tmp_path / "out"
    if case == "task":
        code = evaluate(runs, embedded_path, out, "right", "nfr>5%", extra=("--tasks", "nope"))
    elif case == "model":
        code = main(["evaluate", str(runs / "right"), "--model-args", f"pretrained={tmp_path / 'missing'}",
                     "--output-path", str(out), "--fail-on", "nfr>5%", "--device", "cpu"])
    else:
        code = evaluate(runs, embedded_path, out, "right", "smooth_nfr>5%")
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def samples_of(out):
    (samples,) = Path(out).glob("samples_t_mc_*.jsonl")
    return [json.loads(x) for x in samples.read_text().splitlines()]


def test_a_kill_between_the_first_samples_and_the_record_resumes(runs, embedded_path, tmp_path, capsys, monkeypatch):
    """Killed after the first chunk's samples are written but before the record counts them: a rerun with the same
    settings resumes from those samples (nothing evaluated twice) and ends as an uninterrupted run does. A folder
    holding other files is still refused, in one line."""
    from lm_eval import evaluator

    from adaptguard.compat.harness import until_decided

    real_write, real_evaluate, calls = until_decided._write_samples, evaluator.evaluate, []

    def killed_after_the_samples(*args):
        real_write(*args)
        raise KeyboardInterrupt

    def counted(*args, **kwargs):
        calls.append(sorted(kwargs["samples"]["t_mc"]))
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(until_decided, "_write_samples", killed_after_the_samples)
    assert evaluate(runs, embedded_path, tmp_path / "out", "right", "pfr>0.5%") == 130
    assert len(samples_of(tmp_path / "out")) == 40
    monkeypatch.setattr(until_decided, "_write_samples", real_write)
    monkeypatch.setattr(evaluator, "evaluate", counted)
    assert evaluate(runs, embedded_path, tmp_path / "out", "right", "pfr>0.5%") == 3, capsys.readouterr().err
    t = record(tmp_path / "out")
    assert calls == [sorted(t["order"][40:80]), sorted(t["order"][80:])]  # the first chunk not evaluated again
    assert t["decisions"] == {"pfr>0.5%": by_hand(runs / "right", tmp_path / "out", "pfr>0.5%")}
    monkeypatch.setattr(evaluator, "evaluate", real_evaluate)
    assert evaluate(runs, embedded_path, tmp_path / "whole", "right", "pfr>0.5%") == 3
    assert t == record(tmp_path / "whole")
    resumed, whole = samples_of(tmp_path / "out"), samples_of(tmp_path / "whole")
    assert len({s["doc_id"] for s in resumed}) == len(resumed) == N
    assert {s["doc_id"]: s["acc"] for s in resumed} == {s["doc_id"]: s["acc"] for s in whole}
    assert compare_decisions(capsys, runs / "right", tmp_path / "out", "pfr>0.5%") == t["decisions"]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine\n")
    assert evaluate(runs, embedded_path, tmp_path / "other", "right", "pfr>0.5%") == 2
    err = capsys.readouterr().err
    assert "is a non-empty folder that is not an evaluate run" in err and len(err.strip().splitlines()) == 1, err


def test_a_task_whose_flips_are_left_out_as_churn_keeps_going(runs, embedded_path, tmp_path, capsys):
    """The old model wrong everywhere: `nfr>5%` is left out as churn (nothing shows the old model above chance) at
    every look, while `acc_drop>50%` is clear at the first. More items might show the old model above chance, and
    then nfr would have to be decided: the task keeps going to its last item, and the flips end left out as churn."""
    code = evaluate(runs, embedded_path, tmp_path / "out", "wrong", "nfr>5%", "acc_drop>50%")
    printed = capsys.readouterr().out
    t = record(tmp_path / "out")
    assert code == 0 and t["status"] == "exhausted" and t["done"] == N and t["looks"] == [40, 80, 120], printed
    assert t["decisions"] == {"acc_drop>50%": "clear"} and t["left_out"] == {"nfr>5%": "churn"}
    assert by_hand(runs / "wrong", tmp_path / "out", "acc_drop>50%") in ("clear", None)
    assert "t_mc: 40/120 items (running); nfr>5%: left out (churn so far)" in printed
    assert "t_mc: 120/120 items (exhausted); nfr>5%: left out (churn);" in printed
    assert "left out: t_mc (churn: " in printed
    assert compare_decisions(capsys, runs / "wrong", tmp_path / "out", "nfr>5%", "acc_drop>50%") == t["decisions"]


def test_a_second_run_on_one_output_path_is_refused_while_the_first_holds_it(runs, embedded_path, tmp_path, capsys,
                                                                           monkeypatch):
    """Two runs on one --output-path at once would write the same documents twice: the second is refused at once (in
    one line naming the folder, exit 2) while the first holds the folder's lock; once the first has ended (here
    killed), a rerun resumes it, and `compare` reads the folder with the lock file in it."""
    import threading

    from lm_eval import evaluator

    out = tmp_path / "out"
    real, calls, reached, release, codes = evaluator.evaluate, [], threading.Event(), threading.Event(), []

    def held_at_the_second_chunk(*args, **kwargs):
        calls.append(kwargs["samples"])
        if len(calls) == 2:
            reached.set()
            release.wait(600)
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluator, "evaluate", held_at_the_second_chunk)
    first = threading.Thread(target=lambda: codes.append(evaluate(runs, embedded_path, out, "right", "pfr>0.5%")))
    first.start()
    try:
        assert reached.wait(600)
        capsys.readouterr()
        code = evaluate(runs, embedded_path, out, "right", "pfr>0.5%")
        err = capsys.readouterr().err
    finally:
        release.set()
        first.join()
    assert code == 2 and len(calls) == 2, err  # refused before evaluating anything
    assert f"--output-path {out}: another evaluate run" in err and len(err.strip().splitlines()) == 1, err
    assert codes == [130] and record(out)["done"] == 40
    monkeypatch.setattr(evaluator, "evaluate", real)
    assert evaluate(runs, embedded_path, out, "right", "pfr>0.5%") == 3
    from adaptguard.compat.harness.until_decided import LOCK

    t = record(out)
    docs = [s["doc_id"] for s in samples_of(out)]
    assert len(docs) == len(set(docs)) == N == t["done"] and (out / LOCK).is_file()
    assert t["decisions"] == {"pfr>0.5%": by_hand(runs / "right", out, "pfr>0.5%")}
    assert compare_decisions(capsys, runs / "right", out, "pfr>0.5%") == t["decisions"]


# ------------------------------------------------------------------ issue 87: only the items that can flip
@pytest.fixture(scope="module")
def mixed(runs):
    """A baseline right on the even documents and wrong on the odd ones (60 each)."""
    (samples,) = (runs / "right").glob("samples_t_mc_*.jsonl")
    (results,) = (runs / "right").glob("results_*.json")
    folder = runs / "mixed"
    if not folder.exists():
        folder.mkdir()
        lines = [json.loads(x) for x in samples.read_text().splitlines()]
        (folder / samples.name).write_text("".join(json.dumps({**x, "acc": float(x["doc_id"] % 2 == 0)}) + "\n"
                                                   for x in lines))
        (folder / results.name).write_text(results.read_text())
    return folder


def evaluated_docs(out):
    return {s["doc_id"] for s in samples_of(out)}


@pytest.mark.parametrize("expr, parity, reason", [("nfr>40%", 0, "cannot flip right → wrong"),
                                                  ("pfr>40%", 1, "cannot flip wrong → right")])
def test_a_flip_rate_evaluates_only_the_items_that_can_flip(runs, embedded_path, tmp_path, capsys, mixed, expr, parity,
                                                            reason):
    """`nfr` needs only the items the old model got right (the even ones), `pfr` only the ones it got wrong: the run
    evaluates no other item, lists the others as not evaluated with why, prints no new-model accuracy, and `compare`
    on its output takes the same decision."""
    code = evaluate(runs, embedded_path, tmp_path / "out", "mixed", expr)
    printed = capsys.readouterr().out
    t = record(tmp_path / "out")
    docs = evaluated_docs(tmp_path / "out")
    assert docs and all(d % 2 == parity for d in docs) and len(docs) == t["done"] <= N // 2, printed
    assert set(t["order"]) == {d for d in range(N) if d % 2 == parity}
    (left,) = t["not_evaluated"]
    assert set(left["docs"]) == {d for d in range(N) if d % 2 != parity} and reason in left["why"]
    assert f"/{N // 2} of {N} items" in printed
    assert f"not evaluated: t_mc, {N // 2} of {N} items — the old model got it" in printed
    assert code == exit_of(t["decisions"]) and t["decisions"][expr] == by_hand(mixed, tmp_path / "out", expr)
    assert compare_decisions(capsys, mixed, tmp_path / "out", expr) == t["decisions"]
    main(["compare", str(mixed), str(tmp_path / "out")])
    assert " → –" in capsys.readouterr().out  # the new model's accuracy was not measured


def test_acc_drop_evaluates_both_strata_in_proportion(runs, embedded_path, tmp_path, capsys, mixed):
    """acc_drop needs both strata: they are evaluated in proportion, and the decision is the score design's written
    in tests/independent.py (its exact unconditional test against the 1 % margin once every item is done)."""
    code = evaluate(runs, embedded_path, tmp_path / "out", "mixed", "acc_drop>1%")
    t = record(tmp_path / "out")
    assert by_hand(mixed, tmp_path / "out", "acc_drop>1%") in (t["decisions"]["acc_drop>1%"], None)
    assert code == exit_of(t["decisions"])
    docs = evaluated_docs(tmp_path / "out")
    assert t["not_evaluated"] == [] and len(t["order"]) == N
    even = sum(d % 2 == 0 for d in docs)
    assert abs(even - len(docs) / 2) <= 1, (even, len(docs))
    assert compare_decisions(capsys, mixed, tmp_path / "out", "acc_drop>1%") == t["decisions"]


@pytest.mark.parametrize("design", ["group", "anytime"])
def test_a_new_row_is_evaluated_by_either_design(runs, embedded_path, tmp_path, capsys, mixed, monkeypatch, design):
    """`flip_rate`, added as one row of the metric table (test_new_metric_row.py), is evaluated until decided: both
    strata (either answer can change), its decision the one tests/independent.py computes from the record and the
    samples, and `compare` on the output agrees."""
    monkeypatch.setitem(metric_table.METRICS, "flip_rate", FLIP_RATE)
    expr = "flip_rate>20%"
    code = evaluate(runs, embedded_path, tmp_path / "out", "mixed", expr, extra=("--design", design))
    t = record(tmp_path / "out")
    assert t["decisions"][expr] == by_hand(mixed, tmp_path / "out", expr)
    assert design == "anytime" or t["not_evaluated"] == []  # the group design: both strata
    assert code == exit_of(t["decisions"])
    assert compare_decisions(capsys, mixed, tmp_path / "out", expr) == t["decisions"]


def test_the_last_look_decides_as_compare_on_all_items(runs, embedded_path, tmp_path, capsys, mixed):
    """Thresholds near the truth run every item that can change them; the decision then is `compare`'s on the
    embedded model's full run against the same baseline (all 120 items, the fixed-n gate), whatever it is."""
    full = runs / "run"
    exprs = ("nfr>35%", "nfr>40%", "pfr>10%")
    whole = compare_decisions(capsys, mixed, full, *exprs)
    for i, expr in enumerate(exprs):
        code = evaluate(runs, embedded_path, tmp_path / f"out{i}", "mixed", expr)
        t = record(tmp_path / f"out{i}")
        assert t["decisions"] == {expr: by_hand(mixed, tmp_path / f"out{i}", expr)} and code == exit_of(t["decisions"])
        if t["status"] != "decided" or t["done"] == N // 2:  # stopped early: only the opposite would be wrong
            assert {t["decisions"][expr], whole[expr]} != {"breach", "clear"}
        if t["done"] == N // 2:
            assert t["decisions"][expr] == whole[expr], (expr, t, whole)
    assert any(record(tmp_path / f"out{i}")["done"] == N // 2 for i in range(len(exprs)))


def test_a_kill_in_the_middle_of_a_stratum_resumes_to_the_uninterrupted_result(runs, embedded_path, tmp_path,
                                                                               capsys, monkeypatch, mixed):
    from lm_eval import evaluator

    real, calls = evaluator.evaluate, []

    def killed_on_the_second(*args, **kwargs):
        calls.append(kwargs["samples"])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluator, "evaluate", killed_on_the_second)
    assert evaluate(runs, embedded_path, tmp_path / "out", "mixed", "nfr>35%", extra=("--chunk", "25")) == 130
    assert record(tmp_path / "out")["done"] == 25  # killed inside the old-right stratum (60 items)
    monkeypatch.setattr(evaluator, "evaluate", real)
    code = evaluate(runs, embedded_path, tmp_path / "out", "mixed", "nfr>35%", extra=("--chunk", "25"))
    whole = evaluate(runs, embedded_path, tmp_path / "whole", "mixed", "nfr>35%", extra=("--chunk", "25"))
    assert code == whole and record(tmp_path / "out") == record(tmp_path / "whole")
    t = record(tmp_path / "out")
    assert t["decisions"] == {"nfr>35%": by_hand(mixed, tmp_path / "out", "nfr>35%")} and code == exit_of(t["decisions"])
    assert sorted(s["doc_id"] for s in samples_of(tmp_path / "out")) == sorted(evaluated_docs(tmp_path / "whole"))


def test_the_anytime_design_visits_every_item_and_bets_adaptively(runs, embedded_path, tmp_path, capsys, mixed):
    """`--design anytime`: every item in random order (none left out), acc_drop by the aGRAPA betting e-process, and
    `compare` on the output takes the same decisions."""
    code = evaluate(runs, embedded_path, tmp_path / "out", "mixed", "nfr>5%", "acc_drop>60%",
                    extra=("--design", "anytime"))
    data = json.loads((tmp_path / "out" / "sequential.json").read_text())
    t = data["tasks"]["t_mc"]
    assert t["decisions"] == {x: by_hand(mixed, tmp_path / "out", x) for x in ("nfr>5%", "acc_drop>60%")}
    assert code == exit_of(t["decisions"])
    assert data["settings"]["bet"] == "agrapa" and "not_evaluated" not in t and sorted(t["order"]) == list(range(N))
    assert {d % 2 for d in evaluated_docs(tmp_path / "out")} == {0, 1}
    assert compare_decisions(capsys, mixed, tmp_path / "out", "nfr>5%", "acc_drop>60%") == t["decisions"]
    report = tmp_path / "out.json"
    test = {d["expr"]: d["test"] for d in json.loads(report.read_text())["gate"]["decisions"]}
    assert "aGRAPA" in test["acc_drop>60%"]


# ------------------------------------------------------------------ issue 97: each task built once, one call per look
M = 60  # items per task of the two-task baseline


@pytest.fixture(scope="module")
def two(tmp_path_factory, embedded_path):
    """Two tasks of 60 items (`t_a` zero-shot, `t_b` two-shot), the embedded model's plain lm-eval run of both
    (`plain`), and a baseline made from it right on every item (`right`)."""
    root = tmp_path_factory.mktemp("two")
    tasks = root / "tasks"
    tasks.mkdir()
    write_mc_tasks(tasks, M, 1, {"t_a": 0, "t_b": 2})
    proc = run_lm_eval_cli("--model", "hf", "--model_args", f"pretrained={embedded_path}", "--tasks", "t_a,t_b",
                           "--include_path", tasks, "--device", "cpu", "--batch_size", "16", "--log_samples",
                           "--output_path", root / "plain")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (results,) = (root / "plain").rglob("results_*.json")
    (root / "right").mkdir()
    (root / "right" / results.name).write_text(results.read_text())
    for samples in (root / "plain").rglob("samples_*.jsonl"):
        lines = [json.loads(x) for x in samples.read_text().splitlines()]
        (root / "right" / samples.name).write_text("".join(json.dumps({**x, "acc": 1.0}) + "\n" for x in lines))
    return root


TWO_EXPRS = ("t_a:nfr>5%", "t_b:pfr>0.5%")  # t_a breaches at its first look; t_b runs to its last


def evaluate_two(two, embedded_path, out):
    args = ["evaluate", str(two / "right"), "--model-args", f"pretrained={embedded_path}", "--output-path", str(out),
            "--include-path", str(two / "tasks"), "--chunk", "20", "--batch-size", "16", "--device", "cpu"]
    return main(args + [x for e in TWO_EXPRS for x in ("--fail-on", e)])


def prompts(sample) -> list[list[str]]:
    """A sample's requests, [[context, continuation], ...], as lm-eval logs them in memory (a list per request) or
    as its CLI writes them (`{"gen_args_0": {"arg_0": ..., "arg_1": ...}, ...}`)."""
    args = sample["arguments"]
    return [list(a.values()) for a in args.values()] if isinstance(args, dict) else [list(a) for a in args]


def loglikelihoods(sample) -> list[float]:
    return [float(r[0][0]) for r in sample["resps"]]


def assert_same_answer(ours: dict, theirs: dict) -> None:
    """One document's sample from two evaluations of one model: the same requests, loglikelihoods within 1e-4 (a
    batch of other documents pads and orders the inputs otherwise), and the same answer where its two best choices
    lie more than 1e-3 apart (beyond float noise)."""
    assert prompts(ours) == prompts(theirs)
    assert np.allclose(loglikelihoods(ours), loglikelihoods(theirs), atol=1e-4, rtol=0)
    top = sorted(loglikelihoods(theirs))[-2:]
    if top[1] - top[0] > 1e-3:
        assert ours["acc"] == theirs["acc"]


def task_samples(folder, task) -> list[dict]:
    (samples,) = Path(folder).rglob(f"samples_{task}_*.jsonl")
    return [json.loads(x) for x in samples.read_text().splitlines()]


@pytest.fixture(scope="module")
def whole_two(two, embedded_path, tmp_path_factory):
    """An uninterrupted two-task run, and the calls it made: [TaskManager.load's names], [each look's samples]."""
    from lm_eval import evaluator
    from lm_eval.tasks import TaskManager

    out = tmp_path_factory.mktemp("whole") / "out"
    loads, looks = [], []
    real_load, real_evaluate = TaskManager.load, evaluator.evaluate

    def load(self, names):
        loads.append(list(names))
        return real_load(self, names)

    def evaluate_look(*args, **kwargs):
        looks.append(kwargs["samples"])
        return real_evaluate(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(TaskManager, "load", load)
        mp.setattr(evaluator, "evaluate", evaluate_look)
        code = evaluate_two(two, embedded_path, out)
    return out, code, loads, looks


def test_each_task_is_built_once_and_a_look_is_one_call_across_the_running_tasks(two, whole_two, embedded_path):
    """lm-eval builds each task once per run, and each look is one `evaluate` call on the next 20 documents of every
    task still running: both tasks at the first look, then t_b alone once t_a has breached. The samples are lm-eval's
    own: each document's prompt and answer as in a plain lm-eval run of the task (t_a), and, for the few-shot t_b, as
    `simple_evaluate` gives on that look's documents alone (the few-shot sampler seeded at each look, as before the
    task was built once). Same answers: `assert_same_answer`."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    from adaptguard.compat.harness.callback import task_manager

    out, code, loads, looks = whole_two
    data = json.loads((out / "sequential.json").read_text())["tasks"]
    a, b = data["t_a"], data["t_b"]
    assert code == 1 and a["decisions"] == {"t_a:nfr>5%": "breach"} and a["looks"] == [20]
    assert b["decisions"] == {"t_b:pfr>0.5%": "undecided"} and b["looks"] == [20, 40, 60] and b["status"] == "exhausted"
    assert loads == [["t_a", "t_b"]]
    assert looks == [{"t_a": sorted(a["order"][:20]), "t_b": sorted(b["order"][:20])},
                     {"t_b": sorted(b["order"][20:40])}, {"t_b": sorted(b["order"][40:60])}]
    plain = {s["doc_id"]: s for s in task_samples(two / "plain", "t_a")}
    ours = task_samples(out, "t_a")
    assert sorted(s["doc_id"] for s in ours) == sorted(a["order"][:20])
    for s in ours:
        assert_same_answer(s, plain[s["doc_id"]])
    ours = task_samples(out, "t_b")
    assert [s["doc_id"] for s in ours] == looks[0]["t_b"] + looks[1]["t_b"] + looks[2]["t_b"]  # appended per look
    lm = HFLM(pretrained=str(embedded_path), batch_size=16, device="cpu")
    alone = simple_evaluate(model=lm, tasks=["t_b"], samples={"t_b": looks[1]["t_b"]}, log_samples=True,
                            task_manager=task_manager(two / "tasks", ["t_b"]), bootstrap_iters=0)["samples"]["t_b"]
    assert [s["doc_id"] for s in ours[20:40]] == [s["doc_id"] for s in alone]
    for s, theirs in zip(ours[20:40], alone):
        assert_same_answer(s, theirs)


KILLS = ["in the evaluation", "after the configs", "between the two tasks' samples", "half way through a line",
         "after the samples"]


@pytest.mark.parametrize("kill", KILLS)
def test_a_kill_at_each_point_of_a_look_resumes_to_the_uninterrupted_run(two, whole_two, embedded_path, tmp_path,
                                                                        capsys, monkeypatch, kill):
    """Killed at each point of a look of both tasks, then rerun with the same settings: the same record (order,
    looks, decisions) and the same samples as the uninterrupted run, nothing evaluated twice. A look whose samples are
    all written counts; one cut short (between the tasks' files, or in the middle of a line) is evaluated again."""
    from lm_eval import evaluator

    from adaptguard.compat.harness import until_decided

    out = tmp_path / "out"
    real_evaluate, real_write, real_atomic = evaluator.evaluate, until_decided._write_samples, \
        until_decided.atomic_write_text
    writes = []

    def evaluation(*args, **kwargs):
        raise KeyboardInterrupt

    def configs(path, text):
        real_atomic(path, text)
        if Path(path).name.startswith("results_"):
            raise KeyboardInterrupt

    def samples(out_, task, stamp, items):
        writes.append(task)
        if kill == "between the two tasks' samples" and len(writes) == 2:
            raise KeyboardInterrupt
        if kill == "half way through a line":
            line = json.dumps(items[-1])
            real_write(out_, task, stamp, items[:-1])
            with open(out_ / f"samples_{task}_{stamp}.jsonl", "a") as f:
                f.write(line[: len(line) // 2])
            raise KeyboardInterrupt
        real_write(out_, task, stamp, items)
        if kill == "after the samples" and len(writes) == 2:
            raise KeyboardInterrupt

    if kill == "in the evaluation":
        monkeypatch.setattr(evaluator, "evaluate", evaluation)
    elif kill == "after the configs":
        monkeypatch.setattr(until_decided, "atomic_write_text", configs)
    else:
        monkeypatch.setattr(until_decided, "_write_samples", samples)
    assert evaluate_two(two, embedded_path, out) == 130
    monkeypatch.setattr(evaluator, "evaluate", real_evaluate)
    monkeypatch.setattr(until_decided, "_write_samples", real_write)
    monkeypatch.setattr(until_decided, "atomic_write_text", real_atomic)
    whole, code = whole_two[0], whole_two[1]
    assert evaluate_two(two, embedded_path, out) == code
    resumed = json.loads((out / "sequential.json").read_text())
    assert resumed["tasks"] == json.loads((whole / "sequential.json").read_text())["tasks"]
    for task in ("t_a", "t_b"):
        ours, theirs = task_samples(out, task), task_samples(whole, task)
        assert [s["doc_id"] for s in ours] == [s["doc_id"] for s in theirs]  # nothing twice, in the same order
        for s, whole_s in zip(ours, theirs):
            assert_same_answer(s, whole_s)
    capsys.readouterr()
    assert compare_decisions(capsys, two / "right", out, *TWO_EXPRS) == {
        **resumed["tasks"]["t_a"]["decisions"], **resumed["tasks"]["t_b"]["decisions"]}


# One `accelerate launch` of two processes: the CLI as a user runs it, its model lm-eval's HF model. On CPU lm-eval's
# HFLM splits the documents between the processes only where it sees more than one GPU, so the script gives the
# loaded model the accelerator, rank and world size lm-eval gives it there.
DP_SCRIPT = """
import contextlib, io, json, os, sys
from adaptguard.cli.main import main
from accelerate import Accelerator, PartialState
from adaptguard.compat.harness import until_decided

PartialState(cpu=True)  # the launch's processes on CPU (gloo): the state lm-eval's Accelerator() then takes
real_load = until_decided.load_lm
def load_data_parallel(*args):
    lm = real_load(*args)
    lm.accelerator = Accelerator()
    lm._rank, lm._world_size = lm.accelerator.process_index, lm.accelerator.num_processes
    real_loglikelihood = lm.loglikelihood
    def counted(requests, *rest, **kwargs):  # the requests this process runs
        scored.append(len(requests))
        return real_loglikelihood(requests, *rest, **kwargs)
    lm.loglikelihood = counted
    return lm
scored = []
until_decided.load_lm = load_data_parallel
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    code = main(sys.argv[1:])
rank = os.environ["RANK"]
folder = os.path.dirname(sys.argv[sys.argv.index("--output-path") + 1])
open(os.path.join(folder, f"rank{rank}.json"), "w").write(
    json.dumps({"code": code, "printed": printed.getvalue(), "world": int(os.environ["WORLD_SIZE"]), "scored": scored}))
"""


def test_two_processes_give_the_one_process_record_and_samples(two, whole_two, embedded_path, tmp_path):
    """`accelerate launch` of `adaptguard evaluate` on two processes (gloo), lm-eval splitting each look's documents
    between them: the same record (order, looks, decisions) and the same samples as one process, written once by
    the main process (the lock, the record, one samples file per task), which alone prints and exits by the verdict;
    the other process exits 0. Each answer of the zero-shot task is one process's (`assert_same_answer`); the two-shot
    task's prompts are lm-eval's under data parallelism, whose few-shot examples differ from one process's (lm-eval
    draws them in document order within each process), and its threshold cannot move with them."""
    from conftest import launch_two_processes

    from adaptguard.compat.harness.until_decided import LOCK

    script = tmp_path / "dp.py"
    script.write_text(DP_SCRIPT)
    out = tmp_path / "dp" / "out"
    args = ["evaluate", str(two / "right"), "--model-args", f"pretrained={embedded_path}", "--output-path", str(out),
            "--include-path", str(two / "tasks"), "--chunk", "20", "--batch-size", "16", "--device", "cpu"]
    launch_two_processes(script, *args, *[x for e in TWO_EXPRS for x in ("--fail-on", e)])
    whole, code = whole_two[0], whole_two[1]
    ranks = [json.loads((tmp_path / "dp" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    # each look's 4-choice documents split in halves: (20 + 20) · 4, then 20 · 4 twice, between the two processes
    assert [r["scored"] for r in ranks] == [[80, 40, 40], [80, 40, 40]]
    assert ranks[0]["code"] == code == 1 and "t_b: 60/60 items (exhausted)" in ranks[0]["printed"]
    assert {k: ranks[1][k] for k in ("code", "printed")} == {"code": 0, "printed": ""}
    assert json.loads((out / "sequential.json").read_text())["tasks"] == json.loads(
        (whole / "sequential.json").read_text())["tasks"]
    names = sorted(p.name.split("_20")[0] for p in out.iterdir())
    assert names == sorted([LOCK, "results", "samples_t_a", "samples_t_b", "sequential.json"]), names
    for task in ("t_a", "t_b"):
        ours, theirs = task_samples(out, task), {s["doc_id"]: s for s in task_samples(whole, task)}
        assert sorted(s["doc_id"] for s in ours) == sorted(theirs)  # each document once, none missing
        for s in ours:
            if task == "t_a":  # zero-shot; t_b's few-shot examples are drawn in document order within each process
                assert_same_answer(s, theirs[s["doc_id"]])
            else:
                assert prompts(s)[0][0].endswith(theirs[s["doc_id"]]["doc"]["q"])


def test_vllm_is_built_from_the_flags_as_lm_eval_builds_it(two, tmp_path, capsys, monkeypatch):
    """`--model vllm` (no GPU here, so no vLLM): the model is made as lm-eval's `simple_evaluate` makes it,
    `get_model("vllm").create_from_arg_string(model_args, {batch_size, device})`, with the parallel sizes in
    `--model-args` untouched; a model that fails to load is one line naming it, and nothing is written."""
    import lm_eval.api.registry as registry

    made = []

    class NoGPU:
        @classmethod
        def create_from_arg_string(cls, arg_string, additional_config):
            made.append((arg_string, additional_config))
            raise RuntimeError("no CUDA device\nmore")

    monkeypatch.setattr(registry, "get_model", lambda name: made.append(name) or NoGPU)
    args = "pretrained=my-org/model-v2,tensor_parallel_size=2,data_parallel_size=4,gpu_memory_utilization=0.8"
    out = tmp_path / "out"
    code = main(["evaluate", str(two / "right"), "--model", "vllm", "--model-args", args, "--batch-size", "auto",
                 "--device", "cuda", "--output-path", str(out), "--fail-on", "nfr>5%"])
    err = capsys.readouterr().err
    assert made == ["vllm", (args, {"batch_size": "auto", "device": "cuda"})]
    assert code == 2 and err.strip() == (f"adaptguard evaluate: error: --model vllm --model-args {args!r}: could not load the "
                                         "model (RuntimeError: no CUDA device)"), err
    assert not out.exists()


def test_an_evaluate_output_is_a_baseline_too(whole_two, capsys):
    """`evaluate` writes each sample as `simple_evaluate` returns it (`arguments` a list of [context, continuation]),
    not as lm-eval's CLI writes it: `compare` reads such a folder as either side (the choices of each item, which the
    churn check reads, from both forms). The run against a copy of itself: no item flips."""
    import shutil

    out = whole_two[0]
    report, again = out.parent / "self.json", out.parent / "again"
    shutil.copytree(out, again, dirs_exist_ok=True)
    code = main(["compare", str(out), str(again), "--fail-on", "t_a:nfr>50%", "--json", str(report)])
    assert "error" not in capsys.readouterr().err
    (decision,) = json.loads(report.read_text())["gate"]["decisions"]
    assert decision["value"] == 0.0 and code == exit_of({"t_a:nfr>50%": decision["decision"]}) != 2
