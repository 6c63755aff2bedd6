"""What the commands share: argument types and the subcommand maker (the gate's `compare` among them, so nothing here
imports beyond the core: what resolves model names is `adaptguard.models.embedded`'s)."""

from __future__ import annotations

import argparse


def finite_float(text: str) -> float:
    """argparse type: a float that is not NaN or infinite (argparse's float accepts "nan" and "inf")."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer ≥ 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def significance(text: str) -> float | None:
    """argparse type: α in (0, 1), or `off` (raw values compared, no test)."""
    if text.lower() == "off":
        return None
    value = finite_float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a level in (0, 1) such as 0.05, or off; got {text!r}")
    return value


def gate_threshold(text: str):
    """argparse type: a `--fail-on` threshold (`compat.gate.Threshold`), its error in argparse's words."""
    from ..compat.gate import GateError, Threshold

    try:
        return Threshold.parse(text)
    except GateError as err:  # argparse names the flag itself: "argument --fail-on: 'nfr>>1': ..."
        raise argparse.ArgumentTypeError(str(err).removeprefix("--fail-on ")) from None


def add_command(sub, name: str, help: str, extra: str | None = None, **kwargs) -> argparse.ArgumentParser:
    """A subcommand whose own page (`adaptguard NAME --help`) opens with the one line the command list shows.
    `extra`: the extra of pyproject.toml it needs beyond the core (`train`, `eval`), checked before it runs."""
    parser = sub.add_parser(name, help=help, description=help, **kwargs)
    parser.set_defaults(extra=extra)
    return parser


DEFAULT_ALPHA = 0.05


def add_embedding_options(parser) -> None:
    """The options of the commands that embed datasets (`drift risk`, `select`)."""
    parser.add_argument("--model", help="embedding model, Hub id or path (default: the embedded tiny model)")
    parser.add_argument("--embedder", default="mean_pooled", help="registered embedder (mean_pooled, sentence, ...)")
    parser.add_argument("--max-examples", type=positive_int, default=256, help="rows embedded per dataset (seeded sample)")
    parser.add_argument("--text-column", default="text", help="column holding the text (default text)")
    parser.add_argument("--split", default="train", help="dataset split (default train)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the row sample and ablations (default 0)")
    parser.add_argument("--device", default="cpu", help="torch device for the embedder (default cpu)")
