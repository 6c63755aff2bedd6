"""`adaptguard select`: choose the tasks to mix into a multitask fine-tune (Xu's thesis)."""

from __future__ import annotations

import argparse

from .common import add_command, add_embedding_options, finite_float, positive_int

SELECT_EXAMPLE = "example: " + "adaptguard select --target target.jsonl --candidates a.jsonl b.jsonl --out mixture.jsonl"


def _select(ns: argparse.Namespace) -> int:
    import json

    from ..models.embedded import default_model
    from ..selection.jobs import run_select
    from ..utils.files import check_dataset_output

    if ns.out is not None:
        check_dataset_output(ns.out, "--out")  # before the embedded default model is built or loaded
    report = run_select(
        ns.target,
        ns.candidates,
        model=default_model(ns.model),
        embedder=ns.embedder,
        p=ns.min_gain,
        method=ns.method,
        feature=ns.feature,
        k=ns.num_tasks,
        seed=ns.seed,
        out=ns.out,
        max_examples=ns.max_examples,
        text_column=ns.text_column,
        split=ns.split,
        device=ns.device,
    )
    print(json.dumps(report, indent=2))
    return 0


def add(sub) -> None:
    sel = add_command(
        sub,
        "select",
        extra="train",
        epilog=SELECT_EXAMPLE,
        help="Choose the tasks to mix into a multitask fine-tune for a target task; write the mixture.",
    )
    sel.add_argument("--target", required=True, help="the target task's dataset (Hub name, directory or file)")
    sel.add_argument("--candidates", nargs="+", required=True, help="candidate task datasets")
    sel.add_argument("--min-gain", type=finite_float, default=0.05,
                     help="p: the minimum relative coverage gain to add a task (default 0.05)")
    sel.add_argument(
        "--method",
        default="full",
        choices=["full", "no_consistency", "no_diversity", "random"],
        help="full: consistency and coverage; no_consistency, no_diversity, random: each criterion left out, for comparison",
    )
    sel.add_argument(
        "--feature",
        default="mean",
        choices=["mean", "pc1"],
        help="compare tasks by their mean embedding (mean) or by their first principal component (pc1)",
    )
    sel.add_argument("--num-tasks", type=positive_int, help="number of tasks for the no_diversity/random ablations")
    sel.add_argument("--out", help="write the mixture here (.jsonl file or directory)")
    add_embedding_options(sel)
    sel.set_defaults(func=_select)
