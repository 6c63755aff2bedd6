"""`adaptguard cache-logits`: read the old model once into a cache MUSCLETrainer trains from."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import add_command, finite_float, positive_int

CACHE_LOGITS_EXAMPLE = (
    "example: "
    + "adaptguard cache-logits --kind vectors --old-model v1/ --student-model v2-base/ --dataset train.jsonl --out cache/"
)


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def _cache_logits(ns: argparse.Namespace) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..muscle.logit_cache import cache_logits_for_training, is_logit_cache
    from ..utils.data import check_local_path, load_any_dataset
    from ..utils.files import check_replaceable

    check_replaceable(Path(ns.out), is_logit_cache, "a logit cache", "--out")  # before loading anything
    if ns.kind == "vectors" and not ns.student_model:
        raise ValueError(
            "--kind vectors: give --student-model, the model to be trained (its output layer W makes the cached m = Wᵀq)"
        )
    from ..models.embedded import resolve_model

    ns.old_model, ns.tokenizer = resolve_model(ns.old_model), ns.tokenizer and resolve_model(ns.tokenizer)
    for name, value in (("--old-model", ns.old_model), ("--old-adapter", ns.old_adapter), ("--tokenizer", ns.tokenizer)):
        if value:
            check_local_path(value, name)
    old = AutoModelForCausalLM.from_pretrained(ns.old_model)
    if ns.old_adapter:
        from peft import PeftModel

        old = PeftModel.from_pretrained(old, ns.old_adapter).merge_and_unload()
    tokenizer = AutoTokenizer.from_pretrained(ns.tokenizer or ns.old_model)
    head = None
    if ns.kind == "vectors":
        from ..muscle.heads import output_head

        student = resolve_model(ns.student_model)
        check_local_path(student, "--student-model")
        head = output_head(AutoModelForCausalLM.from_pretrained(student))
    out = cache_logits_for_training(
        old,
        tokenizer,
        load_any_dataset(ns.dataset, ns.split),
        ns.out,
        k=ns.top_k,
        max_length=ns.max_length,
        batch_size=ns.batch_size,
        model_name=ns.old_model,
        student_head=head,
        temperature=ns.temperature,
        dtype=torch_dtype(ns.dtype),
    )
    print(out)
    return 0


def add(sub) -> None:
    cache = add_command(
        sub,
        "cache-logits",
        extra="train",
        epilog=CACHE_LOGITS_EXAMPLE,
        help="Read the old model once into a cache MUSCLETrainer trains from (top-k, or exact teacher vectors).",
    )
    cache.add_argument("--old-model", required=True, help="old (v1) task model, or its base with --old-adapter")
    cache.add_argument("--old-adapter", help="old task adapter to merge into --old-model")
    cache.add_argument(
        "--tokenizer",
        help="the NEW model's tokenizer, which MUSCLETrainer will tokenize with "
        "(default: the old model's; the vocabularies must be equal)",
    )
    cache.add_argument(
        "--dataset",
        required=True,
        help="Hub name, save_to_disk directory, or .json/.jsonl/.csv/.parquet file, in any format SFTTrainer accepts",
    )
    cache.add_argument("--split", default="train", help="dataset split (default train)")
    cache.add_argument("--out", required=True, help="cache directory to write")
    cache.add_argument("--top-k", type=positive_int, default=64, help="top-k log-probabilities kept per token (default 64)")
    cache.add_argument("--max-length", type=positive_int, default=1024, help="must equal the trainer's max_length")
    cache.add_argument("--batch-size", type=positive_int, default=8, help="rows per forward pass (default 8)")
    cache.add_argument(
        "--kind",
        choices=["topk", "vectors"],
        default="topk",
        help="topk: the top-k log-probabilities (approximate, any loss); vectors: the exact cache the "
        "default loss reads — per token m = Wᵀq (H numbers) with the student's output layer W, "
        "H(q), argmax and label log-probability (needs --student-model and --temperature)",
    )
    cache.add_argument(
        "--student-model",
        metavar="MODEL",
        help="--kind vectors: the model MUSCLETrainer will train (v2's base), whose output layer the vectors are taken with",
    )
    cache.add_argument(
        "--temperature",
        type=finite_float,
        default=2.0,
        help="--kind vectors: the distillation temperature T of the training (default 2.0, MUSCLEConfig's)",
    )
    cache.add_argument(
        "--dtype",
        choices=["bfloat16", "float32"],
        default="float32",
        help="--kind vectors: m's storage, 4 or 2 bytes per hidden unit (default float32: exact to float32's rounding; "
        "bfloat16 halves the cache and costs 3-7 %% of the loss at T 2 on SmolLM2, docs/muscle.md)",
    )
    cache.set_defaults(func=_cache_logits)
