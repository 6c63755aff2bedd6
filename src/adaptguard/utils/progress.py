"""Progress bars (steps done, rate, ETA) for the long stages of the experiments and the embedded builds.

On a terminal a bar redraws every second; in a log file or a pipe (CI) it writes a line at most every 30 s,
so a 10-minute build adds about 20 lines, not thousands. `TQDM_DISABLE=1` turns every bar off (tqdm reads it).
"""

from __future__ import annotations

import sys

from tqdm.auto import tqdm
from transformers import TrainerCallback


def progress_bar(total: int, desc: str, unit: str = "step", show: bool = True) -> tqdm:
    """A bar on stderr for `total` units of `desc` (`show=False`: none); use it as a context manager."""
    tty = sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
                mininterval=1.0 if tty else 30.0, disable=not show)


def say(line: str) -> None:
    """Print a line of results on stdout without breaking a bar being drawn."""
    tqdm.write(line, file=sys.stdout)


class TrainingProgress(TrainerCallback):
    """A named bar over a `Trainer`'s optimizer steps (on the main process), for runs that switch off the
    trainer's own unnamed bar (`disable_tqdm=True`)."""

    def __init__(self, desc: str):
        self.desc, self.bar = desc, None

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.bar = progress_bar(state.max_steps, self.desc)

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None
