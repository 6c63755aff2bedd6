"""What `adaptguard compare` found, typed: a `TaskComparison` per task (its `report.json` entry and the per-item data
behind it) and the `Comparison` of two sides, built once by `compare.compare_runs` and rendered by `report`, `gate`
and `flips`."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

from .evidence import OneRun, evidence_of
from .reading.runs import Sample
from .verdicts import Gate


@dataclass
class TaskComparison(Mapping[str, Any]):
    """One task (and filter) compared. `metrics` is its entry in `report.json`, in order: what identifies it (`task`,
    `filter`, `output_type`, `metric`), the flip metrics, and where they apply `compatible` and the Δ-metrics, the
    similarity metrics, `replicates`, `items`, `churn`, `sequential`, `regression`. Which keys a task has depends on
    its kind, so they stay one mapping, read as `entry["nfr"]` (the decisions, `decide`, take any such mapping). The
    other fields are the per-item data behind them, which the JSON leaves out."""

    metrics: dict[str, Any]
    samples: tuple[list[Sample], list[Sample]] | None = None  # the first old and new run's samples, in item order
    correct: tuple[list[float], list[float]] | None = None  # their 0/1 metric per item; None: scored by similarity only
    runs: tuple[list[list[float]], list[list[float]]] | None = None  # every run's 0/1 per item, per side (first: correct)
    run_samples: tuple[list[list[Sample]], list[list[Sample]]] | None = None  # every run's samples, with replicates
    delta: list[float] | None = None  # S(new) − S(old) per item, with --similarity

    def __getitem__(self, key: str) -> Any:
        return self.metrics[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.metrics)

    def __len__(self) -> int:
        return len(self.metrics)

    @cached_property
    def evidence(self) -> OneRun:
        """The kind of evidence behind the entry, as its type (`evidence`): its tests, intervals and reach. Built once,
        when first asked (`compare_runs` asks once the entry's kind is set: its replicates or its sequential record)."""
        return evidence_of(self.metrics)

    @classmethod
    def of(cls, entry: Mapping) -> TaskComparison:
        """`entry` typed: as it is, or a mapping of metrics (a `report.json` entry read back, or built by hand)."""
        return entry if isinstance(entry, TaskComparison) else cls(dict(entry))


@dataclass
class Comparison(Mapping[str, Any]):
    """What `compare_runs` found, built once; every output renders it (`report`, `gate`). `to_json()` is
    `report.json`: these fields in order (`gate` and `negative_flips` where set), each task as its `metrics`. It reads
    as that mapping too (`report["tasks"]["mmlu"]["nfr"]`), for code written against the dict."""

    old: str | list[str] = ""  # the old run, or its replicates
    new: str | list = ""  # the new run; with several candidates a list, each a run or a list of replicates
    runs: dict[str, Any] = field(default_factory=dict)  # {"old": the old side's runs, "new": [each candidate's]}
    compatible: str | None = None  # the --compatible run
    alpha: float = 0.05
    level: float = 0.95  # the intervals' level, 1 − 2α: the one each decision uses (`evidence.interval`)
    include_churn: bool = False
    tasks: dict[str, TaskComparison] = field(default_factory=dict)  # task, `task,filter` or `task [candidate]`
    overall: dict[str, dict] = field(default_factory=dict)  # per candidate: its tasks that are not churn, pooled
    across_tasks: dict[str, dict] = field(default_factory=dict)  # per candidate: Kübler et al.'s verdict
    notes: list[str] = field(default_factory=list)  # what was chosen for the user
    gate: Gate | None = None  # `gate.check_gate`'s decisions, with --fail-on
    negative_flips: dict[str, list[dict]] | None = None  # per task, the flips --show-flips shows

    @classmethod
    def of(cls, report: Mapping) -> Comparison:
        """`report` typed: as it is, or a mapping shaped as `report.json` (read back, or built by hand)."""
        if isinstance(report, Comparison):
            return report
        gate = report.get("gate")
        return cls(**{**report, "tasks": {k: TaskComparison.of(e) for k, e in report.get("tasks", {}).items()},
                      "gate": None if gate is None else Gate.of(gate)})

    def _keys(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name) is not None
                or f.name not in ("gate", "negative_flips")]

    def __getitem__(self, key: str) -> Any:
        if key not in self._keys():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    def to_json(self) -> str:
        """`report.json`: every field, each task's metrics without its per-item data."""
        return json.dumps(json_ready({**self, "tasks": {k: e.metrics for k, e in self.tasks.items()}}), indent=2)


def json_ready(obj):
    """`obj` for JSON: tuples as lists, a float that is not finite as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Mapping):  # a dict, or a typed record that reads as one (`verdicts`)
        return {k: json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
    return obj
