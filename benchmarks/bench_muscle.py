"""MUSCLETrainer vs plain LoRA SFTTrainer steps on the same model, in one run.

    python benchmarks/bench_muscle.py                 # vocab 32k, seq 256, batch 4, 20 rounds
    python benchmarks/bench_muscle.py --steps 40 --seq 512
    python benchmarks/bench_muscle.py --vocab 32768,131072,262144 --seq 1024 --batch 1 --steps 5 --with-logits
    python benchmarks/bench_muscle.py --vocab 131072 --seq 1024 --batch 8 --hidden 1024 --layers 8 --bf16 --device cuda

Trainers on identical tiny Llama models built from config: plain SFT with a LoRA adapter (TRL's fused LM
head; the baseline), MUSCLE with the old model online, and MUSCLE reading a top-k (k = 64) cache of the old
model, both with the default tiled loss (no (B, L, V) logits); `--with-logits` adds MUSCLE on the full-logits
path (`loss_implementation="logits"`) for comparison. Each round runs one training step of each, in rotating
order; the script prints the medians of the per-round ratios. `--vocab`, `--seq` and `--batch` take
comma-separated lists: one line per combination, then a table. Goals (issue 16, at V = 131072, L = 1024):
`muscle_peak_memory_ratio` ≤ 1.3, `muscle_cached_peak_memory_ratio` ≤ 1.15, `muscle_step_time_ratio` ≤ 1.8,
`muscle_cached_step_time_ratio` ≤ 1.35, and memory flat in V; on an H100 (issue 56), fp32 and bf16 at V 131k:
online ≤ 1.4×, cached ≤ 1.15×, memory ≤ 1.0×. Memory: peak growth of a fresh subprocess per variant (alternated,
median of `--memory-repeats`): peak RSS on CPU, `torch.cuda.max_memory_allocated` on a GPU. `v2_base_copies`:
copies of the new base's weights in the MUSCLE trainer (goal 1). `*_op_ratio`: the operator launches of one step
against SFT's, from `torch.profiler` — CUDA kernels on a GPU, the leaf aten operators on CPU — a measure of the
small-kernel overhead that needs no GPU (goal ≤ 1.5). `--compile-loss` fuses the tiles with torch.compile (the
default on CUDA; `--compile-loss off` forces it off). `--tiles` fixes the tile (TOKENSxVOCAB); by default
`tile_sizes` chooses it (1,024 x 8,192 on CPU, from the free memory on a GPU), and `tiles` in the output says which.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_talr import peak_rss, reset_peak_rss  # noqa: E402


def setup(root: Path, args) -> dict:
    """Tokenizer, v2 base, v2 task adapter, v1 model and a cache, saved under `root` (once)."""
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from tokenizers import Tokenizer, models
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from adaptguard.muscle.logit_cache import cache_logits_for_training

    vocab = {f"t{i}": i for i in range(args.vocab)}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")),
                                  pad_token="t1", eos_token="t2")
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=args.seq + 8)
    for name, seed in (("v2", 0), ("v1", 1)):
        torch.manual_seed(seed)
        LlamaForCausalLM(config).save_pretrained(root / name)
        tok.save_pretrained(root / name)
    torch.manual_seed(2)
    task = get_peft_model(LlamaForCausalLM.from_pretrained(root / "v2"),
                          LoraConfig(r=args.lora_r, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    with torch.no_grad():
        for n, p in task.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)
    task.save_pretrained(root / "v2_adapter")
    g = torch.Generator().manual_seed(3)
    words = [f"t{i}" for i in range(3, args.vocab)]
    rows = []
    for _ in range(args.batch):
        ids = torch.randint(0, len(words), (args.seq - 1,), generator=g).tolist()
        half = len(ids) // 4
        rows.append({"prompt": " ".join(words[i] for i in ids[:half]),
                     "completion": " " + " ".join(words[i] for i in ids[half:])})
    Dataset.from_list(rows).save_to_disk(str(root / "data"))
    cache_logits_for_training(LlamaForCausalLM.from_pretrained(root / "v1"), tok, Dataset.from_list(rows),
                              root / "cache", k=args.k, max_length=args.seq + 8)
    from adaptguard.muscle.trainer import output_head

    cache_logits_for_training(LlamaForCausalLM.from_pretrained(root / "v1"), tok, Dataset.from_list(rows),
                              root / "vectors", max_length=args.seq + 8, temperature=2.0,
                              student_head=output_head(LlamaForCausalLM.from_pretrained(root / "v2")))
    return {"rows": rows}


def build(variant: str, root: Path, args):
    from datasets import load_from_disk
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from adaptguard import MUSCLEConfig, MUSCLETrainer
    from adaptguard.trl_adapter import no_activation_checkpointing

    data = load_from_disk(str(root / "data"))
    tok = AutoTokenizer.from_pretrained(root / "v2")
    common = dict(output_dir=str(root / f"out-{variant}"), bf16=args.bf16, **no_activation_checkpointing(),
                  report_to="none", per_device_train_batch_size=args.batch, max_length=args.seq + 8,
                  learning_rate=1e-5, use_cpu=args.device == "cpu", disable_tqdm=True)
    if variant == "sft":
        trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(root / "v2"), args=SFTConfig(**common),
                             train_dataset=data, processing_class=tok,
                             peft_config=LoraConfig(r=args.lora_r, target_modules=["q_proj", "v_proj"],
                                                    task_type="CAUSAL_LM"))
    else:
        extra = {"old_logits_cache": str(root / "cache")} if variant == "cached" else \
            {"old_logits_cache": str(root / "vectors")} if variant == "exact_cached" else {"old_model": str(root / "v1")}
        implementation = {"muscle_logits": "logits", "exact": "exact", "exact_cached": "exact"}.get(variant, "tiled")
        compile_loss = {"auto": None, "on": True, "off": False}[args.compile_loss]
        tiles = (None, None) if args.tiles == "auto" else tuple(int(x) for x in args.tiles.split("x"))
        trainer = MUSCLETrainer(model=str(root / "v2"), args=MUSCLEConfig(
            new_adapter=str(root / "v2_adapter"), loss_implementation=implementation, compile_loss=compile_loss,
            lse_kernel=args.lse_kernel if implementation == "exact" else "auto", mask=args.mask,
            kl_chunk_size=tiles[0], vocab_chunk_size=tiles[1], **extra, **common), train_dataset=data,
            processing_class=tok)
    # as train() does: accelerate wraps the model's forward in autocast for --bf16 (the Trainer's own autocast
    # context is a no-op in transformers 5), so without this a "bf16" step would run in fp32
    trainer.model = trainer.accelerator.prepare_model(trainer.model)
    trainer.create_optimizer_and_scheduler(num_training_steps=10_000)
    trainer.current_gradient_accumulation_steps = 1
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.model.train()
    return trainer, batch, (batch["labels"][:, 1:] != -100).sum()


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


def op_launches(trainer, batch, n_items) -> int:
    """Operators one training step launches: CUDA kernels on a GPU, the leaf aten operators (those that call no
    other operator) on CPU."""
    from torch.profiler import ProfilerActivity, profile

    cuda = next(trainer.model.parameters()).is_cuda
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        step(trainer, batch, n_items)
    events = prof.events()
    if cuda:
        return sum(1 for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    return sum(1 for e in events if e.name.startswith("aten::") and not e.cpu_children)


def base_copies(trainer) -> int:
    """How many distinct tensors hold the v2 base's embedding matrix in the trainer's model."""
    ptrs = {p.data_ptr() for n, p in trainer.model.named_parameters() if n.endswith("embed_tokens.weight")}
    return len(ptrs)


def memory_child(variant: str, root: Path, args) -> None:
    trainer, batch, n = build(variant, root, args)
    step(trainer, batch, n)
    if args.device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        base = reset_peak_rss()
    for _ in range(3):
        step(trainer, batch, n)
    peak = torch.cuda.max_memory_allocated() if args.device == "cuda" else peak_rss()
    print(json.dumps({"peak_growth": peak - base}))


def measure(args) -> dict:
    """One combination of vocab, seq and batch: the step time and peak memory ratios against SFT."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        setup(root, args)
        variants = ["sft", "muscle", "cached", "exact", "exact_cached"] + (["muscle_logits"] if args.with_logits else [])
        bytes_per_token = cache_bytes_per_token(root / "vectors")
        bundles = {v: build(v, root, args) for v in variants}
        for _ in range(2):
            for b in bundles.values():
                step(*b)
        times = {v: [] for v in bundles}
        for i in range(args.steps):
            for v in variants[i % len(variants):] + variants[:i % len(variants)]:
                times[v].append(step(*bundles[v]))
        copies = base_copies(bundles["muscle"][0])
        ops = {v: op_launches(*b) for v, b in bundles.items()}
        del bundles
        peaks = {v: [] for v in variants}
        cmd = [sys.executable, __file__, *[f"--{k.replace('_', '-')}={getattr(args, k)}" for k in
                                         ("vocab", "seq", "batch", "hidden", "layers", "lora_r", "k", "device",
                                          "compile_loss", "tiles", "lse_kernel")], *(["--mask", args.mask] if args.mask
                                                                                    else []), *(["--bf16"] if args.bf16 else [])]
        for i in range(args.memory_repeats):
            for v in (variants if i % 2 == 0 else variants[::-1]):
                out = subprocess.run([*cmd, "--_child", v, str(root)], capture_output=True, text=True, check=True,
                                     env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
                peaks[v].append(json.loads(out.stdout.strip().splitlines()[-1])["peak_growth"])
    ratio = lambda v: statistics.median(a / b for a, b in zip(times[v], times["sft"]))  # noqa: E731
    med = {v: statistics.median(p) for v, p in peaks.items()} if args.memory_repeats else {}
    memory = lambda v: round(med[v] / med["sft"], 3) if med else None  # noqa: E731 (--memory-repeats 0: not measured)
    mib = lambda v: round(med[v] / 2**20, 1) if med else None  # noqa: E731
    result = {
        "vocab": args.vocab, "seq": args.seq, "batch": args.batch,
        "muscle_step_time_ratio": round(ratio("muscle"), 3),
        "muscle_cached_step_time_ratio": round(ratio("cached"), 3),
        "muscle_peak_memory_ratio": memory("muscle"), "muscle_cached_peak_memory_ratio": memory("cached"),
        "sft_step_seconds_median": round(statistics.median(times["sft"]), 4),
        "sft_peak_growth_mib": mib("sft"), "muscle_peak_growth_mib": mib("muscle"),
        "muscle_cached_peak_growth_mib": mib("cached"),
        "exact_step_time_ratio": round(ratio("exact"), 3),
        "exact_cached_step_time_ratio": round(ratio("exact_cached"), 3),
        "exact_peak_memory_ratio": memory("exact"), "exact_cached_peak_memory_ratio": memory("exact_cached"),
        "exact_cache_bytes_per_token": bytes_per_token, "hidden": args.hidden,
        **flop_floors(args),
        "muscle_op_ratio": round(ops["muscle"] / ops["sft"], 3),
        "muscle_cached_op_ratio": round(ops["cached"] / ops["sft"], 3), "sft_ops": ops["sft"],
        "v2_base_copies": copies, "rounds": args.steps, "k": args.k, "dtype": "bf16" if args.bf16 else "fp32",
        "device": args.device, "compile_loss": args.compile_loss, "tiles": tile_label(args),
        "mask": args.mask or "student_wrong", "lse_kernel": args.lse_kernel,
    }
    if args.with_logits:
        result["muscle_logits_step_time_ratio"] = round(ratio("muscle_logits"), 3)
        result["muscle_logits_peak_memory_ratio"] = memory("muscle_logits")
    return result


def cache_bytes_per_token(path: Path) -> float:
    """Bytes of the exact cache's tensors (m, H(q), s·b·q, argmax, label log-prob) per cached token."""
    from safetensors import safe_open

    total = tokens = 0
    for shard in path.glob("shard-*.safetensors"):
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                if name == "offsets":
                    tokens += int(t[-1])
                else:
                    total += t.numel() * t.element_size()
    return round(total / tokens, 1)


def flop_floors(args) -> dict:
    """The step's matmul FLOPs against LoRA SFT's, counted from the model's sizes (per token: a backbone forward F_b =
    2·params, a vocabulary product F_v = 2·H·V; SFT = forward and activation backward, 2 F_b + 2 F_v). The new teacher
    (v2's adapter) runs online in every MUSCLE variant: + F_b + 2 F_v (its logits, then m = Wᵀq); the old one online
    adds the same; the exact student pass costs SFT's 2 F_v. The tiled path recomputes every tile in its backward: +3
    F_v for three models."""
    h, layers, v = args.hidden, args.layers, args.vocab
    f_b = 2 * layers * (4 * h * h + 3 * h * 4 * h)
    f_v = 2 * h * v
    sft = 2 * f_b + 2 * f_v
    teacher = f_b + 2 * f_v
    return {"exact_cached_flop_floor": round((sft + teacher) / sft, 3),
            "exact_flop_floor": round((sft + 2 * teacher) / sft, 3),
            "tiled_flop_floor": round((2 * f_b + 2 * f_b + 6 * f_v) / sft, 3)}


def tile_label(args) -> str:
    """The tile the online MUSCLE step used, as TOKENSxVOCAB (auto resolved as `tile_sizes` resolves it)."""
    if args.tiles != "auto":
        return args.tiles
    from adaptguard.muscle.tiled import tile_sizes

    free = torch.cuda.mem_get_info()[0] if args.device == "cuda" else None
    return "auto " + "x".join(map(str, tile_sizes(args.batch * args.seq, args.vocab, free)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--vocab", default="32000", help="comma-separated list")
    parser.add_argument("--seq", default="256", help="comma-separated list")
    parser.add_argument("--batch", default="4", help="comma-separated list")
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lora-r", type=int, default=16)
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--memory-repeats", type=int, default=3, help="0: step times and launches only")
    parser.add_argument("--with-logits", action="store_true", help="also MUSCLE on the full-logits path")
    parser.add_argument("--bf16", action="store_true", help="bf16 mixed precision (TRL's bf16=True) for every trainer")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compile-loss", choices=["auto", "on", "off"], default="auto",
                        help="MUSCLEConfig.compile_loss: auto (on CUDA only), on, off")
    parser.add_argument("--mask", default=None, help="MUSCLE's mask (default: the config's, student_wrong); a mask "
                        "that reads only the teachers (old_likelier_token) lets the exact rows use the LSE kernel")
    parser.add_argument("--lse-kernel", choices=["auto", "torch", "cut_cross_entropy"], default="auto",
                        help="the exact rows' student log-sum-exp (MUSCLEConfig.lse_kernel)")
    parser.add_argument("--tiles", default="auto",
                        help="the tiled loss's tile: auto (muscle.tiled.tile_sizes: fixed on CPU, from free memory "
                             "on a GPU) or TOKENSxVOCAB, e.g. 1024x8192")
    parser.add_argument("--_child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    grid = [(int(v), int(s), int(b)) for v in args.vocab.split(",") for s in args.seq.split(",")
            for b in args.batch.split(",")]
    if args._child:
        args.vocab, args.seq, args.batch = grid[0]
        memory_child(args._child[0], Path(args._child[1]), args)
        return
    rows = []
    for vocab, seq, batch in grid:
        args.vocab, args.seq, args.batch = vocab, seq, batch
        rows.append(measure(args))
        print(json.dumps(rows[-1]), flush=True)
    device = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"\n{device}, torch {torch.__version__}")
    columns = [k for k in rows[0] if k not in ("rounds", "k")]
    print("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in columns) + " |")


if __name__ == "__main__":
    main()
