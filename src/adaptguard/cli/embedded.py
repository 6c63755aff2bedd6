"""`adaptguard embedded`: the local path of a model shipped with the package (`--fingerprint`, `--rebuild`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import add_command

HELP = "Print the local path of a model shipped with the package (embedded:tiny, embedded:tiny-v2)."
EXAMPLE = "example: " + "adaptguard embedded tiny --fingerprint"


def _run(ns: argparse.Namespace) -> int:
    from ..models.embedded import embedded_model_path, rebuild_embedded, shipped_manifest, weights_fingerprint

    if ns.rebuild:
        report = rebuild_embedded(ns.name, ns.rebuild)
        print(
            f"rebuilt {ns.name!r} in {report['seconds']:.0f} s on {report['machine']['cpu']}: {ns.rebuild} "
            f"(report: {Path(ns.rebuild) / 'rebuild.json'})"
        )
        prints = report["fingerprints"]
        if report["identical"]:
            print(f"  weights: bit-identical to the shipped build (fingerprint {prints['shipped'][:12]})")
        else:
            print(
                f"  weights: differ from the shipped build ({prints['rebuilt'][:12]} != {prints['shipped'][:12]}): "
                f"max |dw| {report['max_abs_diff']:.3g} over {report['tensors_differing']} of "
                f"{report['tensors_compared']} tensors"
            )
        print(f"  tokenizer: {'identical' if report['tokenizer_identical'] else 'differs'}")
        acc = report["general_accuracy"]
        print(
            f"  general probes: shipped {acc['shipped']:.3f}, rebuilt {acc['rebuilt']:.3f} "
            f"({report['answers_differing']} of {report['general_probes']} answers differ)"
        )
        if not (report["same_recipe"] and report["same_libraries"]):
            print("  note: the recipe or the torch/transformers/tokenizers versions differ from the shipped build's")
        return 0  # a difference is information: trainings differ across CPUs (docs/reproducibility.md)
    path = embedded_model_path(ns.name)
    print(path)
    if ns.fingerprint:
        shipped = shipped_manifest().get(ns.name, {}).get("fingerprint")
        print(f"fingerprint {weights_fingerprint(path)} (shipped: {shipped or 'none, a local build'})")
    return 0


def add(sub) -> None:
    parser = add_command(sub, "embedded", extra="train", help=HELP, epilog=EXAMPLE)
    parser.add_argument("name", nargs="?", default="tiny", help="tiny (default) or tiny-v2")
    parser.add_argument("--fingerprint", action="store_true",
                        help="also print the SHA-256 of the weights and the one recorded for the shipped build")
    parser.add_argument("--rebuild", metavar="DIR",
                        help="train tiny or tiny-v2 on this machine by its recipe into the new directory DIR and report "
                        "how far it lands from the shipped weights (max |dw|, general-probe accuracy of both)")
    parser.set_defaults(func=_run)
