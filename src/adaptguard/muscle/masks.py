"""MUSCLE masking strategies (Echterhoff et al. §4.1, §6.5): `m = 1` aligns a token to the old model, `0` to the new
one. Each takes a `MaskInputs` (all (B, T)) and returns (B, T) booleans. Registered by name through the
`adaptguard_muscle_masks` hook (`adaptguard.muscle.plugin`)."""

from __future__ import annotations

import torch

from .losses import MaskInputs


def student_wrong(x: MaskInputs) -> torch.Tensor:
    """Eq. 1: the student misses the label → follow the old model."""
    return x.student_top1 != x.labels


def old_likelier_token(x: MaskInputs) -> torch.Tensor:
    """LL_L: the old model gives the label more probability than the new one."""
    return x.new_label_logp < x.old_label_logp


def old_likelier_sequence(x: MaskInputs) -> torch.Tensor:
    """LL_S: the same on the whole sequence's log-likelihood, broadcast to every token of the sequence."""
    valid = x.valid.float()
    old, new = (x.old_label_logp * valid).sum(-1), (x.new_label_logp * valid).sum(-1)
    return (new < old)[:, None].expand_as(x.labels)


def old_correct(x: MaskInputs) -> torch.Tensor:
    """The old model's argmax is the label."""
    return x.old_top1 == x.labels


def old_only(x: MaskInputs) -> torch.Tensor:
    """Distil from the old model everywhere (a control)."""
    return torch.ones_like(x.valid)


def new_only(x: MaskInputs) -> torch.Tensor:
    """Distil from the new model everywhere (a control: plain distillation)."""
    return torch.zeros_like(x.valid)


# masks whose value on a token reads that token alone: the exact loss evaluates those that read the student per chunk
for _mask in (student_wrong, old_likelier_token, old_correct, old_only, new_only):
    _mask.per_token = True

MASKS = {"student_wrong": student_wrong, "old_likelier_token": old_likelier_token,
         "old_likelier_sequence": old_likelier_sequence, "old_correct": old_correct,
         "old_only": old_only, "new_only": new_only}


def old_right_items(x: MaskInputs) -> torch.Tensor:
    """(B,) bool: rows whose every scored token is the old model's argmax, i.e. greedy decoding with the old model
    reproduces the row's completion token for token — the item is right under exact match. A row without scored
    tokens is not right."""
    return ((x.old_top1 == x.labels) | ~x.valid).all(-1) & x.valid.any(-1)


def focal_item_weights(x: MaskInputs, alpha: float, beta: float) -> torch.Tensor:
    """Focal distillation's per-item weight (Yan et al., CVPR 2021): `w_i = α + β·1[old model right on i]`, (B,)."""
    return alpha + beta * old_right_items(x).float()
