"""What the pre-registered studies share: their rows and splits, per-item scoring by lm-eval, the registered
verdict rule (the trade-off figure is the demo's: `adaptguard.demo.tradeoff`); and what the studies write: their
reports (`write_report`), the records a session commits (`export_records`), BIG-bench's generated-answer tasks for
lm-eval (`write_lm_eval_generative_tasks`). Each study imports this module; a study that extends another (E3 reuses
E1's updates, E4 E2's design) imports that one, never others."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np

from adaptguard.utils.files import atomic_write_text


def store_model_name(name: str) -> str:
    """The model's name in the store keys. SmolLM2 was `embedded:smollm2` when E1–E5 stored their runs (it is
    `built:smollm2` now): the keys keep that name, so those runs resume and their records recompute unchanged."""
    return "embedded:smollm2" if name == "built:smollm2" else name


def task_rows(spec: str, name: str = "task") -> list[dict]:
    """{input, choices, label} rows of `spec`: `bigbench:<task>` (or a bare BIG-bench task name), or a JSONL file."""
    path = Path(spec)
    if spec.endswith(".jsonl") or path.is_file():
        if not path.is_file():
            raise ValueError(f"{name}: no such file {spec!r}")
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    from adaptguard.data.bigbench import load_tasks

    task = spec.removeprefix("bigbench:")
    return load_tasks([task])[task]


def seeded_order(rows: list[dict], seed: int) -> list[dict]:
    """`rows` in the order of `random.Random(seed).shuffle` over their indices (the registered splits)."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    return [rows[i] for i in order]


def training_rows(rows: list[dict]) -> list[dict]:
    """Prompt → the right choice (as lm-eval scores it: the choice after a space), loss on the completion."""
    return [{"prompt": r["input"], "completion": " " + r["choices"][r["label"]]} for r in rows]


def score_tasks(model, tokenizer, tasks: dict[str, list[dict]], work: Path, batch_size: int) -> dict[str, list[bool]]:
    """{task: per-item correctness} of `model` on each task's rows by lm-eval (log-likelihood of each choice), in
    row order; one lm-eval run for all of them."""
    from adaptguard.compat.harness.callback import evaluate_with_lm_eval, task_runs_from_output
    from adaptguard.data.bigbench import write_lm_eval_tasks

    names = write_lm_eval_tasks(tasks, work, prefix="split_", source="adaptguard experiment split of {name}")
    runs = task_runs_from_output(evaluate_with_lm_eval(model, tokenizer, names, batch_size=batch_size,
                                                       include_path=[work]))
    out = {}
    for key, name in zip(tasks, names):
        by_id = {s.doc_id: bool(s.metrics["acc"]) for s in runs[name].samples.values()}  # one filter ("none")
        out[key] = [by_id[i] for i in range(len(tasks[key]))]
    return out


def score(model, tokenizer, rows: list[dict], work: Path, batch_size: int) -> list[bool]:
    """Per-item correctness of `model` on `rows` by lm-eval (log-likelihood of each choice), in row order."""
    return score_tasks(model, tokenizer, {"rows": rows}, work, batch_size)["rows"]


def nfr(old: list[bool], new: list[bool]) -> float:
    return float(np.mean([o and not n for o, n in zip(old, new)]))


def verdict(lo: float, hi: float, half_width: float = 0.05) -> str:
    """The registered decision rule on the CI of Δ = NFR(arm) − NFR(control)."""
    if hi < 0:
        return "reproduced"
    if lo > 0:
        return "contradicted"
    return "not reproduced" if (hi - lo) / 2 <= half_width else "inconclusive"


def write_report(out, report: dict, markdown: str) -> None:
    """An experiment's `report.json` and `report.md` in `out`, each written whole or not at all; the Markdown is
    also printed."""
    Path(out).mkdir(parents=True, exist_ok=True)
    atomic_write_text(Path(out) / "report.json", json.dumps(report, indent=2, default=float))
    atomic_write_text(Path(out) / "report.md", markdown)
    print(markdown)


RECORD_NAMES = frozenset({"scores.json", "predictions.json", "seconds.json", "epochs.json", "regime.json",
                          "dev_choices.json", "budget.json", "report.json", "report.md"})


def export_records(out: Path, to: Path, names: frozenset[str] = RECORD_NAMES) -> int:
    """Copy the small records of an experiment's `out` — files named in `names` (per-item scores, choices, timings;
    never weights) and the `done.json` of each step that a copy back into `out` finds finished (a score step, under
    a `scores` folder, or a step made of records only), so that it resumes without redoing them — to `to`, keeping
    relative paths. Unfinished (`.partial`) steps are skipped. Returns the number of files copied."""

    def whole(step: Path) -> bool:
        return all(p.name in names or p.name == "done.json" for p in step.rglob("*") if p.is_file())

    n = 0
    for path in sorted(out.rglob("*")):
        rel = path.relative_to(out)
        record = path.name in names or (path.name == "done.json" and ("scores" in rel.parts or whole(path.parent)))
        if path.is_file() and record and ".partial" not in str(rel):
            target = to / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
            n += 1
    return n


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
    """Write generated-answer lm-eval tasks `<prefix><task>` (JSONL of `adaptguard.data.bigbench.load_generative_task`'s
    rows + YAML) into `out_dir`: greedy, up to `max_new_tokens`, stopped at a newline, scored by exact match with
    leading and trailing whitespace ignored; the first `limit` examples of each. Returns the task names."""
    from adaptguard.data.bigbench import write_lm_eval_tasks

    return write_lm_eval_tasks(tasks, out_dir, limit, prefix, template=GENERATIVE_YAML, max_new_tokens=max_new_tokens)
