"""`adaptguard compare OLD NEW`: compatibility of two lm-eval runs, joined sample by sample.

Works for any lm-eval task logged with `--log_samples`:
- multiple choice: prediction = argmax of the logged log-likelihoods, correctness = `acc`;
- generation with a 0/1 metric (`exact_match`, GSM8K-style): prediction = the filtered response;
- generation scored by similarity (`--similarity rouge1`): smooth flips from `D = S(new) − S(old)`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from .files import atomic_write_text
from .compat import delta_metrics, flip_metrics, similarity_deltas, smooth_flip_metrics
from .runs import RunError, Sample, TaskRun, read_run

CORRECTNESS_METRICS = ("acc", "exact_match", "em")


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
    for key, s_old in old.samples.items():
        s_new = new.samples[key]
        if s_old.doc_hash and s_new.doc_hash and s_old.doc_hash != s_new.doc_hash:
            raise RunError(f"task {task!r}: doc_id {key[1]} is a different document (doc_hash differs)")
        if s_old.target_hash and s_new.target_hash and s_old.target_hash != s_new.target_hash:
            raise RunError(f"task {task!r}: doc_id {key[1]} has a different target (target_hash differs)")


def choose_metric(run: TaskRun, filt: str, requested: str | None) -> str | None:
    """The 0/1 correctness metric of a task: `requested`, else the first of acc/exact_match/em present."""
    samples = [s for (f, _), s in run.samples.items() if f == filt]
    names = [requested] if requested else [m for m in CORRECTNESS_METRICS if m in samples[0].metrics]
    for name in names:
        values = [s.metrics.get(name) for s in samples]
        if any(v is None for v in values):
            raise RunError(f"{run.path}: metric {name!r} is missing from some samples of task {run.task!r}")
        if not set(values) <= {0.0, 1.0}:
            raise RunError(f"{run.path}: metric {name!r} of task {run.task!r} is not 0/1; use --similarity for "
                           "generation scored by similarity")
        return name
    return None


def prediction(sample: Sample):
    """The model's answer: argmax log-likelihood for multiple choice, the (first) string for generation."""
    resp = sample.response
    if isinstance(resp, (list, tuple)) and resp and all(isinstance(r, (list, tuple)) and len(r) == 2 for r in resp):
        lls = [float(r[0]) for r in resp]
        return lls.index(max(lls))  # first maximum, as np.argmax in lm-eval's acc
    while isinstance(resp, (list, tuple)) and resp:
        resp = resp[0]
    return resp if isinstance(resp, str) else None


def _text(sample: Sample) -> str:
    pred = prediction(sample)
    if not isinstance(pred, str):
        raise RunError(f"doc_id {sample.doc_id}: --similarity needs generated text, got {sample.response!r:.80}")
    return pred


def _references(sample: Sample) -> list[str]:
    target = sample.target
    refs = target if isinstance(target, list) else [target]
    return [str(r) for r in refs]


def _flips(old: list[Sample], new: list[Sample], metric: str, n_boot: int, seed: int) -> dict:
    preds = [prediction(s) for s in old], [prediction(s) for s in new]
    have = all(p is not None for p in preds[0] + preds[1])
    return flip_metrics([s.metrics[metric] for s in old], [s.metrics[metric] for s in new],
                        *(preds if have else (None, None)), n_boot=n_boot, seed=seed)


def compare_task(old: TaskRun, new: TaskRun, *, similarity: str | None = None, metric: str | None = None,
                 compatible: TaskRun | None = None, n_boot: int = 2000, seed: int = 0) -> dict[str, dict]:
    """Metrics for every filter of a task: {filter: {...}}."""
    check_same_setup(old, new)
    if compatible is not None:
        check_same_setup(old, compatible, labels=("old", "compatible"))
    out = {}
    for filt in old.filters:
        keys = sorted(k for k in old.samples if k[0] == filt)
        o = [old.samples[k] for k in keys]
        n = [new.samples[k] for k in keys]
        c = [compatible.samples[k] for k in keys] if compatible is not None else None
        entry: dict = {"task": old.task, "filter": filt, "output_type": old.output_type or new.output_type}
        name = choose_metric(old, filt, metric)
        if name is not None:
            choose_metric(new, filt, name)
            entry["metric"] = name

            entry.update(_flips(o, n, name, n_boot, seed))
            if c is not None:
                choose_metric(compatible, filt, name)
                compat = _flips(o, c, name, n_boot, seed)
                entry["compatible"] = compat
                entry.update(delta_metrics(entry, compat))
        if similarity is not None and prediction(o[0]) is not None and isinstance(prediction(o[0]), str):
            refs = [_references(s) for s in o]
            old_text = [_text(s) for s in o]
            delta = similarity_deltas(old_text, [_text(s) for s in n], refs, similarity)
            smooth = smooth_flip_metrics(delta, n_boot=n_boot, seed=seed)
            entry["similarity"] = similarity
            entry.update({k: v for k, v in smooth.items() if k != "n"})
            entry["n"] = smooth["n"]
            entry["_delta"] = delta
            if c is not None:
                compat_smooth = smooth_flip_metrics(similarity_deltas(old_text, [_text(s) for s in c], refs,
                                                                      similarity), n_boot=n_boot, seed=seed)
                entry.setdefault("compatible", {}).update(compat_smooth)
                entry.update(delta_metrics(smooth, compat_smooth))
        if "metric" not in entry and "similarity" not in entry:
            raise RunError(f"task {old.task!r} (filter {filt!r}) has no 0/1 metric ({', '.join(CORRECTNESS_METRICS)})"
                           f"; name one with --metric or score the generations with --similarity NAME")
        entry["_correct"] = ([s.metrics[entry["metric"]] for s in o], [s.metrics[entry["metric"]] for s in n]) \
            if "metric" in entry else None
        out[filt] = entry
    return out


def compare_runs(old_path, new_path, *, similarity: str | None = None, metric: str | None = None,
                 compatible_path=None, n_boot: int = 2000, seed: int = 0) -> dict:
    """Compare two lm-eval runs; returns `{"tasks": {name: metrics}}` (name = task, or `task,filter` for
    tasks logged with several filters). Raises `RunError` for anything that does not match."""
    if similarity is not None:
        from .plugins import get_similarity

        get_similarity(similarity)  # unknown name: fail before reading anything
    old, new = read_run(old_path), read_run(new_path)
    compat = read_run(compatible_path) if compatible_path is not None else None
    if set(old) != set(new):
        raise RunError(f"the runs have different tasks: only in {old_path}: {sorted(set(old) - set(new))}, "
                       f"only in {new_path}: {sorted(set(new) - set(old))}")
    if compat is not None and set(compat) != set(old):
        raise RunError(f"the compatible run {compatible_path} has tasks {sorted(compat)}, expected {sorted(old)}")
    tasks = {}
    for task in sorted(old):
        per_filter = compare_task(old[task], new[task], similarity=similarity, metric=metric,
                                  compatible=None if compat is None else compat[task], n_boot=n_boot, seed=seed)
        for filt, entry in per_filter.items():
            tasks[task if len(per_filter) == 1 else f"{task},{filt}"] = entry
    return {"old": str(old_path), "new": str(new_path), "compatible": None if compatible_path is None
            else str(compatible_path), "tasks": tasks}


def _public(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if not k.startswith("_")}


def _clean(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def to_json(report: dict) -> str:
    return json.dumps(_clean({**report, "tasks": {k: _public(v) for k, v in report["tasks"].items()}}), indent=2)


def _fmt(value, pct=False) -> str:
    if value is None:
        return "–"
    if isinstance(value, (tuple, list)):
        return f"[{_fmt(value[0], pct)}, {_fmt(value[1], pct)}]"
    return f"{100 * value:.2f}" if pct else f"{value:.4g}"


def table_rows(report: dict) -> tuple[list[str], list[list[str]]]:
    header = ["task", "n", "old acc", "new acc", "NFR %", "NFR 95% CI", "PFR %", "NFR_mc %", "BTC", "McNemar p"]
    smooth = any("similarity" in e for e in report["tasks"].values())
    compat = report.get("compatible") is not None
    if smooth:
        header += ["S", "smooth NFR %", "smooth PFR %", "m_g", "m_r"]
    if compat:
        header += ["ΔNFR_c", "Δ%NFR_c"]
    rows = []
    for name, e in report["tasks"].items():
        row = [name, str(e["n"]), _fmt(e.get("old_acc")), _fmt(e.get("new_acc")), _fmt(e.get("nfr"), True),
               _fmt(e.get("nfr_ci"), True), _fmt(e.get("pfr"), True), _fmt(e.get("nfr_mc"), True),
               _fmt(e.get("btc")), _fmt(e.get("mcnemar_p"))]
        if smooth:
            row += [e.get("similarity", "–"), _fmt(e.get("smooth_nfr"), True), _fmt(e.get("smooth_pfr"), True),
                    _fmt(e.get("m_g")), _fmt(e.get("m_r"))]
        if compat:
            key = "delta_nfr" if "delta_nfr" in e else "delta_smooth_nfr"
            row += [_fmt(e.get(key), True), _fmt(e.get(f"{key}_pct"))]
        rows.append(row)
    return header, rows


def to_text(report: dict) -> str:
    header, rows = table_rows(report)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths))  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def to_markdown(report: dict) -> str:
    header, rows = table_rows(report)
    lines = [f"# Compatibility: `{report['old']}` → `{report['new']}`", "",
             "NFR/PFR = negative/positive flip rate, NFR_mc = inconsistency flips, BTC = backward trust "
             "compatibility (paper 002 §3); McNemar = exact test on the discordant pairs.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def plot_quadrants(report: dict, path: Path) -> None:
    """Flip quadrants per task (paper 002 Fig. 2/4): a 2×2 count grid for 0/1 metrics, a scatter of
    S(old) vs S(new) coloured by gain/regression for similarity tasks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = list(report["tasks"].items())
    cols = min(3, len(entries))
    rows = math.ceil(len(entries) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.8 * rows), squeeze=False)
    for ax, (name, e) in zip(axes.flat, entries):
        if e.get("_correct") is not None:
            old, new = (np.asarray(v, dtype=bool) for v in e["_correct"])
            grid = np.array([[(~old & new).sum(), (old & new).sum()], [(~old & ~new).sum(), (old & ~new).sum()]])
            labels = [["positive flip", "both right"], ["both wrong", "negative flip"]]
            colors = [["#b7e4c7", "#d8e2dc"], ["#e9ecef", "#f4a3a8"]]
            for i in range(2):
                for j in range(2):
                    ax.add_patch(plt.Rectangle((j, 1 - i), 1, 1, color=colors[i][j]))
                    ax.text(j + 0.5, 1.5 - i, f"{labels[i][j]}\n{grid[i, j]} ({100 * grid[i, j] / e['n']:.1f}%)",
                            ha="center", va="center", fontsize=9)
            ax.set_xlim(0, 2)
            ax.set_ylim(0, 2)
            ax.set_xticks([0.5, 1.5], ["old wrong", "old right"])
            ax.set_yticks([0.5, 1.5], ["new wrong", "new right"])
        else:
            d = e["_delta"]
            ax.hist(d, bins=30, color="#adb5bd")
            ax.axvline(0, color="black", lw=1)
            ax.set_xlabel(f"D = {e['similarity']}(new) − {e['similarity']}(old)")
            ax.set_ylabel("items")
        ax.set_title(f"{name}\nNFR {_fmt(e.get('nfr', e.get('smooth_nfr')), True)}%  "
                     f"PFR {_fmt(e.get('pfr', e.get('smooth_pfr')), True)}%", fontsize=9)
    for ax in list(axes.flat)[len(entries):]:
        ax.axis("off")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)


def write_outputs(report: dict, json_path=None, markdown_path=None, plot_path=None) -> None:
    """Render everything first, then write each file atomically (no half-written report)."""
    rendered = []
    if json_path:
        rendered.append((Path(json_path), to_json(report)))
    if markdown_path:
        rendered.append((Path(markdown_path), to_markdown(report)))
    for path, text in rendered:
        atomic_write_text(path, text)
    if plot_path:
        plot_quadrants(report, Path(plot_path))
