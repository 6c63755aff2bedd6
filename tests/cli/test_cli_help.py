"""The CLI explains itself: `--version`, a description on every subcommand page, help on every option, long flags that
name the thing, and one module per command."""

import argparse
import subprocess
import sys

from adaptguard import __version__
from adaptguard.cli import build_parser


def pages(parser, path=("adaptguard",)):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from pages(sub, (*path, name))


def test_every_page_has_a_description_and_every_option_help():
    seen = 0
    for path, parser in pages(build_parser()):
        assert parser.description, f"{' '.join(path)}: no description"
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            assert action.help, f"{' '.join(path)} {'/'.join(action.option_strings) or action.dest}: no help"
            seen += 1
    assert seen > 60


COMMANDS = ["demo", "compare", "evaluate", "tasks-dir", "lm-eval", "compat-tasks", "cache-logits", "update", "drift",
            "select", "embedded", "built"]


def test_version_and_long_flags():
    proc = subprocess.run([sys.executable, "-m", "adaptguard.cli", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == f"adaptguard {__version__}"
    ns = build_parser().parse_args(["compare", "a", "b", "--n-boot", "7", "--markdown", "r.md"])
    assert ns.n_boot == 7 and ns.markdown == "r.md"
    ns = build_parser().parse_args(["drift", "corrupt", "d.jsonl", "--similarity", "0.5", "--out", "o", "--text-column",
                                    "body"])
    assert ns.similarity == 0.5 and ns.text_column == "body"
    short = [f"{' '.join(path)} {o}" for path, parser in pages(build_parser()) for action in parser._actions
             for o in action.option_strings if o.startswith("--") and len(o) <= 3]
    assert not short, f"one-letter long flags: {short}"


def test_one_module_per_command():
    """`adaptguard --help` offers these commands, each defined by its own module of adaptguard.cli (tasks-dir in
    tasks_dir.py), which adds that one command and nothing else."""
    import importlib
    from pathlib import Path

    parser = build_parser()
    top = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert list(top.choices) == COMMANDS
    folder = Path(importlib.import_module("adaptguard.cli").__file__).parent
    modules = sorted(p.stem for p in folder.glob("*.py"))
    assert sorted(c.replace("-", "_") for c in COMMANDS) == [m for m in modules if m not in ("__init__", "__main__",
                                                                                           "common", "main")]
    for command in COMMANDS:
        module = importlib.import_module(f"adaptguard.cli.{command.replace('-', '_')}")
        sub = argparse.ArgumentParser().add_subparsers()
        module.add(sub)
        assert list(sub.choices) == [command]
