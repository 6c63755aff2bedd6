"""`adaptguard compat-tasks`: `compat_<name>` lm-eval tasks — any task scored as it is, plus its flips against a
reference run."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import add_command

HELP = "Write compat_<name> lm-eval tasks: any task scored as it is, plus its flips against a reference run."
EXAMPLE = "example: " + "adaptguard compat-tasks mmlu arc_easy --out compat-tasks/"


def _run(ns: argparse.Namespace) -> int:
    from ..compat.harness.variants import write_compat_tasks

    for d in ns.include_path or []:
        if not Path(d).is_dir():
            raise ValueError(f"--include-path {d}: no such directory")
    written = write_compat_tasks(ns.names, ns.out, include_path=ns.include_path)
    print("\n".join(map(str, written)))
    print(
        f"use: lm_eval --include_path {ns.out} --tasks {','.join('compat_' + n.removeprefix('compat_') for n in ns.names)}"
        ' --metadata \'{"compat_reference": "runs/old"}\' --log_samples ...'
    )
    return 0


def add(sub) -> None:
    parser = add_command(sub, "compat-tasks", extra="eval", help=HELP, epilog=EXAMPLE)
    parser.add_argument("names", nargs="+", help="task, group or tag names (e.g. mmlu arc_easy)")
    parser.add_argument("--out", required=True, help="directory to write the YAMLs into")
    parser.add_argument("--include-path", action="append",
                        help="your own task folders, as lm_eval's --include_path (repeatable)")
    parser.set_defaults(func=_run)
