"""The record of a run evaluated until decided (`adaptguard evaluate`, driven by `until_decided`), as `compare`
reads it: `sequential.json` beside the run's lm-eval samples holds each task's seeded document order, the documents
done and the looks; `compare` cuts the baseline to those documents and decides with the anytime-valid tests."""

from __future__ import annotations

import json
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np

from .runs import TaskRun

RECORD = "sequential.json"


def load_record(path: str | Path) -> dict | None:
    """The record of an `evaluate` run folder (None for any other run)."""
    p = Path(path)
    return json.loads((p / RECORD).read_text()) if p.is_dir() and (p / RECORD).is_file() else None


def restrict(baseline: dict[str, TaskRun], record: dict) -> dict[str, TaskRun]:
    """The baseline's tasks cut to the documents the sequential run evaluated (those in its samples)."""
    out = {}
    for task, t in record["tasks"].items():
        keep = set(t["order"][: t["done"]])
        out[task] = replace(baseline[task], samples={k: s for k, s in baseline[task].samples.items() if k[1] in keep})
    return out


def sequential_entry(record: dict, task: str, old: TaskRun, new: TaskRun, metric: str) -> dict:
    """The sequential data a decision needs (a compare entry's `sequential`): old and new correctness in the order
    evaluated, and the items done at each look."""
    t = record["tasks"][task]
    order = t["order"][: t["done"]]
    filt = old.filters[0]
    return {"looks": t["looks"], "old": [int(old.samples[filt, d].metrics[metric]) for d in order],
            "new": [int(new.samples[filt, d].metrics[metric]) for d in order], "seed": record["seed"]}


def task_order(doc_ids: list[int], seed: int, task: str) -> list[int]:
    """The task's documents in a seeded random order (the seed and the task's name: stable across runs)."""
    rng = np.random.default_rng([seed, zlib.crc32(task.encode())])
    return [int(d) for d in rng.permutation(sorted(doc_ids))]


