"""Top-k logit cache of the old (v1) model, so that `MUSCLETrainer` can train without it in memory.

For every scored position of every training row (in the shifted-label convention of causal LMs) the
cache keeps the top-k log-probabilities and their token ids, and the log of the remaining mass.
The old distribution is the top-k probabilities plus the remaining mass spread evenly over the other
V − k tokens (`adaptguard.muscle.losses.TopKLogProbs`; the KL is computed from this sparse form); with
k = V it is exact.

Layout of a cache directory: `cache.json` (k, vocabulary size and fingerprint of the tokenizer,
per-row fingerprints of the tokenized training rows, shard table) and `shard-XXXXX.safetensors`
(`logp` (n_tok, k) float32, `idx` (n_tok, k) int32, `rest` (n_tok,) float32, `offsets` (rows + 1,)
int64). Everything is written to a temporary directory and renamed when complete.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers.utils.logging import tqdm as hf_tqdm

from ..trl_adapter import no_activation_checkpointing
from ..utils.files import check_replaceable, replace_dir
from ..utils.labels import shifted_labels

CACHE_VERSION = 1


def tokenizer_fingerprint(tokenizer) -> str:
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:16]


def row_fingerprint(input_ids, labels) -> str:
    """Identity of a tokenized training row (its tokens and which of them are scored)."""
    ids = torch.as_tensor(input_ids, dtype=torch.int64).cpu().numpy().tobytes()
    lab = torch.as_tensor(labels, dtype=torch.int64).cpu().numpy().tobytes()
    return hashlib.sha1(ids + b"|" + lab).hexdigest()


def topk_entries(logits: torch.Tensor, labels: torch.Tensor, k: int) -> tuple[torch.Tensor, ...]:
    """Top-k log-probs/ids and log remaining mass at the scored positions of a batch, in row-major order.

    Args:
        logits: (B, L, V); labels: (B, L) unshifted, −100 = not scored.
    Returns:
        `(logp (N, k), idx (N, k), rest (N,), counts (B,))` with N scored positions.
    """
    shifted = shifted_labels(labels)
    valid = shifted != -100
    logp = torch.log_softmax(logits[valid].float(), -1)
    top, idx = logp.topk(k, dim=-1)
    rest = torch.log1p(-top.exp().sum(-1).clamp(max=1.0)) if k < logits.shape[-1] else \
        torch.full((len(top),), float("-inf"), device=top.device)
    return top, idx.to(torch.int32), rest, valid.sum(-1)


class LogitCache:
    """Read side of a cache directory (lazy: slices are read from the shards on demand)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        meta_file = self.path / "cache.json"
        if not meta_file.exists():
            raise ValueError(f"{self.path}: not an adaptguard logit cache (no cache.json); build one with "
                             "`adaptguard cache-logits`")
        self.meta = json.loads(meta_file.read_text())
        if self.meta.get("version") != CACHE_VERSION:
            raise ValueError(f"{meta_file}: cache version {self.meta.get('version')}, expected {CACHE_VERSION}")
        self.k, self.vocab_size = int(self.meta["k"]), int(self.meta["vocab_size"])
        self.row_index = {h: i for i, h in enumerate(self.meta["row_fingerprints"])}
        self.shard_starts = [0]
        for n in self.meta["shard_rows"]:
            self.shard_starts.append(self.shard_starts[-1] + n)
        self._handles: dict[int, object] = {}
        self._offsets: dict[int, torch.Tensor] = {}

    def check(self, tokenizer, vocab_size: int) -> None:
        if tokenizer_fingerprint(tokenizer) != self.meta["tokenizer"]:
            raise ValueError(f"{self.path}: the cache was built with another tokenizer (fingerprint "
                             f"{self.meta['tokenizer']} ≠ {tokenizer_fingerprint(tokenizer)})")
        if vocab_size != self.vocab_size:
            raise ValueError(f"{self.path}: the cache has {self.vocab_size} logits per token, the model {vocab_size}")

    def rows_for(self, fingerprints: list[str]) -> list[int]:
        missing = [i for i, h in enumerate(fingerprints) if h not in self.row_index]
        if missing:
            raise ValueError(f"{self.path}: {len(missing)} of {len(fingerprints)} training rows are not in the cache "
                             f"(first: row {missing[0]}); it was built for another dataset, tokenizer or max_length")
        return [self.row_index[h] for h in fingerprints]

    def _shard(self, shard: int):
        if shard not in self._handles:
            handle = safe_open(str(self.path / self.meta["shards"][shard]), framework="pt")
            self._handles[shard] = handle
            self._offsets[shard] = handle.get_tensor("offsets")
        return self._handles[shard], self._offsets[shard]

    def row(self, row: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        shard = bisect.bisect_right(self.shard_starts, row) - 1
        local = row - self.shard_starts[shard]
        handle, offsets = self._shard(shard)
        a, b = int(offsets[local]), int(offsets[local + 1])
        return handle.get_slice("logp")[a:b], handle.get_slice("idx")[a:b], handle.get_slice("rest")[a:b]

    def topk_batch(self, rows: list[int], labels: torch.Tensor):
        """`TopKLogProbs` (B, L, k) of a batch for `muscle_token_loss_chunked`; zeros at unscored positions."""
        from .losses import TopKLogProbs

        valid = shifted_labels(labels) != -100
        shape = (*labels.shape, self.k)
        logp = torch.zeros(shape, dtype=torch.float32, device=labels.device)
        idx = torch.zeros(shape, dtype=torch.int64, device=labels.device)
        rest = torch.zeros(labels.shape, dtype=torch.float32, device=labels.device)
        for b, row in enumerate(rows):
            row_logp, row_idx, row_rest = self.row(row)
            positions = valid[b].nonzero().squeeze(1)
            if len(positions) != len(row_logp):
                raise ValueError(f"{self.path}: row {row} has {len(row_logp)} cached positions, the batch "
                                 f"{len(positions)}; was the cache built with another max_length?")
            logp[b, positions] = row_logp.to(labels.device)
            idx[b, positions] = row_idx.to(labels.device, torch.int64)
            rest[b, positions] = row_rest.to(labels.device)
        return TopKLogProbs(logp, idx, rest)


def is_logit_cache(path: Path) -> bool:
    """Whether `path` holds only what `build_logit_cache` writes."""
    return (path / "cache.json").is_file() and all(
        e.name == "cache.json" or (e.name.startswith("shard-") and e.suffix == ".safetensors") for e in path.iterdir())


@torch.no_grad()
def build_logit_cache(model, tokenizer, dataset, data_collator, out_dir: str | Path, k: int = 64,
                      batch_size: int = 8, rows_per_shard: int = 10_000, model_name: str = "") -> Path:
    """Run `model` once over a prepared (tokenized, with `labels`) dataset and write a top-k cache."""
    vocab_size = model.get_output_embeddings().weight.shape[0]
    if not 1 <= k <= vocab_size:
        raise ValueError(f"k must be in [1, {vocab_size}] (the vocabulary size), got {k}")
    for column in ("input_ids", "labels"):
        if column not in dataset.column_names:
            raise ValueError(f"the dataset has no {column!r} column: pass a dataset prepared by the trainer")
    out_dir = Path(out_dir)
    check_replaceable(out_dir, is_logit_cache, "a logit cache", "out_dir")  # before the model pass, never after
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    fingerprints, shards, shard_rows = [], [], []
    try:
        buf = {"logp": [], "idx": [], "rest": [], "counts": []}

        def flush():
            if not buf["counts"]:
                return
            counts = torch.cat(buf["counts"])
            name = f"shard-{len(shards):05d}.safetensors"
            save_file({"logp": torch.cat(buf["logp"]).contiguous(), "idx": torch.cat(buf["idx"]).contiguous(),
                       "rest": torch.cat(buf["rest"]).contiguous(),
                       "offsets": torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])},
                      str(tmp / name))
            shards.append(name)
            shard_rows.append(len(counts))
            for v in buf.values():
                v.clear()

        data = dataset.select_columns(["input_ids", "labels"])
        rows_in_shard = 0
        # transformers' tqdm: on by default, off with transformers.utils.logging.disable_progress_bar()
        for start in hf_tqdm(range(0, len(data), batch_size), desc="caching the old model's top-k", unit="batch"):
            chunk = data[start:start + batch_size]
            examples = [dict(zip(chunk, values)) for values in zip(*chunk.values())]
            fingerprints += [row_fingerprint(e["input_ids"], e["labels"]) for e in examples]
            batch = data_collator(examples)
            logits = model(input_ids=batch["input_ids"].to(device),
                           attention_mask=batch["attention_mask"].to(device)).logits
            top, idx, rest, counts = topk_entries(logits, batch["labels"].to(device), k)
            for key, value in (("logp", top), ("idx", idx), ("rest", rest), ("counts", counts)):
                buf[key].append(value.cpu())
            rows_in_shard += len(examples)
            if rows_in_shard >= rows_per_shard:
                flush()
                rows_in_shard = 0
        flush()
        meta = {"version": CACHE_VERSION, "k": k, "vocab_size": vocab_size, "tokenizer": tokenizer_fingerprint(tokenizer),
                "model": model_name, "rows": len(fingerprints), "shard_rows": shard_rows,
                "row_fingerprints": fingerprints, "shards": shards}
        (tmp / "cache.json").write_text(json.dumps(meta))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        model.train(was_training)
    replace_dir(tmp, out_dir, is_logit_cache, "a logit cache")
    return out_dir


def cache_logits_for_training(old_model, tokenizer, train_dataset, out_dir: str | Path, *, k: int = 64,
                              max_length: int | None = 1024, batch_size: int = 8, model_name: str = "",
                              dataset_kwargs: dict | None = None) -> Path:
    """Tokenize `train_dataset` exactly as `MUSCLETrainer`/`SFTTrainer` will (with `tokenizer`, the new
    model's), run the old model over it and write the cache to `out_dir`."""
    from trl import SFTConfig, SFTTrainer

    vocab = old_model.get_output_embeddings().weight.shape[0]
    if len(tokenizer) > vocab:  # ids past the model's logits: not this vocabulary (a padded model has more logits)
        raise ValueError(f"tokenizer: {len(tokenizer)} tokens, but the old model has {vocab} output logits; MUSCLE "
                         "needs the old and new models to share one vocabulary (is this the new model's tokenizer?)")
    with tempfile.TemporaryDirectory() as tmp:
        args = SFTConfig(output_dir=tmp, max_length=max_length, packing=False, bf16=False,
                         **no_activation_checkpointing(), report_to="none", use_cpu=not torch.cuda.is_available(),
                         dataset_kwargs=dataset_kwargs)
        preparer = SFTTrainer(model=old_model, args=args, train_dataset=train_dataset, processing_class=tokenizer)
        return build_logit_cache(old_model, tokenizer, preparer.train_dataset, preparer.data_collator, out_dir,
                                 k=k, batch_size=batch_size, model_name=model_name)
