"""Running a block with a given number of torch threads, restoring the process's setting afterwards."""

from __future__ import annotations

from contextlib import contextmanager

import torch


@contextmanager
def torch_threads(n: int | None):
    """Use `n` intra-op threads inside the block (None: leave torch's setting alone).

    The embedded-model experiments train models of a few thousand weights, where thread synchronisation
    costs more than it saves (5-100x slower with two threads on a busy 2-core machine, measured)."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
