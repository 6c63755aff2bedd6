# Copyright 2026 The adaptguard developers. Licensed under the Apache License, Version 2.0.
"""
Domain SFT with TALR (token-adaptive loss reweighting): TRL's `sft.py` with `SFTTrainer` → `TALRTrainer`.

On a Hub model (GPU), the paper's setting (003 §4: small learning rate, dynamic τ, floor 0.01):

```bash
accelerate launch examples/sft_talr.py \
    --model_name_or_path Qwen/Qwen2.5-0.5B-Instruct \
    --dataset_name trl-lib/Capybara \
    --learning_rate 5e-6 \
    --num_train_epochs 1 \
    --per_device_train_batch_size 2 \
    --gradient_accumulation_steps 8 \
    --weighting talr \
    --output_dir Qwen2.5-0.5B-TALR
```

Offline on the embedded default (CPU, no download; `data:domain` is the demo's domain set):

```bash
python examples/sft_talr.py \
    --model_name_or_path "$(adaptguard embedded tiny)" \
    --dataset_name data:domain \
    --learning_rate 3e-4 --num_train_epochs 2 --per_device_train_batch_size 16 \
    --bf16 False --use_cpu --report_to none \
    --token_analysis \
    --output_dir tiny-TALR
```

Any baseline is one flag away: `--weighting none` (plain SFT), `--l2_lambda 0.01`, `--kl_beta 0.001`,
`--flow`, `--wise_ft_alpha 0.5`, `--use_peft --lora_r 16` (LoRA), `--weighting dft`.
"""

import argparse


def load_train_eval(script_args):
    from datasets import Dataset, DatasetDict, load_dataset

    if script_args.dataset_name == "embedded:domain":  # `embedded:` names models only
        raise SystemExit("--dataset_name: 'embedded:domain' is now 'data:domain'")
    if script_args.dataset_name == "data:domain":
        from adaptguard.models.embedded import domain_split

        train, test = domain_split()
        return DatasetDict({"train": Dataset.from_list(train), "test": Dataset.from_list(test)})
    return load_dataset(script_args.dataset_name, name=script_args.dataset_config,
                        streaming=script_args.dataset_streaming)


def main(script_args, training_args, model_args):
    from trl import get_peft_config, get_quantization_config

    from adaptguard import TALRTrainer

    model_init_kwargs = dict(
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
    )
    if training_args.model_init_kwargs is not None:
        model_init_kwargs.update(training_args.model_init_kwargs)
    training_args.model_init_kwargs = model_init_kwargs

    dataset = load_train_eval(script_args)
    trainer = TALRTrainer(
        model=model_args.model_name_or_path,
        args=training_args,
        train_dataset=dataset[script_args.dataset_train_split],
        eval_dataset=dataset[script_args.dataset_test_split] if training_args.eval_strategy != "no" else None,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
    )
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model(training_args.output_dir)
    trainer.accelerator.print(f"Model saved to {training_args.output_dir}.")
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)


def make_parser(prog: str | None = None) -> argparse.ArgumentParser:
    from trl import ModelConfig, ScriptArguments, TrlParser

    from adaptguard import TALRConfig

    return TrlParser((ScriptArguments, TALRConfig, ModelConfig), prog=prog)


if __name__ == "__main__":
    script_args, training_args, model_args = make_parser().parse_args_and_config()
    main(script_args, training_args, model_args)
