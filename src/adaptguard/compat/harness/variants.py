"""`compat_<name>` for any task, group or tag lm-eval can load: the original task, scored exactly as it is (same
dataset, prompts, few-shot examples, filters and metrics), plus flips against a reference run of the original
named by `--metadata '{"compat_reference": "runs/old"}'`.

- `CompatTask` is the task class of every variant (lm-eval's `class:` route): it subclasses `ConfigurableTask`,
  keeps the original's `process_results` and adds, per sample, `nfr`, `pfr`, `inconsistency_flips`, `btc` (0/1 metrics:
  `acc`, `exact_match`, `em`) or, with `--metadata '{"compat_similarity": "rouge1"}'`, `smooth_nfr`,
  `smooth_pfr`, `m_g`, `m_r` for generation, by the formulas of `metrics` (the ones `adaptguard compare` uses).
- `write_compat_tasks` writes the variants' YAMLs: a task includes the original's YAML; a group becomes a group
  of variants whose flips are pooled over all documents (size-weighted means of the subtasks' rates, the way
  lm-eval pools group accuracy); a tag becomes a tag of variants.

The reference must have scored the same documents with the same prompts: before any request reaches the model,
every document of this run is looked up in it (by lm-eval's `doc_hash`) and its `prompt_hash` compared, so
another split, `--limit`, a few-shot seed or a template change fails with the task and the difference.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

import yaml
from lm_eval.api.task import ConfigurableTask

from ..metric_table import METRICS, names
from ..reading.runs import RunError, find_sample_files, prediction, read_task_run
from .tasks import doc_hash, flip_results, smooth_results

logger = logging.getLogger(__name__)

PREFIX = "compat_"
CORRECTNESS = ("acc", "exact_match", "em")
# each metric's lm-eval aggregation; its higher_is_better is the metric table's direction
SMOOTH_METRICS = {"smooth_nfr": "mean", "smooth_pfr": "mean", "m_g": "compat_mean_positive",
                  "m_r": "compat_mean_negative_abs"}


def item_rates() -> tuple[str, ...]:
    """The flip rates of the paired answers over every item (`metric_table`: nfr, pfr, ...), each a document's 0/1
    that lm-eval averages (read at call time: a row added is seen)."""
    return names(lambda m: m.about_flips and m.per_item is not None and m.over is None)


def flip_metrics() -> dict[str, str]:
    """The flip metrics a variant adds, with their aggregations: the item rates, the inconsistency flips, and btc
    (over the old-right documents: `compat_btc` reduces each document's (old right, new right))."""
    return {**{name: "mean" for name in item_rates()}, "inconsistency_flips": "mean", "btc": "compat_btc"}


def pooled() -> tuple[str, ...]:
    """The rates over documents, pooled in groups by their sizes."""
    return (*item_rates(), "inconsistency_flips", "smooth_nfr", "smooth_pfr")


class CompatTask(ConfigurableTask):
    """An lm-eval task scored as its original (`metadata.compat_original`) plus flips against the reference."""

    def __init__(self, config: dict | None = None, **kwargs):
        config = {k: v for k, v in (config or {}).items() if k != "class"}
        super().__init__(config=config, **kwargs)
        from lm_eval.api.registry import get_aggregation

        meta = self.config.metadata or {}
        self.original = meta.get("compat_original") or self.config.task.removeprefix(PREFIX)
        self.similarity = meta.get("compat_similarity")
        self._reference = self._load_reference(meta.get("compat_reference"))
        extra = flip_metrics()
        if self.OUTPUT_TYPE == "loglikelihood":
            extra.pop("inconsistency_flips")  # one continuation: no prediction to disagree on
        if self.similarity is not None:
            from ...plugins import get_similarity

            self._score = get_similarity(self.similarity)  # an unknown name fails here, before the model runs
            extra.update(SMOOTH_METRICS)
        for name, aggregation in extra.items():
            self._aggregation_list[name] = get_aggregation(aggregation)
            self._higher_is_better[name] = not METRICS[name].higher_is_worse
        self._calls = 0

    def _load_reference(self, reference) -> dict[str, dict[str, object]] | None:
        """{filter: {doc_hash: sample}} of the reference run's samples of the original task."""
        if reference is None:
            logger.warning("%s: no compat_reference given (--metadata '{\"compat_reference\": DIR}'); reporting "
                           "%s's own metrics only", self.config.task, self.original)
            return None
        try:
            files = find_sample_files(reference)
        except RunError as err:
            raise RunError(f"{self.config.task}: compat_reference {err}") from err
        if self.original not in files:
            raise RunError(f"{self.config.task}: compat_reference {reference} has no samples of {self.original!r} (it "
                           f"has {sorted(files)}); run lm_eval --tasks {self.original} --log_samples on the old model")
        run = read_task_run(self.original, files[self.original])
        out: dict[str, dict] = {}
        for (filt, doc_id), sample in run.samples.items():
            if sample.doc_hash is None:
                raise RunError(f"{sample.where}: doc_id {doc_id} has no doc_hash; was it written by lm-eval "
                               "--log_samples?")
            out.setdefault(filt, {})[sample.doc_hash] = sample
        return out

    def build_all_requests(self, **kwargs) -> None:
        super().build_all_requests(**kwargs)
        self._docs_here = len({inst.doc_id for inst in self.instances})
        if self._reference is None:
            return
        from lm_eval.utils import hash_string

        filters = [f.name for f in self._filters]
        if set(filters) != set(self._reference):
            raise RunError(f"{self.config.task}: the reference run of {self.original} has filters "
                           f"{sorted(self._reference)}, this run {sorted(filters)}")
        refs = self._reference[filters[0]]
        first = {}
        for inst in self.instances:
            if inst.doc_id not in first or inst.idx < first[inst.doc_id].idx:
                first[inst.doc_id] = inst
        for doc_id, inst in sorted(first.items()):
            ref = refs.get(doc_hash(inst.doc))
            if ref is None:
                raise RunError(f"{self.config.task}: doc_id {doc_id} is not in the compat_reference run of "
                               f"{self.original} ({len(refs)} documents there); the runs must score the same documents "
                               "(same dataset and split, the same or a smaller --limit)")
            if ref.prompt_hash and ref.prompt_hash != hash_string(inst.arguments[0]):
                raise RunError(f"{self.config.task}: doc_id {doc_id} has another prompt than in the compat_reference "
                               f"run of {self.original} (prompt_hash differs): another few-shot seed, num_fewshot, "
                               "template or chat template?")

    def process_results(self, doc: dict, results) -> dict:
        out = super().process_results(doc, results)
        if self._reference is None:
            return out
        # lm-eval scores filter by filter, each over all of this rank's documents in turn (evaluator.py): the
        # call count tells which filter's reference to join
        filt = self._filters[(self._calls // max(self._docs_here, 1)) % len(self._filters)].name
        self._calls += 1
        ref = self._reference[filt][doc_hash(doc)]
        metric = next((m for m in CORRECTNESS if m in out and m in ref.metrics), None)
        if metric is not None:
            pred, ref_pred = prediction(results), ref.answer
            flips = flip_results(bool(out[metric]), pred, bool(ref.metrics[metric]), ref_pred, item_rates())
            if self.OUTPUT_TYPE == "loglikelihood":
                flips.pop("inconsistency_flips")
            out.update(flips)
        if self.similarity is not None:
            target = self.doc_to_target(doc)
            references = [str(t) for t in target] if isinstance(target, list) else [str(target)]
            out.update(smooth_results(_text(results), _text(ref.answer), references, self._score))
        return out


def _text(response) -> str:
    pred = prediction(response)
    return pred if isinstance(pred, str) else ""


# ------------------------------------------------------------------------------------ generated YAMLs
def _function_tag(dumper, data):
    return dumper.represent_scalar("!function", data.spec)


class _Function:  # a `!function` reference kept as written
    def __init__(self, spec: str):
        self.spec = spec


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Function, _function_tag)
CLASS = _Function("adaptguard.compat.harness.variants.CompatTask")


def _raw(path: Path) -> dict:
    """A YAML's own keys, `!function` values kept as references (includes are not merged)."""
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!function", lambda loader, node: _Function(loader.construct_scalar(node)))
    with open(path) as f:
        return yaml.load(f, Loader=Loader)  # noqa: S506 (a SafeLoader with one extra tag)


def _metadata(entry) -> dict:
    from lm_eval.tasks._yaml_loader import load_yaml

    return dict(load_yaml(entry.yaml_path, resolve_func=False).get("metadata") or {})


def compat_configs(names: list[str], task_manager) -> dict[str, dict]:
    """{variant name: YAML dict} for `compat_<name>` of each task, group or tag name (and, for groups, of every
    member). Raises `ValueError` naming what lm-eval does not know or what cannot be wrapped."""
    from lm_eval.tasks._index import Kind

    index = task_manager.task_index
    out: dict[str, dict] = {}

    def task_variant(name: str, tag: str | None = None) -> str:
        variant = PREFIX + name
        entry = index[name]
        if entry.kind is Kind.PY_TASK:
            raise ValueError(f"{variant}: {name} is a Python-class task ({entry.yaml_path}); only YAML tasks can be "
                             "wrapped")
        if variant not in out:
            out[variant] = {"include": str(entry.yaml_path), "task": variant, "class": CLASS, "tag": [],
                            "metadata": {**_metadata(entry), "compat_original": name}}
        if tag is not None:
            out[variant]["tag"].append(PREFIX + tag)
        return variant

    def group_variant(name: str) -> str:
        variant = PREFIX + name
        if variant in out:
            return variant
        raw = _raw(index[name].yaml_path)
        members = []
        for item in raw.get("task") or []:
            if isinstance(item, str):
                members += [member(item, name)]
            elif isinstance(item, dict) and "task" in item and "group" not in item:
                members.append({**item, "task": member(item["task"], name)})
            elif isinstance(item, dict) and item.get("group") in index:
                members.append({**item, "group": member(item["group"], name)})
            else:
                raise ValueError(f"{variant}: group {name} ({index[name].yaml_path}) defines a subgroup inline "
                                 f"({item!r:.80}); only groups of named tasks, groups and tags can be wrapped")
        aggregate = list(raw.get("aggregate_metric_list") or [])
        aggregate += [{"metric": m, "aggregation": "mean", "weight_by_size": True} for m in pooled()]
        out[variant] = {"group": variant, "task": members,
                        **{k: v for k, v in raw.items() if k not in ("task", "tag", "group", "group_alias")},
                        "aggregate_metric_list": aggregate}
        return variant

    def member(name: str, group: str):
        if name not in index:
            raise ValueError(f"{PREFIX}{group}: member {name!r} of group {group} is not a task lm-eval knows")
        return variant_of(name)

    def variant_of(name: str):
        entry = index.get(name)
        if entry is None:
            raise ValueError(f"{PREFIX}{name}: lm-eval knows no task, group or tag {name!r} (see lm_eval ls tasks; "
                             "add --include_path for your own tasks)")
        if entry.kind is Kind.GROUP:
            return group_variant(name)
        if entry.kind is Kind.TAG:
            for task in sorted(entry.tags):
                task_variant(task, tag=name)
            return PREFIX + name
        return task_variant(name)

    for name in names:
        variant_of(name.removeprefix(PREFIX))
    for cfg in out.values():
        if "tag" in cfg and not cfg["tag"]:
            cfg["tag"] = None
    return out


def write_compat_tasks(names: list[str], out_dir: str | Path, *, include_path=None, task_manager=None) -> list[Path]:
    """Write `compat_<name>.yaml` for each name (and its group's members) into `out_dir`, for
    `lm_eval --include_path out_dir`; written into a temporary folder first, then renamed into place, so an
    error leaves no partial set."""
    if task_manager is None:
        from .callback import task_manager as manager_for

        task_manager = manager_for(include_path or [], [name.removeprefix(PREFIX) for name in names])
    configs = compat_configs(names, task_manager)
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        for name, cfg in configs.items():
            text = yaml.dump({k: v for k, v in cfg.items() if v is not None}, Dumper=_Dumper, sort_keys=False)
            (tmp / f"{name}.yaml").write_text(text)
        if out_dir.exists():
            for path in tmp.iterdir():
                os.replace(path, out_dir / path.name)
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [out_dir / f"{name}.yaml" for name in configs]
