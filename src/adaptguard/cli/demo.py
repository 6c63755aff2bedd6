"""`adaptguard demo`: the end-to-end demo on the embedded default model, offline."""

from __future__ import annotations

import argparse

from .common import add_command

DEMO_EXAMPLE = "example: " + "adaptguard demo --out demo-out"


def _demo(ns: argparse.Namespace) -> int:
    if ns.seeds is not None:
        from ..utils.sweeps import seed_list  # (imports torch: only when there is something to check)

        seed_list(ns.seeds)  # a bad --seeds fails before anything is announced or written
    # said before the heavy imports (torch, transformers, TRL: several seconds on a fresh machine)
    print(f"adaptguard demo{' (quick)' if ns.quick else ''}: writing {ns.out}/report.md", flush=True)
    from ..demo.run import run_demo

    report = run_demo(ns.out, quick=ns.quick, seeds=ns.seeds)
    print(f"done in {report['seconds']:.0f} s: {ns.out}/report.md, {ns.out}/report.json, {ns.out}/tradeoff.png")
    return 0


def add(sub) -> None:
    demo = add_command(sub, "demo", extra="train", epilog=DEMO_EXAMPLE,
                       help="Run the end-to-end demo on the embedded default model (offline).")
    demo.add_argument("--out", default="demo-out", help="Output directory (default: demo-out).")
    demo.add_argument("--quick", action="store_true", help="SFT vs TALR at two learning rates only (CI smoke).")
    demo.add_argument(
        "--seeds",
        type=int,
        help="run every section over seeds 0..N-1 and report mean and min-max "
        "(default: the trade-off over 2 seeds, the other sections once)",
    )
    demo.set_defaults(func=_demo)
