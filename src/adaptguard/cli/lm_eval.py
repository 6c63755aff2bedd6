"""`adaptguard lm-eval`: the lm-eval CLI with every adaptguard and plugin task directory included, and `compat_<name>`
variants of any task written on the fly."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import add_command

HELP = "Run lm-eval with every adaptguard and plugin task directory included."
EXAMPLE = "example: " + "adaptguard lm-eval run --model hf --model_args pretrained=built:smollm2 --tasks compat_arc_easy"


def run_lm_eval(argv: list[str]) -> int:
    """The real lm-eval CLI with every task directory of the `adaptguard_lm_eval_task_dirs` hook visible.

    lm-eval's CLI takes one `--include_path`, so the plugin directories (after the user's own
    `--include_path`, if given, so that it comes first as before) are gathered into one temporary folder of
    symlinks (`compat.harness.tasks.gathered_include_path`), which replaces the option; nothing of lm-eval is patched."""
    import tempfile

    from ..compat.harness.tasks import gathered_include_path, lm_eval_cli
    from ..models.embedded import resolve_model_names
    from ..plugins import lm_eval_task_dirs

    argv, user_dirs = [resolve_model_names(a) for a in argv], []
    for i, arg in enumerate(argv):
        if arg == "--include_path" and i + 1 < len(argv):
            user_dirs, argv = [Path(argv[i + 1])], argv[:i] + argv[i + 2 :]
            break
        if arg.startswith("--include_path="):
            user_dirs, argv = [Path(arg.split("=", 1)[1])], argv[:i] + argv[i + 1 :]
            break
    for d in user_dirs:
        if not d.is_dir():
            raise ValueError(f"--include_path {d}: no such directory")
    with tempfile.TemporaryDirectory(prefix="adaptguard-lm-eval-tasks-") as tmp:
        include = gathered_include_path([*user_dirs, *lm_eval_task_dirs()], Path(tmp))
        _add_compat_variants(argv, include)
        return lm_eval_cli([*argv, "--include_path", str(include)])


def _add_compat_variants(argv: list[str], include: Path) -> None:
    """Write `compat_<name>` variants (`compat.harness.variants`) into `include` for each `--tasks` name of that form that
    no task folder defines (the hand-written compat tasks and globs are left to lm-eval)."""
    names = []
    for i, arg in enumerate(argv):
        value = (
            argv[i + 1]
            if arg == "--tasks" and i + 1 < len(argv)
            else arg.split("=", 1)[1]
            if arg.startswith("--tasks=")
            else None
        )
        if value is not None:
            names += [n.strip() for n in value.split(",") if n.strip().startswith("compat_") and not any(c in n for c in "*?[")]
    if not names:
        return
    from ..compat.harness.callback import task_manager
    from ..compat.harness.variants import PREFIX, write_compat_tasks

    missing = [n for n in names if n not in task_manager(include, []).task_index]
    if missing:  # written from the tasks they vary, which may be lm-eval's own
        write_compat_tasks(missing, include / "generated-compat-variants",
                           task_manager=task_manager(include, [n.removeprefix(PREFIX) for n in missing]))


def _run(ns: argparse.Namespace) -> int:
    return run_lm_eval(ns.args)


def add(sub) -> None:
    # never parsed here: `main` hands everything after `lm-eval` to lm-eval (its --help included); this entry lists it
    parser = add_command(sub, "lm-eval", extra="eval", help=HELP, epilog=EXAMPLE, add_help=False)
    parser.add_argument("args", nargs=argparse.REMAINDER, help="lm-eval's own arguments (see adaptguard lm-eval --help)")
    parser.set_defaults(func=_run)
