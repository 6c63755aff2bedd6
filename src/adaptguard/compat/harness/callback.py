"""`LMEvalCallback`: run lm-eval tasks on the model being trained, log the scores, and the flips
against a saved reference run (e.g. the model before the update)."""

from __future__ import annotations

import logging
import math
from pathlib import Path

from transformers import TrainerCallback

from ..metric_table import Unit, names
from ..reading.formats import read_runs
from ..reading.runs import TaskRun, samples_from_records

logger = logging.getLogger(__name__)



def evaluate_with_lm_eval(model, tokenizer, tasks: list[str], *, limit=None, num_fewshot=None, batch_size: int = 8,
                          gen_kwargs=None, metadata: dict | None = None, include_path=(), log_samples: bool = True
                          ) -> dict:
    """`lm_eval.simple_evaluate` on an in-memory model (`HFLM`), with every adaptguard/plugin task directory
    (plus `include_path`) visible; returns lm-eval's output dict (`results`, and `samples` when logged)."""
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM

    from ...plugins import lm_eval_task_dirs

    was_training = model.training
    model.eval()
    try:
        lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size)
        manager = task_manager([*include_path, *lm_eval_task_dirs()], tasks, metadata)
        return simple_evaluate(model=lm, tasks=list(tasks), task_manager=manager, limit=limit,
                               num_fewshot=num_fewshot, gen_kwargs=gen_kwargs, log_samples=log_samples,
                               bootstrap_iters=0)
    finally:
        model.train(was_training)


def task_manager(include_path, names, metadata: dict | None = None):
    """lm-eval's `TaskManager` over the folders of `include_path`, with lm-eval's own tasks only when one of `names`
    needs them: indexing its ~14 000 task YAMLs takes 11-20 s on 2 CPU cores, on every call."""
    from lm_eval.tasks import TaskManager

    dirs = [str(d) for d in ([include_path] if isinstance(include_path, (str, Path)) else include_path)]
    manager = TaskManager(include_path=dirs, include_defaults=False, metadata=dict(metadata or {}))
    if _defined_in(manager.task_index, names):
        return manager
    return TaskManager(include_path=dirs, metadata=dict(metadata or {}))


def _defined_in(index: dict, names) -> bool:
    """Whether each of `names` is a task, or a group whose string members are, in lm-eval's task `index`."""
    for name in names:
        entry = index.get(name) if isinstance(name, str) else None
        if entry is None or entry.kind.name not in ("TASK", "GROUP"):
            return False
        if entry.kind.name == "GROUP":
            members = entry.cfg.get("task", [])
            if not _defined_in(index, [m for m in (members if isinstance(members, list) else [members])
                                       if isinstance(m, str)]):
                return False
    return True


def task_runs_from_output(out: dict) -> dict[str, TaskRun]:
    """{task: TaskRun} from the in-memory samples of `simple_evaluate(log_samples=True)`."""
    return {task: TaskRun(task=task, path=Path(f"<in-memory {task}>"),
                          samples=samples_from_records((f"{task} doc {r['doc_id']}", r) for r in records))
            for task, records in out.get("samples", {}).items()}


class LMEvalCallback(TrainerCallback):
    """Evaluate `tasks` with lm-eval (in process, `HFLM` around the model being trained) at every
    evaluation (`when="evaluate"`) or epoch end (`when="epoch"`), and log `lm_eval/<task>/<metric>`.

    With `reference` (an lm-eval `--log_samples` output of the same tasks, e.g. of the model before
    the update), the flips of the current model against it are logged too (`lm_eval/<task>/nfr`,
    `pfr`, `inconsistency_flips`, `btc`; `smooth_*` with `similarity`); the `compat_*` tasks receive the reference
    as `compat_reference`. Task directories of every adaptguard plugin are included (plus
    `include_path`), and `metadata` is passed to the tasks as with `lm_eval --metadata`.
    """

    def __init__(self, tasks: list[str] | str, *, reference: str | Path | None = None, when: str = "evaluate",
                 limit: int | float | None = None, num_fewshot: int | None = None, batch_size: int = 8,
                 gen_kwargs: dict | None = None, metadata: dict | None = None, similarity: str | None = None,
                 include_path: list[str | Path] | str | Path | None = None):
        if when not in ("evaluate", "epoch"):
            raise ValueError(f"when must be 'evaluate' or 'epoch', got {when!r}")
        self.tasks = [t for t in tasks.split(",")] if isinstance(tasks, str) else list(tasks)
        if not self.tasks:
            raise ValueError("LMEvalCallback needs at least one task")
        self.reference = None if reference is None else Path(reference)
        self._reference_runs: dict[str, TaskRun] | None = None
        if self.reference is not None:
            self._reference_runs = read_runs(self.reference)[0]  # fail now, not after an epoch of training
        self.when, self.limit, self.num_fewshot, self.batch_size = when, limit, num_fewshot, batch_size
        self.gen_kwargs, self.similarity = gen_kwargs, similarity
        self.include_path = [] if include_path is None else [include_path] if isinstance(include_path, (str, Path)) \
            else list(include_path)
        self.metadata = dict(metadata or {})
        if self.reference is not None:
            self.metadata.setdefault("compat_reference", str(self.reference))
        self.history: list[dict] = []

    def evaluate(self, model, tokenizer) -> dict[str, float]:
        """Run the tasks now; returns the flat `lm_eval/<task>/<metric>` dict that gets logged."""
        from ..compare import compare_task

        out = evaluate_with_lm_eval(model, tokenizer, self.tasks, limit=self.limit, num_fewshot=self.num_fewshot,
                                    batch_size=self.batch_size, gen_kwargs=self.gen_kwargs, metadata=self.metadata,
                                    include_path=self.include_path, log_samples=self.reference is not None)
        logs: dict[str, float] = {}
        for task, metrics in out["results"].items():
            for key, value in metrics.items():
                if key == "alias" or "_stderr" in key or not isinstance(value, (int, float)):
                    continue
                metric, _, filt = key.partition(",")
                name = metric if filt in ("", "none") else f"{metric},{filt}"
                if math.isfinite(float(value)):
                    logs[f"lm_eval/{task}/{name}"] = float(value)  # np.float64 → float for JSON logs
        if self._reference_runs is not None:
            for task, current in task_runs_from_output(out).items():
                if task not in self._reference_runs or any(f"lm_eval/{task}/nfr" in k for k in logs):
                    continue
                for filt, entry in compare_task(self._reference_runs[task], current,
                                                similarity=self.similarity, n_boot=200).items():
                    suffix = "" if filt == "none" else f",{filt}"
                    for key in names(lambda m: m.about_flips and m.unit is Unit.RATE):  # the rates of flips
                        if entry.get(key) is not None:
                            logs[f"lm_eval/{task}/{key}{suffix}"] = float(entry[key])
        return logs

    def _run(self, state, model, tokenizer) -> None:
        if not state.is_world_process_zero or model is None:
            return
        logs = self.evaluate(model, tokenizer)
        record = {**logs, "epoch": state.epoch, "step": state.global_step}
        self.history.append(record)
        state.log_history.append(record)  # on_evaluate runs after the Trainer logged
        logger.info("lm-eval at step %d: %s", state.global_step, logs)

    def on_evaluate(self, args, state, control, model=None, processing_class=None, **kwargs):
        if self.when == "evaluate":
            self._run(state, model, processing_class)

    def on_epoch_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if self.when == "epoch":
            self._run(state, model, processing_class)
