"""The trainer callbacks of `pick.Pick`'s trainings: the adapter kept after each epoch of the grid (`SaveAtEpochs`),
and the seconds of each optimizer step of the plan's measurement (`StepTimer`)."""

from __future__ import annotations

import time
from pathlib import Path

from transformers import TrainerCallback


class SaveAtEpochs(TrainerCallback):
    """Saves the trained adapter as `out/epoch-<e>` at the end of each epoch e in `epochs`."""

    def __init__(self, epochs, out: Path, adapter_name: str | None):
        self.epochs, self.out, self.adapter_name = set(epochs), out, adapter_name

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        epoch = round(state.epoch)
        if epoch in self.epochs and state.is_world_process_zero:
            model.save_pretrained(self.out / f"epoch-{epoch}",
                                  **({"selected_adapters": [self.adapter_name]} if self.adapter_name else {}))


class StepTimer(TrainerCallback):
    """Seconds of each optimizer step, into `times`."""

    def __init__(self, times: list):
        self.times, self.start = times, None

    def on_step_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self.start)
