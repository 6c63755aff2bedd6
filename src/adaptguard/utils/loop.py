"""The one small training loop of the experiments (embedded pretraining, composition meta-training, the drift
experiment): a fixed number of optimizer steps on the loss a callable returns for each step."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import torch


def train_steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, schedule, steps: int,
                step_loss: Callable[[int], torch.Tensor], *, clip_norm: float | None = None,
                progress: str | None = None) -> list[float]:
    """`steps` updates of `model`: `loss = step_loss(step)`, backward, optional gradient clipping to `clip_norm`,
    `optimizer.step()`, `schedule.step()`. Raises `FloatingPointError` on a non-finite loss (before stepping).
    `progress`: the description of a progress bar (steps, ETA) on stderr; None draws none.
    Returns the loss of every step; leaves the model in train mode."""
    from .progress import progress_bar

    model.train()
    losses = []
    with progress_bar(steps, progress) if progress is not None else nullcontext() as bar:
        for step in range(steps):
            loss = step_loss(step)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"training loss is {loss.item()} at step {step}; lower the learning rate")
            loss.backward()
            if clip_norm is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
            if bar is not None:
                bar.update()
    return losses
