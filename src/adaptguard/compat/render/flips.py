"""The flipped documents behind a compatibility report: prompt, gold answer, the old and the new answer.

`compare_task` keeps the joined samples of each task (`TaskComparison.samples`); the prompts and choice texts are not
kept in memory (a 100k-sample log would double in size), so they are read back here, only for the flipped
documents, from the samples files' lines that `Sample.where` names.
"""

from __future__ import annotations

import numpy as np

from ..comparison import TaskComparison
from ..reading.runs import RunError, Sample, choices_of, read_lines


def _answer(sample: Sample, choices: list[str] | None):
    pred = sample.answer
    return choices[pred] if choices is not None and isinstance(pred, int) and pred < len(choices) else pred


def _gold(target, choices: list[str] | None):
    if choices is not None:
        try:
            return choices[int(target)]
        except (TypeError, ValueError, IndexError):
            pass
    return target


def shorten(text, width: int = 120) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _document(o: Sample, n: Sample, kind: str, records: dict) -> dict:
    if o.prompt is not None or not o.where.rpartition(":")[2].isdigit():  # kept in memory (Inspect, lighteval, JSONL)
        return {"doc_id": o.doc_id, "kind": kind, "prompt": o.prompt, "gold": o.target, "old": o.answer,
                "new": n.answer}
    rec = records.get(o.where)
    if rec is None:
        raise RunError(f"doc_id {o.doc_id}: the sample's line ({o.where or 'in memory'}) cannot be read back")
    choices = choices_of(rec)
    return {"doc_id": o.doc_id, "kind": kind, "prompt": rec.get("arguments", {}).get("gen_args_0", {}).get("arg_0"),
            "gold": _gold(o.target, choices), "old": _answer(o, choices),
            "new": _answer(n, choices)}  # the same document in both runs: the same choices


def flipped_documents(entry: TaskComparison, *, negative_only: bool = False, limit: int | None = None) -> list[dict]:
    """The flips of one report entry, negative first: `[{doc_id, kind, prompt, gold, old, new, [delta]}]`.

    A flip is a change of the 0/1 metric, or, for a task scored by similarity only, a change of S (`delta` =
    S(new) − S(old); the largest regressions first). With replicate runs (`entry["items"]`) an item is listed when it
    flipped in at least one (old run, new run) pair, with `pairs` ("broke in k of R·R′ pairs") and `beyond_noise`
    (flagged by `replicates.items_beyond_noise`), those beyond rerun noise first, then by p; its answers are an old
    run's and a new run's that show the flip.
    """
    if "items" in entry and entry.run_samples is not None:
        return _replicated_documents(entry, negative_only, limit)
    old_samples, new_samples = entry.samples
    if entry.correct is not None:
        old_ok, new_ok = entry.correct
        kinds = ["negative" if o and not n else "positive" if n and not o else None for o, n in zip(old_ok, new_ok)]
        order = sorted(range(len(kinds)), key=lambda i: kinds[i] != "negative")
        delta = None
    else:
        delta = entry.delta
        kinds = ["negative" if d < 0 else "positive" if d > 0 else None for d in delta]
        order = sorted(range(len(kinds)), key=lambda i: float(delta[i]))
    picked = [i for i in order if kinds[i] == "negative" or (kinds[i] == "positive" and not negative_only)][:limit]
    records = read_lines({old_samples[i].where for i in picked if old_samples[i].where})
    out = []
    for i in picked:
        item = _document(old_samples[i], new_samples[i], kinds[i], records)
        if delta is not None:
            item["delta"] = float(delta[i])
        out.append(item)
    return out


def _replicated_documents(entry: TaskComparison, negative_only: bool, limit: int | None) -> list[dict]:
    olds, news = (np.asarray(x, dtype=bool) for x in entry.runs)  # (R_o, N), (R_n, N)
    samples_o, samples_n = entry.run_samples
    items = entry["items"]
    broke = np.asarray(items["broke_pairs"])
    fixed = (~olds).sum(0) * news.sum(0)  # pairs where the item went wrong → right
    p, flagged = np.asarray(items["p"]), np.asarray(items["flagged"])
    negative = [i for i in np.argsort(p, kind="stable") if broke[i] > 0]
    negative.sort(key=lambda i: not flagged[i])
    positive = [] if negative_only else [i for i in range(len(p)) if fixed[i] > 0]
    picked = [(int(i), "negative") for i in negative] + [(int(i), "positive") for i in positive]
    picked = picked[:limit]

    def runs_showing(i: int, kind: str) -> tuple[int, int]:  # an old run and a new run where item i flips so
        want_old = kind == "negative"
        return int(np.flatnonzero(olds[:, i] == want_old)[0]), int(np.flatnonzero(news[:, i] != want_old)[0])

    shown = {(i, kind): runs_showing(i, kind) for i, kind in picked}
    records = read_lines({samples_o[a][i].where for (i, _), (a, _) in shown.items() if samples_o[a][i].where})
    out = []
    for i, kind in picked:
        a, b = shown[i, kind]
        item = _document(samples_o[a][i], samples_n[b][i], kind, records)
        item.update(pairs=int(broke[i] if kind == "negative" else fixed[i]), of_pairs=items["pairs"],
                    beyond_noise=bool(flagged[i]) if kind == "negative" else False,
                    p=items["p"][i] if kind == "negative" else None,
                    rerun_flip_rate=items["rerun_flip_rate"][i])
        out.append(item)
    return out
