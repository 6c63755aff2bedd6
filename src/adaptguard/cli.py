"""The `adaptguard` command line."""

from __future__ import annotations

import argparse
import sys


def _demo(ns: argparse.Namespace) -> int:
    from .demo import run_demo

    print(f"adaptguard demo{' (quick)' if ns.quick else ''}: writing {ns.out}/report.md", flush=True)
    report = run_demo(ns.out, quick=ns.quick)
    print(f"done in {report['seconds']:.0f} s: {ns.out}/report.md, {ns.out}/report.json, {ns.out}/tradeoff.png")
    return 0


def _embedded(ns: argparse.Namespace) -> int:
    from .embedded import embedded_model_path

    print(embedded_model_path(ns.name))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="adaptguard", description="Adapt and update LLMs without breaking "
                                     "what already works.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="Run the end-to-end demo on the embedded default model (offline).")
    demo.add_argument("--out", default="demo-out", help="Output directory (default: demo-out).")
    demo.add_argument("--quick", action="store_true", help="SFT vs TALR at two learning rates only (CI smoke).")
    demo.set_defaults(func=_demo)
    emb = sub.add_parser("embedded", help="Build (once) and print the local path of an embedded default model, "
                         "usable wherever a Hub id is accepted.")
    emb.add_argument("name", nargs="?", default="tiny")
    emb.set_defaults(func=_embedded)
    return parser


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        return ns.func(ns)
    except (ValueError, FileNotFoundError) as err:
        print(f"adaptguard {ns.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
