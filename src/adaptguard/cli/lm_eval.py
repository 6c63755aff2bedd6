"""`adaptguard lm-eval`, `tasks-dir` and `compat-tasks`: lm-eval with every adaptguard task directory, and
compat_<name> variants of any task."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

LM_EVAL_EXAMPLE = "example: " + "adaptguard lm-eval run --model hf --model_args pretrained=built:smollm2 --tasks compat_arc_easy"
COMPAT_TASKS_EXAMPLE = "example: " + "adaptguard compat-tasks mmlu arc_easy --out compat-tasks/"


def _tasks_dir(ns: argparse.Namespace) -> int:
    from ..plugins import lm_eval_task_dirs

    dirs = lm_eval_task_dirs()
    print(dirs[0] if not ns.all else "\n".join(map(str, dirs)))
    return 0


def _model_names(arg: str) -> str:
    """`--model_args pretrained=built:smollm2,...`: each `embedded:<name>` or `built:<name>` value becomes that
    model's local path."""
    import re

    from ..models.embedded import resolve_model

    return re.sub(r"(?<==)(?:embedded|built):[\w-]+", lambda m: resolve_model(m.group(0)), arg)


def run_lm_eval(argv: list[str]) -> int:
    """The real lm-eval CLI with every task directory of the `adaptguard_lm_eval_task_dirs` hook visible.

    lm-eval's CLI takes one `--include_path`, so the plugin directories (after the user's own
    `--include_path`, if given, so that it comes first as before) are gathered into one temporary folder of
    symlinks (`compat.harness.gathered_include_path`), which replaces the option; nothing of lm-eval is patched."""
    import tempfile

    from lm_eval.__main__ import cli_evaluate

    from ..compat.harness import gathered_include_path
    from ..plugins import lm_eval_task_dirs

    argv, user_dirs = [_model_names(a) for a in argv], []
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
    old_argv = sys.argv
    with tempfile.TemporaryDirectory(prefix="adaptguard-lm-eval-tasks-") as tmp:
        include = gathered_include_path([*user_dirs, *lm_eval_task_dirs()], Path(tmp))
        _add_compat_variants(argv, include)
        sys.argv = ["lm_eval", *argv, "--include_path", str(include)]
        try:
            cli_evaluate()
        except SystemExit as done:
            return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        finally:
            sys.argv = old_argv
    return 0


def _add_compat_variants(argv: list[str], include: Path) -> None:
    """Write `compat_<name>` variants (`compat.variants`) into `include` for each `--tasks` name of that form that
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
    from lm_eval.tasks import TaskManager

    from ..compat.variants import write_compat_tasks

    manager = TaskManager(include_path=str(include))
    missing = [n for n in names if n not in manager.task_index]
    if missing:
        write_compat_tasks(missing, include / "generated-compat-variants", task_manager=manager)


def _compat_tasks(ns: argparse.Namespace) -> int:
    from ..compat.variants import write_compat_tasks

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


def _lm_eval(ns: argparse.Namespace) -> int:
    return run_lm_eval(ns.args)


def add(sub) -> None:
    tdir = sub.add_parser(
        "tasks-dir",
        epilog="example: " + "lm_eval --include_path \"$(adaptguard tasks-dir)\" --tasks 'compose_logic_*' ...",
        help="Print adaptguard's lm-eval task directory, for lm_eval --include_path.",
    )
    tdir.add_argument("--all", action="store_true", help="every task directory contributed by plugins, one a line")
    tdir.set_defaults(func=_tasks_dir)
    lme = sub.add_parser(
        "lm-eval",
        epilog=LM_EVAL_EXAMPLE,
        help="Run lm-eval with every adaptguard and plugin task directory included.",
        add_help=False,
    )
    lme.add_argument("args", nargs=argparse.REMAINDER, help="lm-eval's own arguments (see adaptguard lm-eval --help)")
    lme.set_defaults(func=_lm_eval)
    ct = sub.add_parser(
        "compat-tasks",
        epilog=COMPAT_TASKS_EXAMPLE,
        help="Write compat_<name> lm-eval tasks: any task scored as it is, plus its flips against a reference run.",
    )
    ct.add_argument("names", nargs="+", help="task, group or tag names (e.g. mmlu arc_easy)")
    ct.add_argument("--out", required=True, help="directory to write the YAMLs into")
    ct.add_argument(
        "--include-path",
        dest="include_path",
        action="append",
        help="your own task folders, as lm_eval's --include_path (repeatable)",
    )
    ct.set_defaults(func=_compat_tasks)
