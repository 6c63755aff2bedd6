"""The record of a run evaluated until decided (`adaptguard evaluate`, driven by `until_decided`), as `compare`
reads it: `sequential.json` beside the run's lm-eval samples holds each task's design, its seeded document order,
the documents done, the looks and the documents not evaluated (and why); `compare` cuts the baseline to those
documents and decides with the design's tests: the group-sequential tests over the known pool (`group_sequential`,
the default) or the anytime-valid e-processes (`--design anytime`)."""

from __future__ import annotations

import json
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..metric_table import METRICS, Unit
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
    out = {"looks": t["looks"], "old": [int(old.samples[filt, d].metrics[metric]) for d in order],
           "new": [int(new.samples[filt, d].metrics[metric]) for d in order], "seed": record["seed"]}
    if t.get("design") == "group":
        out.update(design="group", items=t["items"], strata=t["strata"])
    elif (record.get("settings") or {}).get("bet"):
        out["bet"] = record["settings"]["bet"]  # the anytime design's acc_drop bet (aGRAPA since issue 87)
    return out


# why an item is not evaluated, per stratum (old right: R, old wrong: W)
NOT_NEEDED = {"R": "the old model got it right: it cannot flip wrong → right (pfr counts only items the old model "
                   "got wrong)",
              "W": "the old model got it wrong: it cannot flip right → wrong (nfr and btc count only items the old "
                   "model got right)"}


def needed_strata(metrics: list[str]) -> str:
    """The strata ("R", "W", "RW" or "") the thresholds' metrics need (their rows' `can_flip`, `metric_table`)."""
    need = set("".join(METRICS[m].can_flip for m in metrics))
    return "".join(s for s in "RW" if s in need)


def group_plan(old_right: dict[int, bool], metrics: list[str], seed: int, task: str) -> dict:
    """A task's group-sequential plan: the documents of the strata the metrics need, each stratum in its seeded
    random order (`task_order`), two strata merged proportionally; the pool's sizes; the documents left out and
    why. `old_right`: {doc id: whether the old model got it right}."""
    from ..stats.group_sequential import proportional_order

    docs = {"R": [d for d, r in old_right.items() if r], "W": [d for d, r in old_right.items() if not r]}
    need = needed_strata(metrics)
    if not any(docs[s] for s in need):  # nothing can change them (old_acc; pfr with no old-wrong item): the fixed-n
        need = "RW"  # decision is known, but compare needs an evaluated chunk to read: the items at random, as before
    orders = {s: task_order(docs[s], seed, f"{task}/{s}") for s in need}
    order = proportional_order(orders["R"], orders["W"]) if need == "RW" else orders[need]
    left = {s: sorted(docs[s]) for s in "RW" if s not in need and docs[s]}
    why = NOT_NEEDED
    return {"design": "group", "order": order, "items": len(old_right),
            "strata": {"R": len(docs["R"]), "W": len(docs["W"])},
            "not_evaluated": [{"why": why[s], "docs": d} for s, d in left.items()]}


def task_order(doc_ids: list[int], seed: int, task: str) -> list[int]:
    """The task's documents in a seeded random order (the seed and the task's name: stable across runs)."""
    rng = np.random.default_rng([seed, zlib.crc32(task.encode())])
    return [int(d) for d in rng.permutation(sorted(doc_ids))]




def group_view(seq: dict) -> dict:
    """A group-sequential task's values over all N items as far as they are known (`compare` puts them in the
    entry): the old accuracy from the baseline, each flip rate from its stratum's items so far scaled to the
    stratum's known size (exact once it is done), and None for what was not measured — no new-model accuracy
    without both strata, no NFR without the old-right items, no PFR without the old-wrong ones."""
    if seq.get("design") != "group":
        return {}
    from ..stats.group_sequential import group_estimate

    entry = {"sequential": seq}
    big_n, m_r = seq["items"], seq["strata"]["R"]
    # every rate of the paired answers the new model's answers change (`metric_table`)
    est = {m.name: group_estimate(entry, m.name) for m in METRICS.values()
           if m.per_item is not None and m.unit is Unit.RATE and m.can_flip}
    # the statistics of the items evaluated as if they were all (McNemar, inconsistency, the replicate summary
    # behind the MDE) describe an unrepresentative subset: none
    return {"n": big_n, "old_acc": m_r / big_n, **est, "nfr_ci": None, "pfr_ci": None, "mcnemar_p": None,
            "inconsistency_flips": None, "replicates": None,
            "n_negative_flips": None if est["nfr"] is None else round(est["nfr"] * big_n, 6),
            "n_positive_flips": None if est["pfr"] is None else round(est["pfr"] * big_n, 6)}
