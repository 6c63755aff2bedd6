"""Task similarity and performance drift (Ni et al.): the bit-string model and Algorithm C1 (`bsc`), Theorem A2
(`theory`), both pure numpy/scipy; datasets built from them (`data`) and the Theorem A2 figure (`plots`)."""

from .bsc import (
    BIT_SEPARATOR,
    DriftTrainingData,
    bits_to_text,
    bsc,
    bsc_samples,
    corrupt_tokens,
    drift_training_texts,
    flip_count,
    next_bit_docs,
    next_bit_scores,
    random_token_strings,
    reference_string,
    sample_similarity,
    similar_reference,
    similarity,
    text_to_bits,
)
from .theory import TheoremA2Sums, theorem_a2_argmax, theorem_a2_curve, theorem_a2_sums

__all__ = ["BIT_SEPARATOR", "DriftTrainingData", "TheoremA2Sums", "bits_to_text", "bsc", "bsc_samples",
           "corrupt_tokens", "drift_training_texts", "flip_count", "next_bit_docs", "next_bit_scores",
           "random_token_strings", "reference_string", "sample_similarity", "similar_reference", "similarity",
           "text_to_bits", "theorem_a2_argmax", "theorem_a2_curve", "theorem_a2_sums"]
