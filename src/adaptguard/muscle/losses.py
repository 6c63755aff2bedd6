"""MUSCLE (Echterhoff et al. §4, eq. 2): the per-token loss that distils from the old model where the mask
says so and from the new model elsewhere, in a reference form and a chunked form for training, with an
exact sparse KL for a top-k cache of the old model. Pure torch; a mask is a callable (see `masks.py`).

Shapes: B = batch size, T = number of scored positions, V = vocabulary; `logits[:, t]` predicts
`labels[:, t]` (shift the labels first, `adaptguard.utils.labels.shifted_labels`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import NamedTuple

import torch

MaskFn = Callable[["MaskInputs"], torch.Tensor]

@dataclass
class MaskInputs:
    """What a MUSCLE masking strategy sees, per scored position (all (B, T), no gradient):
    `labels` (−100 = ignored), `valid`, the argmax token of the student / old / new model and the
    log-probability (at temperature 1) each gives the label token (0 where not valid)."""

    labels: torch.Tensor
    valid: torch.Tensor
    student_top1: torch.Tensor
    old_top1: torch.Tensor
    new_top1: torch.Tensor
    student_label_logp: torch.Tensor
    old_label_logp: torch.Tensor
    new_label_logp: torch.Tensor


def _valid_rows(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    valid = labels != -100
    return valid, valid.reshape(-1).nonzero().squeeze(1)


@torch.no_grad()
def muscle_mask_inputs(student_logits, old_logits, new_logits, labels, chunk_size: int | None = None) -> MaskInputs:
    """`MaskInputs` from (B, T, V) logits aligned with (B, T) labels, computed `chunk_size` scored positions
    at a time (None = all at once) so that at most one chunk of float32 log-probabilities exists."""
    valid, rows = _valid_rows(labels)
    flat_labels = labels.reshape(-1)
    shape = labels.shape
    out = {k: torch.zeros(labels.numel(), dtype=torch.long if k.endswith("top1") else torch.float32,
                          device=labels.device)
           for k in ("student_top1", "old_top1", "new_top1", "student_label_logp", "old_label_logp",
                     "new_label_logp")}
    step = len(rows) if not chunk_size else chunk_size
    for start in range(0, len(rows), max(step, 1)):
        idx = rows[start:start + step]
        y = flat_labels[idx]
        for name, logits in (("student", student_logits), ("old", old_logits), ("new", new_logits)):
            if isinstance(logits, TopKLogProbs):
                k = logits.logp.shape[-1]
                out[f"{name}_top1"][idx], out[f"{name}_label_logp"][idx] = topk_label_stats(
                    logits.logp.reshape(-1, k)[idx], logits.idx.reshape(-1, k)[idx], logits.rest.reshape(-1)[idx], y,
                    student_logits.shape[-1])
                continue
            z = logits.reshape(-1, logits.shape[-1])[idx].float()
            out[f"{name}_top1"][idx] = z.argmax(-1)
            out[f"{name}_label_logp"][idx] = torch.log_softmax(z, -1).gather(-1, y[:, None])[:, 0]
    return MaskInputs(labels=labels, valid=valid, **{k: v.view(shape) for k, v in out.items()})


def apply_mask(mask: MaskFn, inputs: MaskInputs) -> torch.Tensor:
    """m (B, T) float in {0, 1}: 1 = align to the old model, 0 = to the new one; 0 off `valid`."""
    name = getattr(mask, "__name__", repr(mask))
    try:
        m = mask(inputs)
    except AttributeError as err:
        if err.obj is not inputs:
            raise
        # e.g. a plugin written for full logits: the tiled loss never builds them, so no path can give them
        raise ValueError(f"MUSCLE mask {name!r} reads {err.name!r}, which a mask is not given: it sees only "
                         f"{', '.join(f.name for f in fields(MaskInputs))} (per token, no logits)") from err
    if m.shape != inputs.labels.shape:
        raise ValueError(f"MUSCLE mask {name!r} returned shape {tuple(m.shape)}, expected {tuple(inputs.labels.shape)}")
    return (m.bool() & inputs.valid).float()


def muscle_token_loss(student_logits: torch.Tensor, old_logits: torch.Tensor, new_logits: torch.Tensor,
                      labels: torch.Tensor, mask: MaskFn, temperature: float = 2.0
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """MUSCLE per-token loss (Echterhoff et al. eq. 2), reference implementation:
    `m·KL(σ(z_old/T) ‖ σ(z_s/T)) + (1 − m)·KL(σ(z_new/T) ‖ σ(z_s/T))`.

    Args:
        student_logits, old_logits, new_logits: (B, T, V), `logits[:, t]` predicts `labels[:, t]`.
        labels: (B, T), −100 = not scored.
        mask: the masking strategy, `mask(MaskInputs) -> (B, T)` (e.g. `masks.student_wrong`; names are
            resolved by `adaptguard.plugins.get_muscle_mask`).
    Returns:
        `(loss, m)`, both (B, T) float32, 0 on ignored positions; only `loss` carries gradient.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    m = apply_mask(mask, muscle_mask_inputs(student_logits, old_logits, new_logits, labels))
    log_q = torch.log_softmax(student_logits.float() / temperature, -1)
    kls = []
    for teacher in (old_logits, new_logits):
        log_p = torch.log_softmax(teacher.detach().float() / temperature, -1)
        kls.append((log_p.exp() * (log_p - log_q)).sum(-1))
    loss = m * kls[0] + (1 - m) * kls[1]
    return torch.where(labels != -100, loss, torch.zeros_like(loss)), m


class TopKLogProbs(NamedTuple):
    """A teacher given by its top-k log-probabilities (temperature 1) per position instead of logits:
    `logp`, `idx` (B, T, k), sorted by decreasing probability, and `rest` (B, T) = log of the remaining mass,
    spread evenly over the other V − k tokens. With k = V it is the exact distribution."""

    logp: torch.Tensor
    idx: torch.Tensor
    rest: torch.Tensor


def topk_label_stats(logp, idx, rest, labels, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(argmax (n,), log-probability of the label (n,)) of a top-k teacher (n, k) rows: the argmax is the first
    entry; a label outside the top k gets the tail's per-token log-probability."""
    k = logp.shape[-1]
    lp, ix = logp.float(), idx.long()
    tail = rest.float() - (math.log(vocab - k) if vocab > k else 0.0)
    hit = ix == labels[:, None]
    return ix[:, 0], torch.where(hit.any(1), (lp * hit).sum(1), tail)


def sparse_log_probs(logp, rest, temperature: float, vocab: int):
    """(log p_j (n, k), log p_tail (n,)) of a top-k teacher at temperature T; p_tail per tail token."""
    tail = vocab - logp.shape[-1]
    a = logp.float() / temperature
    if tail > 0:
        a_tail = (rest.float() - math.log(tail)) / temperature
        log_z = torch.logsumexp(torch.cat([a, (a_tail + math.log(tail))[:, None]], 1), 1)
    else:
        a_tail = torch.full_like(rest, float("-inf"), dtype=torch.float32)
        log_z = torch.logsumexp(a, 1)
    return a - log_z[:, None], a_tail - log_z


def sparse_kl(lq_top, lq_sum, logp, rest, temperature: float, vocab: int):
    """KL(p_teacher,T ‖ q) per row for a top-k teacher, without densifying: from the student's log q at the
    teacher's top-k indices (n, k) and summed over the vocabulary (n,)."""
    log_pj, log_pt = sparse_log_probs(logp, rest, temperature, vocab)
    pj, pt = log_pj.exp(), log_pt.exp()
    tail = vocab - logp.shape[-1]
    has_tail = torch.isfinite(log_pt) & (tail > 0)
    p_log_p = (pj * log_pj).sum(1) + torch.where(has_tail, tail * pt * log_pt, torch.zeros_like(pt))
    p_log_q = (pj * lq_top).sum(1) + torch.where(has_tail, pt * (lq_sum - lq_top.sum(1)), torch.zeros_like(pt))
    return p_log_p - p_log_q


class _ChunkedMuscleKL(torch.autograd.Function):
    """Per-token MUSCLE KL over the scored rows `idx` of flattened (N, V) logits, `chunk` rows at a time in
    float32; backward recomputes per chunk (grad wrt z_s is (σ(z_s/T) − p_mix) / T with
    p_mix = m p_old + (1 − m) p_new), so no full-size float32 tensor is ever kept. The old teacher is
    dense logits (N, V) or, from a cache, top-k rows (`old` None, `old_topk` = flattened TopKLogProbs)."""

    @staticmethod
    def forward(ctx, student, old, new, m, idx, temperature, chunk, old_topk=None):
        out = torch.empty(len(idx), dtype=torch.float32, device=student.device)
        for start in range(0, len(idx), chunk):
            rows = idx[start:start + chunk]
            log_q = torch.log_softmax(student[rows].float() / temperature, -1)
            mc = m[rows]
            log_p_new = torch.log_softmax(new[rows].float() / temperature, -1)
            total = (1 - mc) * (log_p_new.exp() * (log_p_new - log_q)).sum(-1)
            if old_topk is None:
                log_p_old = torch.log_softmax(old[rows].float() / temperature, -1)
                total += mc * (log_p_old.exp() * (log_p_old - log_q)).sum(-1)
            else:
                top_idx = old_topk.idx[rows].long()
                total += mc * sparse_kl(log_q.gather(1, top_idx), log_q.sum(1), old_topk.logp[rows],
                                        old_topk.rest[rows], temperature, log_q.shape[-1])
            out[start:start + len(rows)] = total
        ctx.save_for_backward(student, new, m, idx, *([old] if old_topk is None else old_topk))
        ctx.sparse, ctx.temperature, ctx.chunk = old_topk is not None, temperature, chunk
        return out

    @staticmethod
    def backward(ctx, grad_out):
        student, new, m, idx, *old = ctx.saved_tensors
        temperature, chunk = ctx.temperature, ctx.chunk
        grad = torch.zeros_like(student)
        for start in range(0, len(idx), chunk):
            rows = idx[start:start + chunk]
            q = torch.softmax(student[rows].float() / temperature, -1)
            mc = m[rows][:, None]
            p_mix = (1 - mc) * torch.softmax(new[rows].float() / temperature, -1)
            if not ctx.sparse:
                p_mix += mc * torch.softmax(old[0][rows].float() / temperature, -1)
            else:
                logp, top_idx, rest = (t[rows] for t in old)
                log_pj, log_pt = sparse_log_probs(logp, rest, temperature, q.shape[-1])
                pt = torch.nan_to_num(log_pt.exp())[:, None]
                p_mix += mc * pt
                p_mix.scatter_add_(1, top_idx.long(), mc * (log_pj.exp() - pt))
            grad[rows] = ((q - p_mix) / temperature * grad_out[start:start + len(rows), None]).to(grad.dtype)
        return grad, None, None, None, None, None, None, None


def muscle_token_loss_chunked(student_logits: torch.Tensor, old_logits: torch.Tensor, new_logits: torch.Tensor,
                              labels: torch.Tensor, mask: MaskFn, temperature: float = 2.0,
                              chunk_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """`muscle_token_loss` computed over the scored tokens in chunks of `chunk_size` (for training): the
    same value and gradient, with at most one chunk of float32 full-vocabulary tensors alive. `old_logits` may
    be a `TopKLogProbs` (a top-k cache of the old model): the KL is then computed from the sparse form."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be ≥ 1, got {chunk_size}")
    vocab = student_logits.shape[-1]
    sparse = isinstance(old_logits, TopKLogProbs)
    old_vocab = vocab if sparse else old_logits.shape[-1]
    if old_vocab != vocab or new_logits.shape[-1] != vocab:
        raise ValueError(f"vocabulary sizes differ: student {vocab}, old {old_vocab}, new {new_logits.shape[-1]}")
    m = apply_mask(mask, muscle_mask_inputs(student_logits, old_logits, new_logits, labels, chunk_size))
    _, rows = _valid_rows(labels)
    if sparse:
        k = old_logits.logp.shape[-1]
        flat_topk = TopKLogProbs(old_logits.logp.reshape(-1, k), old_logits.idx.reshape(-1, k),
                                 old_logits.rest.reshape(-1))
        per_token = _ChunkedMuscleKL.apply(student_logits.reshape(-1, vocab), None,
                                           new_logits.detach().reshape(-1, vocab), m.reshape(-1), rows,
                                           float(temperature), int(chunk_size), flat_topk)
    else:
        per_token = _ChunkedMuscleKL.apply(student_logits.reshape(-1, vocab), old_logits.detach().reshape(-1, vocab),
                                           new_logits.detach().reshape(-1, vocab), m.reshape(-1), rows,
                                           float(temperature), int(chunk_size))
    loss = torch.zeros(labels.numel(), dtype=torch.float32, device=labels.device).index_put((rows,), per_token)
    return loss.view(labels.shape), m
