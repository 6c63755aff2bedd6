"""Drift datasets (Ni et al., App. B–C) as `datasets.Dataset`s: the `drift_bsc_*` lm-eval task documents, the
r-similarity corruption of a real dataset (App. C.2) and the nine prompt styles of Table C2 (App. C.1/C.4).
The maths is in `adaptguard.drift.bsc`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from .bsc import (
    _count,
    _similarity_value,
    bits_to_text,
    bsc_samples,
    corrupt_tokens,
    next_bit_docs,
    random_token_strings,
    reference_string,
)

if TYPE_CHECKING:
    import datasets


def next_bit_dataset(seed: int = 0, length: int = 64) -> datasets.DatasetDict:
    """The `drift_bsc_next_bit` documents (split "test") for c0 = reference_string(length, seed)."""
    import datasets

    return datasets.DatasetDict({"test": datasets.Dataset.from_list(
        next_bit_docs(reference_string(length, _count("seed", seed, 0))))})


def bsc_sample_dataset(seed: int = 0, length: int = 64, delta: float = 0.2, n_samples: int = 64
                       ) -> datasets.DatasetDict:
    """The `drift_bsc_samples` documents (split "test"): n_samples BSC_delta samples of c0 as text."""
    import datasets

    rng = np.random.default_rng(_count("seed", seed, 0))
    base = reference_string(length, rng)
    samples = bsc_samples(base, n_samples, delta, rng)
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(
        [{"text": bits_to_text(z), "n_bits": int(z.size)} for z in samples])})


def corrupt_to_similarity(dataset: datasets.Dataset, r: float, tokenizer: Any, n_strings: int = 8,
                          length: int = 2048, seed: int = 0, text_column: str = "text") -> datasets.Dataset:
    """The r-similarity dataset of App. C.2 made from `dataset` (its 1-similarity version).

    Each text is tokenised (no special tokens); `n_strings` strings of `length` tokens are drawn
    uniformly from the distinct tokens occurring in the data; for each sample ONE string is chosen
    at random and Algorithm C1 keeps every token with probability r, else substitutes that string's
    token at the same position. The returned dataset has the decoded result in `text_column` and
    adds `input_ids` (the modified tokens), `n_kept` (tokens kept by the coin) and `string_index`.
    The kept fraction (see `kept_fraction`) is ≈ r; the fraction of tokens EQUAL to the original is
    slightly higher, as a substituted token can coincide with the original one.
    """
    r = _similarity_value(r)
    if text_column not in dataset.column_names:
        raise ValueError(f"text_column: column {text_column!r} not in the dataset (columns: {dataset.column_names})")
    rng = np.random.default_rng(_count("seed", seed, 0))
    originals = tokenizer(list(dataset[text_column]), add_special_tokens=False)["input_ids"]
    strings = random_token_strings(originals, n_strings, length, rng)
    chosen = rng.integers(strings.shape[0], size=len(originals))
    modified, n_kept = [], []
    for ids, s in zip(originals, chosen):
        new, kept = corrupt_tokens(ids, strings[s], r, rng)
        modified.append(new.tolist())
        n_kept.append(int(kept.sum()))
    texts = tokenizer.batch_decode(modified, clean_up_tokenization_spaces=False)
    import datasets

    new = datasets.Dataset.from_dict({text_column: texts, "input_ids": modified, "n_kept": n_kept,
                                      "string_index": chosen.tolist()})
    rest = dataset.remove_columns([c for c in new.column_names if c in dataset.column_names])
    # a table without columns has no rows, so it cannot be concatenated beside the new columns
    return datasets.concatenate_datasets([rest, new], axis=1) if rest.column_names else new


def kept_fraction(dataset: datasets.Dataset) -> float:
    """Share of tokens that Algorithm C1 kept in a `corrupt_to_similarity` result (≈ r)."""
    total = sum(len(ids) for ids in dataset["input_ids"])
    return sum(dataset["n_kept"]) / total if total else float("nan")


# ---------------------------------------------------------------------------------------------
# Prompt styles (App. C.1 Table C2, App. C.4)


class PromptStyle(NamedTuple):
    """A dataset format of Table C2; `{question}` and `{answer}` are filled from the data."""

    index: str  # row of Table C2
    prompt: str
    completion: str


# Table C2 prints each format on one line with typographic quotes; the line breaks and the plain
# ASCII quotes ' and " (what a script writes) are reconstructed, as is the HumanEval-like layout
# of (i) (docstring on the def's next line, 4-space indent). No prompt ends in whitespace: the
# completion starts with the space or line break after the label, so tokens do not merge across
# the prompt/completion boundary. Style (i) keeps the paper's function name from its example.
PROMPT_STYLES: dict[str, PromptStyle] = {
    "question_solution": PromptStyle("a", "Question: {question}\nSolution:", " {answer}"),
    "question_answer": PromptStyle("b", "Question: {question}\nAnswer:", " {answer}"),
    "solution": PromptStyle("c", "{question}\nSolution:", " {answer}"),
    "answer": PromptStyle("d", "{question}\nAnswer:", " {answer}"),
    "question_quoted_solution": PromptStyle("e", "Question: '{question}'\nSolution:", ' "{answer}"'),
    "question_quoted_answer": PromptStyle("f", "Question: '{question}'\nAnswer:", ' "{answer}"'),
    "quoted_solution": PromptStyle("g", "'{question}'\nSolution:", " '{answer}'"),
    "quoted_answer": PromptStyle("h", "'{question}'\nAnswer:", " '{answer}'"),
    "python_function": PromptStyle("i", 'def solve_linear_equation():\n    """ {question} """',
                                   "\n    return ({answer})"),
}


def _format_row(row: dict[str, Any], style: PromptStyle, question_column: str, answer_column: str
                ) -> dict[str, str]:
    fields = {"question": str(row[question_column]), "answer": str(row[answer_column])}
    prompt, completion = style.prompt.format(**fields), style.completion.format(**fields)
    return {"prompt": prompt, "completion": completion, "text": prompt + completion}


def reformat_prompt_style(dataset: datasets.Dataset, style: str, *, question_column: str = "question",
                          answer_column: str = "answer") -> datasets.Dataset:
    """`dataset` in one of the Table C2 prompt styles: adds `prompt`, `completion` and `text` = both."""
    if style not in PROMPT_STYLES:
        raise ValueError(f"style: unknown prompt style {style!r}; valid: {sorted(PROMPT_STYLES)}")
    for arg, column in (("question_column", question_column), ("answer_column", answer_column)):
        if column not in dataset.column_names:
            raise ValueError(f"{arg}: column {column!r} not in the dataset (columns: {dataset.column_names})")
    return dataset.map(_format_row, fn_kwargs={"style": PROMPT_STYLES[style], "question_column": question_column,
                                               "answer_column": answer_column})
