"""What every command shares: argument types, the parser that also answers to `--dash_option`, and the
default model."""

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


class _HideAliases(argparse.HelpFormatter):
    """Help that shows `--dash-option` and not its `--dash_option` twin (an alias kept for lm-eval/TRL habits)."""

    def _format_action_invocation(self, action):
        import copy

        strings = action.option_strings
        shown = [o for o in strings if not (o.startswith("--") and "_" in o and o.replace("_", "-") in strings)]
        if shown != strings:
            action = copy.copy(action)
            action.option_strings = shown
        return super()._format_action_invocation(action)


class _HideAliasesRaw(_HideAliases, argparse.RawDescriptionHelpFormatter):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse with lm-eval/TRL habits: every `--dash-option` also answers to `--dash_option` (not shown in the
    help), and a subcommand's page shows its one-line help as its description."""

    def __init__(self, *args, **kwargs):
        if kwargs.get("formatter_class") in (None, argparse.HelpFormatter):
            kwargs["formatter_class"] = _HideAliases
        elif kwargs["formatter_class"] is argparse.RawDescriptionHelpFormatter:
            kwargs["formatter_class"] = _HideAliasesRaw
        super().__init__(*args, **kwargs)

    def add_argument(self, *names, **kwargs):
        aliases = ["--" + n[2:].replace("-", "_") for n in names if n.startswith("--") and "-" in n[2:]]
        return super().add_argument(*names, *[a for a in aliases if a not in names], **kwargs)

    def add_subparsers(self, **kwargs):
        action = super().add_subparsers(**kwargs)
        add_parser = action.add_parser

        def add_with_description(name, **kw):
            kw.setdefault("description", kw.get("help"))
            return add_parser(name, **kw)

        action.add_parser = add_with_description
        return action


def _default_model(name: str | None) -> str:
    """The embedded default when no model is named: every command runs offline. `embedded:<name>` or
    `built:<name>` names one of ours."""
    from ..models.embedded import embedded_model_path, resolve_model

    if name:
        name = resolve_model(name)
        from ..utils.data import check_local_path

        check_local_path(name, "model")
        return name
    return str(embedded_model_path("tiny"))


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)


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
