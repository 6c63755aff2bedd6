"""`compare` on the runs people have besides lm-eval (issue 65): real Inspect AI logs (evaluated offline with its `hf/`
provider on the embedded models), lighteval details (the parquet its `--save-details` writes, built from lighteval
0.13's `Detail` schema), and the plain JSONL form — each one's flips equal to a count made independently from the
raw files, and every bad input one line, exit 2, nothing written."""

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
from in_process import run_cli

PAIRS = [("hot", "cold"), ("big", "small"), ("up", "down"), ("fast", "slow"), ("open", "closed"), ("light", "dark"),
         ("old", "new"), ("early", "late"), ("full", "empty"), ("happy", "sad")]


def inspect_eval(model: Path, log_dir: Path, epochs: int = 2) -> Path:
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval_
    from inspect_ai.dataset import Sample
    from inspect_ai.scorer import includes, match
    from inspect_ai.solver import generate

    dataset = [Sample(id=f"q{i}", input=f"the opposite of {a} is", target=b) for i, (a, b) in enumerate(PAIRS)]
    task = Task(dataset=dataset, solver=generate(), scorer=[includes(), match()], name="opposites")
    (log,) = inspect_eval_(task, model=f"hf/{model}", log_dir=str(log_dir), display="none", epochs=epochs,
                           max_tokens=4, model_args={"device": "cpu"})
    assert log.status == "success"
    return Path(log.location)


@pytest.fixture(scope="module")
def inspect_logs(tmp_path_factory, embedded_path, tiny_v2_path):
    pytest.importorskip("inspect_ai", reason="Inspect AI logs need inspect-ai (pip install 'adaptguard[inspect]')")
    root = tmp_path_factory.mktemp("inspect")
    return {"old": inspect_eval(embedded_path, root / "old"), "new": inspect_eval(tiny_v2_path, root / "new")}


def raw_inspect(log: Path, scorer: str = "includes") -> dict:
    """{epoch: {id: 0/1}} read from the .eval zip's own sample files, without inspect_ai."""
    out: dict = {}
    with zipfile.ZipFile(log) as z:
        for name in z.namelist():
            if name.startswith("samples/") and name.endswith(".json"):
                s = json.loads(z.read(name))
                out.setdefault(s["epoch"], {})[s["id"]] = float(s["scores"][scorer]["value"] == "C")
    return out


def test_inspect_logs_compare_with_epochs_as_replicates(inspect_logs, tmp_path):
    from adaptguard.compat.stats.replicates import replicate_flips

    proc = run_cli("compare", inspect_logs["old"], inspect_logs["new"], "--json", tmp_path / "c.json",
                   "--html", tmp_path / "c.html", "--flips-out", tmp_path / "f.jsonl")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "c.json").read_text())
    assert report["runs"] == {"old": 2, "new": [2]}  # two epochs a side
    entry = report["tasks"]["opposites"]
    old, new = raw_inspect(inspect_logs["old"]), raw_inspect(inspect_logs["new"])
    ids = sorted(old[1])
    o = np.array([[old[e][i] for i in ids] for e in sorted(old)])
    n = np.array([[new[e][i] for i in ids] for e in sorted(new)])
    cross = np.mean([(a * (1 - b)).mean() for a in o for b in n])  # by brute force over the 4 pairs
    assert entry["nfr"] == pytest.approx(cross)
    assert entry["replicates"]["excess_nfr"] == pytest.approx(replicate_flips(o, n)["excess_nfr"])
    assert entry["metric"] == "includes"  # the log's first scorer
    flips = [json.loads(x) for x in (tmp_path / "f.jsonl").read_text().splitlines()]
    for f in flips:
        assert f["prompt"] == f"the opposite of {PAIRS[int(f['doc_id'][1:])][0]} is"
    assert "opposites" in (tmp_path / "c.html").read_text()
    proc = run_cli("compare", inspect_logs["old"], inspect_logs["new"], "--scorer", "match", "--json",
                   tmp_path / "m.json")
    assert json.loads((tmp_path / "m.json").read_text())["tasks"]["opposites"]["metric"] == "match"
    # a folder of logs is a run
    proc = run_cli("compare", inspect_logs["old"].parent, inspect_logs["new"].parent, "--json", tmp_path / "d.json")
    assert json.loads((tmp_path / "d.json").read_text())["tasks"]["opposites"]["nfr"] == pytest.approx(cross)


def _edited(log: Path, out: Path, edit) -> Path:
    from inspect_ai.log import read_eval_log, write_eval_log

    data = read_eval_log(str(log))
    edit(data)
    write_eval_log(data, str(out))
    return out


@pytest.mark.parametrize("case, message", [
    ("unfinished", "status is 'error', not 'success'"),
    ("sample_error", "the sample ended in an error"),
    ("scorer", "no score from scorer 'nope' (scorers: includes, match)"),
    ("no_samples", "the Inspect log has no samples"),
])
def test_bad_inspect_logs_are_one_line_errors_and_write_nothing(inspect_logs, tmp_path, case, message):
    from inspect_ai.log import EvalError

    def edit(log):
        if case == "unfinished":
            log.status = "error"
        elif case == "sample_error":
            log.samples[3].error = EvalError(message="model timed out", traceback="", traceback_ansi="")
        elif case == "no_samples":
            log.samples = []

    bad = inspect_logs["new"] if case == "scorer" else _edited(inspect_logs["new"], tmp_path / "bad.eval", edit)
    extra = ["--scorer", "nope"] if case == "scorer" else []
    proc = run_cli("compare", inspect_logs["old"], bad, *extra, "--json", tmp_path / "x.json")
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.json").exists()


# ------------------------------------------------------------------------------------------------- lighteval
DOC_FIELDS = dict(instruction=None, images=None, specific=None, unconditioned_query=None, original_query=None,
                  task_name="", fewshot_samples=[], sampling_methods=[], fewshot_sorting_class=None,
                  generation_size=None, stop_sequences=None, use_logits=False, num_samples=1, generation_grammar=None)
RESPONSE_FIELDS = dict(input=None, input_tokens=[], text=[], output_tokens=[], text_post_processed=None, reasonings=[],
                       logprobs=[], argmax_logits_eq_gold=[], logits=None, unconditioned_logprobs=None,
                       truncated_tokens_count=0, padded_tokens_count=0)


def write_lighteval(folder: Path, task: str, answers: list[int], gold: list[int], date="2026-11-28T10-00-00.000000",
                    doc_ids=True) -> Path:
    """A details file as lighteval 0.13's EvaluationTracker.save writes it: `Dataset.from_list` of
    `asdict(Detail(doc, model_response, metric))`, columns sorted, `to_parquet`."""
    from datasets import Dataset

    rows = []
    for i, (a, g) in enumerate(zip(answers, gold)):
        choices = [f" w{i}_{k}" for k in range(4)]
        doc = {"query": f"{task} question {i}", "choices": choices, "gold_index": g, **DOC_FIELDS,
               "id": str(i) if doc_ids else "", "task_name": task}
        response = {**RESPONSE_FIELDS, "logprobs": [-1.0 if k == a else -5.0 for k in range(4)],
                    "argmax_logits_eq_gold": [a == g]}
        rows.append({"doc": doc, "model_response": response, "metric": {"acc": int(a == g)}})
    dataset = Dataset.from_list(rows)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"details_{task}_{date}.parquet"
    dataset.select_columns(sorted(dataset.column_names)).to_parquet(str(path))
    return path


def test_lighteval_details_compare_and_count_as_lighteval_scored(tmp_path):
    rng = np.random.default_rng(1)
    gold = rng.integers(0, 4, 120).tolist()
    old = [g if rng.random() < 0.7 else (g + 1) % 4 for g in gold]
    new = [a if rng.random() < 0.85 else (a + 2) % 4 for a in old]
    for side, answers in (("old", old), ("new", new)):
        write_lighteval(tmp_path / side, "lighteval|arc:easy|0", answers, gold)
    proc = run_cli("compare", tmp_path / "old", tmp_path / "new", "--json", tmp_path / "c.json", "--flips-out",
                   tmp_path / "f.jsonl")
    assert proc.returncode == 0, proc.stderr[-2000:]
    entry = json.loads((tmp_path / "c.json").read_text())["tasks"]["lighteval|arc:easy|0"]
    o, n = np.array(old) == np.array(gold), np.array(new) == np.array(gold)
    assert entry["nfr"] == pytest.approx((o & ~n).mean()) and entry["pfr"] == pytest.approx((~o & n).mean())
    assert entry["btc"] == pytest.approx((o & n).sum() / o.sum()) and entry["metric"] == "acc"
    assert entry["churn"] is not None  # multiple choice: chance tested
    flips = [json.loads(x) for x in (tmp_path / "f.jsonl").read_text().splitlines()]
    f = flips[0]
    i = int(f["doc_id"])
    assert f["gold"] == f" w{i}_{gold[i]}" and f["old"] == f" w{i}_{old[i]}" and f["new"] == f" w{i}_{new[i]}"


def test_lighteval_without_doc_ids_keys_by_row_and_mixed_sides_must_match(tmp_path):
    write_lighteval(tmp_path / "old", "t", [0, 1, 2, 3], [0, 1, 2, 0], doc_ids=False)
    write_lighteval(tmp_path / "new", "t", [0, 1, 0, 0], [0, 1, 2, 0], doc_ids=False)
    proc = run_cli("compare", tmp_path / "old", tmp_path / "new", "--json", tmp_path / "c.json")
    assert proc.returncode == 0 and json.loads((tmp_path / "c.json").read_text())["tasks"]["t"]["n_negative_flips"] == 1
    jsonl = tmp_path / "other.jsonl"  # the same task by its ids 0..3 in the JSONL form: keys match, so it compares
    jsonl.write_text("".join(json.dumps({"task": "t", "id": i, "correct": c}) + "\n" for i, c in enumerate([1, 1, 0, 0])))
    proc = run_cli("compare", tmp_path / "old", jsonl, "--json", tmp_path / "m.json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    jsonl.write_text("".join(json.dumps({"task": "t", "id": f"x{i}", "correct": 1}) + "\n" for i in range(4)))
    proc = run_cli("compare", tmp_path / "old", jsonl, "--json", tmp_path / "x.json")
    assert proc.returncode == 2 and "different documents" in proc.stderr and not (tmp_path / "x.json").exists()


# --------------------------------------------------------------------------------------------------- JSONL
def test_the_jsonl_form_with_tasks_and_epochs(tmp_path):
    from studies.simulate import simulate_runs

    old, new, _ = simulate_runs(np.random.default_rng(2), 200, 3, 3, drop=5.0, share=0.3, sd_run=0.1)
    old, new = old.astype(bool), new.astype(bool)
    for side, runs in (("old", old), ("new", new)):
        with open(tmp_path / f"{side}.jsonl", "w") as f:
            for e, run in enumerate(runs):
                for i, ok in enumerate(run):
                    f.write(json.dumps({"task": "qa", "id": f"item-{i}", "correct": bool(ok), "epoch": e,
                                        "answer": "A" if ok else "B", "target": "A", "input": f"question {i}"}) + "\n")
    proc = run_cli("compare", tmp_path / "old.jsonl", tmp_path / "new.jsonl", "--json", tmp_path / "c.json",
                   "--fail-on", "excess_nfr>1%")
    assert proc.returncode == 1, proc.stderr[-2000:]
    entry = json.loads((tmp_path / "c.json").read_text())["tasks"]["qa"]
    order = np.argsort([f"item-{i}" for i in range(200)])  # the ids sorted as strings
    cross = np.mean([(a[order] & ~b[order]).mean() for a in old for b in new])
    assert entry["replicates"]["runs"] == [3, 3] and entry["nfr"] == pytest.approx(cross)


@pytest.mark.parametrize("lines, message", [
    (['{"task": "t", "correct": 1}'], "no 'id' field"),
    (['{"task": "t", "id": 1}'], "no 'correct' or 'score' field"),
    (['{"task": "t", "id": 1, "correct": 1}', '{"task": "t", "id": 1, "correct": 0}'], "appears twice"),
    (['{"task": "t", "id": 1, "correct": "yes"}'], "must be a finite number or a boolean"),
    (['{"task": "t", "id": 1, "correct": 1, "epoch": 2}'], "number them 0, 1, 2"),
    (["[1, 2]"], "expected a JSON object"),
    ([""], "no samples"),
])
def test_bad_jsonl_is_one_line_naming_the_line(tmp_path, lines, message):
    good = tmp_path / "good.jsonl"
    good.write_text('{"task": "t", "id": 1, "correct": 1}\n')
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    proc = run_cli("compare", good, bad, "--json", tmp_path / "x.json")
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.json").exists()
