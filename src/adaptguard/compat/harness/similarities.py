"""Built-in similarity functions S for generative flips (`D(x) = S(new) − S(old)`, Echterhoff et al. §3.2): each takes
N predictions and N lists of references and returns N floats, the best over an item's references."""

from __future__ import annotations


def _rouge(kind: str):
    def similarity(predictions: list[str], references: list[list[str]]) -> list[float]:
        from rouge_score import rouge_scorer  # the [eval] extra

        scorer = rouge_scorer.RougeScorer([kind], use_stemmer=True)
        return [scorer.score_multi(refs, pred)[kind].fmeasure for pred, refs in zip(predictions, references)]

    similarity.__name__ = kind
    return similarity


def bleu_similarity(predictions: list[str], references: list[list[str]]) -> list[float]:
    """Sentence BLEU (sacrebleu), scaled to [0, 1]."""
    from sacrebleu.metrics import BLEU  # the [eval] extra

    bleu = BLEU(effective_order=True)
    return [bleu.sentence_score(pred, refs).score / 100.0 for pred, refs in zip(predictions, references)]


def exact_match_similarity(predictions: list[str], references: list[list[str]]) -> list[float]:
    """1.0 when the prediction equals one of the references after stripping surrounding whitespace."""
    return [float(pred.strip() in {r.strip() for r in refs}) for pred, refs in zip(predictions, references)]


SIMILARITIES = {"rouge1": _rouge("rouge1"), "rouge2": _rouge("rouge2"), "rougeL": _rouge("rougeL"),
                "bleu": bleu_similarity, "exact_match": exact_match_similarity}
