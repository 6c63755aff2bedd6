"""Reading lm-eval `--log_samples` output: `samples_<task>_<timestamp>.jsonl` (+ the sibling
`results_<timestamp>.json` for the task configs and few-shot settings), from files or directories of
any depth."""

from __future__ import annotations

import gc
import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

SAMPLES_RE = re.compile(r"^samples_(?P<task>.+)_(?P<ts>\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}\.\d+)\.jsonl$")


class RunError(ValueError):
    """A run cannot be read or compared; the message names the file, task or field."""


@dataclass(slots=True)  # slots: faster to build and smaller, for logs of millions of samples
class Sample:
    doc_id: int
    filter: str
    doc_hash: str | None
    target_hash: str | None
    prompt_hash: str | None
    target: object
    answer: object  # the model's answer in filtered_resps (`prediction`): a choice index, a generated string or None
    metrics: dict[str, float]  # the numeric per-sample metrics (NaN kept: it is refused where it is used)
    where: str = ""  # file:line (or the in-memory source) for messages
    other_metrics: dict[str, object] = field(default_factory=dict)  # listed metrics that are not numbers
    n_choices: int | None = None  # a multiple-choice item's number of choices (for its chance rate)
    prompt: str | None = None  # the input, kept in memory by the readers of logs without lines to go back to


@dataclass
class TaskRun:
    task: str
    path: Path
    samples: dict[tuple[str, int], Sample]
    config: dict = field(default_factory=dict)
    num_fewshot: int | None = None
    format: str = "lm-eval"  # lm-eval, inspect, lighteval or jsonl (`formats`): hashes are compared within one format
    default_metric: str | None = None  # the 0/1 metric to read when none is asked for (an Inspect log's scorer)

    @property
    def filters(self) -> list[str]:
        return sorted({f for f, _ in self.samples})

    @property
    def output_type(self) -> str | None:
        return self.config.get("output_type")


EXAMPLE_RUNS = ("fp32", "int8")


def example_run_path(path: str | Path) -> str | Path:
    """`example:fp32` / `example:int8`, the real pair of runs shipped with the package (SmolLM2-135M and its int8
    quantization on two BIG-bench tasks, `example_runs/README.md`), as their folder; any other path as it is."""
    text = str(path)
    if not text.startswith("example:"):
        return path
    name = text.removeprefix("example:")
    if name.partition("@")[0] not in EXAMPLE_RUNS:
        raise RunError(f"{text}: no such example run; the shipped ones are "
                       f"{', '.join('example:' + n for n in EXAMPLE_RUNS)}")
    return str(Path(__file__).parents[1] / "example_runs" / name)  # compat/example_runs


def find_sample_files(path: str | Path, notes: list[str] | None = None) -> dict[str, Path]:
    """{task: samples file} under `path` (a samples file, or a directory searched at any depth). A folder that holds
    several timestamped runs of a task (lm-eval run twice with one `--output_path`) gives the latest, said in
    `notes`; `DIR@TIMESTAMP` (or a prefix of it, e.g. `runs/old@2026-11-27T10`) picks an earlier one."""
    path_text = str(example_run_path(path))
    stamp = None
    if not Path(path_text).exists() and "@" in path_text:
        path_text, _, stamp = path_text.rpartition("@")
    path = Path(path_text)
    if not path.exists():
        raise RunError(f"{path}: no such file or directory")
    files = [path] if path.is_file() else sorted(path.rglob("samples_*.jsonl"))
    if path.is_file() and not SAMPLES_RE.match(path.name):
        raise RunError(f"{path}: not an lm-eval samples file (expected samples_<task>_<timestamp>.jsonl)")
    if not files:
        raise RunError(f"{path}: no samples_*.jsonl files; run lm_eval with --log_samples --output_path {path}")
    by_task: dict[str, list[Path]] = {}
    stamps = set()
    for f in files:
        m = SAMPLES_RE.match(f.name)
        if m:
            stamps.add(m["ts"])
            if stamp is None or m["ts"].startswith(stamp):
                by_task.setdefault(m["task"], []).append(f)
    if stamp is not None and not by_task:
        raise RunError(f"{path}@{stamp}: no run with that timestamp; runs there: {', '.join(sorted(stamps))}")
    out = {}
    for task, found in by_task.items():
        if len({f.parent for f in found}) > 1:  # e.g. two models' folders under one --output_path
            raise RunError(f"{path}: sample files for task {task!r} in {len({f.parent for f in found})} folders "
                           f"({', '.join(sorted({str(f.parent) for f in found}))}); point at one model's folder")
        found.sort(key=lambda f: SAMPLES_RE.match(f.name)["ts"])
        out[task] = found[-1]
        if len(found) > 1 and notes is not None:
            latest = SAMPLES_RE.match(found[-1].name)["ts"]
            notes.append(f"{path}: {len(found)} runs of task {task!r} there; compared the latest ({latest}); name "
                         f"another as {path}@TIMESTAMP")
    return out


def _results_for(samples_file: Path) -> dict:
    m = SAMPLES_RE.match(samples_file.name)
    results = samples_file.with_name(f"results_{m['ts']}.json")
    if not results.exists():
        return {}
    try:
        return json.loads(results.read_text())
    except json.JSONDecodeError as err:
        raise RunError(f"{results}: not valid JSON ({err})") from err


def read_task_run(task: str, samples_file: Path) -> TaskRun:
    gc_was_enabled = gc.isenabled()
    gc.disable()  # millions of small acyclic objects: the cyclic GC would rescan them again and again
    try:
        samples = _read_samples(samples_file)
    finally:
        if gc_was_enabled:
            gc.enable()
    results = _results_for(samples_file)
    n_shot = results.get("n-shot", {}).get(task)
    return TaskRun(task=task, path=samples_file, samples=samples, config=results.get("configs", {}).get(task, {}),
                   num_fewshot=None if n_shot is None else int(n_shot))


def _read_samples(samples_file: Path) -> dict[tuple[str, int], Sample]:
    samples: dict[tuple[str, int], Sample] = {}
    prefix = f"{samples_file}:"
    decoder, names = None, None
    with open(samples_file, "rb") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = prefix + str(line_no)
            if decoder is not None:
                try:
                    rec = decoder.decode(line)
                except ValueError:  # malformed or unusual (msgspec's errors, invalid UTF-8): the general path names it
                    rec = None
                if rec is not None and rec.metrics == names:
                    _add_typed_sample(samples, where, rec, names)
                    continue
            rec = _load_line(line, samples_file, line_no)
            _add_sample(samples, where, rec)
            if decoder is None and isinstance(rec.get("metrics"), list) and all(isinstance(m, str) for m in rec["metrics"]):
                decoder, names = _record_decoder(rec["metrics"]), rec["metrics"]
    if not samples:
        raise RunError(f"{samples_file}: no samples")
    return samples


def _load_line(line: bytes, samples_file: Path, line_no: int) -> dict:
    try:
        rec = msgspec.json.decode(line)
    except ValueError:
        try:  # lm-eval writes Python's json, whose NaN/Infinity tokens are not JSON
            rec = json.loads(line)
        except ValueError as err:  # JSONDecodeError, or bytes that are not UTF-8
            raise RunError(f"{samples_file}:{line_no}: not valid JSON ({err})") from err
    if not isinstance(rec, dict):
        raise RunError(f"{samples_file}:{line_no}: not an lm-eval sample record (a JSON {type(rec).__name__}, "
                       "expected an object)")
    return rec


def _record_decoder(metric_names: list[str]) -> msgspec.json.Decoder:
    """A decoder of one file's sample lines that builds only the fields `compare` reads (the document, prompts and
    raw responses, most of a line, are skipped without becoming Python objects: 2-3x faster than a full parse).
    Metric values are top-level keys named by `metrics`, so the record type is made per file."""
    fields = [("doc_id", int), ("filtered_resps", msgspec.Raw), ("filter", str, "none"),
              ("doc_hash", str | None, None), ("target_hash", str | None, None), ("prompt_hash", str | None, None),
              ("target", Any, None), ("metrics", list[str], [])]
    fields += [(f"metric_{i}", Any, msgspec.UNSET) for i in range(len(metric_names))]
    record = msgspec.defstruct("SampleRecord", fields, rename={f"metric_{i}": name for i, name in
                                                               enumerate(metric_names)})
    return msgspec.json.Decoder(record)


# a multiple-choice response, [[loglikelihood, is_greedy], ...]; lm-eval logs the numbers as strings
_CHOICE_LOGLIKELIHOODS = msgspec.json.Decoder(list[tuple[float, Any]], strict=False)


def _add_typed_sample(samples: dict[tuple[str, int], Sample], where: str, rec, names: list[str]) -> None:
    """`_add_sample` for a record of `_record_decoder`'s type (same result, without building a dict)."""
    metrics, other = {}, {}
    for i, name in enumerate(names):
        value = getattr(rec, f"metric_{i}")
        if type(value) is float or type(value) is int or type(value) is bool:
            metrics[name] = float(value)
        elif value is not msgspec.UNSET:
            other[name] = value
    answer = n_choices = None
    try:
        lls = [ll for ll, _ in _CHOICE_LOGLIKELIHOODS.decode(rec.filtered_resps)]
        if lls and math.isfinite(sum(lls)):
            answer, n_choices = lls.index(max(lls)), len(lls)
    except msgspec.ValidationError:  # a generation, or something `prediction` will name
        pass
    if answer is None:
        answer = prediction(msgspec.json.decode(rec.filtered_resps), where)
    key = (rec.filter, rec.doc_id)
    if key in samples:
        raise RunError(f"{where}: doc_id {key[1]} appears twice for filter {key[0]!r}")
    samples[key] = Sample(rec.doc_id, rec.filter, rec.doc_hash, rec.target_hash, rec.prompt_hash, rec.target,
                          answer, metrics, where, other, n_choices)


def _add_sample(samples: dict[tuple[str, int], Sample], where: str, rec: dict) -> None:
    """Add one lm-eval sample record to `samples`."""
    try:
        key = (str(rec.get("filter", "none")), int(rec["doc_id"]))
        metrics, other = {}, {}
        for name in rec.get("metrics", ()):
            if name in rec:
                value = rec[name]
                if isinstance(value, (int, float)):  # bool is an int; numpy floats from memory are floats
                    metrics[name] = float(value)
                else:
                    other[name] = value
        response = rec["filtered_resps"]
        sample = Sample(key[1], key[0], rec.get("doc_hash"), rec.get("target_hash"), rec.get("prompt_hash"),
                        rec.get("target"), prediction(response, where), metrics, where, other,
                        len(response) if _is_choice_response(response) else None)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise RunError(f"{where}: not an lm-eval sample record ({err!r} missing or malformed; expected "
                       "doc_id, filtered_resps)") from err
    if key in samples:
        raise RunError(f"{where}: doc_id {key[1]} appears twice for filter {key[0]!r}")
    samples[key] = sample


def samples_from_records(records) -> dict[tuple[str, int], Sample]:
    """{(filter, doc_id): Sample} from `(where, record)` pairs, e.g. the in-memory `results["samples"][task]`
    of `lm_eval.simple_evaluate`."""
    samples: dict[tuple[str, int], Sample] = {}
    for where, rec in records:
        _add_sample(samples, where, rec)
    return samples


def _is_choice_response(response) -> bool:
    """A multiple-choice response: a non-empty list of (loglikelihood, is_greedy) pairs."""
    return type(response) in _SEQUENCES and bool(response) and set(map(type, response)) <= _SEQUENCES \
        and set(map(len, response)) == {2}


def prediction(response, where: str = ""):
    """The model's answer in an lm-eval response (`filtered_resps`, or `results` in `process_results`): the
    index of the largest log-likelihood for multiple choice (a list of (loglikelihood, is_greedy) pairs;
    the first maximum, as lm-eval's `acc`), else the first generated string ("" for an empty response);
    None when the response is neither. A non-finite log-likelihood is refused (a NaN would silently pick a
    choice), naming `where` (file:line). This runs for every sample read: C-level checks, one pass."""
    if _is_choice_response(response):
        try:
            lls = [float(ll) for ll, _ in response]
        except (TypeError, ValueError):
            lls = [math.nan]
        if not math.isfinite(sum(lls)):  # finite iff every term is (log-likelihoods are far from overflowing)
            bad = next(ll for ll, _ in response if not _finite(ll))
            raise RunError(f"{where or 'a sample'}: log-likelihood {bad!r} in filtered_resps is not a finite number")
        return lls.index(max(lls))
    while isinstance(response, (list, tuple)):
        if not response:
            return ""  # no generation at all: the empty answer
        response = response[0]
    return response if isinstance(response, str) else None


_SEQUENCES = {list, tuple}


def _finite(value) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def read_lm_eval_run(path: str | Path, notes: list[str] | None = None) -> dict[str, TaskRun]:
    """All tasks of one lm-eval run: {task: TaskRun} (`find_sample_files` for which files, and `notes`)."""
    return {task: read_task_run(task, f) for task, f in find_sample_files(path, notes).items()}


def read_lines(wheres: set[str]) -> dict[str, dict]:
    """{"file:line": record} for the given places, one pass over each file."""
    by_file: dict[str, set[int]] = defaultdict(set)
    for where in wheres:
        path, _, line = where.rpartition(":")
        if line.isdigit():  # samples read from a file (in-memory results have no lines to go back to)
            by_file[path].add(int(line))
    out = {}
    for path, lines in by_file.items():
        with open(path, "rb") as f:
            for line_no, line in enumerate(f, 1):
                if line_no in lines:
                    try:
                        out[f"{path}:{line_no}"] = msgspec.json.decode(line)
                    except ValueError:  # Python's json NaN tokens; or text that is not UTF-8 in the fields that
                        try:            # `compare` skipped when it read the line
                            out[f"{path}:{line_no}"] = json.loads(line)
                        except ValueError as err:
                            raise RunError(f"{path}:{line_no}: not valid JSON ({err})") from err
    return out


def choices_of(record: dict) -> list[str] | None:
    """The continuations of a multiple-choice request (None for generation). `arguments` as lm-eval's CLI writes it
    ({"gen_args_0": {"arg_0": context, "arg_1": continuation}, ...}) or as `simple_evaluate` returns it, which
    `evaluate` writes ([[context, continuation], ...])."""
    arguments = record.get("arguments", {})
    if isinstance(arguments, list):
        args = [dict(zip(("arg_0", "arg_1"), a)) if isinstance(a, list) else {} for a in arguments]
    else:
        args = [a for _, a in sorted(arguments.items(), key=lambda kv: int(kv[0].rsplit("_", 1)[1]))]
    if len(args) > 1 and all(isinstance(a.get("arg_1"), str) for a in args):
        return [a["arg_1"] for a in args]
    return None


def same_choices(samples: list, look: int = 50) -> bool:
    """Whether the task offers every item the same choices (a fixed label set, e.g. True / False), read back from the
    first `look` samples' lines: only then is the gold index a label whose majority share is a chance rate. Samples
    held in memory (no lines to read) count as varying."""
    wheres = [s.where for s in samples[:look]]
    if not all(w and w.rpartition(":")[2].isdigit() for w in wheres):
        return False
    records = read_lines(set(wheres))
    lists = [choices_of(records[w]) for w in wheres]
    # records without their continuations (a trimmed log) say nothing of a fixed label set: 1/#choices is the rate
    return all(c is not None for c in lists) and len({tuple(c) for c in lists}) == 1


CORRECTNESS_METRICS = ("acc", "exact_match", "em")  # the 0/1 metrics a run is read by, in this order


def choose_metric(run: TaskRun, filt: str, requested: str | None, graded_ok: bool = False) -> str | None:
    """The 0/1 correctness metric of a task: `requested`, else the first of acc/exact_match/em present. With
    `graded_ok` (a --similarity run that named no metric), a default metric that is not 0/1 is passed over (None)
    instead of refused: the similarity scores the task."""
    samples = [s for (f, _), s in run.samples.items() if f == filt]
    present = sorted({m for s in samples for m in s.metrics} | {m for s in samples for m in s.other_metrics})
    names = [requested] if requested else [run.default_metric] if run.default_metric else \
        [m for m in CORRECTNESS_METRICS if m in samples[0].metrics or m in samples[0].other_metrics]
    for name in names:
        for s in samples:
            if name in s.other_metrics:
                raise RunError(f"{s.where or run.path}: metric {name!r} is {s.other_metrics[name]!r}, not a number")
            if name in s.metrics and not math.isfinite(s.metrics[name]):
                raise RunError(f"{s.where or run.path}: metric {name!r} is {s.metrics[name]}, not a finite number")
        values = [s.metrics.get(name) for s in samples]
        if all(v is None for v in values):
            raise RunError(f"{run.path}: task {run.task!r} has no metric {name!r}; its samples have: "
                           f"{', '.join(present) or 'no metric'}")
        if any(v is None for v in values):
            raise RunError(f"{run.path}: metric {name!r} is missing from some samples of task {run.task!r} (the "
                           f"samples have: {', '.join(present)})")
        if not set(values) <= {0.0, 1.0}:
            if graded_ok and not requested:
                return None
            odd = next(v for v in values if v not in (0.0, 1.0))
            texts = all(isinstance(s.answer, str) for s in samples)
            raise RunError(f"{run.path}: metric {name!r} of task {run.task!r} is not 0/1 (e.g. {odd:g}); compare "
                           "needs right or wrong per item: "
                           + ("score the generated answers with --similarity NAME (e.g. rouge1), or " if texts else "")
                           + f"name a 0/1 metric with --metric (the samples have: {', '.join(present)})")
        return name
    return None
