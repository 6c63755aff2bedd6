"""`adaptguard compare OLD NEW`: compatibility of two lm-eval runs, joined sample by sample (rendering and the
figure are in `report`).

Works for any lm-eval task logged with `--log_samples`:
- multiple choice: prediction = argmax of the logged log-likelihoods, correctness = `acc`;
- generation with a 0/1 metric (`exact_match`, GSM8K-style): prediction = the filtered response;
- generation scored by similarity (`--similarity rouge1`): smooth flips from `D = S(new) − S(old)`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from pathlib import Path

from ..plugins import get_similarity
from .comparison import Comparison, TaskComparison
from .decide import across_verdict, churn, churn_rule, flag_regressions, is_churn, pooled_entry
from .metric_table import METRICS, Unit
from .reading.formats import read_runs
from .reading.records import group_view, load_record, restrict, sequential_entry
from .reading.runs import CORRECTNESS_METRICS, RunError, Sample, TaskRun, choose_metric, same_choices
from .stats.metrics import delta_metrics, flip_metrics, similarity_deltas, smooth_flip_metrics
from .stats.replicates import chance_rate, items_beyond_noise, replicate_flips
from .verdicts import Evidence


def check_same_setup(old: TaskRun, new: TaskRun, labels=("old", "new")) -> None:
    """Refuse two runs of a task that did not score the same documents the same way."""
    a, b = labels
    task = old.task
    if old.filters != new.filters:
        raise RunError(f"task {task!r}: filters differ ({a}: {old.filters}, {b}: {new.filters})")
    if old.num_fewshot is not None and new.num_fewshot is not None and old.num_fewshot != new.num_fewshot:
        raise RunError(f"task {task!r}: few-shot settings differ ({a}: {old.num_fewshot}-shot, "
                       f"{b}: {new.num_fewshot}-shot)")
    if old.output_type and new.output_type and old.output_type != new.output_type:
        raise RunError(f"task {task!r}: output types differ ({a}: {old.output_type}, {b}: {new.output_type})")
    only_old, only_new = set(old.samples) - set(new.samples), set(new.samples) - set(old.samples)
    if only_old or only_new:
        raise RunError(f"task {task!r}: different documents ({len(old.samples)} samples in {a}, "
                       f"{len(new.samples)} in {b}; doc_ids only in {a}: {sorted(d for _, d in only_old)[:5]}, "
                       f"only in {b}: {sorted(d for _, d in only_new)[:5]}); was --limit or the dataset different?")
    if old.format != new.format:  # each format hashes documents its own way: the keys and targets must do
        return
    for key, s_old in old.samples.items():
        s_new = new.samples[key]
        if s_old.doc_hash and s_new.doc_hash and s_old.doc_hash != s_new.doc_hash:
            raise RunError(f"task {task!r}: doc_id {key[1]} is a different document (doc_hash differs)")
        if s_old.target_hash and s_new.target_hash and s_old.target_hash != s_new.target_hash:
            raise RunError(f"task {task!r}: doc_id {key[1]} has a different target (target_hash differs)")


def _text(sample: Sample) -> str:
    if not isinstance(sample.answer, str):
        raise RunError(f"{sample.where or f'doc_id {sample.doc_id}'}: --similarity needs generated text, got "
                       f"{sample.answer!r:.80}")
    return sample.answer


def _references(sample: Sample) -> list[str]:
    target = sample.target
    refs = target if isinstance(target, list) else [target]
    return [str(r) for r in refs]


def _flips(old: list[Sample], new: list[Sample], metric: str, n_boot: int, seed: int,
           output_type: str | None = None, level: float = 0.95, new_metric: str | None = None) -> dict:
    preds = [s.answer for s in old], [s.answer for s in new]
    # a loglikelihood task scores one continuation: there is no answer to disagree on, so no inconsistency_flips
    have = output_type != "loglikelihood" and all(p is not None for p in preds[0] + preds[1])
    return flip_metrics([s.metrics[metric] for s in old], [s.metrics[new_metric or metric] for s in new],
                        *(preds if have else (None, None)), n_boot=n_boot, seed=seed, level=level, interval="exact")


def compare_task(old: TaskRun, new: TaskRun, *, similarity: str | None = None, metric: str | None = None,
                 compatible: TaskRun | None = None, n_boot: int = 2000, seed: int = 0,
                 level: float = 0.95) -> dict[str, TaskComparison]:
    """Every filter of a task compared: {filter: TaskComparison}; rates with exact (Clopper–Pearson) intervals at
    `level`."""
    check_same_setup(old, new)
    if compatible is not None:
        check_same_setup(old, compatible, labels=("old", "compatible"))
    out = {}
    for filt in old.filters:
        keys = sorted(k for k in old.samples if k[0] == filt)
        o = [old.samples[k] for k in keys]
        n = [new.samples[k] for k in keys]
        c = [compatible.samples[k] for k in keys] if compatible is not None else None
        delta = None
        entry: dict = {"task": old.task, "filter": filt, "output_type": old.output_type or new.output_type}
        name = choose_metric(old, filt, metric, graded_ok=similarity is not None)
        if name is not None:
            # runs of two formats name their 0/1 metric each its own way (lighteval's acc, a JSONL's correct)
            new_name = choose_metric(new, filt, name if old.format == new.format or metric else None)
            entry["metric"] = name
            if new_name != name:
                entry["metric_new"] = new_name
            entry.update(_flips(o, n, name, n_boot, seed, entry["output_type"], level, new_name))
            entry.update(_row_values([s.metrics[name] for s in o], [s.metrics[new_name or name] for s in n]))
            if c is not None:
                choose_metric(compatible, filt, name)
                compat = _flips(o, c, name, n_boot, seed, entry["output_type"], level)
                entry["compatible"] = compat
                entry.update(delta_metrics(entry, compat))
        if similarity is not None and isinstance(o[0].answer, str):
            refs = [_references(s) for s in o]
            old_text = [_text(s) for s in o]
            delta = similarity_deltas(old_text, [_text(s) for s in n], refs, get_similarity(similarity))
            smooth = smooth_flip_metrics(delta, n_boot=n_boot, seed=seed, level=level, interval="exact")
            entry["similarity"] = similarity
            entry.update({k: v for k, v in smooth.items() if k != "n"})
            entry["n"] = smooth["n"]
            if c is not None:
                compat_smooth = smooth_flip_metrics(similarity_deltas(old_text, [_text(s) for s in c], refs,
                                                                      get_similarity(similarity)),
                                                    n_boot=n_boot, seed=seed, level=level, interval="exact")
                entry.setdefault("compatible", {}).update(compat_smooth)
                entry.update(delta_metrics(smooth, compat_smooth))
        if "metric" not in entry and "similarity" not in entry:
            raise RunError(f"task {old.task!r} (filter {filt!r}) has no 0/1 metric ({', '.join(CORRECTNESS_METRICS)})"
                           f"; name one with --metric or score the generations with --similarity NAME")
        correct = ([s.metrics[entry["metric"]] for s in o],
                   [s.metrics[entry.get("metric_new", entry["metric"])] for s in n]) if "metric" in entry else None
        out[filt] = TaskComparison(entry, samples=(o, n), correct=correct, delta=delta)
    return out


def _side(paths) -> list[Path]:
    """One side's replicate runs: a path, or a list of paths."""
    return [Path(p) for p in (paths if isinstance(paths, (list, tuple)) else [paths])]


def _check_runs_distinct(old: list[Path], candidates: list[list[Path]]) -> None:
    """Refuse a run listed twice on a side, or given as both old and new (its flips would be 0 by construction)."""
    for side in (old, *candidates):
        seen = {}
        for p in side:
            key = p.resolve()
            if key in seen:
                raise RunError(f"{p} is listed twice as a replicate of one side ({seen[key]} and {p}); each run once")
            seen[key] = p
    old_set = {p.resolve(): p for p in old}
    for side in candidates:
        for p in side:
            if p.resolve() in old_set:
                raise RunError(f"{p} is given as both an old and a new run; an update compares two different runs")


def _replicate_vectors(runs: list[dict], first: dict, task: str, filt: str, metric: str
                       ) -> tuple[list[list[float]], list[list[Sample]]]:
    """Per replicate run (after the first), the task's correctness on `filt` and its samples, in the first run's
    document order; a replicate that scored other documents, or another way, is refused naming both files."""
    out, samples = [], []
    for run in runs:
        if task not in run:
            raise RunError(f"{first[task].path} has task {task!r} but its replicate run does not "
                           f"(tasks there: {', '.join(sorted(run))})")
        check_same_setup(first[task], run[task], labels=(str(first[task].path), str(run[task].path)))
        choose_metric(run[task], filt, metric)
        keys = sorted(k for k in first[task].samples if k[0] == filt)
        samples.append([run[task].samples[k] for k in keys])
        out.append([s.metrics[metric] for s in samples[-1]])
    return out, samples


def _row_values(old_correct, new_correct) -> dict[str, float | None]:
    """Every rate of the paired answers (`metric_table`: a row's `per_item`) on one run per side."""
    return {m.name: m.value_of(old_correct, new_correct) for m in METRICS.values()
            if m.per_item is not None and m.unit is Unit.RATE}


def _pair_means(entry: dict, olds: list[list[float]], news: list[list[float]]) -> None:
    """With replicates, the entry's flip metrics become means over every (old run, new run) pair; the item-level
    tests of one pair (McNemar, binomial intervals) would treat churn as signal, so they are dropped."""
    pairs = [{**flip_metrics(o, n, n_boot=1), **_row_values(o, n)} for o in olds for n in news]
    for key in ("n_negative_flips", "n_positive_flips", *_row_values([True], [True])):
        values = [p[key] for p in pairs if p[key] is not None]
        entry[key] = sum(values) / len(values) if values else None
    # one interval per quantity: the run-level one lives in `replicates` (nfr_ci); none at item level here
    entry.update(inconsistency_flips=None, mcnemar_p=None, pfr_ci=None, nfr_ci=None, counts_are_means=True)


def _is_churn(entry: Mapping, samples: list, alpha: float) -> dict | None:
    """Chance churn of a multiple-choice task (`decide.churn`), its chance level from its output type: the mean of
    1/#choices, or — where every item offers the same choices — the majority label's share
    (`replicates.chance_rate`). None for any other task: a loglikelihood, rolling or generated answer has no chance
    level, so its flips are never churn (a lambada-style task logs one [ll, is_greedy] per document: one "choice")."""
    if "metric" not in entry or entry.get("output_type") not in ("multiple_choice", None):
        return None
    if any(s.n_choices is None or s.n_choices < 2 for s in samples):
        return None
    fixed = same_choices(samples)
    chance = chance_rate([s.n_choices for s in samples],
                         [s.target for s in samples] if fixed else list(range(len(samples))))
    n = entry["n"]
    guess = sum(1 / s.n_choices for s in samples) / len(samples)
    if entry.evidence.kind is Evidence.GROUP:
        return _group_churn(entry, entry["sequential"], chance, guess, alpha)
    return churn(entry["old_acc"] * n, entry["new_acc"] * n, entry["n_negative_flips"], n, chance, guess, alpha)


def _group_churn(entry: Mapping, seq: dict, chance: float, guess: float, alpha: float) -> dict:
    """`decide.churn` for a group-sequential run: the old model's accuracy over the whole baseline; the new one's
    over the items evaluated when both strata were sampled in proportion (else not measured: nothing shown below
    chance); the right → wrong flips among the old-right items evaluated against two guessers' rate there,
    chance · (1 − guess) · N / M_R."""
    import numpy as np

    from .stats.metrics import binomial_p

    old, new = np.asarray(seq["old"], bool), np.asarray(seq["new"], bool)
    big_n, m_r, m_w = seq["items"], seq["strata"]["R"], seq["strata"]["W"]
    both = (m_r == 0 or old.any()) and (m_w == 0 or (~old).any())
    p_old = binomial_p(m_r, big_n, chance, greater=True)
    p_new = binomial_p(int(new.sum()), len(new), guess, greater=False) if both and len(new) else 1.0
    rate = min(1.0, chance * (1 - guess) * big_n / m_r) if m_r else 0.0
    p_flips = binomial_p(int((old & ~new).sum()), int(old.sum()), rate, greater=True) if old.any() else 1.0
    return churn_rule(chance, guess, m_r / big_n, entry.get("new_acc"), (p_old, p_new, p_flips), alpha)


def _baseline_samples(old: dict, task: str, filt: str, entry, record: dict | None) -> list:
    """The old samples a task's churn test reads: the compared items, or all the baseline's for a group-sequential
    run (its items are chosen by the old model's answers, so they say nothing of its chance level)."""
    if record is None or entry.evidence.kind is not Evidence.GROUP:
        return entry.samples[0]
    return [s for (f, _), s in old[task].samples.items() if f == filt]


def _metric_for(metric: str | dict[str, str] | None, task: str) -> str | None:
    """The 0/1 metric asked for `task`: one name for every task, or the first of {TASKGLOB: name} that matches."""
    if metric is None or isinstance(metric, str):
        return metric
    return next((name for glob, name in metric.items() if fnmatch.fnmatchcase(task, glob)), None)


def _select_tasks(old: dict, new: dict, old_path, new_path, tasks: str | None, common: bool,
                  notes: list[str]) -> list[str]:
    """The tasks compared: those matching the `tasks` globs (comma-separated) on both sides; with `common`, the
    tasks the sides share (the others listed in `notes`), else the sides must have the same tasks."""
    def chosen(names):
        if tasks is None:
            return set(names)
        return {t for t in names if any(fnmatch.fnmatchcase(t, g.strip()) for g in tasks.split(","))}

    a, b = chosen(old), chosen(new)
    if tasks is not None and not (a | b):
        raise RunError(f"--tasks {tasks!r}: matches none of the tasks ({', '.join(sorted(set(old) | set(new)))})")
    if a != b:
        if not common:
            raise RunError(f"the runs have different tasks: only in {old_path}: {sorted(a - b)}, only in {new_path}: "
                           f"{sorted(b - a)}; compare the ones they share with --common-tasks, or name them with "
                           "--tasks")
        if not a & b:
            raise RunError(f"{old_path} and {new_path} share no task ({sorted(a)} vs {sorted(b)})")
        notes.append(f"compared the {len(a & b)} tasks both sides have; left out, only in {old_path}: "
                     f"{', '.join(sorted(a - b)) or 'none'}; only in {new_path}: {', '.join(sorted(b - a)) or 'none'}")
    return sorted(a & b)


def _across_tasks(mine: dict[str, TaskComparison], alpha: float) -> dict | None:
    """Kübler et al.'s verdict across a candidate's tasks (every task with a 0/1 metric, churn included: an
    accuracy test is valid at chance; `decide.across_verdict`)."""
    names = [k for k, e in mine.items() if e.runs is not None]
    if not names:
        return None
    pooled = pooled_entry([mine[k].runs[0] for k in names], [mine[k].runs[1] for k in names])
    return {"tasks": names, "n": pooled["n"], "old_acc": pooled["old_acc"], "new_acc": pooled["new_acc"],
            "pooled": pooled, **across_verdict(names, [mine[k] for k in names], pooled, alpha)}


def _labels(candidates: list[list[Path]]) -> list[str]:
    """Each candidate's name in the report: its first run's folder name, or new1, new2, ... where two share one."""
    labels = [c[0].name.partition("@")[0] for c in candidates]
    return labels if len(set(labels)) == len(labels) else [f"new{i + 1}" for i in range(len(candidates))]


def _add_runs(entry: TaskComparison, olds: list, news: list, task: str, filt: str, level: float, alpha: float) -> None:
    """A 0/1 entry's runs on each side (its first run's vector, then each replicate's), their flip statistics
    (`replicate_flips`), and with replicates the pair means and the items broken beyond rerun noise."""
    more_o, samples_o = _replicate_vectors(olds[1:], olds[0], task, filt, entry["metric"])
    more_n, samples_n = _replicate_vectors(news[1:], news[0], task, filt, entry.get("metric_new", entry["metric"]))
    o, n = [entry.correct[0], *more_o], [entry.correct[1], *more_n]
    entry.metrics["replicates"] = replicate_flips(o, n, level=level)
    entry.runs = (o, n)
    if len(o) > 1 or len(n) > 1:
        _pair_means(entry.metrics, o, n)
        entry.metrics["items"] = items_beyond_noise(o, n, q=alpha)
        entry.run_samples = ([entry.samples[0], *samples_o], [entry.samples[1], *samples_n])


def _pooled(mine: dict[str, TaskComparison], include_churn: bool, level: float) -> dict | None:
    """The flip statistics of every item of the tasks that are not churn (all with `include_churn`), pooled; None
    with fewer than two 0/1 tasks."""
    pooled = [e.runs for e in mine.values() if e.runs is not None and (include_churn or not is_churn(e))]
    if not pooled or sum(e.runs is not None for e in mine.values()) < 2:
        return None
    import numpy as np

    return {"tasks": len(pooled), **replicate_flips(np.concatenate([p[0] for p in pooled], 1),
                                                    np.concatenate([p[1] for p in pooled], 1), level=level)}


def compare_runs(old_path, new_path, *, similarity: str | None = None, metric: str | dict[str, str] | None = None,
                 compatible_path=None, n_boot: int = 2000, seed: int = 0, alpha: float = 0.05,
                 include_churn: bool = False, tasks: str | None = None, common_tasks: bool = False,
                 scorer: str | None = None) -> Comparison:
    """Compare two lm-eval runs; returns the `Comparison`, its `tasks` {name: TaskComparison} (name = task, or
    `task,filter` for tasks logged with several filters).

    `old_path` may be a list of runs: replicates of the old side (training seeds, repeated sampled evaluations).
    `new_path` may be a list of runs, each a candidate compared with the old side (then the names are
    `task [run]`); a candidate that is itself a list is replicates of one new model. With replicates on any side a
    task's entry has `replicates` (`replicates.replicate_flips`: noise floor, excess NFR, run-level interval,
    minimum detectable effect) and `items` (`replicates.items_beyond_noise`: the items broken beyond rerun noise),
    and its flip metrics are means over every (old, new) pair. Every entry with a 0/1 metric gets `churn` (multiple
    choice: is the old model above chance?) and `regression` (Benjamini–Hochberg across the candidate's tasks at
    `alpha`, churn tasks left out unless `include_churn`); `overall[label]` pools the tasks that are not churn;
    `across_tasks[label]` is Kübler et al.'s accuracy verdict over every task. `metric`: one 0/1 metric name, or
    {TASKGLOB: name}; `tasks`: comma-separated globs of the tasks to compare; `common_tasks`: compare the tasks both
    sides have (else different task sets are refused); `scorer`: the Inspect scorer read as correctness. A side may
    be any format `formats.read_runs` reads (lm-eval, Inspect, lighteval, JSONL); an Inspect log's epochs are
    replicate runs. `notes` lists what was chosen for the user (the latest of several runs in a folder, tasks left
    out). Raises `RunError` for anything that does not match."""
    if similarity is not None:
        get_similarity(similarity)  # unknown name: fail before reading anything
    notes: list[str] = []
    olds = _side(old_path)
    raw = list(new_path) if isinstance(new_path, (list, tuple)) else [new_path]
    candidates = [_side(p) for p in raw]
    _check_runs_distinct(olds, candidates)
    old, *old_replicates = [run for p in olds for run in read_runs(p, notes, scorer)]  # Inspect's epochs: replicates
    compat = read_runs(compatible_path, notes, scorer)[0] if compatible_path is not None else None
    labels = _labels(candidates)
    level = 1 - 2 * alpha  # two one-sided bounds at 1 − α: the interval each decision uses (evidence.interval)
    report_tasks, overall, across, runs_per_side = {}, {}, {}, []
    for paths, label in zip(candidates, labels):
        new, *new_replicates = [run for p in paths for run in read_runs(p, notes, scorer)]
        runs_per_side.append(1 + len(new_replicates))
        record = load_record(paths[0]) if len(paths) == 1 and not old_replicates else None
        base = restrict(old, record) if record is not None else old  # evaluated until decided: its documents only
        names = _select_tasks(base, new, olds[0], paths[0], tasks, common_tasks or record is not None, notes)
        if compat is not None and not set(names) <= set(compat):
            raise RunError(f"the compatible run {compatible_path} lacks tasks {sorted(set(names) - set(compat))}")
        mine: dict[str, TaskComparison] = {}
        for task in names:
            per_filter = compare_task(base[task], new[task], similarity=similarity, metric=_metric_for(metric, task),
                                      compatible=None if compat is None else compat[task], n_boot=n_boot, seed=seed,
                                      level=level)
            for filt, entry in per_filter.items():
                if entry.correct is not None:
                    _add_runs(entry, [old, *old_replicates], [new, *new_replicates], task, filt, level, alpha)
                    if record is not None:
                        entry.metrics["sequential"] = sequential_entry(record, task, base[task], new[task],
                                                                       entry["metric"])
                        # the group design evaluated only some strata: the values over all N items, as known
                        entry.metrics.update(group_view(entry.metrics["sequential"]))
                    entry.metrics["churn"] = _is_churn(entry, _baseline_samples(old, task, filt, entry, record),
                                                       alpha)
                name = task if len(per_filter) == 1 else f"{task},{filt}"
                mine[name if len(candidates) == 1 else f"{name} [{label}]"] = entry
        for name, regression in flag_regressions(mine, alpha, include_churn).items():
            mine[name].metrics["regression"] = regression
        # a group-sequential run evaluated the items chosen by the old model's answers: no pooled view of them
        group = any(e.evidence.kind is Evidence.GROUP for e in mine.values())
        if not group:
            pooled = _pooled(mine, include_churn, level)
            if pooled is not None:
                overall[label] = pooled
            verdict = _across_tasks(mine, alpha)
            if verdict is not None:
                across[label] = verdict
        report_tasks.update(mine)
        del new, new_replicates  # one candidate in memory at a time
    return Comparison(
        old=str(olds[0]) if len(olds) == 1 else [str(p) for p in olds],
        new=str(candidates[0][0]) if len(candidates) == 1 and len(candidates[0]) == 1
        else [str(c[0]) if len(c) == 1 else [str(p) for p in c] for c in candidates],
        runs={"old": 1 + len(old_replicates), "new": runs_per_side},
        compatible=None if compatible_path is None else str(compatible_path), alpha=alpha, level=level,
        include_churn=include_churn, tasks=report_tasks, overall=overall, across_tasks=across,
        notes=list(dict.fromkeys(notes)))
