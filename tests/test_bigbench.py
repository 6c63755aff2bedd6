"""BIG-bench tasks read from the sdist into local lm-eval tasks (a small archive of the sdist's layout stands in
for the 358 MB download)."""

import io
import json
import tarfile

import pytest

TOY = {"task_prefix": "Is it true?", "append_choices_to_input": False, "examples": [
    {"input": "The sky is blue.", "target_scores": {"T": 1, "F": 0}},
    {"input": "Fish fly.", "target_scores": {"T": 0, "F": 1}},
    {"input": "Ambiguous.", "target_scores": {"T": 1, "F": 1}},  # no single right answer: dropped
    {"input": "Generative only.", "target": "x"},  # not multiple choice: dropped
]}
QA = {"examples": [{"input": "2 + 2?", "target_scores": {"3": 0, "4": 1, "5": 0}}]}


def fake_sdist(path, tasks):
    with tarfile.open(path, "w:gz") as archive:
        for name, task in tasks.items():
            data = json.dumps(task).encode()
            info = tarfile.TarInfo(f"bigbench-1.0.0/bigbench/benchmark_tasks/{name}/task.json")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def test_load_tasks_reads_multiple_choice_examples_with_bigbench_prompts(tmp_path, monkeypatch):
    from adaptguard.data.bigbench import load_tasks

    monkeypatch.setenv("ADAPTGUARD_CACHE", str(tmp_path / "cache"))
    sdist = fake_sdist(tmp_path / "bigbench-1.0.0.tar.gz", {"toy": TOY, "qa": QA})
    tasks = load_tasks(["toy", "qa"], sdist=sdist)
    assert tasks["toy"] == [
        {"input": "Is it true?\nQ: The sky is blue.\nA:", "choices": ["T", "F"], "label": 0},
        {"input": "Is it true?\nQ: Fish fly.\nA:", "choices": ["T", "F"], "label": 1}]
    # BIG-bench's defaults: no prefix, choices listed after the question
    assert tasks["qa"] == [{"input": "Q: 2 + 2?\n  choice: 3\n  choice: 4\n  choice: 5\nA:",
                            "choices": ["3", "4", "5"], "label": 1}]
    sdist.unlink()  # read once into the cache: no archive needed any more
    assert load_tasks(["toy"]) == {"toy": tasks["toy"]}
    with pytest.raises(FileNotFoundError):
        load_tasks(["other"], sdist=sdist)
    with pytest.raises(ValueError, match=r"no task.json for \['nope'\]"):
        load_tasks(["nope"], sdist=fake_sdist(tmp_path / "again.tar.gz", {"toy": TOY}))


def test_generative_task_reads_subtasks_with_one_target(tmp_path, monkeypatch):
    from adaptguard.data.bigbench import load_generative_task

    monkeypatch.setenv("ADAPTGUARD_CACHE", str(tmp_path / "cache"))
    sub_b = {"task_prefix": "Add.", "examples": [{"input": "1 + 1?", "target": "2"},
                                                 {"input": "two answers", "target": ["a", "b"]},  # dropped
                                                 {"input": "one in a list", "target": [" 7 "]}]}
    sub_a = {"examples": [{"input": "Unscramble: hte", "target": "the", "target_scores": {"the": 1}},
                          {"input": "scores only", "target_scores": {"x": 1, "y": 0}}]}  # dropped: no target
    sdist = fake_sdist(tmp_path / "bigbench-1.0.0.tar.gz", {"gen": {"examples": []}, "gen/b_sub": sub_b,
                                                            "gen/a_sub": sub_a, "other": QA})
    rows = load_generative_task("gen", sdist=sdist)
    # subtasks in path order, each with its own prefix; the target stripped
    assert rows == [{"input": "Q: Unscramble: hte\nA:", "target": "the", "subtask": "a_sub"},
                    {"input": "Add.\nQ: 1 + 1?\nA:", "target": "2", "subtask": "b_sub"},
                    {"input": "Add.\nQ: one in a list\nA:", "target": "7", "subtask": "b_sub"}]
    sdist.unlink()
    assert load_generative_task("gen") == rows  # cached
    with pytest.raises(ValueError, match="'nope' has no examples with one target string"):
        load_generative_task("nope", sdist=fake_sdist(tmp_path / "again.tar.gz", {"other": QA}))


def test_written_tasks_load_in_lm_eval(tmp_path):
    from lm_eval.tasks import TaskManager, get_task_dict

    from adaptguard.data.bigbench import write_lm_eval_tasks

    rows = [{"input": "Q: 2 + 2?\nA:", "choices": ["3", "4"], "label": 1}] * 3
    names = write_lm_eval_tasks({"qa": rows}, tmp_path, limit=2)
    assert names == ["bb_qa"]
    task = get_task_dict(names, TaskManager(include_path=str(tmp_path)))["bb_qa"]
    docs = list(task.test_docs())
    assert len(docs) == 2
    assert task.doc_to_text(docs[0]) == "Q: 2 + 2?\nA:" and task.doc_to_choice(docs[0]) == ["3", "4"]
    assert task.doc_to_target(docs[0]) == 1
