"""Progress bars (steps done, rate, ETA) for the long stages of the experiments and the embedded builds.

On a terminal a bar redraws every second; in a log file or a pipe (CI) it writes a line at most every 30 s,
so a 10-minute build adds about 20 lines, not thousands. `TQDM_DISABLE=1` turns every bar off (tqdm reads it).
"""

from __future__ import annotations

import itertools
import os
import queue
import sys
from collections.abc import Callable

from tqdm.auto import tqdm
from transformers import TrainerCallback


def progress_bar(total: int, desc: str, unit: str = "step", show: bool = True) -> tqdm:
    """A bar on stderr for `total` units of `desc` (`show=False`: none); use it as a context manager. In a worker
    process that relays (`relay_to`), the bar is drawn by the parent."""
    if _relay is not None:
        return _RelayedBar(total, desc, unit, show)
    tty = sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
                mininterval=1.0 if tty else 30.0, disable=not show)


def say(line: str) -> None:
    """Print a line of results on stdout without breaking a bar being drawn (in a relaying worker: by the parent)."""
    if _relay is not None:
        _relay.put((None, "say", line))
        return
    tqdm.write(line, file=sys.stdout)


# In a worker process (`relay_to`): the queue its bars and `say` lines go to, for the parent to draw
# (`draw_relayed`); two processes drawing on one terminal overwrite each other's bars.
_relay = None
_bar_ids = itertools.count()


def relay_to(channel) -> None:
    """Send this process's bars and `say` lines to `channel` (a multiprocessing queue) instead of the terminal."""
    global _relay
    _relay = channel


class _RelayedBar:
    """What `progress_bar` returns in a relaying process: opening, updating and closing, sent as messages."""

    def __init__(self, total: int, desc: str, unit: str, show: bool):
        self.key, self.n, self.show = (os.getpid(), next(_bar_ids)), 0, show
        self._send("open", total, desc, unit)

    def _send(self, *message) -> None:
        if self.show:
            _relay.put((self.key, *message))

    def update(self, n: int = 1) -> None:
        self.n += n
        self._send("update", n)

    def close(self) -> None:
        self._send("close")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def relay_done() -> None:
    """Tell the drawing process that this worker's task has sent everything (messages of one process arrive in
    order, so nothing of the task comes after this)."""
    _relay.put((None, "done"))


def draw_relayed(channel, tasks: int, running: Callable[[], bool]) -> None:
    """Draw what workers send on `channel` until `tasks` tasks said `relay_done`, or no worker is `running()` and
    the channel is empty (a worker that died says nothing more)."""
    bars = {}
    while tasks:
        try:
            key, kind, *args = channel.get(timeout=1)
        except queue.Empty:
            if not running():
                break
            continue
        if kind == "done":
            tasks -= 1
        elif kind == "say":
            say(*args)
        elif kind == "open":
            bars[key] = progress_bar(*args)
        elif kind == "update" and key in bars:
            bars[key].update(*args)
        elif kind == "close" and key in bars:
            bars.pop(key).close()
    for bar in bars.values():
        bar.close()


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
