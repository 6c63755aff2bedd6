"""TALRTrainer vs SFTTrainer: step time and peak memory, measured in one run.

    python benchmarks/bench_talr.py                  # vocab 32k, seq 512, batch 4, 20 paired steps
    python benchmarks/bench_talr.py --steps 40 --seq 1024
    python benchmarks/bench_talr.py --kl-beta 0.001 --vocab 131072 --seq 1024 --batch 1   # TALR + KL to a frozen copy
    python benchmarks/bench_talr.py --vocab 131072 --seq 2048 --batch 4 --hidden 1024 --layers 8 --bf16 --device cuda

Both trainers train identical tiny Llama models (built from config, vocabulary ≥ 32k so the LM head
and loss matter) on the same batch. Step time = forward + backward + optimizer step through each
trainer's own `training_step`; the two alternate (A/B, then B/A) and the script prints the median of
the paired ratios. Peak memory: `torch.cuda.max_memory_allocated` on a GPU; on CPU, the peak RSS
growth of a fresh subprocess per variant (alternated, median of 3). Goals: `talr_step_time_ratio`
≤ 1.03, `talr_peak_memory_ratio` ≤ 1.02. With `--kl-beta β` the TALR side adds the k3 KL to a frozen copy of
the model, whose label log-probabilities also come from TRL's fused LM head (no (B, L, V) logits): its extra cost
is the reference's forward, and its memory should stay flat in the vocabulary.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import torch


def build(variant: str, args, out: str):
    from datasets import Dataset
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from trl import SFTConfig, SFTTrainer

    from adaptguard import TALRConfig, TALRTrainer
    from adaptguard.trl_adapter import no_activation_checkpointing

    vocab = {f"t{i}": i for i in range(args.vocab)}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")),
                                  pad_token="t1", eos_token="t2")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=args.seq, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    g = torch.Generator().manual_seed(1)
    rows = []
    for _ in range(args.batch):
        ids = torch.randint(3, args.vocab, (args.seq,), generator=g).tolist()
        rows.append({"input_ids": ids, "completion_mask": [0] * (args.seq // 4) + [1] * (args.seq - args.seq // 4)})
    common = dict(output_dir=out, bf16=args.bf16, **no_activation_checkpointing(), report_to="none",
                  per_device_train_batch_size=args.batch, max_length=args.seq, learning_rate=1e-5,
                  use_cpu=args.device == "cpu", disable_tqdm=True)
    if variant == "sft":
        trainer = SFTTrainer(model=model, args=SFTConfig(**common), train_dataset=Dataset.from_list(rows),
                             processing_class=tok)
    else:
        trainer = TALRTrainer(model=model, args=TALRConfig(**common, kl_beta=args.kl_beta),
                              train_dataset=Dataset.from_list(rows), processing_class=tok)
    # as train() does: accelerate wraps the model's forward in autocast for --bf16 (the Trainer's own autocast
    # context is a no-op in transformers 5), so without this a "bf16" step would run in fp32
    trainer.model = trainer.accelerator.prepare_model(trainer.model)
    trainer.create_optimizer_and_scheduler(num_training_steps=10_000)
    trainer.current_gradient_accumulation_steps = 1
    batch = next(iter(trainer.get_train_dataloader()))
    n_items = (batch["labels"][:, 1:] != -100).sum()
    trainer.model.train()
    return trainer, batch, n_items


def step(trainer, batch, n_items) -> float:
    cuda = next(trainer.model.parameters()).is_cuda
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    trainer.training_step(trainer.model, dict(batch), n_items)
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def measure_memory_child(variant: str, args) -> None:
    """Runs in a subprocess: peak memory growth of 3 training steps of one variant (bytes, on stdout)."""
    with tempfile.TemporaryDirectory() as out:
        trainer, batch, n_items = build(variant, args, out)
        step(trainer, batch, n_items)  # optimizer state exists from here on
        if args.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        else:
            base = reset_peak_rss()
        for _ in range(3):
            step(trainer, batch, n_items)
        peak = torch.cuda.max_memory_allocated() if args.device == "cuda" else peak_rss()
        print(json.dumps({"peak_growth": peak - base}))


def peak_rss() -> int:
    """Peak resident set size of this process (VmHWM), bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def reset_peak_rss() -> int:
    """Reset VmHWM to the current RSS (Linux ≥ 4.0: `5 > /proc/self/clear_refs`) and return it."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return peak_rss()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20, help="paired steps (≥ 20)")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--memory-repeats", type=int, default=3)
    parser.add_argument("--kl-beta", type=float, default=0.0, help="TALR side with the KL baseline (frozen copy)")
    parser.add_argument("--bf16", action="store_true", help="bf16 mixed precision (TRL's bf16=True) for both trainers")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--_memory-child", dest="memory_child", choices=["sft", "talr"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        measure_memory_child(args.memory_child, args)
        return
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        sft = build("sft", args, a)
        talr = build("talr", args, b)
        for _ in range(3):  # warm-up
            step(*sft)
            step(*talr)
        ratios, t_sft, t_talr = [], [], []
        for i in range(args.steps):
            order = [("sft", sft), ("talr", talr)] if i % 2 == 0 else [("talr", talr), ("sft", sft)]
            times = {name: step(*bundle) for name, bundle in order}
            t_sft.append(times["sft"])
            t_talr.append(times["talr"])
            ratios.append(times["talr"] / times["sft"])

    peaks = {"sft": [], "talr": []}
    cmd = [sys.executable, __file__, "--vocab", str(args.vocab), "--seq", str(args.seq), "--batch", str(args.batch),
           "--hidden", str(args.hidden), "--layers", str(args.layers), "--kl-beta", str(args.kl_beta), "--device",
           args.device, *(["--bf16"] if args.bf16 else [])]
    for i in range(args.memory_repeats):
        for variant in (["sft", "talr"] if i % 2 == 0 else ["talr", "sft"]):
            out = subprocess.run([*cmd, "--_memory-child", variant], capture_output=True, text=True, check=True,
                                 env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
            peaks[variant].append(json.loads(out.stdout.strip().splitlines()[-1])["peak_growth"])
    result = {
        "talr_step_time_ratio": round(statistics.median(ratios), 4),
        "talr_peak_memory_ratio": round(statistics.median(peaks["talr"]) / statistics.median(peaks["sft"]), 4),
        "sft_step_seconds_median": round(statistics.median(t_sft), 4),
        "talr_step_seconds_median": round(statistics.median(t_talr), 4),
        "sft_peak_growth_mib": round(statistics.median(peaks["sft"]) / 2**20, 1),
        "talr_peak_growth_mib": round(statistics.median(peaks["talr"]) / 2**20, 1),
        "kl_beta": args.kl_beta, "paired_steps": args.steps, "vocab": args.vocab, "seq": args.seq, "batch": args.batch,
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "dtype": "bf16" if args.bf16
        else "fp32", "torch_threads": torch.get_num_threads(),
    }
    for key, value in result.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
