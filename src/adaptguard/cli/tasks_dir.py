"""`adaptguard tasks-dir`: adaptguard's lm-eval task directory (all of the plugins' with `--all`), for
`lm_eval --include_path`."""

from __future__ import annotations

import argparse

from .common import add_command

HELP = "Print adaptguard's lm-eval task directory, for lm_eval --include_path."
EXAMPLE = "example: " + "lm_eval --include_path \"$(adaptguard tasks-dir)\" --tasks 'compose_logic_*' ..."


def _run(ns: argparse.Namespace) -> int:
    from ..plugins import lm_eval_task_dirs

    dirs = lm_eval_task_dirs()
    print(dirs[0] if not ns.all else "\n".join(map(str, dirs)))
    return 0


def add(sub) -> None:
    parser = add_command(sub, "tasks-dir", help=HELP, epilog=EXAMPLE)
    parser.add_argument("--all", action="store_true", help="every task directory contributed by plugins, one a line")
    parser.set_defaults(func=_run)
