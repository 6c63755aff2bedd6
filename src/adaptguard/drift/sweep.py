"""The synthetic performance-drift experiment of Ni et al., App. B (Fig. B1), scaled to a laptop CPU.

A small GPT-2-style model (``transformers.GPT2LMHeadModel`` built from a config, no download) is trained
on ``n0`` samples of a base subpopulation (reference string ``c0``) plus ``n1`` samples of a subpopulation
whose reference has similarity ``r`` to ``c0`` (Def. 4); each sample is ``BSC_delta(c[1:l])``,
``l ~ U{1..L}`` (Assumption 1). The model is then scored on ``c0`` itself: the mean next-bit loss over
all ``L`` positions, teacher-forced. Theorem A2 predicts the loss is worst for ``r`` close to and below
1/2; the paper's GPT-2 run peaks at ``r = 3/8``.

Bits are tokens: ids 0 and 1 are the bits and id 2 is BOS, which starts every sequence so that the
first bit is predicted too (App. B's "vocabulary size of 3"). No tokenizer is involved here; the
``drift_bsc_*`` lm-eval tasks use the text form ``"0 1 1 0"`` (``adaptguard.drift.bits_to_text``) to
probe real language models instead. Training and evaluation use the loss over the two bits only
(log-softmax of the logits of ids 0 and 1), which is what "next-bit loss" means and equals
``adaptguard.drift.next_bit_scores(...)["nll"]``.

Settings, ours (``DriftExperimentConfig()``) against App. B's GPT-2 run:

=====================  =======================  ==========================================
setting                paper (App. B)           default here
=====================  =======================  ==========================================
L (string length)      64                       32
delta                  0.2                      0.2
n0 / n1                100000 / 16384           20000 / 3277 (the same ratio)
model                  GPT-2, 12 layers,        GPT-2, 2 layers, 4 heads, width 32
                       12 heads, width 768
batch size             1024                     64
steps                  not reported             300 (19200 samples, < 1 epoch)
AdamW                  b=(0.9, 0.98), eps 1e-8, same
                       weight decay 0.01
learning rate          3e-5 -> 3e-4 linear      peak_lr/10 -> peak_lr linear warmup (1/10
                       warmup (1/10 of steps),  of steps), cosine decay to 0
                       cosine decay to 0
precision              mixed                    float32 (CPU)
r                      0, 1/8, ..., 7/8         same
repetitions            5                        5 (``quick()``: 2)
=====================  =======================  ==========================================

Reference strings: App. B's text builds the similarity-r string by flipping ``ceil(rL)`` bits, which
contradicts Def. 4 (similarity = share of EQUAL bits); we flip ``round((1 - r)L)`` bits, as
``adaptguard.drift.similar_reference`` documents. The paper does not report a loss at ``r = 1``, so
neither do we.

For reference every run also records the loss of the Bayes-optimal predictor of its training
distribution (``bayes_next_bit_loss``). It is nearly the same for every r < 1 (the noiseless c0 prefix
rules the other subpopulation out after a few differing bits), so any dependence of the measured loss
on r comes from the learner: how well a finite model, trained for a finite time, tells the two
subpopulations apart. The shape of the curve therefore depends on the training budget. Measured here
(L = 32, 2-3 repetitions): after 150 steps at width 32 the loss falls steadily with r (peak at r = 0,
an undertrained model that mostly averages the two strings position by position); after 300 steps
(the default) r <= 3/8 are near the Bayes loss and the peak sits at 1/2 to 5/8; width 64 after 400
steps is nearly flat, within the spread of the repetitions.

Speed: the models are tiny, so one torch thread is as fast as two, and on a busy machine a second
thread made training 5-45 times slower here (threads wait on each other). This module sets nothing
global; a caller that wants speed calls ``torch.set_num_threads(1)`` first. With one thread a run
takes about 5-10 s, the default sweep (40 runs) 4-7 minutes, ``quick()`` (16 runs) 1-2 minutes.

Repetition ``k`` uses seed ``seed + k`` for every ``r``: within a repetition all ``r`` share ``c0`` and
the model's initial weights (a paired comparison), and repetitions differ in both, as the paper's
repetitions differ in their reference draws.
"""

from __future__ import annotations

import json
import math
import os
import textwrap
import time
from dataclasses import asdict, dataclass, fields, replace
from numbers import Integral, Real
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from ..utils.figures import new_figure, save_figure
from ..utils.files import atomic_write_text
from ..utils.loop import train_steps
from ..utils.progress import progress_bar
from .bsc import bsc_samples, reference_string, similar_reference, similarity

__all__ = [
    "BOS",
    "PAPER_SETTINGS",
    "DriftExperimentConfig",
    "DriftTrainingBits",
    "bayes_next_bit_loss",
    "build_model",
    "drift_training_bits",
    "encode_samples",
    "next_bit_eval",
    "plot_drift",
    "run_drift_experiment",
    "run_single",
    "train_model",
]

BOS = 2  # token ids 0 and 1 are the bits
VOCAB_SIZE = 3
IGNORE = -100  # label of padding positions

PAPER_SETTINGS: dict[str, Any] = {
    "length": 64, "delta": 0.2, "n0": 100000, "n1": 16384, "n_layer": 12, "n_head": 12, "n_embd": 768,
    "vocab_size": 3, "batch_size": 1024, "steps": "not reported", "initial_lr": 3e-5, "peak_lr": 3e-4,
    "final_lr": 0.0, "warmup_fraction": 0.1, "schedule": "linear warmup, cosine decay",
    "adam_betas": [0.9, 0.98], "adam_eps": 1e-8, "weight_decay": 0.01, "precision": "mixed",
    "similarities": [k / 8 for k in range(8)], "repetitions": 5, "reported_peak_r": 3 / 8,
}
ADAM_BETAS = (0.9, 0.98)
ADAM_EPS = 1e-8
WEIGHT_DECAY = 0.01
INITIAL_LR_FRACTION = 0.1  # paper: 3e-5 initial for a 3e-4 peak


@dataclass(frozen=True)
class DriftExperimentConfig:
    """Settings of the App. B experiment (paper values in ``PAPER_SETTINGS`` and the module docstring).

    The defaults take 4-7 minutes on one CPU core with one torch thread, ``quick()`` 1-2 (module docstring).
    """

    similarities: tuple[float, ...] = tuple(k / 8 for k in range(8))
    """Similarities r of the second reference string to c0, each in [0, 1] (paper: 0, 1/8, ..., 7/8)."""
    repetitions: int = 5
    """Runs per r with different reference draws and model initialisations (paper: 5)."""
    length: int = 32
    """L, bits per reference string and the model's context length (paper: 64)."""
    delta: float = 0.2
    """BSC flip probability of every sample bit, in [0, 1/2) (paper: 0.2)."""
    n0: int = 20000
    """Samples of the base subpopulation c0 (paper: 100000)."""
    n1: int = 3277
    """Samples of the similarity-r subpopulation (paper: 16384; 3277/20000 keeps the paper's ratio)."""
    n_layer: int = 2
    """Transformer blocks (paper: 12)."""
    n_head: int = 4
    """Attention heads; must divide n_embd (paper: 12)."""
    n_embd: int = 32
    """Width of the residual stream (paper: 768)."""
    steps: int = 300
    """Optimiser steps (paper: not reported). At 300 the r = 0 runs reach the Bayes loss while runs with
    r >= 1/2 still confuse the two subpopulations; see the module docstring for other budgets."""
    batch_size: int = 64
    """Samples per step, padded to the longest (paper: 1024)."""
    peak_lr: float = 3e-3
    """Peak learning rate, reached after the warmup; starts at peak_lr/10, ends at 0 (paper: 3e-4)."""
    warmup_fraction: float = 0.1
    """Share of the steps spent in the linear warmup, in [0, 1) (paper: 0.1)."""
    seed: int = 0
    """Repetition k uses seed + k for its data, reference strings and model initialisation."""

    def __post_init__(self) -> None:
        sims = self.similarities
        if isinstance(sims, (str, bytes)) or not hasattr(sims, "__len__") or len(sims) == 0:
            raise ValueError(f"similarities: expected a non-empty sequence of numbers in [0, 1], got {sims!r}")
        for r in sims:
            if isinstance(r, bool) or not isinstance(r, Real) or not 0.0 <= r <= 1.0:
                raise ValueError(f"similarities: every r must be a number in [0, 1], got {r!r}")
        object.__setattr__(self, "similarities", tuple(float(r) for r in sims))
        for name, minimum in (("repetitions", 1), ("length", 1), ("n0", 1), ("n1", 1), ("n_layer", 1),
                              ("n_head", 1), ("n_embd", 1), ("steps", 1), ("batch_size", 1), ("seed", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Integral) or value < minimum:
                raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_head: must divide n_embd = {self.n_embd}, got {self.n_head}")
        if isinstance(self.delta, bool) or not isinstance(self.delta, Real) or not 0.0 <= self.delta < 0.5:
            raise ValueError(f"delta: the flip probability must lie in [0, 1/2) (Assumption 1), got {self.delta!r}")
        if isinstance(self.peak_lr, bool) or not isinstance(self.peak_lr, Real) or not self.peak_lr > 0:
            raise ValueError(f"peak_lr: expected a positive number, got {self.peak_lr!r}")
        frac = self.warmup_fraction
        if isinstance(frac, bool) or not isinstance(frac, Real) or not 0.0 <= frac < 1.0:
            raise ValueError(f"warmup_fraction: expected a number in [0, 1), got {frac!r}")

    @classmethod
    def quick(cls, **overrides: Any) -> DriftExperimentConfig:
        """The default with 2 repetitions instead of 5 (its runs are the default's first two); under 2 minutes."""
        return replace(cls(repetitions=2), **overrides)

    def settings(self) -> dict[str, Any]:
        """The settings as a JSON-ready dict, with the paper's values under ``"paper"``."""
        ours = asdict(self)
        ours["similarities"] = list(self.similarities)
        ours.update(vocab_size=VOCAB_SIZE, initial_lr=self.peak_lr * INITIAL_LR_FRACTION, final_lr=0.0,
                    schedule="linear warmup, cosine decay", adam_betas=list(ADAM_BETAS), adam_eps=ADAM_EPS,
                    weight_decay=WEIGHT_DECAY, precision="float32", dropout=0.0,
                    loss="mean next-bit NLL (nats) on c0, softmax over the two bit tokens, all L positions")
        return {**ours, "paper": dict(PAPER_SETTINGS)}


# ---------------------------------------------------------------------------------------------
# Data


class DriftTrainingBits(NamedTuple):
    """App. B's training set as bit arrays (the same draws as ``adaptguard.drift.drift_training_texts``)."""

    samples: list[np.ndarray]  # n0 + n1 uint8 arrays of shapes (l_i,), shuffled
    base: np.ndarray  # c0, shape (length,)
    other: np.ndarray  # reference of similarity r to c0, shape (length,)
    source: np.ndarray  # shape (n0 + n1,): 0 where samples[i] comes from c0, 1 from `other`


def drift_training_bits(n0: int, n1: int, r: float, *, length: int = 64, delta: float = 0.2,
                        seed: int = 0) -> DriftTrainingBits:
    """n0 samples BSC_delta(c0[1:l]) and n1 samples BSC_delta(c1[1:l]) with similarity(c0, c1) ≈ r, shuffled.

    Draws in the order of ``drift_training_texts`` from ``np.random.default_rng(seed)``, so
    ``bits_to_text`` of the samples equals that function's texts for the same arguments.
    """
    rng = np.random.default_rng(seed)
    base = reference_string(length, rng)
    other = similar_reference(base, r, rng)
    samples = bsc_samples(base, n0, delta, rng) + bsc_samples(other, n1, delta, rng)
    order = rng.permutation(n0 + n1)
    return DriftTrainingBits([samples[i] for i in order], base, other, (order >= n0).astype(np.uint8))


def encode_samples(samples: list[np.ndarray], length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token labels for bit strings, right-padded to ``length``.

    Row i: inputs ``[BOS, z_1, ..., z_{l-1}, pad...]``, labels ``[z_1, ..., z_l, -100...]``, so every bit
    (also the first) is predicted from the bits before it. Padding follows the real tokens, which a
    causal model never attends to from a real position, so no attention mask is needed.
    Returns two int64 tensors of shape (len(samples), length).
    """
    inputs = torch.full((len(samples), length), BOS, dtype=torch.long)
    labels = torch.full((len(samples), length), IGNORE, dtype=torch.long)
    for i, z in enumerate(samples):
        if not 1 <= z.size <= length:
            raise ValueError(f"samples: sample {i} has {z.size} bits; expected 1..{length}")
        bits = torch.as_tensor(z.astype(np.int64))
        inputs[i, 1:z.size] = bits[:-1]
        labels[i, :z.size] = bits
    return inputs, labels


# ---------------------------------------------------------------------------------------------
# Model, loss, training


def build_model(config: DriftExperimentConfig, seed: int) -> torch.nn.Module:
    """A GPT-2 LM over the 3-token vocabulary, context ``config.length``, initialised from ``seed``.

    Dropout is off: the runs are short and dropout would only add noise to a comparison across r.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt_config = GPT2Config(vocab_size=VOCAB_SIZE, n_positions=config.length, n_embd=config.n_embd,
                            n_layer=config.n_layer, n_head=config.n_head, resid_pdrop=0.0, embd_pdrop=0.0,
                            attn_pdrop=0.0, bos_token_id=BOS, eos_token_id=BOS)
    torch.manual_seed(seed)
    return GPT2LMHeadModel(gpt_config)


def bit_log_probs(model: torch.nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of the next bit, normalised over the two bit tokens.

    inputs: int64 (B, T). Returns float (B, T, 2): entry [b, t, v] = log p(bit v | inputs[b, :t+1]).
    """
    logits = model(input_ids=inputs).logits[..., :2]
    return torch.log_softmax(logits.float(), dim=-1)


def _bit_nll(log_probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean NLL over the positions whose label is not -100. log_probs (B, T, 2), labels (B, T)."""
    return torch.nn.functional.nll_loss(log_probs.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)


@torch.no_grad()
def next_bit_eval(model: torch.nn.Module, reference: np.ndarray) -> tuple[float, float]:
    """App. B's test loss: the model reads c0 teacher-forced and predicts each of its L bits.

    reference: c0, shape (L,) of 0/1, L <= the model's context. Returns (mean NLL in nats over the L
    positions, share of positions where the more likely bit is c0's).
    """
    inputs, labels = encode_samples([np.asarray(reference, dtype=np.uint8)], len(reference))
    was_training = model.training
    model.eval()
    try:
        log_probs = bit_log_probs(model, inputs)
    finally:
        model.train(was_training)
    nll = _bit_nll(log_probs, labels).item()
    accuracy = (log_probs.argmax(-1) == labels).float().mean().item()
    return nll, accuracy


def bayes_next_bit_loss(base: np.ndarray, other: np.ndarray, n0: int, n1: int, delta: float) -> float:
    """The test loss on c0 of the Bayes-optimal predictor of the training distribution (not the sample).

    After the prefix c0[:t], subpopulation i has posterior weight ∝ n_i · Π_{s<t} P(c0[s] | c_i) with
    P = 1 − delta where c_i agrees with c0 and delta where not (both share the length distribution,
    which cancels); the next bit is c0[t] with probability Σ_i w_i P(c0[t] | c_i). base, other: shapes (L,).
    Returns the mean NLL (nats) over the L positions. It is not a floor for a trained model: c0 is
    noiseless, so a model more confident than 1 − delta scores below it.
    """
    differ = np.asarray(base) != np.asarray(other)
    log_odds = np.log(delta / (1 - delta))
    # log of n1/n0 times the likelihood ratio of c1 to c0 for the prefix before each position
    log_w1 = math.log(n1 / n0) + log_odds * np.concatenate([[0], np.cumsum(differ)[:-1]])
    w1 = np.exp(log_w1 - np.logaddexp(0.0, log_w1))
    p_bit = (1 - w1) * (1 - delta) + w1 * np.where(differ, delta, 1 - delta)
    return float(-np.mean(np.log(p_bit)))


def _lr_factor(step: int, steps: int, warmup_fraction: float) -> float:
    """Learning-rate multiplier: linear from 1/10 to 1 over the warmup, then cosine down to 0."""
    warmup = int(warmup_fraction * steps)
    if step < warmup:
        return INITIAL_LR_FRACTION + (1 - INITIAL_LR_FRACTION) * step / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def train_model(data: DriftTrainingBits, config: DriftExperimentConfig, seed: int) -> tuple[torch.nn.Module, float]:
    """Train a fresh model (``build_model(config, seed)``) on the samples; batches drawn by a seeded shuffle.

    Returns (model, mean training loss over the last tenth of the steps).
    """
    model = build_model(config, seed)
    inputs, labels = encode_samples(data.samples, config.length)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.peak_lr, betas=ADAM_BETAS, eps=ADAM_EPS,
                                  weight_decay=WEIGHT_DECAY)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: _lr_factor(step, config.steps, config.warmup_fraction))
    rng = np.random.default_rng(seed)
    n = inputs.shape[0]
    epochs = math.ceil(config.steps * config.batch_size / n)
    order = torch.as_tensor(np.concatenate([rng.permutation(n) for _ in range(epochs)]))

    def step_loss(step: int) -> torch.Tensor:
        batch = order[step * config.batch_size:(step + 1) * config.batch_size]
        return _bit_nll(bit_log_probs(model, inputs[batch]), labels[batch])

    losses = train_steps(model, optimizer, schedule, config.steps, step_loss)
    tail_losses = losses[config.steps - max(1, config.steps // 10):]
    return model, float(np.mean(tail_losses))


def run_single(config: DriftExperimentConfig, r: float, repetition: int) -> dict[str, Any]:
    """One training run at similarity r; seed = config.seed + repetition. Returns its scores and timing."""
    start = time.perf_counter()
    seed = config.seed + repetition
    data = drift_training_bits(config.n0, config.n1, r, length=config.length, delta=config.delta, seed=seed)
    model, train_loss = train_model(data, config, seed)
    loss, accuracy = next_bit_eval(model, data.base)
    bayes = bayes_next_bit_loss(data.base, data.other, config.n0, config.n1, config.delta)
    return {"r": float(r), "repetition": repetition, "seed": seed, "loss": loss, "accuracy": accuracy,
            "bayes_loss": bayes, "train_loss": train_loss, "similarity": similarity(data.base, data.other),
            "seconds": time.perf_counter() - start}


# ---------------------------------------------------------------------------------------------
# Sweep and outputs


def summarize(runs: list[dict[str, Any]], similarities: tuple[float, ...]) -> dict[str, Any]:
    """Per-r mean/min/max of the runs' losses, mean accuracy and Bayes loss, in the order of ``similarities``."""
    losses = [[run["loss"] for run in runs if run["r"] == r] for r in similarities]
    accuracies = [[run["accuracy"] for run in runs if run["r"] == r] for r in similarities]
    bayes = [float(np.mean([run["bayes_loss"] for run in runs if run["r"] == r])) for r in similarities]
    means = [float(np.mean(x)) for x in losses]
    return {"r": list(similarities), "loss_mean": means, "loss_min": [float(np.min(x)) for x in losses],
            "loss_max": [float(np.max(x)) for x in losses], "accuracy_mean": [float(np.mean(x)) for x in accuracies],
            "bayes_loss_mean": bayes, "losses": losses, "accuracies": accuracies,
            "peak_r": similarities[int(np.argmax(means))]}


def plot_drift(result: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    """Bar chart of the mean test loss per r with min-max error bars (Fig. B1), written atomically as PNG."""
    r, mean = np.asarray(result["r"]), np.asarray(result["loss_mean"])
    err = np.stack([mean - np.asarray(result["loss_min"]), np.asarray(result["loss_max"]) - mean])
    fig = new_figure(figsize=(6.4, 4.8))
    ax = fig.add_subplot()
    ax.bar([f"{x:g}" if x in (0, 1) else f"{round(x * 8)}/8" if x * 8 == round(x * 8) else f"{x:.3g}" for x in r],
           mean, yerr=err, capsize=4, color="C0")
    ax.plot(range(len(r)), result["bayes_loss_mean"], "_", color="C3", markersize=16, markeredgewidth=2,
            label="ideal predictor of the training mixture")
    ax.axhline(result["optimal_loss"], color="grey", linestyle="--", linewidth=1, label="ideal model of c0's data alone")
    # bars start just below the lowest value, and the legend gets a free band above the highest
    low, high = min(result["optimal_loss"], float(np.min(result["loss_min"]))), float(np.max(result["loss_max"]))
    span = high - low + 1e-3
    ax.set_ylim(low - 0.05 * span, high + 0.25 * span)
    ax.set(xlabel="similarity r of the second subpopulation to c0", ylabel="next-bit loss on c0 (nats)",
           title=f"Synthetic drift (Ni et al. App. B), {len(result['losses'][0])} runs per r")
    ax.legend(loc="upper center", ncol=2, fontsize="x-small")
    caption = ("Bars: mean loss of the trained models on c0, min–max over runs. Red: the Bayes-optimal predictor of "
               "the training data (c0 and the r-similar string in their shares). Grey: −ln(1−δ) = "
               f"{result['optimal_loss']:.3f}, the label noise δ alone. A trained model can score below both: c0 is "
               "noiseless.")
    fig.text(0.01, 0.01, textwrap.fill(caption, 120), fontsize=7, va="bottom")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return save_figure(fig, path, dpi=100)


def run_drift_experiment(out_dir: str | os.PathLike[str], *, quick: bool = False, progress: Any = None,
                         show_progress: bool = True, **overrides: Any) -> dict[str, Any]:
    """Run the sweep over r x repetitions and write ``out_dir/drift.json`` and ``out_dir/drift.png``.

    ``overrides`` replace fields of ``DriftExperimentConfig()`` (or of ``.quick()``), e.g. ``steps=100``;
    an unknown name raises ValueError. ``progress``, if given, is called with each finished run's dict;
    ``show_progress=False`` draws no bar (a caller drawing its own from ``progress``).
    The JSON holds ``r``, ``loss_mean``, ``loss_min``, ``loss_max``, ``accuracy_mean``, the per-repetition
    ``losses``/``accuracies`` (one list per r), every run (``runs``), ``peak_r`` (the r of the largest mean
    loss), ``bayes_loss_mean`` (``bayes_next_bit_loss`` per r), ``optimal_loss`` (-ln(1-delta), the loss of the
    ideal model of the base data alone), ``settings`` (with the paper's) and ``seconds``. Returns that dict.
    """
    known = {f.name for f in fields(DriftExperimentConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"overrides: unknown setting(s) {unknown}; valid: {sorted(known)}")
    config = DriftExperimentConfig.quick(**overrides) if quick else DriftExperimentConfig(**overrides)
    out = Path(out_dir)
    start = time.perf_counter()
    runs = []
    with progress_bar(config.repetitions * len(config.similarities), "drift: training runs", unit="run",
                      show=show_progress) as bar:
        for repetition in range(config.repetitions):
            for r in config.similarities:
                runs.append(run_single(config, r, repetition))
                bar.update()
                if progress is not None:
                    progress(runs[-1])
    from ..utils.sweeps import machine_info

    result = {**summarize(runs, config.similarities), "optimal_loss": -math.log(1 - config.delta),
              "runs": runs, "settings": {**config.settings(), "preset": "quick" if quick else "default"},
              "machine": machine_info(), "seconds": time.perf_counter() - start}
    plot_drift(result, out / "drift.png")
    atomic_write_text(out / "drift.json", json.dumps(result, indent=2) + "\n")
    return result
