"""Evaluate a new model through lm-eval only until the gate decides (`adaptguard evaluate`).

Each task is built once per run (lm-eval's `TaskManager.load`), and each look is one call of lm-eval's lower-level
`evaluator.evaluate` on the next chunk of documents of every task still running (`samples={task: [doc indices]}`),
so a look is one batch across tasks and the model is loaded once. With the default design (`group`) only the
documents that can change a threshold are visited: those the old model got right for `nfr`/`btc`, those it got wrong
for `pfr`, both strata in proportion for `acc_drop`/`new_acc` (`records.group_plan`; the others are listed in the
record as not evaluated, with why), each stratum in a seeded random order, and after each look every (task,
threshold) is decided by the group-sequential tests over the known pool (`group_sequential`: α spent over the looks;
the last look is `compare`'s fixed-n test on all items). With `design="anytime"` every document is visited in a
seeded random order and decided by the anytime-valid tests of `anytime` (e-processes: valid however often one looks,
N not used). A task stops when each of its thresholds is decided (one left out so far, as a churn task's flips are,
is not: more items may show the old model above chance), the run when every task has stopped or run out of
documents. The output folder is an ordinary lm-eval `--log_samples` run (the samples evaluated so far) plus the
record (`records.RECORD`) of the order and the looks: `compare BASELINE OUT` reads it and takes the same decisions,
and a rerun resumes where a kill left it (the record is written before the first samples and again after each look's
samples, which are appended to each task's file: a look whose samples are all written counts when it resumes, one
cut short is evaluated again: `_samples_counted`). A run holds the folder's lock (`LOCK`) throughout: one run on a
folder at a time.

Under `accelerate launch` (lm-eval's data-parallel HF model: `lm.world_size` > 1) every process runs the same looks,
each evaluating its share of the documents; the main process alone decides, tells the others the next look's
documents (`_next_look`), and writes the record and the samples."""

from __future__ import annotations

import contextlib
import json
from datetime import datetime, timezone
from pathlib import Path

from ...utils.files import atomic_write_text
from ..reading.records import RECORD, group_plan, load_record, task_order
from ..reading.runs import RunError
from ..verdicts import Decision, LeftOut, ThresholdDecision


def load_lm(model: str, model_args: str, batch_size: int, device: str | None):
    """The lm-eval model (`--model`, `--model-args` as lm-eval takes them), loaded once; a model that fails to load
    is one line of bad input."""
    from lm_eval.api.registry import get_model

    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        return get_model(model).create_from_arg_string(model_args,
                                                       {"batch_size": batch_size, "device": device})
    except Exception as err:  # lm-eval and transformers raise many kinds: name the model and say why, in one line
        raise ValueError(f"--model {model} --model-args {model_args!r}: could not load the model "
                         f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from None


def _write_samples(out: Path, task: str, stamp: str, samples: list[dict]) -> None:
    """Append one look's samples to the task's samples file, on disk (fsync) before the record counts them."""
    import os

    from lm_eval.utils import handle_non_serializable

    text = "".join(json.dumps(s, default=handle_non_serializable, ensure_ascii=False) + "\n" for s in samples)
    with open(out / f"samples_{task}_{stamp}.jsonl", "a", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _samples_counted(out: Path, task: str, stamp: str, t: dict, chunk: int) -> int:
    """How many of `task`'s written samples count when a run resumes (`t` its record): the record's, and the next
    look's too when all of its samples were written (a kill between them and the record). A look cut short by a kill
    during its append (some of its lines, the last perhaps half written) does not count: its lines are removed
    (atomically) and it is evaluated again, so that the looks fall where an uninterrupted run's do."""
    path = out / f"samples_{task}_{stamp}.jsonl"
    if not path.exists():
        return 0
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    whole = len(lines) - (1 if lines and not lines[-1].endswith("\n") else 0)
    done = t["done"]
    look = done + len(t["order"][done: done + chunk])
    keep = look if whole >= look else min(done, whole)
    if keep != len(lines):
        atomic_write_text(path, "".join(lines[:keep]))
    return keep


def progress_line(task: str, t: dict, decisions: list[ThresholdDecision], left_out: list[LeftOut] = ()) -> str:
    """One line per task and look: items done, each threshold's interval (or e-value's p) and its decision, and the
    thresholds left out (a churn task's flips: "so far" while it runs, as more items may show a model above
    chance)."""
    so_far = " so far" if t["status"] == "running" else ""
    parts = [f"{x.expr}: left out ({x.short}{so_far})" for x in left_out]
    for d in decisions:
        seen = f"{100 * d.value:.1f}%"
        if d.interval is not None:
            seen += f" [{100 * d.interval[0]:.1f}, {100 * d.interval[1]:.1f}]"
        else:
            seen += f" (p {min(d.p_value, d.p_within):.2g})"
        parts.append(f"{d.metric} {seen} vs {100 * d.threshold:g}%: {d.decision}")
    of = f" of {t['items']}" if t.get("items", len(t["order"])) != len(t["order"]) else ""  # the rest cannot flip
    return f"{task}: {t['done']}/{len(t['order'])}{of} items ({t['status']}); " + "; ".join(parts)


@contextlib.contextmanager
def _lm_eval_quietly(seen: set[str]):
    """lm-eval's own screen output of one chunk (its bars, the `git describe` error it prints outside a repository)
    kept off the screen; each other line (a warning about a task's config, an error) shown once per run."""
    import os
    import sys
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            for line in tmp.read().decode(errors="replace").replace("\r", "\n").splitlines():
                noise = not line.strip() or "it/s]" in line or "%|" in line or "not a git repository" in line
                if not noise and line not in seen:
                    seen.add(line)
                    print(line, file=sys.stderr)


DESIGNS = ("group", "anytime")


def check_thresholds(thresholds: list, design: str = "group") -> None:
    """Refuse a threshold without a sequential test of the design, and an unknown design (before any model is
    loaded)."""
    from ..gate import ACROSS
    from ..metric_table import ANYTIME, names

    if design not in DESIGNS:
        raise RunError(f"--design {design!r}: give one of {', '.join(DESIGNS)}")
    for t in thresholds:
        decided = names(lambda m: ANYTIME in m.tests)
        if t.metric not in decided:
            raise RunError(f"--fail-on {t.expr!r}: evaluate decides {', '.join(decided[:-1])} and "
                           f"{decided[-1]} (anytime-valid tests); use compare on finished runs for the others")
        if design == "group" and t.tasks == ACROSS:
            raise RunError(f"--fail-on {t.expr!r}: the group-sequential design decides each task on its own; give "
                           "--design anytime for a threshold across tasks")


def _metrics_of(task: str, thresholds: list) -> list[str]:
    """The metrics of the thresholds that apply to `task`."""
    from fnmatch import fnmatchcase

    return [t.metric for t in thresholds if fnmatchcase(task, t.tasks)]


LOCK = ".adaptguard-evaluate.lock"  # in the output folder, held for a whole run (compare reads samples_*, results_*)


def holds_other_files(out: Path) -> bool:
    """Whether the folder `out` holds anything but the lock of an evaluate run."""
    return out.is_dir() and any(p.name != LOCK for p in out.iterdir())


@contextlib.contextmanager
def output_lock(out: str | Path):
    """The output folder's lock (`LOCK`), held for a whole run: a second run on the folder at the same time, which
    would evaluate the same documents into it twice, is refused at once (`RunError`, naming the folder). A folder made
    here that holds only the lock when the run ends (a model that did not load) is removed again."""
    from filelock import FileLock, Timeout

    out = Path(out)
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(out / LOCK), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise RunError(f"--output-path {out}: another evaluate run is writing to it (holding {out / LOCK}); wait "
                       "for that run to end, or give another --output-path") from None
    try:
        yield
    finally:
        if made and not holds_other_files(out):
            with contextlib.suppress(OSError):
                (out / LOCK).unlink()  # while held: a run that opens the path from now on makes a new lock
                out.rmdir()
        lock.release()


def _check_folder(out: Path, settings: dict) -> dict | None:
    """The record of the evaluate run in `out` to resume (None for a new run); refuses one with other settings and
    a folder with other files."""
    record = load_record(out)
    if record is not None and record["settings"] != settings:
        raise RunError(f"{out}: holds an evaluate run with other settings ({record['settings']}); give another "
                       "--output-path, or the same settings to resume it")
    if record is None and holds_other_files(out):
        raise RunError(f"{out}: is a non-empty folder that is not an evaluate run; give a new --output-path")
    return record


def evaluate_until_decided(baseline: str | Path, out: str | Path, lm, thresholds: list, *, tasks: list[str] | None
                           = None, alpha: float = 0.05, chunk: int = 50, seed: int = 0, task_manager=None,
                           say=print, locked: bool = False, design: str = "group") -> dict | None:
    """Evaluate `lm` (an lm-eval model instance, loaded once) on the baseline's tasks until every threshold is decided
    (module docstring; `design` "group" or "anytime"), holding the output folder's lock (`output_lock`; `locked`:
    the caller holds it already).
    Returns the gate (`gate.check_gate`) of the final state (None on every process of a launch but the main one,
    which alone decides and writes: `main_process`). Raises `RunError`/`GateError` for bad input before
    anything is evaluated or written, and while another run holds the folder."""
    from ..reading.formats import read_runs

    out = Path(out)
    base = read_runs(baseline)[0]
    names = sorted(base) if tasks is None else tasks
    missing = [t for t in names if t not in base]
    if missing:
        raise RunError(f"{baseline}: no task {', '.join(missing)} in the baseline run (its tasks: "
                       f"{', '.join(sorted(base))})")
    for task in names:
        if len(base[task].filters) != 1:
            raise RunError(f"{baseline}: task {task!r} was logged with several filters ({base[task].filters}); "
                           "evaluate takes one filter per task")
    check_thresholds(thresholds, design)
    settings = {"baseline": str(Path(baseline).resolve()), "thresholds": [t.expr for t in thresholds],
                "alpha": alpha, "chunk": chunk, "seed": seed, "tasks": names}
    if design != "anytime":  # a record without a design is an anytime run (made before the group design)
        settings["design"] = design
    else:  # acc_drop's adaptive bet (a record without one: the grid of 24 constant bets, before issue 87)
        settings["bet"] = "agrapa"
    if main_process():
        _check_folder(out, settings)  # bad input before the lock is written into the folder
    with contextlib.nullcontext() if locked or not main_process() else output_lock(out):
        return _until_decided(baseline, out, lm, thresholds, base, settings, task_manager, say)


def _plan(run, settings: dict, thresholds: list, task: str) -> dict:
    """A task's order (and, for the group design, its pool and the documents left out: `records.group_plan`)."""
    seed = settings["seed"]
    if settings.get("design", "anytime") == "anytime":
        return {"order": task_order([d for _, d in run.samples], seed, task)}
    from ..reading.runs import choose_metric

    filt = run.filters[0]
    metric = choose_metric(run, filt, None)
    old_right = {d: bool(s.metrics[metric]) for (_, d), s in run.samples.items()}
    return group_plan(old_right, _metrics_of(task, thresholds), seed, task)


def main_process() -> bool:
    """Whether this is the launch's main process: the one that decides and writes (`accelerate launch` and torchrun
    number the processes in `RANK`; a plain run is the main process)."""
    import os

    return os.environ.get("RANK", "0") == "0"


def _next_look(batches: dict[str, list[int]] | None) -> dict[str, list[int]]:
    """The next look's documents, {task: doc indices} ({} to stop), sent by the main process to every other
    process of the launch (each returns what the main process sent); with one process, `batches` itself."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return batches
    from accelerate.utils import broadcast_object_list  # places the object on each backend's device (NCCL, gloo)

    return broadcast_object_list([batches], from_process=0)[0]


def _build_tasks(names: list[str], task_manager) -> dict:
    """{name: lm-eval Task}, each built once for the whole run (its dataset, few-shot sampler and filters), set as
    `simple_evaluate` sets them (no few-shot where the task gives no number)."""
    from lm_eval.tasks import TaskManager

    tasks = (task_manager or TaskManager()).load(names)["tasks"]
    for task in tasks.values():
        if task.get_config("num_fewshot") is None:
            task.set_config(key="num_fewshot", value=0)
    return tasks


def _look(lm, tasks: dict, batches: dict[str, list[int]]) -> dict | None:
    """One look: lm-eval's `evaluator.evaluate` of `lm` on `batches` ({task: doc indices}) of the built `tasks`, one
    batch across them, each process its share under data parallelism. The seeds (few-shot sampler's included) are set
    as `simple_evaluate` sets them on each call, with its defaults, so that a look's prompts do not depend on the looks
    before it. lm-eval's output dict (`configs`, `samples`), None on every process but the main one."""
    import random

    import numpy as np
    import torch
    from lm_eval import evaluator

    random.seed(0)
    np.random.seed(1234)
    torch.manual_seed(1234)
    for task in batches:
        tasks[task].set_fewshot_seed(seed=1234)
    return evaluator.evaluate(lm=lm, task_dict={"tasks": {task: tasks[task] for task in batches}, "groups": {}},
                              samples=batches, log_samples=True, bootstrap_iters=0)


def _until_decided(baseline: str | Path, out: Path, lm, thresholds: list, base: dict, settings: dict, task_manager,
                   say) -> dict | None:
    """`evaluate_until_decided`'s run, the inputs checked and the folder's lock held (on the main process)."""
    from lm_eval.utils import setup_logging

    from ..compare import compare_runs
    from ..gate import check_gate

    names, alpha, chunk = settings["tasks"], settings["alpha"], settings["chunk"]
    seen: set[str] = set()
    setup_logging("ERROR")  # lm-eval's INFO lines per call, as `simple_evaluate(verbosity="ERROR")` kept them
    with _lm_eval_quietly(seen):
        tasks = _build_tasks(names, task_manager)
    if not main_process():  # follow the main process's looks; alone, as lm-eval's HF model is on CPU, do nothing
        while batches := _next_look(None):
            if lm.world_size > 1:
                with _lm_eval_quietly(seen):
                    _look(lm, tasks, batches)
        return None
    record = _check_folder(out, settings)  # again: a run that held the folder may have left a record meanwhile
    if record is None:
        record = {"settings": settings, "seed": settings["seed"], "stamp": datetime.now(timezone.utc).strftime(
            "%Y-%m-%dT%H-%M-%S.%f"), "configs": {}, "tasks": {
            task: {**_plan(base[task], settings, thresholds, task), "done": 0, "looks": [], "status": "running"}
            for task in names}}
        out.mkdir(parents=True, exist_ok=True)
        # before any samples: a kill after the first look's samples leaves a record (its stamp and order) to resume
        atomic_write_text(out / RECORD, json.dumps(record, indent=1) + "\n")
    stamp = record["stamp"]
    results_file = out / f"results_{stamp}.json"
    if results_file.exists():  # resume: a look's configs are written before its samples, the record after them
        record["configs"] = {**json.loads(results_file.read_text()).get("configs", {}), **record["configs"]}
    for task, t in record["tasks"].items():  # resume: the samples written are the truth (written before the record)
        done = _samples_counted(out, task, stamp, t, chunk)
        if done != t["done"]:
            t["done"] = done
            t["looks"] = [n for n in t["looks"] if n < done] + [done]
            atomic_write_text(out / RECORD, json.dumps(record, indent=1) + "\n")  # what compare reads below
    gate = None
    while True:
        running = {task: t for task, t in record["tasks"].items() if t["status"] == "running"}
        # a kill in the middle of a look leaves some tasks a look behind: that look is finished before any decision,
        # as an uninterrupted run takes its decisions only once every running task has had it
        most = max((len(t["looks"]) for t in running.values()), default=0)
        behind = {task: t for task, t in running.items() if len(t["looks"]) < most}
        if not behind and any(t["done"] for t in record["tasks"].values()):
            report = compare_runs(baseline, out, alpha=alpha, tasks=",".join(names), common_tasks=True)
            gate = check_gate(report, thresholds, alpha)
            for task, t in record["tasks"].items():
                mine = [d for d in gate.decisions if d.task == task]
                left_out = [x for x in gate.left_out if x.task == task]
                # left out is not decided: more items may show the old model above chance (churn) or define the
                # metric (btc with no item the old model got right so far), and then it must be decided
                undecided = [d for d in mine if d.decision is Decision.UNDECIDED] + left_out
                if t["status"] == "running" and not undecided and mine:
                    t["status"] = "decided"
                elif t["status"] == "running" and t["done"] >= len(t["order"]):
                    t["status"] = "exhausted"
                t["decisions"] = {d.expr: d.decision.value for d in mine}
                t["left_out"] = {x.expr: x.short for x in left_out}
                say(progress_line(task, t, mine, left_out))
            atomic_write_text(out / RECORD, json.dumps(record, indent=1) + "\n")
            running = {task: t for task, t in running.items() if t["status"] == "running"}
        # sorted: lm-eval 0.4.13 visits the chosen documents in dataset order but labels them in the order given
        batches = _next_look({task: sorted(t["order"][t["done"]: t["done"] + chunk])
                              for task, t in (behind or running).items()})
        if not batches:
            return gate
        with _lm_eval_quietly(seen):
            results = _look(lm, tasks, batches)
        record["configs"].update({task: results["configs"][task] for task in batches})
        atomic_write_text(results_file, json.dumps(
            {"configs": record["configs"], "n-shot": {k: v.get("num_fewshot", 0) for k, v in record["configs"]
                                                     .items()}}, default=str, indent=1) + "\n")
        for task, docs in batches.items():
            _write_samples(out, task, stamp, list(results["samples"][task]))
            t = record["tasks"][task]
            t["done"] += len(docs)
            t["looks"].append(t["done"])
        atomic_write_text(out / RECORD, json.dumps(record, indent=1) + "\n")  # after its samples: resumable
