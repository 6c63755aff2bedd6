"""The runs `compare` reads besides lm-eval's `--log_samples` folders (`runs`): Inspect AI logs, lighteval's
per-sample details, and a plain JSONL form any harness can write. Each becomes the same `TaskRun`s, so flips, the
noise floor, churn, the gate and the page work on all of them.

- **Inspect AI** (`.eval` or `.json` logs, read with inspect_ai's own `read_eval_log`; the `inspect` extra): one task
  per log; the item key is the sample id; Inspect's epochs are replicate runs of one model; correctness is the chosen
  scorer's value mapped by Inspect's own `value_to_float` (C/I, booleans, numbers). A folder of logs is a run.
- **lighteval** (`details_<task>_<date>.parquet`, what `--save-details` writes: the columns `doc`, `model_response`,
  `metric` of lighteval's `Detail`): the key is `doc.id`, or the row when lighteval left it empty; the metrics are
  its metric names.
- **JSONL** (any other harness): one JSON object a line, `{"task", "id", "correct"}` (or `"score"` instead of
  `correct`), optional `"answer"`, `"input"`, `"target"`, `"choices"`, `"doc_hash"` and `"epoch"` (replicates of one
  model, as Inspect's). docs/compat.md has the form.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from .runs import SAMPLES_RE, RunError, Sample, TaskRun, example_run_path, read_lm_eval_run

FORMATS = ("lm-eval", "inspect", "lighteval", "jsonl")


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _text(value) -> str:
    """An input or target as text: a string, a list of chat messages (their contents), or a list of strings."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return "\n".join(_text(getattr(v, "text", None) or getattr(v, "content", None) or v) for v in value)
    return "" if value is None else str(value)


def _keys_of_one_type(ids: list) -> list:
    """Ids of one task as given (int or str); mixed, as strings (they must sort)."""
    return ids if len({type(i) for i in ids}) <= 1 else [str(i) for i in ids]


def detect(path: str | Path) -> str:
    """The format of a run: a file by its name, a folder by what it holds (lm-eval samples first)."""
    text = str(example_run_path(path))
    p = Path(text)
    if not p.exists() and "@" in text:  # DIR@TIMESTAMP (lm-eval's runs)
        p = Path(text.rpartition("@")[0])
    if not p.exists():
        raise RunError(f"{p}: no such file or directory")
    if p.is_file():
        if SAMPLES_RE.match(p.name):
            return "lm-eval"
        if p.suffix == ".eval" or (p.suffix == ".json" and _is_inspect_json(p)):
            return "inspect"
        if p.suffix == ".parquet":
            return "lighteval"
        if p.suffix == ".jsonl":
            return "jsonl"
        raise RunError(f"{p}: not a run compare reads (lm-eval samples_*.jsonl, an Inspect .eval/.json log, "
                       "lighteval details_*.parquet, or the JSONL form of docs/compat.md)")
    for kind, found in (("lm-eval", lambda: next(p.rglob("samples_*.jsonl"), None)),
                        ("inspect", lambda: next(p.rglob("*.eval"), None) or next(
                            (f for f in p.rglob("*.json") if _is_inspect_json(f)), None)),
                        ("lighteval", lambda: next(p.rglob("details_*.parquet"), None)),
                        ("jsonl", lambda: next(p.rglob("*.jsonl"), None))):
        if found():
            return kind
    raise RunError(f"{p}: no run found there: no samples_*.jsonl files (run lm_eval with --log_samples "
                   f"--output_path {p}), Inspect .eval/.json logs, lighteval details_*.parquet, or *.jsonl in the form "
                   "of docs/compat.md")


def _is_inspect_json(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(4096)
    return b'"eval"' in head and (b'"version"' in head or b'"status"' in head)


def read_runs(path: str | Path, notes: list[str] | None = None, scorer: str | None = None
              ) -> list[dict[str, TaskRun]]:
    """The run(s) at `path`, in any format: [{task: TaskRun}] — several when the log holds replicates (Inspect's
    epochs, a JSONL `epoch` field), each a run of the same model."""
    kind = detect(path)
    if scorer is not None and kind != "inspect":
        raise RunError(f"--scorer {scorer}: {path} is a {kind} run; --scorer names an Inspect log's scorer "
                       "(use --metric for the others)")
    if kind == "lm-eval":
        return [read_lm_eval_run(path, notes)]
    p = Path(path)
    files = [p] if p.is_file() else sorted(
        f for pattern in {"inspect": ("*.eval", "*.json"), "lighteval": ("details_*.parquet",),
                          "jsonl": ("*.jsonl",)}[kind] for f in p.rglob(pattern)
        if kind != "inspect" or f.suffix == ".eval" or _is_inspect_json(f))
    reader = {"inspect": lambda f: _read_inspect(f, scorer), "lighteval": _read_lighteval, "jsonl": _read_jsonl}[kind]
    runs: list[dict[str, TaskRun]] = []
    seen: dict[str, Path] = {}
    for f in files:
        for epoch, tasks in enumerate(reader(f)):
            while len(runs) <= epoch:
                runs.append({})
            for task, run in tasks.items():
                if task in runs[epoch]:
                    raise RunError(f"{path}: task {task!r} is in two logs ({seen[task]} and {f}); point at one "
                                   "run's logs")
                seen[task] = f
                runs[epoch][task] = run
    if not runs or not runs[0]:
        raise RunError(f"{path}: no samples")
    return runs


def _sample(key, metrics: dict, where: str, *, answer=None, target=None, prompt=None, n_choices=None,
            doc_hash=None) -> Sample:
    return Sample(key, "none", doc_hash, None if target is None else _digest(target), None, target, answer,
                  metrics, where, {}, n_choices, prompt)


def _read_inspect(path: Path, scorer: str | None) -> list[dict[str, TaskRun]]:
    """An Inspect log: one task, one run per epoch."""
    try:
        from inspect_ai.log import read_eval_log
        from inspect_ai.scorer import value_to_float
    except ImportError as err:
        raise ImportError(f"{path} is an Inspect AI log: reading it needs inspect-ai (pip install "
                          "'adaptguard[inspect]')") from err
    try:
        log = read_eval_log(str(path))
    except Exception as err:  # noqa: BLE001 - inspect_ai raises several kinds for a file that is not a log
        raise RunError(f"{path}: not a readable Inspect log ({type(err).__name__}: {err})") from err
    if log.status != "success":
        raise RunError(f"{path}: the Inspect log's status is {log.status!r}, not 'success' (an unfinished or failed "
                       "run): finish it (inspect eval-retry) or give a finished log")
    samples = log.samples or []
    if not samples:
        raise RunError(f"{path}: the Inspect log has no samples")
    names = list(samples[0].scores or {})
    if not names:
        raise RunError(f"{path}: the Inspect log's samples have no scores")
    name = scorer or names[0]
    to_float = value_to_float()
    task = log.eval.task.rpartition("/")[2]
    ids = _keys_of_one_type([s.id for s in samples])
    by_epoch: dict[int, dict] = {}
    for s, key in zip(samples, ids):
        where = f"{path}#{s.id}/epoch{s.epoch}"
        if s.error is not None:
            raise RunError(f"{where}: the sample ended in an error ({str(s.error.message)[:120]}); rerun it")
        if name not in (s.scores or {}):
            raise RunError(f"{where}: no score from scorer {name!r} (scorers: {', '.join(s.scores or {}) or 'none'})"
                           + ("" if scorer else "; choose one with --scorer"))
        score = s.scores[name]
        value = score.value
        if isinstance(value, dict):
            raise RunError(f"{where}: scorer {name!r} gives several values ({', '.join(value)}); compare needs one")
        samples_of = by_epoch.setdefault(s.epoch, {})
        if ("none", key) in samples_of:
            raise RunError(f"{where}: sample id {s.id!r} appears twice in epoch {s.epoch}")
        choices = getattr(s, "choices", None) or None
        samples_of["none", key] = _sample(
            key, {name: float(to_float(value))}, where, answer=score.answer if score.answer is not None
            else (s.output.completion if s.output else None), target=_text(s.target), prompt=_text(s.input),
            n_choices=len(choices) if choices else None, doc_hash=_digest(_text(s.input)))
    config = {"output_type": "multiple_choice" if getattr(samples[0], "choices", None) else "generate_until"}
    return [{task: TaskRun(task, path, by_epoch[e], config, None, "inspect", name)} for e in sorted(by_epoch)]


def _read_lighteval(path: Path) -> list[dict[str, TaskRun]]:
    """lighteval's details of one task (`details_<task>_<date>.parquet`)."""
    try:
        import pyarrow.parquet as pq
    except ModuleNotFoundError as err:
        from ...extras import missing_extra

        raise (missing_extra(err, f"{path}: reading lighteval's parquet details") or err) from None

    try:
        rows = pq.read_table(path).to_pylist()
    except Exception as err:  # noqa: BLE001 - pyarrow's errors for a file that is not parquet
        raise RunError(f"{path}: not a readable parquet file ({err})") from err
    if not rows:
        raise RunError(f"{path}: no samples")
    missing = {"doc", "model_response", "metric"} - set(rows[0])
    if missing:
        raise RunError(f"{path}: not lighteval details (no column {', '.join(sorted(missing))}; expected doc, "
                       "model_response, metric as --save-details writes them)")
    stem = path.stem.removeprefix("details_")
    task = stem.rsplit("_", 1)[0] if "_" in stem else stem  # details_<task>_<date>
    ids = _keys_of_one_type([r["doc"].get("id") or i for i, r in enumerate(rows)])
    samples = {}
    for i, (row, key) in enumerate(zip(rows, ids)):
        doc, response, metric = row["doc"], row["model_response"] or {}, row["metric"] or {}
        where = f"{path}#row{i}"
        if ("none", key) in samples:
            raise RunError(f"{where}: doc id {key!r} appears twice")
        choices, gold = doc.get("choices") or [], doc.get("gold_index")
        gold = gold[0] if isinstance(gold, list) and len(gold) == 1 else gold
        logprobs = response.get("logprobs") or []
        multiple_choice = bool(choices) and len(logprobs) == len(choices) > 1
        if multiple_choice:
            answer = choices[max(range(len(logprobs)), key=logprobs.__getitem__)]
        else:
            texts = response.get("text_post_processed") or response.get("text") or []
            answer = texts[0] if texts else ""
        target = choices[gold] if isinstance(gold, int) and 0 <= gold < len(choices) else gold
        numbers = {k: float(v) for k, v in metric.items() if isinstance(v, (int, float))}  # bool is an int
        samples["none", key] = _sample(key, numbers, where, answer=answer, target=target, prompt=doc.get("query"),
                                       n_choices=len(choices) if multiple_choice else None,
                                       doc_hash=_digest([doc.get("query"), choices]))
    output_type = "multiple_choice" if all(s.n_choices for s in samples.values()) else "generate_until"
    return [{task: TaskRun(task, path, samples, {"output_type": output_type}, None, "lighteval")}]


def _read_jsonl(path: Path) -> list[dict[str, TaskRun]]:
    """The plain form: one object a line (module docstring); several tasks and epochs may share a file."""
    by: dict[tuple[int, str], dict] = {}
    with open(path, "rb") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{line_no}"
            try:
                rec = json.loads(line)
            except ValueError as err:
                raise RunError(f"{where}: not valid JSON ({err})") from err
            if not isinstance(rec, dict):
                raise RunError(f"{where}: expected a JSON object with task, id and correct (or score)")
            for field in ("task", "id"):
                if field not in rec:
                    raise RunError(f"{where}: no {field!r} field (each line needs task, id and correct or score)")
            if not isinstance(rec["id"], (int, str)) or isinstance(rec["id"], bool):
                raise RunError(f"{where}: 'id' must be a string or an integer, got {rec['id']!r}")
            name = "correct" if "correct" in rec else "score" if "score" in rec else None
            if name is None:
                raise RunError(f"{where}: no 'correct' or 'score' field")
            value = rec[name]
            if not isinstance(value, (bool, int, float)) or not math.isfinite(float(value)):
                raise RunError(f"{where}: {name!r} must be a finite number or a boolean, got {value!r}")
            epoch = rec.get("epoch", 0)
            if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
                raise RunError(f"{where}: 'epoch' must be an integer ≥ 0, got {epoch!r}")
            samples = by.setdefault((epoch, str(rec["task"])), {})
            if ("none", rec["id"]) in samples:
                raise RunError(f"{where}: id {rec['id']!r} of task {rec['task']!r} appears twice"
                               + (f" in epoch {epoch}" if "epoch" in rec else ""))
            choices = rec.get("choices")
            samples["none", rec["id"]] = _sample(
                rec["id"], {name: float(value)}, where, answer=rec.get("answer"), target=rec.get("target"),
                prompt=None if rec.get("input") is None else _text(rec["input"]),
                n_choices=len(choices) if isinstance(choices, list) and choices else None,
                doc_hash=rec.get("doc_hash") or (None if rec.get("input") is None else _digest(_text(rec["input"]))))
    if not by:
        raise RunError(f"{path}: no samples")
    epochs = sorted({e for e, _ in by})
    if epochs != list(range(len(epochs))):
        raise RunError(f"{path}: epochs {epochs}: number them 0, 1, 2, ... (each a rerun of the model)")
    runs = []
    for e in epochs:
        tasks = {}
        for (epoch, task), samples in by.items():
            if epoch == e:
                kinds = {type(k) for _, k in samples}
                if len(kinds) > 1:
                    raise RunError(f"{path}: task {task!r} mixes integer and string ids; use one kind")
                multiple = all(s.n_choices for s in samples.values())
                first = next(iter(samples.values()))
                tasks[task] = TaskRun(task, path, samples, {"output_type": "multiple_choice" if multiple else None},
                                      None, "jsonl", next(iter(first.metrics)))
        runs.append(tasks)
    return runs
