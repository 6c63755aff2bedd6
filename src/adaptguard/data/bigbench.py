"""BIG-bench multiple-choice tasks as local lm-eval tasks, offline after one download from the package index.

BIG-bench (Srivastava et al., 2022; Apache-2.0) ships its task data in the PyPI sdist `bigbench==1.0.0` (358 MB).
Installing it would pull heavy dependencies, so the sdist is fetched once from the package index (its sha256 checked
against the index's), and the `task.json` files asked for are read out of the archive into
`$ADAPTGUARD_CACHE/bigbench/<task>.json`. `write_lm_eval_tasks` turns them into lm-eval `multiple_choice` tasks (a
JSONL file and a YAML each, usable with `--include_path`), scored by log-likelihood of each choice.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tarfile
import urllib.request
from pathlib import Path

SDIST = "bigbench-1.0.0.tar.gz"
INDEX = os.environ.get("ADAPTGUARD_PYPI_SIMPLE", "https://pypi.org/simple")

# Short-context multiple-choice tasks that fit a 135M model's window (checked: ≥ 2 choices, one right answer).
DEFAULT_TASKS = ("general_knowledge", "sports_understanding", "date_understanding", "navigate", "misconceptions",
                 "hindu_knowledge")

YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: multiple_choice
test_split: test
doc_to_text: "{{{{input}}}}"
doc_to_choice: choices
doc_to_target: label
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
  source: "{source}"
"""


def _download_sdist(downloads: Path) -> Path:
    """The BIG-bench sdist in `downloads`, fetched from the package index once and checked against its sha256."""
    target = downloads / SDIST
    if target.exists():
        return target
    downloads.mkdir(parents=True, exist_ok=True)
    page = urllib.request.urlopen(f"{INDEX}/bigbench/", timeout=60).read().decode()
    match = re.search(rf'href="([^"]*{re.escape(SDIST)})#sha256=([0-9a-f]{{64}})"', page)
    if match is None:
        raise RuntimeError(f"{SDIST} is not listed on {INDEX}/bigbench/")
    url, expected = match.groups()
    print(f"downloading {SDIST} (358 MB, once) ...", file=sys.stderr, flush=True)
    partial, digest = target.with_name(target.name + ".partial"), hashlib.sha256()
    with urllib.request.urlopen(url, timeout=600) as response, open(partial, "wb") as out:
        for block in iter(lambda: response.read(1 << 20), b""):
            digest.update(block)
            out.write(block)
    if digest.hexdigest() != expected:
        partial.unlink()
        raise RuntimeError(f"{SDIST}: sha256 {digest.hexdigest()} differs from the index's {expected}")
    os.replace(partial, target)
    return target


def zero_shot_prompt(task: dict, text: str, choices: list[str]) -> str:
    """BIG-bench's zero-shot multiple-choice prompt (its `json_task` format): the task prefix, the input after
    `example_input_prefix` (default "\\nQ: "), the choices listed when `append_choices_to_input` (default true),
    then `example_output_prefix` (default "\\nA: ") without its trailing space (lm-eval adds one before a choice)."""
    prompt = task.get("task_prefix", "") + task.get("example_input_prefix", "\nQ: ") + text
    if task.get("append_choices_to_input", True):
        prompt += "".join(f"\n  choice: {c}" for c in choices)
    return (prompt + task.get("example_output_prefix", "\nA: ")).rstrip().lstrip("\n")


def load_tasks(names: tuple[str, ...] | list[str], sdist: Path | None = None) -> dict[str, list[dict]]:
    """{task: [{"input", "choices", "label"}]} for BIG-bench multiple-choice tasks, read from
    `$ADAPTGUARD_CACHE/bigbench/` or, for the missing ones, from the sdist (downloaded once to
    `$ADAPTGUARD_CACHE/downloads/` unless given). Choices keep the file's order; examples without exactly one
    top-scoring choice are dropped."""
    from ..models.embedded import cache_root

    cache = cache_root() / "bigbench"
    cache.mkdir(parents=True, exist_ok=True)
    missing = [n for n in names if not (cache / f"{n}.json").exists()]
    if missing:
        sdist = sdist or _download_sdist(cache_root() / "downloads")
        wanted = {f"bigbench/benchmark_tasks/{n}/task.json": n for n in missing}
        with tarfile.open(sdist) as archive:
            for member in archive:
                name = wanted.get(member.name.split("/", 1)[-1])
                if name is not None:
                    data = archive.extractfile(member).read()
                    tmp = cache / f".{name}.json.tmp"
                    tmp.write_bytes(data)
                    os.replace(tmp, cache / f"{name}.json")
        still = [n for n in missing if not (cache / f"{n}.json").exists()]
        if still:
            raise ValueError(f"BIG-bench has no task.json for {still} (subtask folders are not read)")
    tasks = {}
    for name in names:
        raw = json.loads((cache / f"{name}.json").read_text())
        rows = []
        for ex in raw.get("examples", []):
            scores = ex.get("target_scores")
            if not scores or sorted(scores.values()).count(max(scores.values())) != 1:
                continue
            choices = list(scores)
            rows.append({"input": zero_shot_prompt(raw, ex["input"], choices), "choices": choices,
                         "label": choices.index(max(scores, key=scores.get))})
        if not rows:
            raise ValueError(f"BIG-bench task {name!r} has no multiple-choice examples")
        tasks[name] = rows
    return tasks


def load_generative_task(name: str, sdist: Path | None = None) -> list[dict]:
    """[{"input", "target", "subtask"}] of a BIG-bench task with generated answers: the examples of its `task.json`
    and of every subtask folder's (in path order) that have one target string, the input in BIG-bench's zero-shot
    format (as `zero_shot_prompt`, without choices). Cached as `$ADAPTGUARD_CACHE/bigbench/<task>.generative.json`."""
    from ..models.embedded import cache_root

    cache = cache_root() / "bigbench" / f"{name}.generative.json"
    if cache.exists():
        return json.loads(cache.read_text())
    sdist = sdist or _download_sdist(cache_root() / "downloads")
    folder = f"bigbench/benchmark_tasks/{name}/"
    rows = []
    with tarfile.open(sdist) as archive:
        members = sorted((m for m in archive if m.name.split("/", 1)[-1].startswith(folder)
                          and m.name.endswith("/task.json")), key=lambda m: m.name)
        for member in members:
            raw = json.loads(archive.extractfile(member).read())
            subtask = member.name.split("/", 1)[-1][len(folder):].removesuffix("task.json").strip("/")
            for ex in raw.get("examples", []):
                target = ex.get("target")
                target = target[0] if isinstance(target, list) and len(target) == 1 else target
                if isinstance(target, str) and target.strip():
                    rows.append({"input": zero_shot_prompt({**raw, "append_choices_to_input": False}, ex["input"], []),
                                 "target": target.strip(), "subtask": subtask or name})
    if not rows:
        raise ValueError(f"BIG-bench task {name!r} has no examples with one target string (or no such task)")
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_name(f".{cache.name}.tmp")
    tmp.write_text(json.dumps(rows))
    os.replace(tmp, cache)
    return rows


GENERATIVE_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: generate_until
test_split: test
doc_to_text: "{{{{input}}}}"
doc_to_target: target
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: {max_new_tokens}
  do_sample: false
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    regexes_to_ignore: ["^\\\\s+", "\\\\s+$"]
metadata:
  version: 1.0
  source: "{source}"
"""


def write_lm_eval_generative_tasks(tasks: dict[str, list[dict]], out_dir: Path, limit: int | None = None,
                                   max_new_tokens: int = 8, prefix: str = "bb_") -> list[str]:
    """Write generated-answer lm-eval tasks `<prefix><task>` (JSONL of `load_generative_task`'s rows + YAML) into
    `out_dir`: greedy, up to `max_new_tokens`, stopped at a newline, scored by exact match with leading and trailing
    whitespace ignored; the first `limit` examples of each. Returns the task names."""
    return write_lm_eval_tasks(tasks, out_dir, limit, prefix, template=GENERATIVE_YAML, max_new_tokens=max_new_tokens)


def write_lm_eval_tasks(tasks: dict[str, list[dict]], out_dir: Path, limit: int | None = None, prefix: str = "bb_",
                        source: str = "BIG-bench {name} (Apache-2.0), from the PyPI sdist bigbench==1.0.0",
                        template: str = YAML, **fields) -> list[str]:
    """Write multiple-choice lm-eval tasks `<prefix><task>` (JSONL of {"input", "choices", "label"} + YAML) into
    `out_dir`; the first `limit` examples of each. Returns the task names. `template` and `fields`: another YAML
    (`GENERATIVE_YAML`) and what it needs besides the task, data file and source."""
    out_dir.mkdir(parents=True, exist_ok=True)
    names = []
    for name, rows in tasks.items():
        task = prefix + name
        data = out_dir / f"{task}.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows[:limit]))
        (out_dir / f"{task}.yaml").write_text(template.format(task=task, data=data, source=source.format(name=name),
                                                              **fields))
        names.append(task)
    return names
