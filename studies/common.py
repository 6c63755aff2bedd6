"""What the pre-registered studies share: their rows and splits, per-item scoring by lm-eval, the registered
verdict rule (the trade-off figure is the demo's: `adaptguard.demo.tradeoff`). Each study imports this module; a
study that extends another (E3 reuses E1's updates, E4 E2's design) imports that one, never others."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np


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
