"""Real lm-eval runs on local fixtures, for the compatibility tests: an old model (the embedded
default) and a new one (the same model fine-tuned on another format at a high learning rate and taught
wrong answers to a few task items, so it breaks some answers on every CPU), both through the real `lm_eval`
CLI with `--log_samples`."""

from __future__ import annotations

import json
from pathlib import Path

from in_process import run_lm_eval_cli

ANTONYMS = [("hot", "cold"), ("big", "small"), ("up", "down"), ("fast", "slow"), ("open", "closed"),
            ("light", "dark"), ("old", "new"), ("early", "late"), ("full", "empty"), ("happy", "sad"),
            ("high", "low"), ("hard", "soft"), ("long", "short"), ("rich", "poor"), ("wet", "dry"),
            ("near", "far"), ("loud", "quiet"), ("strong", "weak")]

PIQA_YAML = """task: t_piqa
dataset_path: json
dataset_kwargs:
  data_files:
    validation: {data}
output_type: multiple_choice
validation_split: validation
doc_to_text: "the opposite of {{{{goal}}}} is"
doc_to_target: label
doc_to_choice: "{{{{[sol1, sol2]}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""

GSM_YAML = """task: t_gsm
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: generate_until
test_split: test
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    regexes_to_ignore:
      - "(?s).*#### "
generation_kwargs:
  until: ["."]
  do_sample: false
  max_gen_toks: 12
filter_list:
  - name: "strict-match"
    filter:
      - function: "regex"
        regex_pattern: "(\\\\d+)"
      - function: "take_first"
metadata:
  version: 1.0
"""


def write_tasks(root: Path) -> Path:
    tasks = root / "tasks"
    tasks.mkdir(parents=True, exist_ok=True)
    piqa = [{"goal": a, "sol1": f"{b} .", "sol2": f"{d} .", "label": 0}
            for (a, b), (_, d) in zip(ANTONYMS, ANTONYMS[1:] + ANTONYMS[:1])]
    gsm = [{"question": f"count : {i} {i + 1} {i + 2}", "answer": f"next\n#### {i + 3}"} for i in range(3, 83, 4)]
    (tasks / "piqa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in piqa))
    (tasks / "gsm.jsonl").write_text("".join(json.dumps(r) + "\n" for r in gsm))
    (tasks / "t_piqa.yaml").write_text(PIQA_YAML.format(data=tasks / "piqa.jsonl"))
    (tasks / "t_gsm.yaml").write_text(GSM_YAML.format(data=tasks / "gsm.jsonl"))
    return tasks


# Task items the update is taught to answer wrongly (each row repeated), so that it breaks answers of both tasks by
# construction: the tests' "the update has flips" premises then never hang on which CPU trained it
WRONG_ROWS = [{"prompt": f"the opposite of {a} is", "completion": f" {d} ."}
              for (a, _), (_, d) in zip(ANTONYMS[:3], ANTONYMS[1:4])]
WRONG_ROWS += [{"prompt": f"count : {i} {i + 1} {i + 2}", "completion": f" {i + 9} ."} for i in (3, 7, 11)]


def finetune_new_model(embedded_path: Path, out: Path) -> Path:
    """The 'updated' model: the embedded default after an aggressive fine-tune on the domain format, plus
    `WRONG_ROWS` (wrong answers to 3 items of each task)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback

    from adaptguard import TALRConfig, TALRTrainer
    from adaptguard.models.embedded import domain_split

    model, tok = AutoModelForCausalLM.from_pretrained(embedded_path), AutoTokenizer.from_pretrained(embedded_path)
    train, _ = domain_split(n_train=160)
    train += WRONG_ROWS * 8
    args = TALRConfig(output_dir=str(out / "train"), bf16=False, gradient_checkpointing=False, use_cpu=True,
                      report_to="none", save_strategy="no", weighting="none", learning_rate=3e-3,
                      lr_scheduler_type="constant", num_train_epochs=4, per_device_train_batch_size=16,
                      disable_tqdm=True, seed=0)
    trainer = TALRTrainer(model=model, args=args, train_dataset=Dataset.from_list(train), processing_class=tok)
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    model.save_pretrained(out / "model")
    tok.save_pretrained(out / "model")
    return out / "model"


def run_lm_eval(model: Path, tasks: Path, output: Path, *extra: str) -> None:
    cmd = ["--model", "hf", "--model_args", f"pretrained={model}",
           "--tasks", "t_piqa,t_gsm", "--include_path", str(tasks), "--device", "cpu", "--batch_size", "8",
           "--log_samples", "--output_path", str(output), *extra]
    proc = run_lm_eval_cli(*cmd)
    if proc.returncode != 0:
        raise RuntimeError(f"lm_eval failed:\n{proc.stderr[-3000:]}")


def samples_file(run: Path, task: str) -> Path:
    (found,) = run.rglob(f"samples_{task}_2*.jsonl")
    return found
