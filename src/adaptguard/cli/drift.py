"""`adaptguard drift`: task-similarity drift (Ni et al.) — the bound, the synthetic experiment, similarity
corruption, prompt styles and the drift risk of a dataset."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import add_command, add_embedding_options, finite_float, positive_int

DRIFT_EXAMPLE = "example: " + "adaptguard drift risk --finetune new_data.jsonl --keep old_task.jsonl"
BOUND_EXAMPLE = "example: " + "adaptguard drift bound --out bound.png"
EXPERIMENT_EXAMPLE = "example: " + "adaptguard drift experiment --quick --out drift-out"
CORRUPT_EXAMPLE = "example: " + "adaptguard drift corrupt data.jsonl --similarity 0.5 --out half-similar.jsonl"
STYLES_EXAMPLE = "example: " + "adaptguard drift styles qa.jsonl --style question_answer --out qa-styled.jsonl"
RISK_EXAMPLE = "example: " + "adaptguard drift risk --finetune new_data.jsonl --keep old_task.jsonl --json risk.json"


def _drift_bound(ns: argparse.Namespace) -> int:
    import numpy as np

    from ..drift.plots import plot_theorem_a2
    from ..drift.theory import theorem_a2_argmax, theorem_a2_curve

    params = dict(
        n=ns.samples, d=ns.length, alpha_i=ns.alpha_i, alpha_j=ns.alpha_j, delta=ns.delta, k_mis=ns.k_mis,
        lambda_l=ns.lambda_l, mu_l=ns.mu_l,
    )
    if ns.points < 2:
        raise ValueError(f"--points must be at least 2, got {ns.points}")
    r = np.linspace(0.0, 1.0, ns.points)
    f = theorem_a2_curve(r, **params)
    peak, paper = theorem_a2_argmax(**params), theorem_a2_argmax(**params, formula="A32")
    print(
        f"Theorem A2 lower bound f(r): maximiser r* = {peak:.4f} (f = {float(theorem_a2_curve(peak, **params)):.4g}); "
        f"(A32) gives {paper:.4f}"
    )
    plot_theorem_a2(r, f, peak, ns.out, paper_argmax=paper)
    print(f"plot: {ns.out}")
    return 0


def _drift_experiment(ns: argparse.Namespace) -> int:
    from ..drift.sweep import run_drift_experiment
    from ..utils.threads import torch_threads

    with torch_threads(ns.threads):
        from ..utils.sweeps import seed_list

        # repetition k uses seed k: --seeds N runs seeds 0..N-1 at every r
        overrides = {} if ns.seeds is None else {"repetitions": len(seed_list(ns.seeds))}
        report = run_drift_experiment(ns.out, quick=ns.quick, **overrides)
    for r, mean, lo, hi in zip(report["r"], report["loss_mean"], report["loss_min"], report["loss_max"]):
        print(f"r = {r:.3f}: next-bit loss on c0 {mean:.4f} (min {lo:.4f}, max {hi:.4f})")
    print(f"highest mean loss at r = {report['peak_r']:.3f} over {len(report['losses'][0])} seeds")
    print(f"{ns.out}/drift.json, {ns.out}/drift.png")
    return 0


def _drift_corrupt(ns: argparse.Namespace) -> int:
    from transformers import AutoTokenizer

    from ..drift.data import corrupt_to_similarity, kept_fraction
    from ..models.embedded import default_model
    from ..utils.data import load_any_dataset
    from ..utils.files import check_dataset_output, write_dataset

    check_dataset_output(ns.out, "--out")  # refuse to replace a user's directory before any work
    tokenizer = AutoTokenizer.from_pretrained(default_model(ns.tokenizer), trust_remote_code=False)
    data = corrupt_to_similarity(
        load_any_dataset(ns.dataset, ns.split),
        ns.similarity,
        tokenizer,
        n_strings=ns.n_strings,
        length=ns.length,
        seed=ns.seed,
        text_column=ns.text_column,
    )
    write_dataset(data, ns.out)
    print(f"{len(data)} rows at similarity r = {ns.similarity} (kept fraction {kept_fraction(data):.4f}) -> {ns.out}")
    return 0


def _drift_styles(ns: argparse.Namespace) -> int:
    from ..drift.data import PROMPT_STYLES, reformat_prompt_style
    from ..utils.data import load_any_dataset
    from ..utils.files import check_dataset_output, write_dataset

    if ns.style != "list" and ns.style not in PROMPT_STYLES:
        raise ValueError(f"--style: unknown style {ns.style!r}; valid: list, {', '.join(PROMPT_STYLES)}")
    if ns.style == "list":
        for name, style in PROMPT_STYLES.items():
            print(f"{name}: {style.prompt!r} -> {style.completion!r}")
        return 0
    if not (ns.dataset and ns.out):
        raise ValueError("give DATASET and --out (or --style list)")
    check_dataset_output(ns.out, "--out")
    data = reformat_prompt_style(
        load_any_dataset(ns.dataset, ns.split), ns.style, question_column=ns.question_column, answer_column=ns.answer_column
    )
    write_dataset(data, ns.out)
    print(f"{len(data)} rows in style {ns.style!r} -> {ns.out}")
    return 0


def _drift_risk(ns: argparse.Namespace) -> int:
    import json

    from ..models.embedded import default_model
    from ..selection.jobs import run_drift_risk

    report = run_drift_risk(
        ns.finetune,
        ns.keep,
        model=default_model(ns.model),
        embedder=ns.embedder,
        band=(ns.band[0], ns.band[1]),
        max_examples=ns.max_examples,
        text_column=ns.text_column,
        split=ns.split,
        seed=ns.seed,
        device=ns.device,
    )
    for row in report["keep"]:
        flag = "  AT RISK (intermediate similarity)" if row["at_risk"] else ""
        print(f"{row['task']}: similarity {row['similarity']:.3f}{flag}")
    if ns.json:
        from ..utils.files import atomic_write_text

        atomic_write_text(Path(ns.json), json.dumps(report, indent=2))
    return 0


def add(sub) -> None:
    drift = add_command(
        sub,
        "drift",
        epilog=DRIFT_EXAMPLE,
        help="Measure task-similarity drift: the bound, the synthetic experiment, corruption, prompt styles, risk.",
    )
    dsub = drift.add_subparsers(dest="drift_command", required=True)
    bound = add_command(
        dsub,
        "bound",
        epilog=BOUND_EXAMPLE,
        help="Print where the lower bound on drift peaks as the data's similarity r varies, and plot the bound.",
    )
    # defaults: the paper's synthetic setting (d = L = 64, delta = 0.2, n0 = 100000, n1 = 16384); lambda, mu are free
    for flag, kind, default in (
        ("--samples", int, 116384),  # n = n0 + n1
        ("--length", int, 64),  # d = L, the bit strings' length
        ("--alpha-i", finite_float, 0.1408),
        ("--alpha-j", finite_float, 0.8592),
        ("--delta", finite_float, 0.2),
        ("--k-mis", finite_float, 1.0),
        ("--lambda-l", finite_float, 0.5),
        ("--mu-l", finite_float, 0.09),
        ("--points", int, 201),
    ):
        bound.add_argument(flag, type=kind, default=default, help=f"default {default}")
    bound.add_argument("--out", default="theorem_a2.png", help="PNG to write")
    bound.set_defaults(func=_drift_bound, command="drift bound")
    exp = add_command(
        dsub,
        "experiment",
        extra="train",
        epilog=EXPERIMENT_EXAMPLE,
        help="The synthetic experiment: train small GPT-2s on a base bit string plus data of similarity r, "
        "next-bit loss on the base string for r in {0, 1/8, ..., 7/8}.",
    )
    exp.add_argument("--quick", action="store_true", help="a smaller sweep (under 2 minutes on 2 CPU cores)")
    exp.add_argument("--out", default="drift-out", help="output directory for drift.json and drift.png")
    exp.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1: the models are tiny)")
    exp.add_argument("--seeds", type=int, help="repetitions (seeds 0..N-1) per r; default 5, 2 with --quick")
    exp.set_defaults(func=_drift_experiment, command="drift experiment")
    cor = add_command(
        dsub,
        "corrupt",
        extra="train",
        epilog=CORRUPT_EXAMPLE,
        help="Make a dataset of similarity r to the original: a share 1 - r of each row's tokens replaced by random "
        "strings from the data.",
    )
    cor.add_argument("dataset", help="Hub name, save_to_disk dir or .json/.jsonl/.csv/.parquet file")
    cor.add_argument("--similarity", type=finite_float, required=True, help="r: the fraction of tokens kept, in [0, 1]")
    cor.add_argument("--tokenizer", help="Hub id or path (default: the embedded tiny model's)")
    cor.add_argument("--out", required=True, help=".jsonl file or directory (save_to_disk)")
    cor.add_argument("--text-column", default="text", help="column holding the text (default text)")
    cor.add_argument("--split", default="train", help="dataset split (default train)")
    cor.add_argument(
        "--n-strings",
        type=positive_int,
        default=8,
        help="random token strings drawn from the data, one chosen per row (default 8)",
    )
    cor.add_argument("--length", type=positive_int, default=2048, help="tokens per random string (default 2048)")
    cor.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    cor.set_defaults(func=_drift_corrupt, command="drift corrupt")
    sty = add_command(
        dsub,
        "styles",
        extra="train",
        epilog=STYLES_EXAMPLE,
        help="Reformat a question/answer dataset in one of Ni et al.'s prompt styles (--style list prints them).",
    )
    sty.add_argument("dataset", nargs="?", help="Hub name, save_to_disk dir or .json/.jsonl/.csv/.parquet file")
    sty.add_argument("--style", required=True, help="a prompt style's name, or `list` to print every style with its template")
    sty.add_argument("--out", help=".jsonl file or directory (save_to_disk) to write")
    sty.add_argument("--question-column", default="question", help="column holding the question (default question)")
    sty.add_argument("--answer-column", default="answer", help="column holding the answer (default answer)")
    sty.add_argument("--split", default="train", help="dataset split (default train)")
    sty.set_defaults(func=_drift_styles, command="drift styles")
    risk = add_command(
        dsub,
        "risk",
        extra="train",
        epilog=RISK_EXAMPLE,
        help="Similarity of a fine-tuning dataset to each dataset to keep; flags the "
        "intermediate band where Ni et al. predicts the most drift.",
    )
    risk.add_argument("--finetune", required=True, help="the fine-tuning dataset (Hub name, directory or file)")
    risk.add_argument("--keep", nargs="+", required=True, help="datasets whose abilities must be kept")
    risk.add_argument(
        "--band",
        nargs=2,
        type=finite_float,
        default=[0.25, 0.55],
        metavar=("LOW", "HIGH"),
        help="similarities flagged at risk (Ni et al.: intermediate; default 0.25 0.55)",
    )
    risk.add_argument("--json", help="also write the report here")
    add_embedding_options(risk)
    risk.set_defaults(func=_drift_risk, command="drift risk")
