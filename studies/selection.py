"""Does Algorithm-1 task selection beat random choice? An experiment on the embedded default
(paper 001 §3.3.2, Table 3.1 in spirit: each target in turn, the other tasks as candidates; methods
``full`` / ``no_consistency`` / ``no_diversity`` / ``random`` at an equal number of training rows).

Tasks. The embedded tiny model knows three skills from pretraining (`adaptguard.models.embedded`): the capital
of each fictional country (24 facts), the opposite of a word (18 antonym pairs, both directions: 36) and
the next number (1..95). Each skill is asked in three formats it never saw, giving a 3 × 3 grid of tasks
``<skill>/<format>``::

    qa     question : opposite of hot ? answer :   ->  " cold ."
    io     input: opposite of hot\\noutput:         ->  " cold"
    arrow  opposite of hot =>                      ->  " cold"

plus distractor tasks of the compositional suite (`adaptguard.tasks.compose`, written ``input: x\\noutput:``):
A (capitalization), E (opposite words, another vocabulary) and F (plus one on 1..1000). Those are
beyond what the tiny model learns in this budget (measured: < 15 % exact match after 320 steps on the task
itself), so they play the part of unrelated data that only dilutes a mixture.

A target is one grid task; the candidates are the other eight and the distractors. Its skill × format
combination is never trained on, so the fine-tuned model scores only if the mixture teaches the target's
*format* (from another skill in that format) and exercises its *skill* (in another format) — the
"coverage" of the target by the union of the chosen tasks, which is what Algorithm 1's diversity term
looks for, while consistency ranks the candidates.

Protocol. Every task's prompts (inputs only, no answers; at most `n_embed`, a seeded sample) are
embedded with the built-in `mean_pooled` embedder on the tiny model itself. `select_tasks` picks tasks
by each method (``random`` and ``no_consistency`` over `n_random` seeds; ``random`` at the size ``full``
picked; ``no_diversity`` = the single most consistent task), plus two references: ``base`` (no fine-tuning)
and ``all`` (every candidate). Each choice becomes a multitask mixture of exactly `n_rows` rows, split
equally over the chosen tasks (each task's rows cycled in a seeded order), so methods differ only in *which*
tasks they choose. The tiny model is fully fine-tuned on it with plain SFT (`TALRTrainer`,
``weighting="none"``, completion-only loss) and scored by greedy exact match (and word-level exact match,
paper 001 §9.1.2) on all target items, zero-shot (no demonstrations).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from adaptguard.utils.files import atomic_write_text

logger = logging.getLogger(__name__)

SKILLS = ("capital", "opposite", "next")
FORMATS = ("qa", "io", "arrow")
GRID = tuple(f"{skill}/{fmt}" for skill in SKILLS for fmt in FORMATS)
DISTRACTORS = ("A", "E", "F")
SELECTION_METHODS = ("full", "no_consistency", "no_diversity", "random")
REFERENCES = ("base", "all")
_N_DISTRACTOR_ROWS = 256  # distinct generated items per distractor task


@dataclass(frozen=True)
class ExperimentConfig:
    """Settings of `run_selection_experiment` (the defaults are the documented default run).

    targets: grid tasks (``<skill>/<format>``, see `GRID`) used in turn as the target.
    p: Algorithm 1's threshold — a task is added only if it raises coverage by a factor ≥ 1 + p. 0.5, not
        the library's 0.05: a union of more tasks has a wider covariance, so coverage creeps up with almost
        any addition and p = 0.05 keeps 8 of the 11 candidates for two of the three default targets.
    n_embed: prompts embedded per task; n_random: seeds of ``random`` and ``no_consistency``.
    n_rows: training rows of every mixture; epochs, learning_rate, batch_size: the fine-tuning.
    include_all: also train on every candidate (reference row ``all``).
    threads: torch CPU threads during the run (restored afterwards; None: leave torch's setting). One by
        default: a 128-wide model gains little from a second thread, and with another job on the cores
        two spinning threads were several times slower than one.
    """

    targets: tuple[str, ...] = ("capital/qa", "opposite/io", "next/arrow")
    distractors: tuple[str, ...] = DISTRACTORS
    p: float = 0.5
    n_embed: int = 24
    n_random: int = 3
    n_rows: int = 256
    epochs: float = 10.0
    learning_rate: float = 1e-3
    batch_size: int = 16
    max_new_tokens: int = 8
    include_all: bool = True
    model: str = "tiny"
    threads: int | None = 1

    def __post_init__(self):
        if not self.targets:
            raise ValueError("targets: empty; choose at least one of " + ", ".join(GRID))
        bad = [t for t in self.targets if t not in GRID]
        if bad:
            raise ValueError(f"targets {bad} are not grid tasks; valid: {', '.join(GRID)}")
        from adaptguard.tasks.compose import SIMPLE_TASKS

        bad = [d for d in self.distractors if d not in SIMPLE_TASKS]
        if bad:
            raise ValueError(f"distractors {bad} are not simple compose tasks; valid: {', '.join(SIMPLE_TASKS)}")
        for name in ("n_embed", "n_random", "n_rows", "batch_size", "max_new_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < (2 if name == "n_embed" else 1):
                raise ValueError(f"{name} must be an integer >= {2 if name == 'n_embed' else 1}, got {value!r}")
        if self.threads is not None and not (isinstance(self.threads, int) and self.threads >= 1):
            raise ValueError(f"threads must be None or an integer >= 1, got {self.threads!r}")
        if not self.p >= 0:
            raise ValueError(f"p must be >= 0, got {self.p!r}")
        if not (self.epochs > 0 and self.learning_rate > 0):
            raise ValueError(f"epochs and learning_rate must be > 0, got {self.epochs!r}, {self.learning_rate!r}")


QUICK = ExperimentConfig(targets=("opposite/io",), n_random=2, include_all=False)


# ------------------------------------------------------------------------------------------ tasks
def skill_pairs(skill: str, spec=None) -> list[tuple[str, str]]:
    """(question, answer) pairs of one skill the embedded model learned in pretraining."""
    from adaptguard.models.embedded import ANTONYMS, EMBEDDED_MODELS, world_facts

    if skill == "capital":
        return [(f"capital of {country}", city) for country, city in world_facts(spec or EMBEDDED_MODELS["tiny"])]
    if skill == "opposite":
        return [(f"opposite of {a}", b) for x, y in ANTONYMS for a, b in ((x, y), (y, x))]
    if skill == "next":
        return [(f"number after {n}", str(n + 1)) for n in range(1, 96)]
    raise ValueError(f"unknown skill {skill!r}; valid: {', '.join(SKILLS)}")


def render(question: str, answer: str, fmt: str) -> dict[str, str]:
    """One prompt/completion row of `question` → `answer` in format `fmt` (see `FORMATS`)."""
    if fmt == "qa":
        return {"prompt": f"question : {question} ? answer :", "completion": f" {answer} ."}
    if fmt == "io":
        return {"prompt": f"input: {question}\noutput:", "completion": f" {answer}"}
    if fmt == "arrow":
        return {"prompt": f"{question} =>", "completion": f" {answer}"}
    raise ValueError(f"unknown format {fmt!r}; valid: {', '.join(FORMATS)}")


def task_rows(name: str, seed: int = 0) -> list[dict[str, str]]:
    """Rows of a grid task (``capital/qa``) or of a compose distractor (``A``..``H``, `seed` for its items)."""
    if "/" in name:
        skill, fmt = name.split("/", 1)
        return [render(q, a, fmt) for q, a in skill_pairs(skill)]
    from adaptguard.tasks.compose import generate

    return [render(item["input"], item["output"], "io") for item in generate(name, _N_DISTRACTOR_ROWS, seed)]


def task_pool(cfg: ExperimentConfig, seed: int = 0) -> dict[str, list[dict[str, str]]]:
    """name → rows of every task of the experiment: the grid, then the distractors."""
    return {name: task_rows(name, seed) for name in (*GRID, *cfg.distractors)}


def _rng(seed: int, *parts: str) -> np.random.Generator:
    from zlib import crc32

    return np.random.default_rng([seed, *(crc32(p.encode()) for p in parts)])


def cycled(rows: Sequence[dict], n: int, rng: np.random.Generator) -> list[dict]:
    """`n` rows: whole seeded permutations of `rows` one after another (every row once before any repeats)."""
    order = np.concatenate([rng.permutation(len(rows)) for _ in range(-(-n // len(rows)))])[:n]
    return [rows[i] for i in order]


def mixture_parts(pool: Mapping[str, Sequence[dict]], selected: Sequence[str], n_rows: int, seed: int = 0
                  ) -> dict[str, list[dict]]:
    """The rows each selected task contributes to a mixture of exactly `n_rows` rows.

    Tasks are taken in sorted order (the mixture depends on the set, not on the order of selection);
    each gets n_rows // k rows and the first n_rows % k tasks one more. Each task's rows come from
    `cycled` with a generator seeded by (seed, task name).
    """
    missing = [name for name in selected if name not in pool]
    if missing:
        raise ValueError(f"selected tasks {missing} are not in the pool ({', '.join(pool)})")
    names = sorted(set(selected))
    if not names or n_rows < len(names):
        raise ValueError(f"n_rows={n_rows} must be at least the number of selected tasks ({len(names)})")
    base, extra = divmod(n_rows, len(names))
    return {name: cycled(pool[name], base + (i < extra), _rng(seed, "mixture", name)) for i, name in enumerate(names)}


# ------------------------------------------------------------------------------------- embedding
def embed_pool(pool: Mapping[str, Sequence[dict]], model: str | Path, n_embed: int, seed: int = 0,
               batch_size: int = 64) -> dict[str, np.ndarray]:
    """name → (m, d) mean-pooled embeddings by `model` of up to m = `n_embed` prompts per task (a seeded
    sample). Prompts only: like the paper's φ(x), selection sees the inputs, never the answers."""
    from adaptguard.selection.embedders import mean_pooled

    texts = {}
    for name, rows in pool.items():
        order = _rng(seed, "embed", name).permutation(len(rows))[:n_embed]
        texts[name] = [rows[i]["prompt"] for i in order]
    flat = mean_pooled([t for ts in texts.values() for t in ts], model=model, batch_size=batch_size)
    bounds = np.cumsum([len(ts) for ts in texts.values()])[:-1]
    return dict(zip(texts, np.split(flat, bounds)))


def selections(target: np.ndarray, candidates: Mapping[str, np.ndarray], p: float, n_random: int, seed: int = 0
               ) -> dict:
    """method → list of `SelectionResult` for target embeddings (n₀, d) and candidates name → (nᵢ, d):
    one result for ``full`` and ``no_diversity``, one per seed `seed`..`seed + n_random − 1` for
    ``no_consistency`` and ``random`` (at the size ``full`` selects)."""
    from adaptguard.selection.coverage import select_tasks

    seeds = [seed + i for i in range(n_random)]
    return {"full": [select_tasks(target, candidates, p, method="full")],
            "no_consistency": [select_tasks(target, candidates, p, method="no_consistency", seed=s) for s in seeds],
            "no_diversity": [select_tasks(target, candidates, p, method="no_diversity")],
            "random": [select_tasks(target, candidates, p, method="random", seed=s) for s in seeds]}


# --------------------------------------------------------------------------- fine-tune and score
def finetune(model_path: str | Path, rows: Sequence[dict], cfg: ExperimentConfig, seed: int, work: Path):
    """The base model fully fine-tuned on `rows` (prompt/completion) with plain SFT; returns the model."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback

    from adaptguard.talr.config import TALRConfig
    from adaptguard.talr.trainer import TALRTrainer
    from adaptguard.trl_adapter import no_activation_checkpointing

    args = TALRConfig(output_dir=str(work), weighting="none", learning_rate=cfg.learning_rate,
                      num_train_epochs=cfg.epochs, per_device_train_batch_size=cfg.batch_size, max_length=64,
                      bf16=False, use_cpu=True, **no_activation_checkpointing(), report_to="none",
                      save_strategy="no", disable_tqdm=True, logging_strategy="no", seed=seed)
    trainer = TALRTrainer(model=AutoModelForCausalLM.from_pretrained(model_path), args=args,
                          train_dataset=Dataset.from_list(list(rows)),
                          processing_class=AutoTokenizer.from_pretrained(model_path))
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    return trainer.model


def score(model, tokenizer, rows: Sequence[dict], max_new_tokens: int = 8) -> dict:
    """Greedy zero-shot exact match and word-level exact match (paper 001 §9.1.2) of `rows`, in [0, 1]."""
    from adaptguard.tasks.compose import exact_match, word_exact_match
    from adaptguard.utils.generation import generate_answers

    preds = generate_answers(model, tokenizer, list(rows), max_new_tokens=max_new_tokens, batch_size=64)
    truths = [r["completion"].strip() for r in rows]
    return {"exact_match": float(np.mean([exact_match(p, t) for p, t in zip(preds, truths)])),
            "word_exact_match": float(np.mean([word_exact_match(p, t) for p, t in zip(preds, truths)])),
            "examples": [{"prompt": r["prompt"], "prediction": p, "answer": t}
                         for r, p, t in list(zip(rows, preds, truths))[:3]]}


# ----------------------------------------------------------------------------------------- run it
def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values))


def run_selection_experiment(out_dir: str | Path, *, quick: bool = False, seed: int = 0,
                             config: ExperimentConfig | None = None) -> dict:
    """Run the experiment (module docstring) and write ``selection.json``, ``selection.md`` and each
    target's ``full`` mixture (``mixtures/<target>.jsonl``) into `out_dir`. Returns the report.

    `config` overrides the preset (`QUICK` when `quick`, else `ExperimentConfig()`); `seed` seeds the
    embedding sample, the random ablations, the mixtures and the training.
    """
    import datasets
    import torch
    import transformers
    from transformers import AutoTokenizer

    from adaptguard.models.embedded import embedded_model_path
    from adaptguard.selection.jobs import write_mixture

    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    cfg = config or (QUICK if quick else ExperimentConfig())
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    threads = torch.get_num_threads()
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    progress = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    work = Path(tempfile.mkdtemp(prefix=".selection-", dir=out))
    try:
        path = embedded_model_path(cfg.model)
        tokenizer = AutoTokenizer.from_pretrained(path)
        pool = task_pool(cfg, seed)
        embeddings = embed_pool(pool, path, cfg.n_embed, seed)
        trained: dict[tuple[str, tuple[str, ...]], dict] = {}

        def evaluate(target: str, selected: Sequence[str]) -> dict:
            # the same set gives the same mixture, so its model is trained once per target
            key = (target, tuple(sorted(selected)))
            if key not in trained:
                if selected:
                    parts = mixture_parts(pool, selected, cfg.n_rows, seed)
                    rows = [row for part in parts.values() for row in part]
                    order = _rng(seed, "shuffle").permutation(len(rows))
                    model = finetune(path, [rows[i] for i in order], cfg, seed, work / "run")
                else:
                    model = transformers.AutoModelForCausalLM.from_pretrained(path)
                trained[key] = score(model, tokenizer, pool[target], cfg.max_new_tokens)
                logger.info("%s <- %s: exact match %.3f", target, "+".join(key[1]) or "base",
                            trained[key]["exact_match"])
            return trained[key]

        targets = {}
        for target in cfg.targets:
            candidates = {name: emb for name, emb in embeddings.items() if name != target}
            chosen = selections(embeddings[target], candidates, cfg.p, cfg.n_random, seed)
            methods = {}
            for method, results in chosen.items():
                runs = [{**r.to_dict(), **evaluate(target, r.selected)} for r in results]
                for run in runs:
                    run.pop("consistency")
                methods[method] = {"runs": runs, "exact_match": _mean([r["exact_match"] for r in runs]),
                                   "word_exact_match": _mean([r["word_exact_match"] for r in runs]),
                                   "size": _mean([len(r["selected"]) for r in runs])}
            references = {"base": []} | ({"all": sorted(candidates)} if cfg.include_all else {})
            for name, selected in references.items():
                result = evaluate(target, selected)
                methods[name] = {"runs": [{"selected": selected, **result}], "exact_match": result["exact_match"],
                                 "word_exact_match": result["word_exact_match"], "size": len(selected)}
            full = chosen["full"][0].selected
            mixture = {name: datasets.Dataset.from_list(rows)
                       for name, rows in mixture_parts(pool, full, cfg.n_rows, seed).items()}
            mixture_file = f"mixtures/{target.replace('/', '-')}.jsonl"  # relative to out_dir
            targets[target] = {"n_test": len(pool[target]), "consistency": chosen["full"][0].consistency,
                               "methods": methods, "mixture": mixture_file,
                               "mixture_rows": write_mixture(mixture, out / mixture_file, text_column="prompt",
                                                             seed=seed)}
    finally:
        shutil.rmtree(work, ignore_errors=True)
        torch.set_num_threads(threads)
        transformers.logging.set_verbosity(verbosity)
        if progress:
            datasets.enable_progress_bars()

    methods = [*SELECTION_METHODS, *(m for m in REFERENCES if m in next(iter(targets.values()))["methods"])]
    summary = {m: {"exact_match": _mean([t["methods"][m]["exact_match"] for t in targets.values()]),
                   "word_exact_match": _mean([t["methods"][m]["word_exact_match"] for t in targets.values()])}
               for m in methods}
    report = {"config": dataclasses.asdict(cfg), "seed": seed, "model": str(path),
              "embedder": f"mean_pooled on the embedded {cfg.model!r} model (prompts only)",
              "candidates": [*GRID, *cfg.distractors], "targets": targets, "summary": summary,
              "trainings": sum(1 for key in trained if key[1]), "seconds": round(time.time() - start, 1)}
    atomic_write_text(out / "selection.json", json.dumps(report, indent=2) + "\n")
    atomic_write_text(out / "selection.md", selection_markdown(report))
    return report


def _pct(value: float) -> str:
    return f"{100 * value:.1f}"


def selection_markdown(report: dict) -> str:
    """The report as Markdown: a summary over targets, then one table per target (selected tasks, scores)."""
    cfg = report["config"]
    intro = (f"Embedder: {report['embedder']}; threshold p = {cfg['p']}; every mixture has {cfg['n_rows']} rows "
             f"({cfg['epochs']:g} epochs, lr {cfg['learning_rate']:g}, plain SFT); `random` and `no_consistency`: "
             f"mean of {cfg['n_random']} seeds. Scores: zero-shot exact match (EM) / word-level exact match (%) "
             f"on all items of the target. Run time {report['seconds']:.0f} s, {report['trainings']} trainings.")
    lines = ["# Task selection on the embedded default (paper 001 Algorithm 1, Table 3.1 in spirit)", "", intro, "",
             "| method | " + " | ".join(report["targets"]) + " | mean EM | mean word EM |",
             "|---|" + "---|" * (len(report["targets"]) + 2)]
    for method, s in report["summary"].items():
        cells = [_pct(t["methods"][method]["exact_match"]) for t in report["targets"].values()]
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {_pct(s['exact_match'])} | "
                     f"{_pct(s['word_exact_match'])} |")
    for target, t in report["targets"].items():
        lines += ["", f"## Target {target} ({t['n_test']} items)", "",
                  "| method | selected tasks | coverage | EM | word EM |", "|---|---|---|---|---|"]
        for method, m in t["methods"].items():
            for i, run in enumerate(m["runs"]):
                label = method if len(m["runs"]) == 1 else f"{method} (seed {i})"
                cov = f"{run['coverage']:.3g}" if "coverage" in run else "–"
                lines.append(f"| {label} | {', '.join(run['selected']) or '(none)'} | {cov} | "
                             f"{_pct(run['exact_match'])} | {_pct(run['word_exact_match'])} |")
        top = sorted(t["consistency"].items(), key=lambda kv: -kv[1])
        lines += ["", "Consistency order: " + ", ".join(f"{n} ({c:.3f})" for n, c in top)]
    return "\n".join(lines) + "\n"
