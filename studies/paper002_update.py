"""Paper 002 on a real model: a base-model update with and without a MUSCLE compatibility adapter (issue 14,
experiment 2; paper 002 §5, §6.5).

v1 = SmolLM2-135M-Instruct (`built:smollm2`); v2 = a real update of it with the same vocabulary: v1 trained on
through plain TRL `SFTTrainer` (language modelling) on other text — LogiQA passages — with the recipe below, built
once into `$ADAPTGUARD_CACHE/paper002/`. Then `adaptguard update`'s pipeline (`run_update`) with these two local
checkpoints: LoRA task adapters on v1 and on v2 for a real task (MedMCQA questions, answer = the right option's
text, scored by exact match of the greedy answer), and the compatibility adapter on v2 with eq. 1's
`student_wrong` mask and with LL_L (`old_likelier_token`, §6.5). The task adapters are trained once and reused by
the second mask. Reported: accuracy, NFR of v1→v2 and v1→v2+compat with 95% bootstrap CIs, McNemar p, and the
share of training tokens each mask aligns to v1 (does eq. 1's mask fire on a real model?).

    python studies/paper002_update.py --quick      # 32 training questions, 1 epoch, 30 test: ≤ 10 min (+ v2 once)
    python studies/paper002_update.py              # 96 training questions, 2 epochs, 100 test
    python studies/paper002_update.py --old_model meta-llama/Llama-3.2-1B --new_model meta-llama/Llama-3.2-1B-Instruct

Writes OUT/report.json, OUT/report.md and, per mask, OUT/<mask>/ (run_update's report, flips.png, adapters).
Data: MedMCQA (MIT) and LogiQA (CC BY-NC-SA 4.0) from the PyPI wheel evals==3.0.1.post1 (fetched once).
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, HfArgumentParser

sys.path.append(str(Path(__file__).resolve().parents[1]))  # run as `python studies/<name>.py`: `studies` from the root

from adaptguard.models.embedded import cache_root, resolve_model
from adaptguard.update import UpdateConfig, run_update
from adaptguard.utils.files import replace_dir
from adaptguard.utils.progress import say
from adaptguard.utils.sweeps import command_line, machine_info, report_footer
from studies.common import write_report
from studies.openai_evals import as_prompt_completion, load_set

# v2: v1 trained on (full fine-tuning, language modelling) on LogiQA passages. Set once, before any update run.
V2_RECIPE = {"text": "logiqa passages (the text before 'Question:')", "passages": 32, "max_steps": 8,
             "batch_size": 4, "learning_rate": 1e-4, "max_length": 256, "seed": 0}
MASKS = ("student_wrong", "old_likelier_token")


@dataclass
class Args:
    old_model: str = field(default="built:smollm2", metadata={"help": "v1: Hub id, local path, built:<name> or embedded:<name>."})
    new_model: str | None = field(default=None, metadata={"help": "v2 (same vocabulary); default: v1 trained on "
                                                                  "LogiQA passages by V2_RECIPE, built once."})
    train_rows: int = field(default=96, metadata={"help": "MedMCQA training questions."})
    test_rows: int = field(default=100, metadata={"help": "MedMCQA test questions."})
    task_epochs: float = field(default=2.0, metadata={"help": "Epochs of the task adapters."})
    compat_epochs: float = field(default=2.0, metadata={"help": "Epochs of the compatibility adapter."})
    task_learning_rate: float = field(default=1e-3, metadata={"help": "LoRA learning rate of the task adapters."})
    compat_learning_rate: float = field(default=1e-3, metadata={"help": "LoRA learning rate of MUSCLE."})
    batch_size: int = field(default=8, metadata={"help": "Training batch size."})
    seed: int = field(default=0, metadata={"help": "Split and training seed."})
    out: str = field(default="paper002-update-out", metadata={"help": "Output directory."})
    quick: bool = field(default=False, metadata={"help": "32 training questions, 1 epoch each, 30 test."})


def build_v2(v1_path: str) -> Path:
    """v1 trained on by V2_RECIPE with TRL's SFTTrainer, cached under $ADAPTGUARD_CACHE/paper002/ (a temporary
    folder renamed when complete)."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from adaptguard.trl_adapter import no_activation_checkpointing

    key = hashlib.sha256(json.dumps([v1_path, V2_RECIPE], sort_keys=True).encode()).hexdigest()[:12]
    target = cache_root() / "paper002" / f"v2-{key}"
    if (target / "model.safetensors").exists():
        return target
    say(f"building v2 once: {V2_RECIPE['max_steps']} steps of language modelling on LogiQA passages -> {target}")
    passages = [r["input"].split("Passage:", 1)[-1].split("Question:", 1)[0].strip()
                for r in load_set("logiqa")[:V2_RECIPE["passages"]]]
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        args = SFTConfig(output_dir=tmp, max_steps=V2_RECIPE["max_steps"], learning_rate=V2_RECIPE["learning_rate"],
                         per_device_train_batch_size=V2_RECIPE["batch_size"], max_length=V2_RECIPE["max_length"],
                         seed=V2_RECIPE["seed"], bf16=torch.cuda.is_available(), use_cpu=not torch.cuda.is_available(),
                         **no_activation_checkpointing(), report_to="none", save_strategy="no", logging_steps=1,
                         disable_tqdm=True)
        trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(v1_path), args=args,
                             train_dataset=Dataset.from_dict({"text": passages}),
                             processing_class=AutoTokenizer.from_pretrained(v1_path))
        trainer.train()
        trainer.save_model(Path(tmp) / "model")
        (Path(tmp) / "model" / "adaptguard_v2_recipe.json").write_text(json.dumps({"v1": v1_path, **V2_RECIPE}))
        replace_dir(Path(tmp) / "model", target)
    return target


def main(args: Args) -> dict:
    if args.quick:
        args.train_rows, args.test_rows, args.task_epochs, args.compat_epochs = 32, 30, 1.0, 1.0
    start, out = time.perf_counter(), Path(args.out)
    v1 = resolve_model(args.old_model)
    v2 = str(build_v2(v1)) if args.new_model is None else resolve_model(args.new_model)
    rows = load_set("medmcqa")
    random.Random(args.seed).shuffle(rows)
    test = as_prompt_completion(rows[:args.test_rows])
    train = as_prompt_completion(rows[args.test_rows:args.test_rows + args.train_rows])
    results = {}
    for i, mask in enumerate(MASKS):
        run_dir = out / mask
        if i:  # the task adapters do not depend on the mask: the second run reuses the first run's
            for name in ("v1_task_adapter", "v2_task_adapter"):
                if not (run_dir / name).exists():
                    shutil.copytree(out / MASKS[0] / name, run_dir / name)
        cfg = UpdateConfig(old_base=v1, new_base=v2, train=train, test=test, output_dir=str(run_dir), lora_r=16,
                           lora_alpha=32, task_learning_rate=args.task_learning_rate, task_epochs=args.task_epochs,
                           compat_learning_rate=args.compat_learning_rate, compat_epochs=args.compat_epochs,
                           mask=mask, batch_size=args.batch_size, max_length=256, max_new_tokens=24, seed=args.seed,
                           use_cpu=not torch.cuda.is_available())
        say(f"update with mask {mask} ...")
        results[mask] = run_update(cfg)
    command = command_line("studies/paper002_update.py", args)
    report = {"settings": {**vars(args), "v1": v1, "v2": v2, "v2_recipe": V2_RECIPE if args.new_model is None else None,
                           "command": command},
              "masks": {m: {k: v for k, v in r.items() if k != "config"} for m, r in results.items()},
              "machine": machine_info(), "seconds": time.perf_counter() - start}
    write_report(out, report, markdown(report))
    return report


def markdown(report: dict) -> str:
    s, masks = report["settings"], report["masks"]
    first = next(iter(masks.values()))
    v2 = (f"v1 trained on LogiQA passages ({s['v2_recipe']['max_steps']} steps, batch {s['v2_recipe']['batch_size']}, "
          f"learning rate {s['v2_recipe']['learning_rate']:g}, TRL SFTTrainer)") if s["v2_recipe"] else s["new_model"]
    lines = [f"# Paper 002 update on a real model: {s['old_model']} → {v2}", "",
             f"Task: MedMCQA, {first['n_train']} training and {first['n_test']} test questions, answer = the right "
             f"option's text, exact match of the greedy answer. LoRA task adapters ({s['task_epochs']:g} epochs) on "
             f"v1 and v2; the compatibility adapter on v2 ({s['compat_epochs']:g} epochs) per mask.", "",
             f"v1 acc {first['old_acc']:.3f}, v2 acc {first['new_acc']:.3f}; NFR v1→v2 {first['nfr']:.3f} "
             f"(95% CI {first['nfr_ci'][0]:.3f}–{first['nfr_ci'][1]:.3f}), PFR {first['pfr']:.3f}, McNemar p "
             f"{first['mcnemar_p_v1_v2']:.3g}.", "",
             "| mask | v2+compat acc | NFR_c (95% CI) | ΔNFR_c | PFR_c | McNemar p v1 vs v2+compat | "
             "tokens aligned to v1 (first → last log) |", "|---|---|---|---|---|---|---|"]
    for mask, r in masks.items():
        aligned = " → ".join(f"{x:.2f}" for x in r["frac_aligned_old_first_last"] or [])
        lines.append(f"| {mask} | {r['compat_acc']:.3f} | {r['nfr_compat']:.3f} ({r['nfr_compat_ci'][0]:.3f}–"
                     f"{r['nfr_compat_ci'][1]:.3f}) | {r['delta_nfr']:+.3f} | {r['pfr_compat']:.3f} | "
                     f"{r['mcnemar_p_v1_compat']:.3g} | {aligned} |")
    lines += ["", "Flip plots: `<mask>/flips.png`.", "",
              report_footer(report), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    (parsed,) = HfArgumentParser(Args).parse_args_into_dataclasses()
    main(parsed)
