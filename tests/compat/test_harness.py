import json
import math
from pathlib import Path

import pytest
from datasets import Dataset

from adaptguard.compat.harness import tasks as harness


def test_aggregations():
    assert harness.btc_aggregation([(1, 1), (1, 0), (0, 1), (1, 1)]) == pytest.approx(2 / 3)
    assert math.isnan(harness.btc_aggregation([(0, 1)]))
    assert harness.mean_positive([0.5, -0.2, 0.1, 0.0]) == pytest.approx(0.3)
    assert harness.mean_negative_abs([0.5, -0.2, -0.4]) == pytest.approx(0.3)


def test_aggregations_registered_with_lm_eval():
    from lm_eval.api.registry import get_aggregation

    assert get_aggregation("compat_btc") is harness.btc_aggregation
    assert get_aggregation("compat_mean_positive") is harness.mean_positive


def test_doc_hash_matches_lm_eval_logs(lm_runs):
    from lm_eval_runs import samples_file

    for task in ("t_piqa", "t_gsm"):
        for line in open(samples_file(lm_runs / "old", task)):
            rec = json.loads(line)
            assert harness.doc_hash(rec["doc"]) == rec["doc_hash"]


def test_per_sample_flips_against_a_reference(monkeypatch):
    doc = {"goal": "g", "sol1": "aa", "sol2": "b", "label": 0}
    monkeypatch.setitem(harness._REFERENCES, "compat_piqa",
                        {harness.doc_hash(doc): {"answer": 0}})  # the reference chose choice 0
    # reference right (choice 0); now wrong (choice 1): a negative flip
    out = harness.multiple_choice_results("compat_piqa", doc, [(-5.0, False), (-2.0, True)], 0, ["aa", "b"])
    assert out == {"acc": 0.0, "acc_norm": 0.0, "nfr": 1.0, "pfr": 0.0, "inconsistency_flips": 1.0, "btc": (1.0, 0.0)}
    # acc_norm divides by the choice length in characters: -5/2 > -2/1 is false, -2.5 < -2
    out = harness.multiple_choice_results("compat_piqa", doc, [(-3.0, False), (-2.0, True)], 0, ["aa", "b"])
    assert out["acc"] == 0.0 and out["acc_norm"] == 1.0
    other = {"goal": "x", "sol1": "a", "sol2": "b", "label": 0}
    with pytest.raises(ValueError, match="same documents"):
        harness.multiple_choice_results("compat_piqa", other, [(-1.0, False), (-2.0, True)], 0, ["a", "b"])


def _task_utils(folder: str):
    import importlib.util

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location(f"{folder}_utils", ROOT / "lm_eval_tasks" / folder / "utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gsm8k_exact_match_and_smooth_flips(monkeypatch):
    utils = _task_utils("compat")
    # read from the installed lm-eval's gsm8k.yaml: the settings its own gsm8k task scores exact_match with
    assert utils.GSM8K_EXACT_MATCH == {"regexes_to_ignore": [",", "\\$", "(?s).*#### ", "\\.$"], "ignore_case": True}
    doc = {"question": "q", "answer": "work\n#### 1,234"}
    monkeypatch.setitem(harness._REFERENCES, "compat_gsm8k", {harness.doc_hash(doc): {"answer": "99"}})
    out = utils.gsm8k_results(doc, ["1234."])  # "," and the final "." ignored, as lm-eval's gsm8k does
    assert out == {"exact_match": 1.0, "nfr": 0.0, "pfr": 1.0, "inconsistency_flips": 0.0, "btc": (0.0, 1.0)}
    out = utils.gsm8k_results(doc, ["1,235"])
    assert out == {"exact_match": 0.0, "nfr": 0.0, "pfr": 0.0, "inconsistency_flips": 1.0, "btc": (0.0, 0.0)}

    sdoc = {"id": "1", "dialogue": "d", "summary": "the cat sat down"}
    monkeypatch.setitem(harness._REFERENCES, "compat_samsum",
                        {harness.doc_hash(sdoc): {"answer": "the cat sat"}})
    out = harness.similarity_results("compat_samsum", sdoc, ["a dog"], [sdoc["summary"]])
    assert out["rouge1"] == 0.0
    assert out["smooth_nfr"] == 1.0 and out["m_r"] == pytest.approx(-6 / 7)


def test_local_data_dir_and_missing_file(tmp_path):
    (tmp_path / "compat_gsm8k.jsonl").write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n")
    (tmp_path / "compat_gsm8k.train.jsonl").write_text(json.dumps({"question": "p", "answer": "#### 2"}) + "\n")
    data = harness.load_dataset_for("compat_gsm8k", "openai/gsm8k", "main", "test", compat_data_dir=str(tmp_path),
                                    pretrained="ignored")
    assert set(data) == {"test", "train"} and data["train"][0]["question"] == "p"
    with pytest.raises(ValueError, match="has no compat_piqa.jsonl"):
        harness.load_dataset_for("compat_piqa", "baber/piqa", None, "validation", compat_data_dir=str(tmp_path))


def test_lm_eval_callback_logs_scores_and_flips(lm_runs, embedded_path, tmp_path):
    from conftest import cpu_args
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adaptguard import LMEvalCallback, TALRTrainer

    old_results = json.loads(next((lm_runs / "old").rglob("results_*.json")).read_text())["results"]
    callback = LMEvalCallback(["t_piqa", "t_gsm"], reference=lm_runs / "old", when="epoch",
                              include_path=lm_runs / "tasks", batch_size=8)
    model, tok = AutoModelForCausalLM.from_pretrained(embedded_path), AutoTokenizer.from_pretrained(embedded_path)
    # learning rate 0: the model stays the old one, so scores equal the old CLI run and nothing flips
    trainer = TALRTrainer(model=model, args=cpu_args(tmp_path, learning_rate=0.0, num_train_epochs=1),
                          train_dataset=Dataset.from_list([{"text": "count : 1 2 3 4 5 6 ."}] * 4),
                          processing_class=tok, callbacks=[callback])
    trainer.train()
    (logged,) = [h for h in trainer.state.log_history if "lm_eval/t_piqa/acc" in h]
    assert logged["lm_eval/t_piqa/acc"] == pytest.approx(old_results["t_piqa"]["acc,none"])
    assert logged["lm_eval/t_gsm/exact_match,strict-match"] == pytest.approx(
        old_results["t_gsm"]["exact_match,strict-match"])
    assert logged["lm_eval/t_piqa/nfr"] == 0.0 and logged["lm_eval/t_piqa/pfr"] == 0.0
    assert logged["lm_eval/t_gsm/nfr,strict-match"] == 0.0


def test_lm_eval_callback_bad_reference(tmp_path):
    from adaptguard import LMEvalCallback

    with pytest.raises(ValueError, match="--log_samples"):
        LMEvalCallback(["t_piqa"], reference=tmp_path)
    with pytest.raises(ValueError, match="when"):
        LMEvalCallback(["t_piqa"], when="step")


def test_compare_and_the_harness_extract_the_same_predictions(monkeypatch):
    """One prediction extraction (`runs.prediction`) for `compare` and the compat_* tasks: an empty response is the
    empty answer in both, so their inconsistency flips agree item by item."""
    from adaptguard.compat.compare import compare_task
    from adaptguard.compat.reading.runs import TaskRun, prediction, samples_from_records

    assert prediction([]) == "" and prediction([[]]) == "" and prediction([["72"]]) == "72"
    assert prediction([(-2.0, False), (-1.0, True), (-1.0, False)]) == 1  # the first maximum, as lm-eval's acc
    docs = [{"question": f"q{i}", "answer": "#### 1"} for i in range(3)]
    old_resps, new_resps = [["1"], ["2"], ["3"]], [[], ["1"], ["4"]]
    per_sample = []
    for doc, old, new in zip(docs, old_resps, new_resps):
        monkeypatch.setitem(harness._REFERENCES, "compat_gsm8k", {harness.doc_hash(doc): {"answer": prediction(old)}})
        per_sample.append(harness.exact_match_results("compat_gsm8k", doc, new, doc["answer"],
                                                      **_task_utils("compat").GSM8K_EXACT_MATCH))

    def run(resps):  # read as compare reads a samples file's records
        records = ((f"line {i}", {"doc_id": i, "target": "1", "filtered_resps": r, "metrics": ["exact_match"],
                                  "exact_match": float(prediction(r) == "1")}) for i, r in enumerate(resps))
        return TaskRun("t", Path("<memory>"), samples_from_records(records))

    entry = compare_task(run(old_resps), run(new_resps))["none"]
    for key in ("nfr", "pfr", "inconsistency_flips"):
        assert entry[key] == pytest.approx(sum(s[key] for s in per_sample) / 3), key
    assert [s["inconsistency_flips"] for s in per_sample] == [1.0, 0.0, 1.0]
