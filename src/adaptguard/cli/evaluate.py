"""`adaptguard evaluate`: a new model through lm-eval against a baseline run, only until the gate decides."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import DEFAULT_ALPHA, add_command, gate_threshold, positive_int, significance

EVALUATE_EXAMPLE = ("example: adaptguard evaluate runs/old --model hf --model-args pretrained=my-org/model-v2 "
                    "--fail-on 'nfr>2%' --output-path runs/new")


def _evaluate(ns: argparse.Namespace) -> int:
    import contextlib
    import tempfile

    from ..compat.gate import exit_status
    from ..compat.harness.callback import task_manager
    from ..compat.harness.tasks import gathered_include_path
    from ..compat.harness.until_decided import (
        check_thresholds,
        evaluate_until_decided,
        holds_other_files,
        load_lm,
        main_process,
        output_lock,
    )
    from ..compat.reading.formats import read_runs
    from ..compat.reading.records import load_record
    from ..compat.render.decisions import describe
    from ..models.embedded import resolve_model_names
    from ..plugins import lm_eval_task_dirs

    if ns.significance is None:
        raise ValueError("--significance off: evaluate stops on its tests' decisions; give a level such as 0.05")
    out = Path(ns.output_path)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--output-path {out}: is a file; give a folder")
    if holds_other_files(out) and load_record(out) is None:
        raise ValueError(f"--output-path {out}: is a non-empty folder that is not an evaluate run; give a new one")
    base = read_runs(ns.baseline)[0]  # bad baselines and tasks fail here, before the model loads
    tasks = [t.strip() for t in ns.tasks.split(",")] if ns.tasks else None
    missing = [t for t in tasks or [] if t not in base]
    if missing:
        raise ValueError(f"{ns.baseline}: no task {', '.join(missing)} in the baseline run (its tasks: "
                         f"{', '.join(sorted(base))})")
    for d in ns.include_path or []:
        if not Path(d).is_dir():
            raise ValueError(f"--include-path {d}: no such directory")
    check_thresholds(ns.fail_on, ns.design)
    # the folder's lock before the model loads: a second run on it at once is refused at once (held by the main
    # process of an `accelerate launch`, which alone writes)
    lock = output_lock(out) if main_process() else contextlib.nullcontext()
    with lock, tempfile.TemporaryDirectory(prefix="adaptguard-evaluate-tasks-") as tmp:
        lm = load_lm(ns.model, resolve_model_names(ns.model_args), ns.batch_size, ns.device)
        include = gathered_include_path([*map(Path, ns.include_path or []), *lm_eval_task_dirs()], Path(tmp))
        gate = evaluate_until_decided(ns.baseline, out, lm, ns.fail_on, tasks=tasks, alpha=ns.significance,
                                      chunk=ns.chunk, seed=ns.seed, locked=True, design=ns.design,
                                      task_manager=task_manager(include, tasks or sorted(base)))
    if gate is None:  # another process of the launch: the main one prints and exits by the verdict
        return 0
    print(describe(gate))
    for task, t in (load_record(out) or {"tasks": {}})["tasks"].items():
        for left in t.get("not_evaluated", []):  # the group design: items that cannot change any threshold asked
            print(f"not evaluated: {task}, {len(left['docs'])} of {t['items']} items — {left['why']}")
    print(f"run: {out} (lm-eval samples and {out / 'sequential.json'}; `adaptguard compare {ns.baseline} {out}` "
          "takes the same decisions)")
    return exit_status(gate)


def add(sub) -> None:
    ev = add_command(
        sub,
        "evaluate",
        extra="eval",
        epilog=EVALUATE_EXAMPLE,
        help="Evaluate a new model through lm-eval against a baseline run, only until every --fail-on threshold is "
        "decided (anytime-valid tests: stop early on a clear breach or a clear pass).",
    )
    ev.add_argument("baseline", help="the old model's lm-eval --log_samples run (its tasks and documents are evaluated)")
    ev.add_argument("--model", default="hf", help="lm-eval model type (default hf)")
    ev.add_argument("--model-args", required=True, help="lm-eval model arguments, e.g. pretrained=my-org/model-v2 "
                    "(built:smollm2 and embedded:<name> resolve to local models)")
    ev.add_argument("--fail-on", action="append", required=True, type=gate_threshold, metavar="EXPR",
                    help="a threshold as in compare, repeatable: nfr, pfr, btc, old_acc, new_acc, acc_drop per task, "
                    "and overall:acc_drop>VALUE")
    ev.add_argument("--output-path", required=True, help="folder for the new model's samples and the record of the "
                    "order and the looks; an interrupted run resumes from it")
    ev.add_argument("--tasks", metavar="TASK[,TASK...]", help="evaluate only these tasks of the baseline")
    ev.add_argument("--chunk", type=positive_int, default=50, help="items per task between two looks (default 50)")
    ev.add_argument("--seed", type=int, default=0, help="the seed of each task's item order (default 0)")
    ev.add_argument("--significance", type=significance, default=DEFAULT_ALPHA, metavar="ALPHA",
                    help="α of every sequential test (default 0.05)")
    ev.add_argument("--design", choices=("group", "anytime"), default="group",
                    help="group (default): only the items that can change a threshold, group-sequential over the "
                    "baseline's known items, the last look compare's fixed-n test; anytime: every item in random "
                    "order, anytime-valid e-processes (needed for overall: thresholds)")
    ev.add_argument("--batch-size", default=1, help="lm-eval batch size (default 1)")
    ev.add_argument("--device", default=None, help="lm-eval device, e.g. cuda:0 (default: cuda where there is one, "
                    "else cpu)")
    ev.add_argument("--include-path", action="append", help="your own task folders, as lm_eval's --include_path")
    ev.set_defaults(func=_evaluate)
