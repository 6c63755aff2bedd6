"""The selection CLI jobs: `adaptguard select` (embed datasets, select tasks, write the mixture) and
`adaptguard drift risk`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from .coverage import drift_risk, select_tasks


def _sample_texts(data, name: str, text_column: str, max_examples: int | None, seed: int) -> list[str]:
    if text_column not in data.column_names:
        raise ValueError(f"dataset {name!r}: no column {text_column!r} (columns: {', '.join(data.column_names)})")
    if len(data) < 2:
        raise ValueError(f"dataset {name!r}: needs at least 2 rows, has {len(data)}")
    if max_examples is not None and len(data) > max_examples:
        data = data.shuffle(seed=seed).select(range(max_examples))
    texts = data[text_column]
    bad = [i for i, t in enumerate(texts) if not isinstance(t, str) or not t.strip()]
    if bad:
        raise ValueError(f"dataset {name!r}: column {text_column!r} has empty or non-string values "
                         f"(sampled rows {bad[:10]})")
    return texts


def write_mixture(tasks: Mapping[str, object], out: str | Path, *, text_column: str = "text",
                  seed: int = 0) -> dict[str, int]:
    """Concatenate the rows of `tasks` (name → `datasets.Dataset`) into one shuffled mixture for
    multitask SFT and write it atomically: ``.jsonl`` → JSON lines, anything else → `save_to_disk`.

    Keeps the columns every task shares with the same type (always `text_column`) plus a ``task`` column
    naming each row's task (replacing a ``task`` column the inputs may have). Returns rows per task.
    """
    import datasets

    from ..utils.files import write_dataset

    if not tasks:
        raise ValueError("tasks: empty; nothing to write")
    missing = [name for name, data in tasks.items() if text_column not in data.column_names]
    if missing:
        raise ValueError(f"tasks {missing}: no column {text_column!r}")

    def prepare(data):
        data = data.remove_columns(["task"]) if "task" in data.column_names else data
        return data.cast_column(text_column, datasets.Value("string"))

    parts = [prepare(data) for data in tasks.values()]
    first = parts[0]
    shared = [c for c in first.column_names if all(c in d.column_names and d.features[c] == first.features[c]
                                                   for d in parts)]
    mixture = datasets.concatenate_datasets([
        d.select_columns(shared).add_column("task", [name] * len(d)) for name, d in zip(tasks, parts)
    ]).shuffle(seed=seed).flatten_indices()
    write_dataset(mixture, out)
    return {name: len(d) for name, d in zip(tasks, parts)}


def run_select(target: str, candidates: Sequence[str], *, model: str | Path, embedder: str = "mean_pooled",
               p: float = 0.05, method: str = "full", feature: str = "mean", k: int | None = None,
               seed: int = 0, shrinkage: float | None = None, out: str | Path | None = None,
               max_examples: int | None = 256, text_column: str = "text", split: str = "train",
               batch_size: int = 16, device: str = "cpu") -> dict:
    """`adaptguard select`: embed the target and candidate datasets, select tasks, optionally write the mixture.

    Datasets are anything `adaptguard.utils.data.load_any_dataset` reads (Hub names, save_to_disk folders,
    .jsonl/.json/.csv/.parquet files); each is named by the spec given. At most `max_examples` rows of
    each (a seeded sample) are embedded with the registered `embedder` and `model`; the mixture at
    `out` holds *all* rows of the selected tasks (see `write_mixture`). Returns a JSON-friendly report.
    """
    from ..plugins import get_embedder
    from ..utils.data import load_any_dataset

    embed = get_embedder(embedder)
    if out is not None:
        from ..utils.files import check_dataset_output

        check_dataset_output(out, "out")  # refuse to replace a user's directory before any work
    candidates = list(candidates)
    if not candidates:
        raise ValueError("candidates: empty; give at least one candidate dataset")
    if len(set(candidates)) != len(candidates):
        repeated = sorted({c for c in candidates if candidates.count(c) > 1})
        raise ValueError(f"candidates: listed more than once: {repeated}")
    if max_examples is not None and max_examples < 2:
        raise ValueError(f"max_examples must be >= 2 (or None for all rows), got {max_examples}")
    target_texts = _sample_texts(load_any_dataset(target, split), target, text_column, max_examples, seed)
    data = {name: load_any_dataset(name, split) for name in candidates}
    texts = {name: _sample_texts(d, name, text_column, max_examples, seed) for name, d in data.items()}

    embeddings = embed([*target_texts, *(t for ts in texts.values() for t in ts)], model=model,
                       batch_size=batch_size, device=device)
    bounds = np.cumsum([len(target_texts), *(len(ts) for ts in texts.values())])
    target_emb, *candidate_embs = np.split(embeddings, bounds[:-1])
    result = select_tasks(target_emb, dict(zip(candidates, candidate_embs)), p, method=method, feature=feature,
                          k=k, seed=seed, shrinkage=shrinkage)
    report = {"target": target, "model": str(model), "embedder": embedder, "p": p,
              "examples_embedded": {target: len(target_texts), **{n: len(t) for n, t in texts.items()}},
              **result.to_dict(), "out": None}
    if out is not None:
        report["mixture_rows"] = write_mixture({n: data[n] for n in result.selected}, out,
                                               text_column=text_column, seed=seed)
        report["out"] = str(out)
    return report


def run_drift_risk(finetune: str, keep: Sequence[str], *, model: str | Path, embedder: str = "mean_pooled",
                   band: tuple[float, float] = (0.25, 0.55), max_examples: int | None = 256,
                   text_column: str = "text", split: str = "train", seed: int = 0, batch_size: int = 16,
                   device: str = "cpu") -> dict:
    """`adaptguard drift risk`: the similarity of a fine-tuning dataset to each dataset whose ability must be
    kept (see `drift_risk`), flagging the intermediate band Ni et al. warns about.

    Raw LM embeddings share a large common direction, so the centre `c` of `drift_risk` is the average of
    the per-dataset mean embeddings (fine-tuning set and keep sets weighted equally): similarities are
    then relative to this pool of tasks, r = 1/2 meaning "no more alike than a typical pair of them".
    """
    from ..plugins import get_embedder
    from ..utils.data import load_any_dataset

    keep = list(keep)
    if not keep:
        raise ValueError("keep: empty; give at least one dataset whose ability must be kept")
    embed = get_embedder(embedder)
    names = [finetune, *keep]
    texts = [_sample_texts(load_any_dataset(n, split), n, text_column, max_examples, seed) for n in names]
    embeddings = embed([t for ts in texts for t in ts], model=model, batch_size=batch_size, device=device)
    parts = np.split(embeddings, np.cumsum([len(ts) for ts in texts])[:-1])
    center = np.mean([p.mean(axis=0) for p in parts], axis=0)
    rows = drift_risk(parts[0], dict(zip(keep, parts[1:])), band=band, center=center)
    return {"finetune": finetune, "model": str(model), "embedder": embedder, "band": list(band), "keep": rows}
