"""The CLI explains itself: `--version`, a description on every subcommand page, help on every option, and the
underscore spellings lm-eval and TRL users type (`--n_boot` for `--n-boot`)."""

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


def test_version_and_underscore_aliases():
    proc = subprocess.run([sys.executable, "-m", "adaptguard.cli", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == f"adaptguard {__version__}"
    ns = build_parser().parse_args(["compare", "a", "b", "--n_boot", "7", "--markdown", "r.md"])
    assert ns.n_boot == 7 and ns.markdown == "r.md"
    ns = build_parser().parse_args(["drift", "corrupt", "d.jsonl", "--r", "0.5", "--out", "o", "--text_column", "body"])
    assert ns.text_column == "body"
