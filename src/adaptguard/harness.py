"""lm-evaluation-harness glue for the `compat_*` tasks: datasets, per-sample flip metrics against a
reference run, and aggregations registered with the harness.

A reference run is the `--output_path` directory (or a samples file) of an earlier lm-eval run of the
same task (or of the harness's own task of the same dataset, e.g. `piqa` for `compat_piqa`) with
`--log_samples`, named through `--metadata '{"compat_reference": "runs/old"}'`. Samples are joined
on lm-eval's `doc_hash`, so both runs must have scored the same documents.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from .runs import RunError, find_sample_files, read_task_run

# task -> {doc_hash: reference sample record (filtered_resps + metrics)}
_REFERENCES: dict[str, dict[str, dict]] = {}


# ------------------------------------------------------------------------------------ aggregations
def btc_aggregation(items: list[tuple[float, float]]) -> float:
    """BTC = #{old right ∧ new right} / #{old right} from per-sample (old_right, new_right) pairs."""
    old_right = [n for o, n in items if o]
    return sum(old_right) / len(old_right) if old_right else float("nan")


def mean_positive(items: list[float]) -> float:
    """m_g: mean D over the samples with D > 0 (NaN when there is none)."""
    pos = [d for d in items if d > 0]
    return sum(pos) / len(pos) if pos else float("nan")


def mean_negative_abs(items: list[float]) -> float:
    """m_r: mean |D| over the samples with D < 0 (NaN when there is none)."""
    neg = [-d for d in items if d < 0]
    return sum(neg) / len(neg) if neg else float("nan")


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
        records.setdefault(sample.doc_hash, {"filtered_resps": sample.response})
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
def _argmax(values: list[float]) -> int:
    return values.index(max(values))


def flip_results(correct: bool, pred, ref_correct: bool, ref_pred) -> dict:
    return {"nfr": float(ref_correct and not correct), "pfr": float(not ref_correct and correct),
            "nfr_mc": float(not correct and pred != ref_pred), "btc": (float(ref_correct), float(correct))}


def multiple_choice_results(task: str, doc: dict, results, gold: int, choices: list[str]) -> dict:
    """acc / acc_norm as lm-eval computes them, plus flips against the reference run."""
    lls = [float(r[0]) for r in results]
    pred = _argmax(lls)
    pred_norm = _argmax([ll / max(len(c), 1) for ll, c in zip(lls, choices)])
    out = {"acc": float(pred == gold), "acc_norm": float(pred_norm == gold)}
    ref = reference_for(task, doc)
    if ref is not None:
        ref_lls = [float(r[0]) for r in ref["filtered_resps"]]
        ref_pred = _argmax(ref_lls)
        out.update(flip_results(bool(out["acc"]), pred, ref_pred == gold, ref_pred))
    return out


GSM8K_IGNORE = [",", r"\$", r"(?s).*#### ", r"\.$"]


def gsm8k_normalise(text: str) -> str:
    """lm-eval's gsm8k exact_match normalisation (ignore_case, the task's regexes_to_ignore)."""
    for pattern in GSM8K_IGNORE:
        text = re.sub(pattern, "", text)
    return text.strip().lower()


def _first_text(resp) -> str:
    while isinstance(resp, list):
        resp = resp[0] if resp else ""
    return str(resp)


def exact_match_results(task: str, doc: dict, results, target: str) -> dict:
    pred = gsm8k_normalise(_first_text(results))
    gold = gsm8k_normalise(target)
    out = {"exact_match": float(pred == gold)}
    ref = reference_for(task, doc)
    if ref is not None:
        ref_pred = gsm8k_normalise(_first_text(ref["filtered_resps"]))
        out.update(flip_results(bool(out["exact_match"]), pred, ref_pred == gold, ref_pred))
    return out


def similarity_results(task: str, doc: dict, results, references: list[str], similarity: str = "rouge1") -> dict:
    """The similarity score, plus smooth flips `D = S(new) − S(old)` against the reference run."""
    from .plugins import get_similarity

    score = get_similarity(similarity)
    text = _first_text(results)
    s_new = float(score([text], [references])[0])
    out = {similarity: s_new}
    ref = reference_for(task, doc)
    if ref is not None:
        s_old = float(score([_first_text(ref["filtered_resps"])], [references])[0])
        d = s_new - s_old
        out.update({"smooth_pfr": float(d > 0), "smooth_nfr": float(d < 0), "m_g": d, "m_r": d})
    return out


def task_dirs() -> list[Path]:
    """Every lm-eval task directory contributed through the `adaptguard_lm_eval_task_dirs` hook."""
    from .plugins import lm_eval_task_dirs

    return lm_eval_task_dirs()

