"""Dataset loaders and per-sample results of the compat_* tasks (the logic is in adaptguard.compat.harness.tasks)."""

from lm_eval.tasks.hellaswag.utils import process_docs as hellaswag_docs  # noqa: F401  (lm-eval's own, unchanged)

from adaptguard.compat.harness import tasks as harness
from adaptguard.compat.stats.metrics import btc_aggregation, mean_negative_abs, mean_positive  # noqa: F401


def _gsm8k_exact_match() -> dict:
    """The exact_match settings of lm-eval's own gsm8k task (its gsm8k.yaml `metric_list`), read from the installed
    lm-eval so that compat_gsm8k normalises answers exactly as `gsm8k` does (process_results does not get them)."""
    from pathlib import Path

    import lm_eval.tasks
    import yaml

    config = yaml.safe_load((Path(lm_eval.tasks.__file__).parent / "gsm8k" / "gsm8k.yaml").read_text())
    metric = next(m for m in config["metric_list"] if m["metric"] == "exact_match")
    return {"regexes_to_ignore": metric.get("regexes_to_ignore"), "ignore_case": metric.get("ignore_case", False)}


GSM8K_EXACT_MATCH = _gsm8k_exact_match()


def piqa_dataset(**kwargs):
    return harness.load_dataset_for("compat_piqa", "baber/piqa", None, "validation", aliases=("piqa",), **kwargs)


def piqa_results(doc, results):
    return harness.multiple_choice_results("compat_piqa", doc, results, int(doc["label"]), [doc["sol1"], doc["sol2"]])


def hellaswag_dataset(**kwargs):
    return harness.load_dataset_for("compat_hellaswag", "Rowan/hellaswag", None, "validation",
                                    aliases=("hellaswag",), **kwargs)


def hellaswag_results(doc, results):
    return harness.multiple_choice_results("compat_hellaswag", doc, results, int(doc["gold"]), doc["choices"])


def gsm8k_dataset(**kwargs):
    return harness.load_dataset_for("compat_gsm8k", "openai/gsm8k", "main", "test", aliases=("gsm8k",), **kwargs)


def gsm8k_results(doc, results):
    return harness.exact_match_results("compat_gsm8k", doc, results, doc["answer"], **GSM8K_EXACT_MATCH)


def samsum_dataset(**kwargs):
    return harness.load_dataset_for("compat_samsum", "knkarthick/samsum", None, "test", **kwargs)


def samsum_results(doc, results):
    return harness.similarity_results("compat_samsum", doc, results, [doc["summary"]], "rouge1")
