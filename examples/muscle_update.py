# Copyright 2026 The adaptguard developers. Licensed under the Apache License, Version 2.0.
"""
MUSCLE (paper 002): train a compatibility adapter so that the task model on an updated base keeps the
old task model's right answers. In TRL's example style: `MUSCLEConfig` extends `SFTConfig`.

You have: the new base model (v2), its task LoRA adapter, and the old task model (v1 base + adapter).

```bash
accelerate launch examples/muscle_update.py \
    --model_name_or_path meta-llama/Llama-2-7b-hf \
    --new_adapter my-org/llama2-piqa-lora \
    --old_model huggyllama/llama-7b --old_adapter my-org/llama1-piqa-lora \
    --dataset_name my-org/piqa-sft \
    --learning_rate 1e-4 --num_train_epochs 10 --gradient_accumulation_steps 8 \
    --temperature 2 --mask student_wrong \
    --output_dir llama2-piqa-compat
```

Without the old model in memory: first `adaptguard cache-logits --old-model ... --tokenizer <v2> --dataset ...
--out cache/`, then pass `--old_logits_cache cache/` instead of `--old_model`.

Offline on the embedded default (CPU): `adaptguard update --preset tiny` runs the whole experiment;
this script trains only the compatibility adapter, e.g. on the preset's outputs:

```bash
python examples/muscle_update.py \
    --model_name_or_path "$(adaptguard embedded tiny-v2)" \
    --new_adapter update-out/v2_task_adapter \
    --old_model "$(adaptguard embedded tiny)" --old_adapter update-out/v1_task_adapter \
    --dataset_name data:domain \
    --learning_rate 2e-3 --num_train_epochs 3 --per_device_train_batch_size 16 \
    --bf16 False --use_cpu --report_to none --output_dir tiny-compat
```
"""


def main(script_args, training_args):
    from datasets import Dataset, load_dataset

    from adaptguard import MUSCLETrainer

    if script_args.dataset_name == "embedded:domain":  # `embedded:` names models only
        raise SystemExit("--dataset_name: 'embedded:domain' is now 'data:domain'")
    if script_args.dataset_name == "data:domain":
        from adaptguard.models.embedded import domain_split

        train = Dataset.from_list(domain_split()[0])
    else:
        train = load_dataset(script_args.dataset_name, name=script_args.dataset_config,
                             split=script_args.dataset_train_split)
    trainer = MUSCLETrainer(model=script_args.model_name_or_path, args=training_args, train_dataset=train)
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    # only the compatibility adapter; the frozen new-teacher copy stays out of the saved model
    trainer.model.save_pretrained(training_args.output_dir, selected_adapters=["default"])
    trainer.accelerator.print(f"Compatibility adapter saved to {training_args.output_dir}.")


if __name__ == "__main__":
    from dataclasses import dataclass, field

    from trl import ScriptArguments, TrlParser

    from adaptguard import MUSCLEConfig

    @dataclass
    class Args(ScriptArguments):
        model_name_or_path: str = field(default=None, metadata={"help": "The new (v2) base model."})

    script_args, training_args = TrlParser((Args, MUSCLEConfig)).parse_args_and_config()
    main(script_args, training_args)
