"""Validation shared by the configs and the CLI."""

from __future__ import annotations

import math


def check_finite(obj, names: tuple[str, ...] | list[str]) -> None:
    """Refuse NaN and ±inf in the numeric fields `names` of a config (None is left to the field's own check):
    a NaN compares false with everything, so `l2_lambda=nan` would silently act as "off"."""
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value}")


def _text(value) -> str:
    """The text of a completion: a string, or the contents of a list of chat messages."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(m.get("content") or "" if isinstance(m, dict) else str(m) for m in value)
    return "" if value is None else str(value)


def check_completions(dataset, name: str = "train_dataset") -> None:
    """Refuse a dataset in which every completion is empty (prompt/completion rows, or chat `messages` whose
    assistant turns are all empty): training would fit only the end-of-sequence token and report accuracy 0.
    Datasets that are not map-style (a streaming `IterableDataset` has no length: reading it here would consume
    it) or have neither column are left alone."""
    columns = getattr(dataset, "column_names", None)
    if not columns or not hasattr(dataset, "__len__") or len(dataset) == 0:
        return
    if "completion" in columns:
        if not any(_text(c).strip() for c in dataset["completion"]):
            raise ValueError(f"{name}: every row's 'completion' is empty ({len(dataset)} rows): nothing to learn; "
                             "check the dataset's completion column")
    elif "messages" in columns:
        turns = [m for messages in dataset["messages"] for m in messages or [] if m.get("role") == "assistant"]
        if turns and not any(_text(m.get("content")).strip() for m in turns):
            raise ValueError(f"{name}: every assistant turn of 'messages' is empty ({len(dataset)} rows): nothing "
                             "to learn")


def check_tokenizer_fits(tokenizer, model, name: str = "processing_class") -> None:
    """Refuse a tokenizer with more tokens than `model` has embedding rows: a wrong tokenizer (another model's)
    would otherwise fail deep inside the first forward with an index error. A processor's tokenizer is checked."""
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(embeddings, "num_embeddings", None)
    if tokenizer is None or rows is None:
        return
    if len(tokenizer) > rows:
        model_name = getattr(getattr(model, "config", None), "_name_or_path", "") or type(model).__name__
        raise ValueError(f"{name}: the tokenizer has {len(tokenizer)} tokens but the model ({model_name}) has "
                         f"{rows} embedding rows: pass the model's own tokenizer (or, after adding tokens, call "
                         "model.resize_token_embeddings(len(tokenizer)))")
