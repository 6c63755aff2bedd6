"""Seed sweeps of the embedded-model experiments: mean and min–max over seeds, and the machine they ran on.

The toy experiments train models in-process, and their floats depend on the CPU's kernels (AVX2,
AVX-512, scalar) and thread count: a difference of a few test items between two methods can be noise.
So the experiments report the spread over seeds and name the machine, and a claim is stated as holding
only where it holds beyond that spread.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence

import numpy as np
import torch


def machine_info() -> dict:
    """The CPU, torch's kernel capability and thread count, and the library versions the numbers came from."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": platform.python_version(), "system": platform.system()}


def machine_line(info: dict) -> str:
    """One Markdown line naming the machine of `machine_info()`."""
    threads = f"{info['threads']} thread" + ("s" if info["threads"] != 1 else "")
    return (f"Measured on {info['cpu']} ({info['system']}, torch {info['torch']}, {info['cpu_capability']} "
            f"kernels, {threads}).")


def spread(values: Sequence[float]) -> dict:
    """{"mean", "min", "max", "n"} of `values` (one per seed)."""
    if len(values) == 0:
        raise ValueError("spread needs at least one value")
    arr = np.asarray(values, dtype=float)
    return {"mean": float(arr.mean()), "min": float(arr.min()), "max": float(arr.max()), "n": len(arr)}


def format_spread(s: dict, fmt: str = ".3f", scale: float = 1.0) -> str:
    """`mean (min–max)`, or just the value for a single seed; `scale` e.g. 100 for percent."""
    mean = format(scale * s["mean"], fmt)
    return mean if s["n"] == 1 else f"{mean} ({format(scale * s['min'], fmt)}–{format(scale * s['max'], fmt)})"


def seed_list(n: int) -> list[int]:
    """Seeds 0 … n−1, checking `n` (a CLI's `--seeds`)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"--seeds: expected a positive integer, got {n!r}")
    return list(range(n))


def command_line(script: str, args) -> str:
    """The shell command that reruns `script` with `args` (an HfArgumentParser dataclass): the fields that differ
    from their defaults, as flags, e.g. `python examples/x.py --quick --limit 50`."""
    import dataclasses
    import shlex

    flags = []
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        if f.default is dataclasses.MISSING or value == f.default:
            continue
        flags += [f"--{f.name}"] if value is True else [f"--{f.name}", str(value)]
    return shlex.join(["python", script, *flags])


def report_footer(report: dict) -> str:
    """The last line of an experiment's Markdown: wall time, the command that reproduces it, the machine."""
    return (f"Total time {report['seconds'] / 60:.1f} min. Reproduce: `{report['settings']['command']}`. "
            + machine_line(report["machine"]))
