"""The MedCalc-style domain (issue 37): items from the medcalc-bench package's calculators, MedCalc-Bench's
final-answer rule, disjoint seeded splits, and the lm-eval task."""

import json

import pytest
from conftest import ROOT

pytest.importorskip("medcalc")

TASK_DIR = ROOT / "lm_eval_tasks" / "medcalc"


def test_answers_match_the_formulas_computed_independently():
    from adaptguard.data.medcalc import medcalc_items

    rows = medcalc_items(["bmi", "mean_arterial_pressure", "centor", "glasgow_coma"], 30, seed=3)
    assert [r["calculator"] for r in rows[:4]] == ["bmi", "mean_arterial_pressure", "centor", "glasgow_coma"]
    gcs = {"eyes open spontaneously": 4, "eye opening to verbal command": 3, "eye opening to pain": 2,
           "no eye opening": 1, "oriented": 5, "confused": 4, "inappropriate words": 3, "incomprehensible sounds": 2,
           "no verbal response": 1, "obeys commands": 6, "localizes pain": 5, "withdrawal from pain": 4,
           "flexion to pain": 3, "extension to pain": 2, "no motor response": 1}
    for r in rows:
        x = json.loads(r["inputs"])
        if r["calculator"] == "bmi":
            expected = x["weight"][0] / (x["height"][0] / 100) ** 2
        elif r["calculator"] == "mean_arterial_pressure":
            expected = 2 / 3 * x["dia_bp"][0] + 1 / 3 * x["sys_bp"][0]
        elif r["calculator"] == "centor":  # McIsaac's age points, then one point per criterion
            age = x["age"][0]
            expected = (1 if age <= 14 else -1 if age >= 45 else 0) + (x["temperature"][0] > 38) + \
                x["exudate_swelling_tonsils"] + x["tender_lymph_nodes"] + x["cough_absent"]
        else:
            expected = sum(gcs[v] for v in x.values())
        if r["kind"] == "decimal":
            assert float(r["answer"]) == pytest.approx(expected, abs=1e-3)
        else:
            assert int(r["answer"]) == expected
        # the completion is the rationale and the answer line; the note states the inputs
        assert r["completion"].endswith(f"\nAnswer: {r['answer']}") and r["prompt"].startswith("Patient note: ")
        assert r["prompt"].endswith("\nExplanation:") and "  " not in r["completion"]


def test_the_final_answer_rule():
    from adaptguard.data.medcalc import final_answer, is_correct

    assert final_answer("step 1 ... Answer: 3\nAnswer: -2 points") == "-2"  # the last Answer line
    assert final_answer("no answer line") is None and final_answer("Answer: unclear") is None
    assert is_correct("Answer: 3", "3", "integer") and not is_correct("Answer: 3.4", "3", "integer")
    assert is_correct("Answer: 104.9", "100", "decimal") and is_correct("Answer: 95.0", "100", "decimal")
    assert not is_correct("Answer: 105.1", "100", "decimal") and not is_correct("the BMI is 100", "100", "decimal")
    with pytest.raises(ValueError, match="kind must be 'integer' or 'decimal', got 'date'"):
        is_correct("Answer: 1", "1", "date")


def test_splits_are_disjoint_seeded_and_stable():
    from adaptguard.data.medcalc import CALCULATORS, medcalc_dataset, medcalc_splits

    splits = medcalc_splits(list(CALCULATORS), 20, 10, 10, seed=0)
    assert [len(splits[k]) for k in ("train", "dev", "test")] == [20 * 7, 10 * 7, 10 * 7]
    prompts = [{r["prompt"] for r in splits[k]} for k in ("train", "dev", "test")]
    assert sum(map(len, prompts)) == 40 * 7 and not (prompts[0] & prompts[1] or prompts[0] & prompts[2])
    # more items extend the draw: a larger train set keeps the smaller one's items
    assert medcalc_splits(["centor"], 5, 0, 0)["train"] == medcalc_splits(["centor"], 8, 2, 0)["train"][:5]
    assert medcalc_splits(["centor"], 5, 0, 0, seed=1)["train"] != medcalc_splits(["centor"], 5, 0, 0)["train"]
    data = medcalc_dataset(["bmi"], 3)
    assert data.column_names == ["prompt", "completion", "answer", "kind", "calculator", "inputs"] and len(data) == 3


def test_bad_input_names_what_is_wrong(monkeypatch):
    import builtins

    from adaptguard.data import medcalc

    with pytest.raises(ValueError, match=r"calculators: unknown \['apgar'\]; known: centor, curb_65"):
        medcalc.medcalc_items(["centor", "apgar"], 2)
    with pytest.raises(ValueError, match="calculator glasgow_coma: only 120 distinct notes, 500 asked"):
        medcalc.medcalc_items(["glasgow_coma"], 500)  # 4 × 5 × 6 responses
    real_import = builtins.__import__

    def no_medcalc(name, *args, **kwargs):
        if name.startswith("medcalc"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_medcalc)
    monkeypatch.setattr("importlib.import_module", lambda name: no_medcalc(name))
    with pytest.raises(ImportError, match=r"pip install 'adaptguard\[medcalc\]'"):
        medcalc.medcalc_items(["bmi"], 1)


def test_lm_eval_task_loads_the_splits_and_scores_by_the_rule():
    import sys

    from lm_eval.tasks import TaskManager

    from adaptguard.data.medcalc import medcalc_splits

    manager = TaskManager(include_path=str(TASK_DIR), include_defaults=False,
                          metadata={"calculators": ["centor", "bmi"], "n_dev": 2, "n_test": 3, "seed": 4})
    task = manager.load_task_or_group(["medcalc"])["medcalc"]
    expected = medcalc_splits(["centor", "bmi"], 0, 2, 3, seed=4)
    assert [task.doc_to_text(d) for d in task.test_docs()] == [r["prompt"] for r in expected["test"]]
    assert [d["answer"] for d in task.validation_docs()] == [r["answer"] for r in expected["dev"]]
    sys.path.insert(0, str(TASK_DIR))
    try:
        import utils as medcalc_utils  # the task folder's glue, as lm-eval loads it
    finally:
        sys.path.remove(str(TASK_DIR))
    doc = expected["test"][1]  # a BMI item: within 5 % counts
    gold = float(doc["answer"])
    assert medcalc_utils.process_results(doc, [doc["completion"]]) == {"acc": 1.0, "answered": 1.0}
    assert medcalc_utils.process_results(doc, [f"... Answer: {gold * 1.06:.3f}"]) == {"acc": 0.0, "answered": 1.0}
    assert medcalc_utils.process_results(doc, ["I cannot tell."]) == {"acc": 0.0, "answered": 0.0}


def test_readme_example_is_current():
    import re

    from adaptguard.data.medcalc import medcalc_items

    readme = (TASK_DIR / "README.md").read_text()
    example = re.search(r"```\n(Patient note: .*?)\n```", readme, re.DOTALL).group(1)
    row = medcalc_items(["bmi"], 1)[0]
    assert example == row["prompt"] + row["completion"]
