"""`adaptguard compare`: what an update broke, between two runs of any harness, and the gate."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import DEFAULT_ALPHA, add_command, gate_threshold, positive_int, significance

COMPARE_EXAMPLE = "example: " + "adaptguard compare runs/old runs/new --fail-on 'nfr>2%' --html report.html"


def _compare(ns: argparse.Namespace) -> int:
    from ..compat.compare import compare_runs
    from ..compat.render.outputs import write_outputs
    from ..compat.render.report import to_text

    outputs = _check_outputs(ns)  # before reading the runs
    if ns.plot:
        from ..utils.figures import check_figure_path

        check_figure_path(ns.plot, "--plot")
    report = compare_runs(
        _replicates(ns.old),
        [_replicates(p) for p in ns.new],
        similarity=ns.similarity,
        metric=_metrics(ns.metric),
        compatible_path=ns.compatible,
        n_boot=ns.n_boot,
        seed=ns.seed,
        alpha=ns.significance or DEFAULT_ALPHA,
        include_churn=ns.include_churn,
        tasks=ns.tasks,
        common_tasks=ns.common_tasks,
        scorer=ns.scorer,
    )
    if ns.fail_on:  # before anything is written: a threshold that cannot apply is bad input (exit 2)
        from ..compat.gate import check_gate

        report.gate = check_gate(report, ns.fail_on, ns.significance)
    flips = {}
    every = bool(ns.flips_out or ns.html)
    if ns.show_flips or every:  # one pass over the sample files serves all three
        from ..compat.render.flips import flipped_documents

        flips = {
            task: flipped_documents(e, negative_only=not every, limit=None if every else ns.show_flips)
            for task, e in report.tasks.items()
        }
    if ns.show_flips:  # negative flips come first in each task's list
        report.negative_flips = {
            task: [f for f in found if f["kind"] == "negative"][: ns.show_flips] for task, found in flips.items()
        }
    all_flips = [{"task": task, **flip} for task, found in flips.items() for flip in found] if every else None
    to_stdout = "-" in outputs.values()
    # the table goes to the terminal unless an output does (then stdout carries that output alone, for a pipe)
    print(to_text(report), file=sys.stderr if to_stdout else sys.stdout)
    write_outputs(report, ns.json, ns.markdown, ns.plot, flips_path=ns.flips_out, flips=all_flips, html_path=ns.html)
    for label, path in (
        ("json", ns.json),
        ("markdown", ns.markdown),
        ("plot", ns.plot),
        ("flips", ns.flips_out),
        ("page", ns.html),
    ):
        if path and path != "-":
            print(f"{label}: {path}", file=sys.stderr if to_stdout else sys.stdout)
    if ns.fail_on:
        from ..compat.gate import exit_status
        from ..compat.render.decisions import describe

        print(describe(report.gate), file=sys.stdout if report.gate.passed and not to_stdout else sys.stderr)
        return exit_status(report.gate)
    return 0


def _check_outputs(ns: argparse.Namespace) -> dict[str, str]:
    """The output flags given, checked before anything is read or written: two outputs to one path, or two to
    stdout (`-`), are refused; `--plot` and `--html` are files, never stdout."""
    given = {
        flag: str(path)
        for flag, path in (
            ("--json", ns.json),
            ("--markdown", ns.markdown),
            ("--plot", ns.plot),
            ("--flips-out", ns.flips_out),
            ("--html", ns.html),
        )
        if path
    }
    if given.get("--plot") == "-":
        raise ValueError("--plot -: a PNG is not written to stdout; give a file path")
    seen: dict[str, str] = {}
    for flag, path in given.items():
        if path != "-":
            blocked = next((q for q in Path(path).resolve().parents if q.exists() and not q.is_dir()), None)
            if blocked is not None:
                raise ValueError(f"{flag} {path}: {blocked} is a file, not a folder; give a path in a folder "
                                 "(nothing was written)")
            if Path(path).is_dir():
                raise ValueError(f"{flag} {path}: is a directory; give a file path (nothing was written)")
        key = path if path == "-" else str(Path(path).resolve())
        if key in seen:
            raise ValueError(f"{seen[key]} and {flag} both write to {path}; give each output its own path (nothing was written)")
        seen[key] = flag
    return given


def _metrics(args: list[str] | None) -> str | dict[str, str] | None:
    """`--metric NAME` (every task) or `--metric TASKGLOB:NAME` (repeatable; the first matching glob wins)."""
    if not args:
        return None
    if len(args) == 1 and ":" not in args[0]:
        return args[0]
    out = {}
    for arg in args:
        glob, sep, name = arg.rpartition(":")
        if not sep or not glob or not name:
            raise ValueError(f"--metric {arg!r}: give NAME alone (one --metric for every task) or TASKGLOB:NAME")
        out[glob] = name
    return out


def _replicates(arg: str) -> str | list[str]:
    """`run1,run2,...`: replicate runs of one side (seeds of one recipe, or repeated sampled evaluations)."""
    parts = [p for p in arg.split(",")]
    if any(not p for p in parts):
        raise ValueError(f"{arg!r}: an empty run in a comma-separated list of replicates")
    return parts[0] if len(parts) == 1 else parts


def add(sub) -> None:
    cmp = add_command(
        sub,
        "compare",
        epilog=COMPARE_EXAMPLE,
        help="Compare two runs of an eval harness: what the update broke, item by item, and a gate for CI.",
    )
    cmp.add_argument(
        "old",
        help="old model's run: an lm-eval --output_path directory or a samples_*.jsonl file, an "
        "Inspect AI .eval/.json log or a folder of them (its epochs are replicates), lighteval "
        "details_*.parquet, or JSONL as docs/compat.md shows; example:fp32 for the shipped pair; "
        "RUN1,RUN2,... for replicate runs of the old model (training seeds, repeated sampled "
        "evaluations): flips are then measured against the noise floor of reruns",
    )
    cmp.add_argument(
        "new",
        nargs="+",
        help="new model's run, same form (RUN1,RUN2,... for its replicates); several "
        "arguments (e.g. v2 candidates) are each compared with OLD in one table, "
        "tasks named `task [run]`",
    )
    cmp.add_argument("--compatible", help="a third run (e.g. a compatibility adapter): adds the Δ-metrics")
    cmp.add_argument(
        "--similarity",
        help="score generations with this similarity plugin (rouge1, rouge2, rougeL, "
        "bleu, exact_match, or a plugin's) for smooth flips",
    )
    cmp.add_argument(
        "--metric",
        action="append",
        metavar="[TASKGLOB:]NAME",
        help="0/1 per-sample metric for correctness (default: acc, exact_match or em); repeatable as "
        "TASKGLOB:NAME for a metric per task, e.g. --metric 'gsm8k*:exact_match' --metric '*:acc'",
    )
    cmp.add_argument(
        "--scorer",
        metavar="NAME",
        help="for Inspect AI logs: the scorer whose value is correctness "
        "(default: the log's first scorer; C/I, booleans and numbers mapped as Inspect's value_to_float)",
    )
    cmp.add_argument("--tasks", metavar="GLOB[,GLOB...]", help="compare only the tasks matching these globs, e.g. 'mmlu_*,arc_*'")
    cmp.add_argument(
        "--common-tasks",
        action="store_true",
        help="when the runs have different tasks, compare the ones both have (the others are listed) instead of refusing",
    )
    cmp.add_argument("--json", metavar="FILE", help="write the metrics as JSON ('-': to stdout)")
    cmp.add_argument("--markdown", metavar="FILE", help="write the table as Markdown ('-': to stdout)")
    cmp.add_argument("--plot", help="draw the flip quadrants as PNG")
    cmp.add_argument(
        "--html",
        metavar="FILE",
        help="write one self-contained page (no server, nothing fetched): the "
        "verdict, the table, the figure and every flipped item, filterable by task and direction, "
        "searchable and sortable",
    )
    cmp.add_argument("--n-boot", type=positive_int, default=2000, help="bootstrap resamples for the intervals")
    cmp.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    cmp.add_argument(
        "--show-flips",
        type=positive_int,
        metavar="N",
        help="show up to N negative flips per task: prompt (shortened), gold, old and new answer (also in --markdown and --json)",
    )
    cmp.add_argument(
        "--flips-out",
        metavar="FILE",
        help="write every flipped document, both answers, as JSON lines "
        "('-': to stdout); with replicate runs, each item's 'broke in k of R·R′ pairs' and whether it "
        "broke beyond rerun noise, those first",
    )
    cmp.add_argument(
        "--fail-on",
        action="append",
        type=gate_threshold,
        metavar="EXPR",
        help="regression gate, repeatable: [TASKGLOB:]METRIC>VALUE or <VALUE over nfr, excess_nfr, pfr, "
        "inconsistency_flips, btc, old_acc, new_acc, acc_drop, smooth_nfr, ... (rates as 2%% or "
        "0.02; e.g. 'nfr>2%%', 'excess_nfr>1%%', 'mmlu_*:btc<0.95', and 'overall:acc_drop>0.5%%' "
        "for every task together). Each (task, threshold) is decided: breach (its one-sided test "
        "supports it), clear (the data show the metric within it) or undecided. Exit status 1 on a "
        "breach, else 3 on an undecided threshold (or nothing left to decide), 0 when every one is "
        "clear, 2 for bad input",
    )
    cmp.add_argument(
        "--significance",
        type=significance,
        default=DEFAULT_ALPHA,
        metavar="ALPHA",
        help="a --fail-on breach counts only when a test supports it at level ALPHA (default 0.05): "
        "exact one-sided binomial on the item counts for rates and btc, McNemar for acc_drop, a "
        "t-test over runs and items with replicates; 'off' compares raw values. Also the level of "
        "the per-task Benjamini-Hochberg flags and of the chance test",
    )
    cmp.add_argument(
        "--include-churn",
        action="store_true",
        help="count tasks where the old model is not above chance (churn) in the gate and the overall row",
    )
    cmp.set_defaults(func=_compare)
