"""The composition section of `adaptguard demo`: compositional in-context learning (Xu's thesis Ch. 4)
on the embedded default.

The paper's finding: a model that does two simple tasks in context (settings ``simple1``/``simple2``)
mostly fails their composite when the demonstrations are of the simple tasks (``composite``) and does
much better when they are composite (``composite_icl``). The embedded "tiny" model (3 layers, hidden
128) was pretrained only on facts, antonyms and counting, so out of the box it does none of these tasks
in context. It is first *meta-trained* to learn in context, briefly (full fine-tune, 2000 steps of 4
prompts, 2-7 minutes on one CPU core depending on the machine; the quick preset's 700 steps are a smoke run):

* on the ``simple1``/``simple2`` prompts of every composite in ``simple_pairs`` (the simple tasks, each
  in that composite's syntax; the evaluated pairs' simple tasks included, with other seeds, as the
  paper's models know the simple tasks), and
* on the ``composite_icl`` prompts of *other* composites (``train_composites``, disjoint from the
  evaluated pairs), so that it learns to read composite demonstrations,

then evaluated on the four settings of held-out composites: A+F (compose by parts) and A+B (compose by
steps). No composite item of an evaluated pair is ever trained on (`meta_training_rows` draws only
from the settings above and refuses overlapping pairs).

Meta-training supervises the answer of *every* demonstration, not only the query's (each answer is a
prediction from the demonstrations before it): K times the signal per sequence, which a two-minute
budget needs. That loss mask is not a prompt/completion split, hence a plain torch loop (like the
embedded model's pretraining) rather than an SFT trainer.

K: the paper uses 10 demonstrations, but its prompts do not fit the tiny model's 256 positions (the
byte-level tokenizer spends ~14 tokens on "input:"/"output:" alone; A+B at K = 10 needs ~520). Each
pair gets the largest K <= ``k`` for which every prompt of its four settings plus ``max_new_tokens``
fits; the chosen K is reported (4 for A+F, 3 for A+B). One seed by default (the paper: 3;
`run_composition_seeds` for more), 50 test prompts per setting (the paper: 100).

What to expect at this budget (seeds 0-4, `adaptguard demo --seeds 5`, mean (min-max) word-level exact
match): the simple tasks are partly learned in context (A+F: 0.82 (0.70-0.96) and 0.79 (0.70-0.86);
A+B: 0.84 (0.76-0.92) and 0.30 (0.10-0.63)); composites get only a part (A+F 0.26 word-level, exact 0;
A+B 0), from simple and from composite demonstrations alike: the model does not read the composite
demonstrations, as no meta-training task needed them to be read (each is told apart by its query).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..tasks.compose import (
    COMPOSITES,
    SETTINGS,
    build_prompts,
    exact_match,
    word_exact_match,
)
from ..utils.files import atomic_write_text
from ..utils.loop import train_steps

_ANSWER = re.compile(r"output:( [^\n]*\n)")  # a demonstration's or the query's answer, with its newline


@dataclass(frozen=True)
class CompositionConfig:
    """Recipe of the composition section; `PRESETS` holds the demo's default and quick ones."""

    eval_pairs: tuple[str, ...] = ("A+F", "A+B")
    train_composites: tuple[str, ...] = ("D+F", "B+D")  # composite_icl meta-training: by parts, by steps
    simple_pairs: tuple[str, ...] = ("A+F", "A+B")  # simple1/simple2 meta-training
    k: int = 4  # demonstrations per prompt (at most; see `fit_k`)
    n_train: int = 300  # meta-training prompts per (pair, setting)
    n_test: int = 50  # test prompts per (evaluated pair, setting)
    steps: int = 2000
    batch_size: int = 4  # small batches, many updates: learns fastest per CPU second here
    learning_rate: float = 1e-3  # 5e-4, 7e-4, 2e-3, 3e-3 learned less in 2000 steps
    max_new_tokens: int = 28  # the longest answer (two upper-case objects, one byte a token) fits
    max_positions: int = 256
    model: str = "tiny"
    # torch intra-op threads during the section (None: leave torch's setting). The model is too small to
    # gain from a second thread, and on a busy machine spinning OpenMP threads made it ~100x slower.
    threads: int | None = 1

    def __post_init__(self) -> None:
        for name in ("eval_pairs", "train_composites", "simple_pairs"):
            for pair in getattr(self, name):
                if pair not in COMPOSITES:
                    raise ValueError(f"unknown pair {pair!r} in {name}; valid: {', '.join(COMPOSITES)}")
        if not self.eval_pairs:
            raise ValueError("eval_pairs must name at least one composite")
        overlap = set(self.eval_pairs) & set(self.train_composites)
        if overlap:
            raise ValueError(f"train_composites must not contain evaluated pairs (held out): {sorted(overlap)}")
        for name in ("k", "n_train", "n_test", "steps", "batch_size", "max_new_tokens", "max_positions", "threads"):
            value = getattr(self, name)
            if name == "threads" and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be positive, got {self.learning_rate!r}")


PRESETS = {
    "default": CompositionConfig(),
    "quick": CompositionConfig(n_train=200, n_test=20, steps=700),
}


def _token_count(tokenizer, text: str) -> int:
    return len(tokenizer(text)["input_ids"])


def fit_k(pair: str, settings: tuple[str, ...], k: int, tokenizer, *, room: int, n: int, seed: int,
          max_positions: int) -> int:
    """The largest K <= `k` for which the first `n` prompts of `pair` in each of `settings` (seed `seed`)
    take at most `max_positions - room` tokens; ValueError if not even K = 1 fits."""
    for kk in range(k, 0, -1):
        longest = max(_token_count(tokenizer, row["prompt"]) for setting in settings
                      for row in build_prompts(pair, setting, k=kk, n_test=n, seed=seed))
        if longest + room <= max_positions:
            return kk
    raise ValueError(f"no prompt of {pair} fits {max_positions} positions with {room} tokens to spare")


def meta_training_rows(config: CompositionConfig, tokenizer, seed: int = 0) -> list[dict]:
    """The meta-training prompts: dicts with `text` (prompt, answer and newline), `pair`, `setting`, `k`.

    Only ``simple1``/``simple2`` of `config.simple_pairs` and ``composite_icl`` of
    `config.train_composites` (never an evaluated pair), with seeds other than the evaluation's."""
    sources = [(pair, ("simple1", "simple2")) for pair in config.simple_pairs]
    sources += [(pair, ("composite_icl",)) for pair in config.train_composites]
    rows = []
    for i, (pair, settings) in enumerate(sources):
        train_seed = 1_000_003 * (seed + 1) + i  # never an evaluation seed (those are `seed`)
        k = fit_k(pair, settings, config.k, tokenizer, room=config.max_new_tokens, n=config.n_train,
                  seed=train_seed, max_positions=config.max_positions)
        for setting in settings:
            rows += [{"text": f"{r['prompt']} {r['output']}\n", "pair": pair, "setting": setting, "k": k}
                     for r in build_prompts(pair, setting, k=k, n_test=config.n_train, seed=train_seed)]
    return rows


def answer_labels(tokenizer, text: str) -> tuple[list[int], list[int]]:
    """(input ids, labels): labels are the ids of the answer tokens (every "output: ..." line) and -100
    elsewhere."""
    enc = tokenizer(text, return_offsets_mapping=True)
    spans = [m.span(1) for m in _ANSWER.finditer(text)]
    labels = [t if any(a <= start < b for a, b in spans) else -100
              for t, (start, _) in zip(enc["input_ids"], enc["offset_mapping"])]
    return enc["input_ids"], labels


def meta_train(model, tokenizer, rows: list[dict], config: CompositionConfig, seed: int) -> list[float]:
    """Full fine-tune of `model` in place on `rows` (answers only), AdamW with a one-cycle schedule;
    returns the loss of each step."""
    import torch

    if config.batch_size > len(rows):
        raise ValueError(f"batch_size={config.batch_size} is more than the {len(rows)} meta-training prompts")
    encoded = [answer_labels(tokenizer, r["text"]) for r in rows]
    rng = np.random.default_rng(seed)
    optim = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(optim, max_lr=config.learning_rate, total_steps=config.steps,
                                                pct_start=0.1)
    pad = tokenizer.pad_token_id

    def step_loss(_step: int):
        batch = [encoded[i] for i in rng.choice(len(encoded), size=config.batch_size, replace=False)]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([x + [pad] * (width - len(x)) for x, _ in batch])
        labels = torch.tensor([y + [-100] * (width - len(y)) for _, y in batch])
        mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x, _ in batch])
        return model(input_ids=ids, attention_mask=mask, labels=labels).loss

    losses = train_steps(model, optim, sched, config.steps, step_loss, clip_norm=1.0,
                         progress="composition: meta-training")
    model.eval()
    return losses


def evaluate(model, tokenizer, ks: dict[str, int], n_test: int, seed: int, max_new_tokens: int
             ) -> tuple[dict, dict]:
    """(table, predictions) over the pairs of `ks` (pair -> K) x SETTINGS: table[pair][setting] holds the
    mean `word_exact_match` and `exact_match` of greedy answers to `n_test` prompts, predictions[pair][setting]
    the per-item rows (`input`, `outputs`, `prediction`)."""
    from ..utils.generation import generate_answers

    table, predictions = {}, {}
    for pair, k in ks.items():
        table[pair], predictions[pair] = {}, {}
        for setting in SETTINGS:
            rows = build_prompts(pair, setting, k=k, n_test=n_test, seed=seed)
            preds = generate_answers(model, tokenizer, rows, max_new_tokens=max_new_tokens)
            predictions[pair][setting] = [{"input": r["input"], "outputs": r["outputs"], "prediction": p}
                                          for r, p in zip(rows, preds)]
            table[pair][setting] = scores(predictions[pair][setting])
    return table, predictions


def scores(items: list[dict]) -> dict[str, float]:
    """Mean `word_exact_match` and `exact_match` of items with `prediction` and `outputs`."""
    return {"word_exact_match": float(np.mean([word_exact_match(i["prediction"], i["outputs"]) for i in items])),
            "exact_match": float(np.mean([exact_match(i["prediction"], i["outputs"]) for i in items]))}


def markdown_section(result: dict) -> str:
    """The section for the demo report: the accuracy table and how it was made."""
    s = result["settings"]
    head = "| pair | K | " + " | ".join(SETTINGS) + " |"
    lines = [
        "## Compositional in-context learning (Xu's thesis Ch. 4)", "",
        (f"The embedded `{s['model']}` model, meta-trained for {s['steps']} steps "
        f"({result['train_seconds']:.0f} s) to learn in context: on the simple tasks' prompts "
        f"(`simple1`/`simple2` of {', '.join(s['simple_pairs'])}) and on composite-in-context prompts of "
        f"*other* composites ({', '.join(s['train_composites'])}). Evaluated on held-out composites "
        f"({', '.join(s['eval_pairs'])}; none of their composite items trained on), {s['n_test']} test "
        "prompts per setting. Cells: word-level exact match / exact match (§9.1.2). K = demonstrations "
        f"per prompt, the largest <= {s['k']} that fits the model's {s['max_positions']} positions "
        "(the paper uses 10). On a two-word answer, a word-level score of 0.5 means one part right."), "",
        head, "|---|---|" + "---|" * len(SETTINGS),
    ]
    for pair, row in result["table"].items():
        cells = " | ".join(f"{row[st]['word_exact_match']:.2f} / {row[st]['exact_match']:.2f}" for st in SETTINGS)
        lines.append(f"| {pair} | {result['ks'][pair]} | {cells} |")
    base = result.get("base_table")
    if base:
        lines += ["", "Before meta-training (word-level exact match): " + "; ".join(
            f"{pair} " + ", ".join(f"{st} {row[st]['word_exact_match']:.2f}" for st in SETTINGS)
            for pair, row in base.items()) + "."]
    lines += ["", ("Settings: simple1/simple2 = demonstrations and query of one simple task; composite = "
              "demonstrations of the two simple tasks, composite query; composite_icl = composite "
              "demonstrations and query."), ""]
    return "\n".join(lines)


def run_composition_demo(out_dir: str | Path | None, *, quick: bool = False, seed: int = 0,
                         config: CompositionConfig | None = None) -> dict:
    """Meta-train the embedded model and evaluate compositional ICL (see the module docstring).

    Returns {"table": {pair: {setting: {"word_exact_match", "exact_match"}}}, "base_table" (the same
    before meta-training), "predictions" ({pair: {setting: [{"input", "outputs", "prediction"}]}}),
    "ks", "markdown", "seconds", "train_seconds", "losses", "settings"}. `config` overrides the preset
    chosen by `quick`. Writes `out_dir/composition.json` when `out_dir` is given."""
    from ..utils.threads import torch_threads

    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    config = config or PRESETS["quick" if quick else "default"]
    start = time.perf_counter()
    with torch_threads(config.threads):
        result = _run(config, seed)
    result["settings"] = {**asdict(config), "seed": seed, "quick": quick, "train_rows": result.pop("train_rows")}
    result["seconds"] = time.perf_counter() - start
    result["markdown"] = markdown_section(result)
    if out_dir is not None:
        atomic_write_text(Path(out_dir) / "composition.json", json.dumps(result, indent=2))
    return result


def _run(config: CompositionConfig, seed: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..models.embedded import embedded_model_path

    path = embedded_model_path(config.model)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    if config.max_positions > model.config.max_position_embeddings:
        raise ValueError(f"max_positions={config.max_positions} exceeds the model's "
                         f"{model.config.max_position_embeddings} positions")
    ks = {pair: fit_k(pair, SETTINGS, config.k, tokenizer, room=config.max_new_tokens, n=config.n_test,
                      seed=seed, max_positions=config.max_positions) for pair in config.eval_pairs}
    # a glance at the untrained model, on the first few test prompts (it scores ~0)
    base_table, _ = evaluate(model, tokenizer, ks, min(config.n_test, 10), seed, config.max_new_tokens)
    rows = meta_training_rows(config, tokenizer, seed)
    train_start = time.perf_counter()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        losses = meta_train(model, tokenizer, rows, config, seed)
    train_seconds = time.perf_counter() - train_start
    table, predictions = evaluate(model, tokenizer, ks, config.n_test, seed, config.max_new_tokens)
    return {"table": table, "base_table": base_table, "predictions": predictions, "ks": ks, "losses": losses,
            "train_seconds": train_seconds, "train_rows": len(rows)}


def run_composition_seeds(out_dir: str | Path, *, quick: bool = False, seeds: list[int] | tuple[int, ...] = (0,),
                          config: CompositionConfig | None = None) -> dict:
    """`run_composition_demo` once per seed (meta-training data and order and the test prompts
    follow the seed), into `out_dir/seed-<seed>/`, and the spread of every cell.

    Returns {"seeds", "table": {pair: {setting: {metric: spread}}}, "ks", "per_seed": [result without its
    predictions], "machine", "markdown"} and writes it to `out_dir/composition.json`."""
    from ..utils.sweeps import machine_info, spread

    if not seeds:
        raise ValueError("seeds: give at least one seed")
    runs = []
    for seed in seeds:
        run = run_composition_demo(Path(out_dir) / f"seed-{seed}", quick=quick, seed=seed, config=config)
        run.pop("predictions", None)  # kept in seed-<seed>/composition.json
        runs.append(run)
    first = runs[0]["table"]
    table = {pair: {st: {m: spread([r["table"][pair][st][m] for r in runs]) for m in first[pair][st]}
                    for st in first[pair]} for pair in first}
    result = {"seeds": list(seeds), "table": table, "ks": runs[0]["ks"], "per_seed": runs,
              "machine": machine_info()}
    result["markdown"] = seeds_markdown_section(result)
    atomic_write_text(Path(out_dir) / "composition.json", json.dumps(result, indent=2))
    return result


def seeds_markdown_section(result: dict) -> str:
    """The demo report's section over seeds: each cell's mean (min–max) over the seeds."""
    from ..utils.sweeps import format_spread, machine_line

    first = result["per_seed"][0]
    lines = first["markdown"].split("\n")
    head = lines.index("| pair | K | " + " | ".join(SETTINGS) + " |")
    rows = [f"| {pair} | {result['ks'][pair]} | " + " | ".join(
        f"{format_spread(row[st]['word_exact_match'], '.2f')} / {format_spread(row[st]['exact_match'], '.2f')}"
        for st in SETTINGS) + " |" for pair, row in result["table"].items()]
    n = len(result["seeds"])
    note = (f"Cells over {n} seeds {result['seeds']} (meta-training data and order and the test "
            "prompts follow the seed): mean (min–max). A difference between two settings is a finding only "
            "where their min–max ranges do not overlap.")
    tail = [line for line in lines[head + 2 + len(rows):] if not line.startswith("Before meta-training")]
    return "\n".join([*lines[:head], note, "", *lines[head:head + 2], *rows, *tail,
                      machine_line(result["machine"]), ""])
