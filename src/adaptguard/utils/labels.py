"""Label shifting of causal LMs: `logits[:, t]` predicts `labels[:, t + 1]`."""

from __future__ import annotations

import torch

IGNORE_INDEX = -100  # the label of positions that are not scored (transformers' convention)


def shifted_labels(labels: torch.Tensor) -> torch.Tensor:
    """(B, L) labels aligned with (B, L, V) logits: position t holds the label `logits[:, t]` predicts, −100 at
    the end. Shifting the labels, not the (large) logits, avoids copying a (B, L, V) tensor."""
    return torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], IGNORE_INDEX)], dim=1)


def shifted_token_nll(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token NLL from full logits, shifted as a causal LM does.

    Args:
        logits: (B, L, V); labels: (B, L) with −100 on ignored positions.
    Returns:
        `(token_nll (B, L−1), mask (B, L−1))`, NLL 0 off the mask.
    """
    labels = labels[:, 1:]
    mask = labels != IGNORE_INDEX
    nll = torch.nn.functional.cross_entropy(
        logits[:, :-1].float().flatten(0, 1), labels.clamp(min=0).flatten(), reduction="none"
    ).view(labels.shape)
    return torch.where(mask, nll, torch.zeros_like(nll)), mask
