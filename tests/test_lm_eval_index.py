"""The suite's cache of lm-eval's own task index (`lm_eval_index.py`) gives lm-eval's entries: checked folder by folder
against lm-eval's own `TaskIndex.build` (the whole index takes 11-20 s to build; these folders well under one), and
a given folder still overrides a default task as lm-eval merges them."""

from pathlib import Path

import lm_eval.tasks
from lm_eval.tasks import TaskManager
from lm_eval.tasks._index import Kind, TaskIndex

ROOT = Path(lm_eval.tasks.__file__).parent
# folders with !function tags, includes, groups, python tasks, and tasks spread over many YAMLs
FOLDERS = ("gsm8k", "piqa", "ifeval", "humaneval", "hendrycks_ethics", "anli", "glue", "arithmetic")


def test_cached_entries_are_lm_evals_own():
    assert TaskIndex.build.adaptguard_cached  # conftest installed it: the test below checks what the suite runs on
    cached = TaskIndex.build([ROOT])
    for folder in FOLDERS:
        own = {name: e for name, e in TaskIndex.build.original([ROOT / folder]).items() if e.kind != Kind.TAG}
        here = {name: e for name, e in cached.items()
                if e.yaml_path is not None and (ROOT / folder) in e.yaml_path.parents and e.kind != Kind.TAG}
        assert own and here == own, folder
    tags = {name: e for name, e in TaskIndex.build.original([ROOT / "arithmetic"]).items() if e.kind == Kind.TAG}
    assert tags and all(e.tags <= cached[name].tags for name, e in tags.items())


def test_a_given_folder_overrides_a_default_task(tmp_path, caplog):
    (tmp_path / "piqa.yaml").write_text((ROOT / "piqa" / "piqa.yaml").read_text())
    manager = TaskManager(include_path=str(tmp_path))
    assert manager.task_index["piqa"].yaml_path == tmp_path / "piqa.yaml"
    assert manager.task_index["gsm8k"].yaml_path.parent == ROOT / "gsm8k"
    assert "Task 'piqa' from" in caplog.text and "overrides existing task" in caplog.text
