"""lm-evaluation-harness glue for the `compat_*` tasks: datasets, per-sample flips against a reference run
(by the formulas of `metrics`), the aggregations registered with the harness, and the gathered task folder of
`adaptguard lm-eval`.

A reference run is the `--output_path` directory (or a samples file) of an earlier lm-eval run of the
same task (or of the harness's own task of the same dataset, e.g. `piqa` for `compat_piqa`) with
`--log_samples`, named through `--metadata '{"compat_reference": "runs/old"}'`. Samples are joined
on lm-eval's `doc_hash`, so both runs must have scored the same documents.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

from ..reading.runs import RunError, find_sample_files, prediction, read_task_run
from ..stats.metrics import (
    btc_aggregation,
    flip_indicators,
    mean_negative_abs,
    mean_positive,
    similarity_deltas,
)

# task -> {doc_hash: {"answer": the reference run's answer (`runs.answer`)}}
_REFERENCES: dict[str, dict[str, dict]] = {}


def _register() -> None:
    import lm_eval.api.metrics  # noqa: F401  (fills the registries first)
    from lm_eval.api.registry import AGGREGATION_REGISTRY, register_aggregation

    for name, fn in (("compat_btc", btc_aggregation), ("compat_mean_positive", mean_positive),
                     ("compat_mean_negative_abs", mean_negative_abs)):
        if name not in AGGREGATION_REGISTRY:
            register_aggregation(name)(fn)


_register()


# ---------------------------------------------------------------------------------------- datasets
def doc_hash(doc: dict) -> str:
    """lm-eval's `doc_hash` of a document, as written to `--log_samples`."""
    from lm_eval.utils import handle_non_serializable

    text = json.dumps(doc, indent=2, default=handle_non_serializable, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _load_reference(task: str, reference: str, aliases: tuple[str, ...]) -> dict[str, dict]:
    try:
        files = find_sample_files(reference)
    except RunError as err:
        raise RunError(f"{task}: compat_reference {err}") from err
    for name in (task, *aliases):
        if name in files:
            path = files[name]
            break
    else:
        raise RunError(f"{task}: compat_reference {reference} has no samples of {task!r} or {list(aliases)} "
                       f"(it has {sorted(files)}); run the old model on {task} with --log_samples first")
    records: dict[str, dict] = {}
    for (_, doc_id), sample in sorted(read_task_run(name, path).samples.items()):
        if sample.doc_hash is None:
            raise RunError(f"{path}: doc_id {doc_id} has no doc_hash; was it written by lm-eval --log_samples?")
        # several filters per doc: keep the first (compat tasks log one filter)
        records.setdefault(sample.doc_hash, {"answer": sample.answer})
    return records


def load_dataset_for(task: str, hf_path: str, hf_name: str | None, split: str, *, aliases: tuple[str, ...] = (),
                     compat_reference: str | None = None, compat_data_dir: str | None = None, **_unused):
    """`custom_dataset` body: the Hub dataset — or, with `compat_data_dir`, local copies in the same
    format: `<task>.jsonl` as the evaluated split and `<task>.<split>.jsonl` for others (e.g.
    `compat_gsm8k.train.jsonl` for few-shot examples) — and the reference run's samples when
    `compat_reference` is given."""
    import datasets

    if compat_data_dir is not None:
        local = Path(compat_data_dir) / f"{task}.jsonl"
        if not local.exists():
            raise RunError(f"{task}: compat_data_dir {compat_data_dir} has no {task}.jsonl")
        files = {split: str(local)}  # <task>.<split>.jsonl adds other splits (few-shot examples)
        files.update({f.name[len(task) + 1:-len(".jsonl")]: str(f)
                      for f in Path(compat_data_dir).glob(f"{task}.*.jsonl")})
        data = datasets.load_dataset("json", data_files=files)
    else:
        data = datasets.load_dataset(hf_path, hf_name)
    if compat_reference is not None:
        _REFERENCES[task] = _load_reference(task, compat_reference, aliases)
    else:
        _REFERENCES.pop(task, None)
    return data


def reference_for(task: str, doc: dict) -> dict | None:
    refs = _REFERENCES.get(task)
    if refs is None:
        return None
    rec = refs.get(doc_hash(doc))
    if rec is None:
        raise RunError(f"{task}: the compat_reference run has no sample for this document (doc_hash "
                       f"{doc_hash(doc)[:12]}...); the runs must score the same documents (same dataset, no --limit)")
    return rec


# ------------------------------------------------------------------------------- per-sample results
def flip_results(correct: bool, pred, ref_correct: bool, ref_pred, rates: tuple[str, ...] = ()) -> dict:
    """This sample's flips against the reference run, by the formulas of `metrics.flip_indicators`; `btc`
    is the (old right, new right) pair that the `compat_btc` aggregation reduces; `rates`, more rates of the paired
    answers named by their rows (`metric_table`: the item's 0/1)."""
    from ..metric_table import METRICS

    flips = flip_indicators([ref_correct], [correct], [ref_pred], [pred])
    out = {k: float(v[0]) for k, v in flips.items()}
    out.update({k: float(METRICS[k].per_item(np.array([ref_correct]), np.array([correct]))[0]) for k in rates})
    return {**out, "btc": (float(ref_correct), float(correct))}


def multiple_choice_results(task: str, doc: dict, results, gold: int, choices: list[str]) -> dict:
    """acc / acc_norm as lm-eval computes them, plus flips against the reference run."""
    lls = [float(r[0]) for r in results]
    pred = prediction(results)
    pred_norm = int(np.argmax([ll / max(len(c), 1) for ll, c in zip(lls, choices)]))  # lm-eval's acc_norm
    out = {"acc": float(pred == gold), "acc_norm": float(pred_norm == gold)}
    ref = reference_for(task, doc)
    if ref is not None:
        ref_pred = ref["answer"]
        out.update(flip_results(bool(out["acc"]), pred, ref_pred == gold, ref_pred))
    return out


def _text(response) -> str:
    pred = prediction(response)
    return pred if isinstance(pred, str) else ""


def exact_match_results(task: str, doc: dict, results, target: str, *, regexes_to_ignore: list[str] | None = None,
                        ignore_case: bool = False) -> dict:
    """lm-eval's `exact_match` (its own `exact_match_hf_evaluate`, with the task's normalisation), plus flips
    against the reference run."""
    from lm_eval.api.metrics import exact_match_hf_evaluate

    def correct(text: str) -> bool:
        return bool(exact_match_hf_evaluate(predictions=[text], references=[target],
                                            regexes_to_ignore=regexes_to_ignore, ignore_case=ignore_case)["exact_match"])

    pred = _text(results)
    out = {"exact_match": float(correct(pred))}
    ref = reference_for(task, doc)
    if ref is not None:
        ref_pred = _text(ref["answer"])
        out.update(flip_results(bool(out["exact_match"]), pred, correct(ref_pred), ref_pred))
    return out


def similarity_results(task: str, doc: dict, results, references: list[str], similarity: str = "rouge1") -> dict:
    """The similarity score, plus smooth flips `D = S(new) − S(old)` against the reference run (per sample:
    `smooth_pfr`/`smooth_nfr` are the indicators D > 0 / D < 0; `m_g`/`m_r` carry D to their aggregations)."""
    from ...plugins import get_similarity

    score = get_similarity(similarity)
    s_new = float(score([_text(results)], [references])[0])
    out = {similarity: s_new}
    ref = reference_for(task, doc)
    if ref is not None:
        out.update(smooth_results(_text(results), _text(ref["answer"]), references, score))
    return out


def smooth_results(new_text: str, old_text: str, references: list[str], score) -> dict:
    """This sample's smooth flips, `D = S(new) − S(old)` (`metrics.similarity_deltas`): `smooth_pfr`/`smooth_nfr`
    are the indicators D > 0 / D < 0; `m_g`/`m_r` carry D to their aggregations."""
    d = float(similarity_deltas([old_text], [new_text], [references], score)[0])
    return {"smooth_pfr": float(d > 0), "smooth_nfr": float(d < 0), "m_g": d, "m_r": d}


def gathered_include_path(dirs: list[Path], into: Path) -> Path:
    """One directory that holds every task directory of `dirs` (as `<i>-<name>/`), for lm-eval's single
    `--include_path`. Files are symlinked (copied where symlinks are unavailable); directories are real, so
    lm-eval's `**/*.yaml` scan finds them on every Python, and `!function utils.x` resolves next to each YAML."""
    into.mkdir(parents=True, exist_ok=True)
    for i, src in enumerate(dirs):
        src = Path(src).resolve()
        dest = into / f"{i}-{src.name}"
        for path in sorted(src.rglob("*")):
            if "__pycache__" in path.parts:
                continue
            target = dest / path.relative_to(src)
            if path.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                target.symlink_to(path)
            except OSError:
                shutil.copy2(path, target)
    return into


def lm_eval_cli(argv: list[str]) -> int:
    """lm-eval's own command line on `argv` (as `lm_eval ARGS...`); its exit status."""
    import sys

    from lm_eval.__main__ import cli_evaluate

    old_argv, sys.argv = sys.argv, ["lm_eval", *argv]
    try:
        cli_evaluate()
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    finally:
        sys.argv = old_argv
    return 0
