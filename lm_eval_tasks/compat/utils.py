"""Dataset loaders and per-sample results of the compat_* tasks (the logic is in adaptguard.harness)."""

from adaptguard import harness
from adaptguard.harness import btc_aggregation, mean_negative_abs, mean_positive  # noqa: F401


def piqa_dataset(**kwargs):
    return harness.load_dataset_for("compat_piqa", "baber/piqa", None, "validation", aliases=("piqa",), **kwargs)


def piqa_results(doc, results):
    return harness.multiple_choice_results("compat_piqa", doc, results, int(doc["label"]), [doc["sol1"], doc["sol2"]])


def hellaswag_dataset(**kwargs):
    return harness.load_dataset_for("compat_hellaswag", "Rowan/hellaswag", None, "validation",
                                    aliases=("hellaswag",), **kwargs)


def _hellaswag_text(text):
    import re

    text = text.strip().replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")


def hellaswag_docs(dataset):
    """lm-eval's hellaswag preprocessing, unchanged, so its `hellaswag` runs can serve as reference."""
    def process(doc):
        ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
        return {"query": _hellaswag_text(doc["activity_label"] + ": " + ctx),
                "choices": [_hellaswag_text(e) for e in doc["endings"]], "gold": int(doc["label"])}

    return dataset.map(process)


def hellaswag_results(doc, results):
    return harness.multiple_choice_results("compat_hellaswag", doc, results, int(doc["gold"]), doc["choices"])


def gsm8k_dataset(**kwargs):
    return harness.load_dataset_for("compat_gsm8k", "openai/gsm8k", "main", "test", aliases=("gsm8k",), **kwargs)


def gsm8k_results(doc, results):
    return harness.exact_match_results("compat_gsm8k", doc, results, doc["answer"])


def samsum_dataset(**kwargs):
    return harness.load_dataset_for("compat_samsum", "knkarthick/samsum", None, "test", **kwargs)


def samsum_results(doc, results):
    return harness.similarity_results("compat_samsum", doc, results, [doc["summary"]], "rouge1")
