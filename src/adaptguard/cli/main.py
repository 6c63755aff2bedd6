"""The `adaptguard` command line: one module per command (its arguments, help and run function), put together here."""

from __future__ import annotations

import argparse
import sys

from ..compat.verdicts import EXIT_BAD_INPUT
from . import built, cache_logits, compare, compat_tasks, demo, drift, embedded, evaluate, lm_eval, select, tasks_dir, update


class _OneLineParser(argparse.ArgumentParser):
    """argparse's refusals without the usage it prints first (8–9 lines for `compare`): one line naming the argument,
    exit 2, and where the usage is. Subcommands' parsers are of the same class (`add_subparsers` uses the parent's)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (--help for usage)\n")


def build_parser():
    from .. import __version__

    parser = _OneLineParser(prog="adaptguard", description="Adapt and update LLMs without breaking what already works.")
    parser.add_argument("--version", action="version", version=f"adaptguard {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (demo, compare, evaluate, tasks_dir, lm_eval, compat_tasks, cache_logits, update, drift, select, embedded,
                    built):
        command.add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from ..utils.quiet import hide_unused_library_noise

    hide_unused_library_noise()  # e.g. bitsandbytes' kernel download note, said only when a 4-bit model is loaded
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["lm-eval"]:  # pass everything, --help included, to lm-eval itself
        return _guarded("lm-eval", lambda: lm_eval.run_lm_eval(argv[1:]), "eval")
    ns = build_parser().parse_args(argv)
    return _guarded(ns.command, lambda: ns.func(ns), ns.extra)


def _guarded(command: str, fn, extra: str | None = None) -> int:
    """Run a command: bad input, a file-system error or a missing extra is one line on stderr and exit 2."""
    from ..extras import missing_extra, require

    try:
        if extra:
            require(extra, f"adaptguard {command}")
        return fn()
    except (ValueError, OSError, ImportError) as err:  # bad input, file-system errors, a missing extra
        if isinstance(err, ModuleNotFoundError):
            err = missing_extra(err, f"adaptguard {command}", extra) or err
        detail = f"{err.strerror}: {err.filename}" if isinstance(err, OSError) and err.filename and err.strerror else str(err)
        print(f"adaptguard {command}: error: {detail}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print(f"adaptguard {command}: interrupted", file=sys.stderr)
        return 130
