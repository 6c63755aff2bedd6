"""lm-eval glue of the medcalc task: the splits built by adaptguard.data.medcalc at load time (no download), and
MedCalc-Bench's final-answer rule per sample."""

from __future__ import annotations

from adaptguard.data import medcalc


def medcalc_dataset(calculators: list[str] | None = None, n_train: int = 0, n_dev: int = 0, n_test: int = 50,
                    seed: int = 0, **_lm_eval_metadata):
    """{train, dev, test} with `n_*` items per calculator each (disjoint notes); `calculators` (default: all),
    sizes and `seed` come from `--metadata`. lm-eval also passes its other metadata, which is ignored."""
    from datasets import Dataset, DatasetDict

    splits = medcalc.medcalc_splits(calculators or list(medcalc.CALCULATORS), n_train, n_dev, n_test, seed)
    return DatasetDict({name: Dataset.from_list(rows) for name, rows in splits.items()})


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """acc: the final answer is right by MedCalc-Bench's rule; answered: a final answer could be read at all."""
    return {"acc": float(medcalc.is_correct(results[0], doc["answer"], doc["kind"])),
            "answered": float(medcalc.final_answer(results[0]) is not None)}
