"""Task similarity and performance drift, the data maths (Ni et al., App. A–C); numpy and scipy only.

- Bit-string subpopulations (App. A, Def. 1, Assumption 1, Def. 4): reference strings, binary
  symmetric channel samples, references of a given similarity, and the two similarity measures
  (A6 between references, A7 between a sample and a reference).
- Text for language models: bit strings as "0 1 1 0" (one token per bit for GPT-2-style BPE), the
  training texts of the synthetic drift experiment (App. B) and the next-bit evaluation documents
  used by the `drift_bsc_*` lm-eval tasks.
- Real data: the token-level r-similarity corruption (App. C.2, Algorithm C1); the datasets built from
  it and the prompt styles of Table C2 are in `adaptguard.drift.data`.

All randomness comes from a seed or a `numpy.random.Generator` passed in: same seed, same data.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral, Real
from typing import Any, NamedTuple

import numpy as np
from scipy.special import logsumexp

BIT_SEPARATOR = " "

# ---------------------------------------------------------------------------------------------
# Argument checks


def _rng(rng: np.random.Generator | int) -> np.random.Generator:
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, Integral) and not isinstance(rng, bool):
        return np.random.default_rng(int(rng))
    raise ValueError(f"rng: expected an int seed or a numpy.random.Generator, got {type(rng).__name__}")


def _count(name: str, value: Any, minimum: int) -> int:
    if not isinstance(value, Integral) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return int(value)


def _similarity_value(r: Any) -> float:
    if not isinstance(r, Real) or not 0.0 <= r <= 1.0:
        raise ValueError(f"r: a similarity is a fraction in [0, 1], got {r!r}")
    return float(r)


def _delta(delta: Any) -> float:
    if not isinstance(delta, Real) or not 0.0 <= delta < 0.5:
        raise ValueError(
            f"delta: the flip probability must lie in [0, 1/2), got {delta!r}; at delta = 1/2 a sample is "
            "independent of its reference string, and above 1/2 it identifies the complement string instead, "
            "so the channel no longer identifies the reference (Ni et al., Assumption 1: delta < 1/2)")
    return float(delta)


def _bits(name: str, bits: Any) -> np.ndarray:
    arr = np.asarray(bits)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name}: expected a non-empty 1-D array of bits, got shape {arr.shape}")
    if not np.isin(arr, (0, 1)).all():
        raise ValueError(f"{name}: bits must be 0 or 1, got values {np.unique(arr)[:10].tolist()}")
    return arr.astype(np.uint8)


# ---------------------------------------------------------------------------------------------
# Subpopulations of bit strings (App. A)


def reference_string(length: int, rng: np.random.Generator | int) -> np.ndarray:
    """A reference string c ~ U({0,1}^length) (Assumption 1). Returns uint8 array, shape (length,).

    With an int seed this is `np.random.default_rng(seed).integers(0, 2, length, dtype=np.uint8)`, which is how
    `drift_training_texts` and the `drift_bsc_*` lm-eval tasks obtain the same base string c0.
    """
    return _rng(rng).integers(0, 2, size=_count("length", length, 1), dtype=np.uint8)


def bsc(bits: Sequence[int] | np.ndarray, delta: float, rng: np.random.Generator | int) -> np.ndarray:
    """BSC_delta(bits) (Def. 1): each bit flipped independently with probability delta.

    bits: shape (l,) of 0/1. Returns uint8, shape (l,).
    """
    arr = _bits("bits", bits)
    return arr ^ (_rng(rng).random(arr.size) < _delta(delta))


def bsc_samples(reference: Sequence[int] | np.ndarray, n: int, delta: float, rng: np.random.Generator | int,
                *, min_length: int = 1) -> list[np.ndarray]:
    """n samples of the subpopulation of `reference` (Assumption 1, App. B): z = BSC_delta(c[1:l]).

    The length l is uniform on {min_length, ..., L} with L = len(reference) (App. B; Assumption 1's
    "l ~ U([n])" means the string length). Each bit is flipped independently with probability delta.
    reference: shape (L,) of 0/1. Returns n uint8 arrays of shapes (l_i,).
    """
    ref = _bits("reference", reference)
    n, delta = _count("n", n, 0), _delta(delta)
    min_length = _count("min_length", min_length, 1)
    if min_length > ref.size:
        raise ValueError(f"min_length: must be <= len(reference) = {ref.size}, got {min_length}")
    rng = _rng(rng)
    lengths = rng.integers(min_length, ref.size + 1, size=n)
    noisy = ref ^ (rng.random((n, ref.size)) < delta)
    return [noisy[i, :l] for i, l in enumerate(lengths)]


def flip_count(r: float, length: int) -> int:
    """Bits to flip for similarity r (Def. 4): round((1 − r)·length), halves rounded up."""
    return math.floor((1.0 - _similarity_value(r)) * _count("length", length, 1) + 0.5)


def similar_reference(reference: Sequence[int] | np.ndarray, r: float, rng: np.random.Generator | int
                      ) -> np.ndarray:
    """A reference string of similarity r to `reference`: flip a random set of round((1−r)·L) positions.

    This follows Def. 4 (A6: similarity = fraction of EQUAL bits), so the result has similarity
    1 − round((1−r)L)/L, the value nearest r that L bits allow. App. B's text says "flip ⌈rL⌉ bits",
    which would give similarity 1 − r instead and contradicts Def. 4; we follow Def. 4.
    reference: shape (L,) of 0/1. Returns uint8, shape (L,).
    """
    ref = _bits("reference", reference)
    positions = _rng(rng).choice(ref.size, size=flip_count(r, ref.size), replace=False)
    out = ref.copy()
    out[positions] ^= 1
    return out


def similarity(a: Sequence[int] | np.ndarray, b: Sequence[int] | np.ndarray) -> float:
    """r(i, j) of two reference strings (Def. 4, A6): the fraction of positions with equal bits.

    a, b: shapes (L,) and (L,).
    """
    a, b = _bits("a", a), _bits("b", b)
    if a.size != b.size:
        raise ValueError(f"b: reference strings must have equal lengths, got {a.size} and {b.size}")
    return float(np.mean(a == b))


def sample_similarity(sample: Sequence[int] | np.ndarray, reference: Sequence[int] | np.ndarray) -> float:
    """r_j(z) of a sample to a reference (A7): (1/len z) Σ_{k ≤ len z} 1(z(k) = c_j(k)).

    The sample is compared with the reference's prefix of the same length; its expectation over
    z ~ M_i (and random flip positions) is (1 − 2δ)·r(i, j) + δ. sample: shape (l,), reference: (L,), l ≤ L.
    """
    z, c = _bits("sample", sample), _bits("reference", reference)
    if z.size > c.size:
        raise ValueError(f"sample: longer ({z.size} bits) than the reference ({c.size} bits)")
    return float(np.mean(z == c[: z.size]))


# ---------------------------------------------------------------------------------------------
# Text for language models (App. B)


def bits_to_text(bits: Sequence[int] | np.ndarray) -> str:
    """Bits as space-separated digits, e.g. [0, 1, 1, 0] -> "0 1 1 0".

    Spaces make a GPT-2-style byte-level BPE tokenise one token per bit ("0", "Ġ1", "Ġ1", "Ġ0"):
    checked with GPT-2's vocabulary, 64 random bits give 64 tokens spaced but 21 unspaced, because
    its merges join digit runs ("111", "000000"). Tokenisers that split digits (Llama, SmolLM2)
    give one token per bit either way, plus possibly a space token.
    """
    arr = _bits("bits", bits)
    return BIT_SEPARATOR.join("01"[b] for b in arr)


def text_to_bits(text: str) -> np.ndarray:
    """Inverse of `bits_to_text`. Returns uint8, shape (number of bits,)."""
    parts = text.split(BIT_SEPARATOR)
    if not text or any(p not in ("0", "1") for p in parts):
        raise ValueError(f"text: expected bits separated by single spaces like '0 1 1', got {text[:40]!r}")
    return np.array([p == "1" for p in parts], dtype=np.uint8)


class DriftTrainingData(NamedTuple):
    """Training set of the synthetic drift experiment (App. B) and its two reference strings."""

    texts: list[str]  # n0 + n1 samples as `bits_to_text`, shuffled
    base: np.ndarray  # c0, shape (length,): the evaluation string
    other: np.ndarray  # the reference of similarity r to c0, shape (length,)
    source: np.ndarray  # shape (n0 + n1,): 0 where texts[i] comes from c0, 1 from `other`


def drift_training_texts(n0: int, n1: int, r: float, *, length: int = 64, delta: float = 0.2,
                         seed: int = 0) -> DriftTrainingData:
    """App. B's training set: n0 samples of the base string c0 and n1 of a string of similarity r, shuffled.

    c0 = reference_string(length, seed), the string that `drift_bsc_*` lm-eval tasks evaluate with
    metadata {"seed": seed, "length": length}. Defaults are App. B's GPT-2 run (L = 64, δ = 0.2).
    """
    n0, n1 = _count("n0", n0, 0), _count("n1", n1, 0)
    rng = np.random.default_rng(_count("seed", seed, 0))
    base = reference_string(length, rng)
    other = similar_reference(base, r, rng)
    samples = bsc_samples(base, n0, delta, rng) + bsc_samples(other, n1, delta, rng)
    order = rng.permutation(n0 + n1)
    source = (order >= n0).astype(np.uint8)
    return DriftTrainingData([bits_to_text(samples[i]) for i in order], base, other, source)


def next_bit_docs(reference: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
    """One lm-eval document per position t of c0: context c0[:t], choices for the next bit, gold c0[t].

    The choices carry their leading separator (" 0"/" 1", or "0"/"1" at t = 0) so that context +
    choice is exactly `bits_to_text(c0[:t+1])`, the training format.
    """
    ref = _bits("reference", reference)
    return [{"t": t, "context": bits_to_text(ref[:t]) if t else "",
             "choices": [f"{BIT_SEPARATOR if t else ''}{b}" for b in "01"], "label": int(ref[t])}
            for t in range(ref.size)]


def next_bit_scores(logliks: Sequence[float], label: int) -> dict[str, float]:
    """Scores of one next-bit prediction from the log-likelihoods of the choices "0" and "1".

    acc: 1 if the gold bit has the larger log-likelihood. nll: −log softmax(logliks)[label], the
    next-bit loss renormalised over {0, 1} (App. B's test loss for a model that puts all mass on
    the two bits). nll_raw: −logliks[label], the model's loss over its whole vocabulary.
    """
    lls = np.asarray(logliks, dtype=float)
    if lls.shape != (2,) or label not in (0, 1):
        raise ValueError(f"logliks: expected 2 log-likelihoods and label 0/1, got {lls.shape} and {label!r}")
    return {"acc": float(np.argmax(lls) == label), "nll": float(logsumexp(lls) - lls[label]),
            "nll_raw": float(-lls[label])}


# ---------------------------------------------------------------------------------------------
# r-similarity corruption of real data (App. C.2, Algorithm C1)


def random_token_strings(token_ids: Sequence[Sequence[int]], n_strings: int, length: int,
                         rng: np.random.Generator | int) -> np.ndarray:
    """The artificial strings of App. C.2: tokens drawn uniformly from the distinct tokens in the data.

    token_ids: the tokenised samples. Returns int64, shape (n_strings, length).
    """
    present = [np.asarray(ids, dtype=np.int64) for ids in token_ids]
    vocab = np.unique(np.concatenate(present)) if present else np.array([], dtype=np.int64)
    if vocab.size == 0:
        raise ValueError("dataset: no tokens to draw the random strings from (all samples are empty)")
    return _rng(rng).choice(vocab, size=(_count("n_strings", n_strings, 1), _count("length", length, 1)))


def corrupt_tokens(original: Sequence[int], artificial: Sequence[int] | np.ndarray, r: float,
                   rng: np.random.Generator | int) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm C1: keep token l of `original` if rnd < r (rnd ~ U[0,1]), else take token l of `artificial`.

    Positions past the end of `artificial` wrap around (token l mod its length); the paper's samples
    are shorter than its 2048-token strings, so this only extends it. original: shape (n,).
    Returns (modified ids int64 shape (n,), kept mask bool shape (n,)).
    """
    s1 = np.asarray(original, dtype=np.int64)
    s2 = np.asarray(artificial, dtype=np.int64)
    if s2.ndim != 1 or s2.size == 0:
        raise ValueError(f"artificial: expected a non-empty 1-D token string, got shape {s2.shape}")
    kept = _rng(rng).random(s1.size) < _similarity_value(r)
    return np.where(kept, s1, s2[np.arange(s1.size) % s2.size]), kept
