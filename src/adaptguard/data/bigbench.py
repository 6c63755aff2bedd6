"""BIG-bench multiple-choice and generated-answer tasks as local lm-eval tasks, read from the task data wherever it
already is, and fetched from the package index only when it is nowhere.

BIG-bench (Srivastava et al., 2022; Apache-2.0) ships its task data (`bigbench/benchmark_tasks/<task>/task.json`) in
the PyPI sdist `bigbench==1.0.0` (358 MB) and in its GitHub checkout. Installing the sdist would pull heavy
dependencies, and a package index may stop listing it (one seen on 2026-12-05 lists only 0.0.1), so the data is
looked for, in this order (`task_source`):

1. a path given by the caller (`source=`, the example scripts' `--bigbench`) or by `$ADAPTGUARD_BIGBENCH`: the sdist
   archive, an unpacked sdist or checkout, or its `benchmark_tasks` folder;
2. an installed `bigbench` package that has its `benchmark_tasks` folder;
3. what an earlier run left in the cache: the `task.json` files read before (`$ADAPTGUARD_CACHE/bigbench/`) and the
   sdist (`$ADAPTGUARD_CACHE/downloads/`);
4. the package index: the sdist fetched once into the cache (its sha256 checked against the index's).

When none has it, one line says what to provide. `write_lm_eval_tasks` turns the rows into lm-eval tasks (a JSONL
file and a YAML each, usable with `--include_path`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import sys
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

SDIST = "bigbench-1.0.0.tar.gz"
INDEX = os.environ.get("ADAPTGUARD_PYPI_SIMPLE", "https://pypi.org/simple")
ENV = "ADAPTGUARD_BIGBENCH"  # where a user keeps BIG-bench's data: the sdist, a checkout or its benchmark_tasks
TASKS = "bigbench/benchmark_tasks/"  # the tasks' folder inside the sdist and a checkout

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


class BigBenchUnavailable(RuntimeError):
    """No source of BIG-bench's task data worked; the message says in one line what to provide."""


class TaskFiles:
    """BIG-bench's task files, by their path under `benchmark_tasks/` ("hyperbaton/task.json"), from an sdist archive
    or a folder (an unpacked sdist, a checkout, or `benchmark_tasks` itself)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        if self.path.is_file():
            self.root = None
        else:
            found = [r for r in (self.path / "bigbench" / "benchmark_tasks", self.path / "benchmark_tasks", self.path)
                     if r.is_dir() and any(r.glob("*/task.json"))]
            if not found:
                raise BigBenchUnavailable(f"{self.path}: holds no BIG-bench tasks (no benchmark_tasks/<task>/task.json)")
            self.root = found[0]

    def read(self, names: dict[str, str]) -> dict[str, bytes]:
        """{key: the bytes of its file} for `names` {path under benchmark_tasks/: key}, the ones that exist."""
        if self.root is not None:
            return {key: (self.root / rel).read_bytes() for rel, key in names.items() if (self.root / rel).is_file()}
        found = {}
        with tarfile.open(self.path) as archive:
            for member in archive:
                rel = member.name.split("/", 1)[-1].removeprefix(TASKS) if TASKS in member.name else None
                if rel in names:
                    found[names[rel]] = archive.extractfile(member).read()
        return found

    def folder(self, task: str) -> dict[str, bytes]:
        """{path under benchmark_tasks/: bytes} of every task.json of `task`'s folder, its subtasks' included."""
        if self.root is not None:
            base = self.root / task
            return {str(p.relative_to(self.root)): p.read_bytes() for p in base.rglob("task.json")} if base.is_dir() \
                else {}
        found = {}
        with tarfile.open(self.path) as archive:
            for member in archive:
                rel = member.name.split("/", 1)[-1].removeprefix(TASKS) if TASKS in member.name else ""
                if rel.startswith(f"{task}/") and rel.endswith("/task.json"):
                    found[rel] = archive.extractfile(member).read()
        return found


def _installed_tasks() -> Path | None:
    """The `benchmark_tasks` folder of an installed `bigbench` package (the 0.0.1 placeholder has none), or None."""
    spec = importlib.util.find_spec("bigbench")
    for location in (spec.submodule_search_locations or []) if spec else []:
        if (Path(location) / "benchmark_tasks").is_dir():
            return Path(location) / "benchmark_tasks"
    return None


def task_source(source: str | Path | None = None) -> TaskFiles | None:
    """Where the task data is, before the cache (module docstring, 1–2): `source`, `$ADAPTGUARD_BIGBENCH`, an
    installed package; None when none is given (then the cache and the index are tried)."""
    given = source or os.environ.get(ENV)
    if given:
        if not Path(given).exists():
            raise BigBenchUnavailable(f"{'the BIG-bench path' if source else ENV} {given}: no such file or folder")
        return TaskFiles(Path(given))
    installed = _installed_tasks()
    return TaskFiles(installed) if installed is not None else None


def _download_sdist(downloads: Path) -> Path:
    """The BIG-bench sdist in `downloads`, fetched from the package index once and checked against its sha256."""
    target = downloads / SDIST
    if target.exists():
        return target
    downloads.mkdir(parents=True, exist_ok=True)
    help_ = (f"set {ENV} to a copy of {SDIST}, an unpacked one or a BIG-bench checkout "
             f"(github.com/google/BIG-bench), or put {SDIST} at {target}")
    try:
        page = urllib.request.urlopen(f"{INDEX}/bigbench/", timeout=60).read().decode()
    except (urllib.error.URLError, OSError) as e:
        raise BigBenchUnavailable(f"BIG-bench's task data is not here and the package index {INDEX} cannot be "
                                  f"reached ({getattr(e, 'reason', e)}): {help_}") from e
    match = re.search(rf'href="([^"]*{re.escape(SDIST)})#sha256=([0-9a-f]{{64}})"', page)
    if match is None:
        raise BigBenchUnavailable(f"BIG-bench's task data is not here and {SDIST} is not listed on {INDEX}/bigbench/: "
                                  f"{help_}")
    url, expected = urllib.parse.urljoin(f"{INDEX}/bigbench/", match[1]), match[2]  # an index may link relatively
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


def _cached_sdist() -> TaskFiles:
    """The sdist in the cache, fetched from the index if it is not there (module docstring, 3–4)."""
    from ..models.embedded import cache_root

    return TaskFiles(_download_sdist(cache_root() / "downloads"))


def zero_shot_prompt(task: dict, text: str, choices: list[str]) -> str:
    """BIG-bench's zero-shot multiple-choice prompt (its `json_task` format): the task prefix, the input after
    `example_input_prefix` (default "\\nQ: "), the choices listed when `append_choices_to_input` (default true),
    then `example_output_prefix` (default "\\nA: ") without its trailing space (lm-eval adds one before a choice)."""
    prompt = task.get("task_prefix", "") + task.get("example_input_prefix", "\nQ: ") + text
    if task.get("append_choices_to_input", True):
        prompt += "".join(f"\n  choice: {c}" for c in choices)
    return (prompt + task.get("example_output_prefix", "\nA: ")).rstrip().lstrip("\n")


def load_tasks(names: tuple[str, ...] | list[str], sdist: str | Path | None = None) -> dict[str, list[dict]]:
    """{task: [{"input", "choices", "label"}]} for BIG-bench multiple-choice tasks, from the first source that has
    the data (module docstring; `sdist`: a path to use first, an archive or a folder). Task files read from an
    archive (358 MB to scan) are kept in `$ADAPTGUARD_CACHE/bigbench/<task>.json`; a folder is read in place.
    Choices keep the file's order; examples without exactly one top-scoring choice are dropped."""
    from ..models.embedded import cache_root

    source, cache = task_source(sdist), cache_root() / "bigbench"
    if source is not None and source.root is not None:  # a folder: read in place
        raw_files = source.read({f"{n}/task.json": n for n in names})
    else:  # the cache, then an archive (given, or the cache's sdist), whose files are kept in the cache
        raw_files = {n: (cache / f"{n}.json").read_bytes() for n in names if (cache / f"{n}.json").exists()} \
            if source is None else {}
        missing = [n for n in names if n not in raw_files]
        if missing:
            extracted = (source or _cached_sdist()).read({f"{n}/task.json": n for n in missing})
            cache.mkdir(parents=True, exist_ok=True)
            for name, data in extracted.items():
                tmp = cache / f".{name}.json.tmp"
                tmp.write_bytes(data)
                os.replace(tmp, cache / f"{name}.json")
            raw_files.update(extracted)
    still = [n for n in names if n not in raw_files]
    if still:
        raise ValueError(f"BIG-bench has no task.json for {still} (subtask folders are not read)")
    tasks = {}
    for name in names:
        raw = json.loads(raw_files[name])
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


def load_generative_task(name: str, sdist: str | Path | None = None) -> list[dict]:
    """[{"input", "target", "subtask"}] of a BIG-bench task with generated answers: the examples of its `task.json`
    and of every subtask folder's (in path order) that have one target string, the input in BIG-bench's zero-shot
    format (as `zero_shot_prompt`, without choices). From the first source that has the data (module docstring);
    rows read from an archive are kept as `$ADAPTGUARD_CACHE/bigbench/<task>.generative.json`."""
    from ..models.embedded import cache_root

    cache = cache_root() / "bigbench" / f"{name}.generative.json"
    source = task_source(sdist)
    if source is None and cache.exists():
        return json.loads(cache.read_text())
    source = source or _cached_sdist()
    files = source.folder(name)
    rows = []
    for rel in sorted(files):
        raw = json.loads(files[rel])
        subtask = rel[len(name):].removesuffix("task.json").strip("/")
        for ex in raw.get("examples", []):
            target = ex.get("target")
            target = target[0] if isinstance(target, list) and len(target) == 1 else target
            if isinstance(target, str) and target.strip():
                rows.append({"input": zero_shot_prompt({**raw, "append_choices_to_input": False}, ex["input"], []),
                             "target": target.strip(), "subtask": subtask or name})
    if not rows:
        raise ValueError(f"BIG-bench task {name!r} has no examples with one target string (or no such task)")
    if source.root is None:  # read from an archive: kept
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f".{cache.name}.tmp")
        tmp.write_text(json.dumps(rows))
        os.replace(tmp, cache)
    return rows


def write_lm_eval_tasks(tasks: dict[str, list[dict]], out_dir: Path, limit: int | None = None, prefix: str = "bb_",
                        source: str = "BIG-bench {name} (Apache-2.0), from the PyPI sdist bigbench==1.0.0",
                        template: str = YAML, **fields) -> list[str]:
    """Write multiple-choice lm-eval tasks `<prefix><task>` (JSONL of {"input", "choices", "label"} + YAML) into
    `out_dir`; the first `limit` examples of each. Returns the task names. `template` and `fields`: another YAML
    (e.g. a generated-answer task of `load_generative_task`'s rows) and what it needs besides the task, data file
    and source."""
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
