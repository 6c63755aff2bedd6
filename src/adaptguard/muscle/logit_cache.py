"""Caches of the old (v1) model, so that `MUSCLETrainer` can train without it in memory: its top-k log-probabilities
(version 1, below), or — exact, and the one the default loss reads — its teacher vectors (version 2,
`build_vector_cache`: per scored token m = s·W_sᵀ softmax(z_old/T) with the student's output layer W_s, H(q), s·b·q, the
argmax and the label's log-probability; `shard-*.safetensors` hold `m` (n, H) in float32 by default (bfloat16 on
request: docs/muscle.md says what it costs), `entropy`, `bias_dot`, `label_logp` (n,) float32, `top1` (n,) int32
and `offsets`; `cache.json` records the temperature, the output layer's fingerprint, the hidden size and the dtype,
and a cache built for another output layer or temperature is refused in one line).

The top-k cache:

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

CACHE_VERSION = 1  # the top-k cache; an exact cache of teacher vectors is version 2 ("kind": "vectors")
VECTORS_VERSION = 2


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
        self.kind = self.meta.get("kind", "topk")
        if (self.kind, self.meta.get("version")) not in (("topk", CACHE_VERSION), ("vectors", VECTORS_VERSION)):
            raise ValueError(f"{meta_file}: cache version {self.meta.get('version')} ({self.kind}), expected "
                             f"{CACHE_VERSION} (topk) or {VECTORS_VERSION} (vectors)")
        self.k, self.vocab_size = int(self.meta.get("k", 0)), int(self.meta["vocab_size"])
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

    def check_vectors(self, head, temperature: float) -> None:
        """Refuse, in one line, an exact cache built for another output layer or temperature: its m = Wᵀq vectors
        hold W and q_T."""
        if self.kind != "vectors":
            raise ValueError(f"{self.path}: a top-k cache, not teacher vectors")
        if head_fingerprint(head) != self.meta["head"]:
            raise ValueError(f"{self.path}: built for another output layer (fingerprint {self.meta['head']} ≠ "
                             f"{head_fingerprint(head)}): rebuild it with the student's model (adaptguard cache-logits "
                             "--kind vectors --student-model ...)")
        if float(temperature) != float(self.meta["temperature"]):
            raise ValueError(f"{self.path}: built at temperature {self.meta['temperature']}, the training uses "
                             f"{temperature}: rebuild it at that temperature")

    def vectors_batch(self, rows: list[int], labels: torch.Tensor):
        """The cached teacher's `exact.TeacherVectors` at the batch's scored positions, in row-major order (the
        order `exact_token_loss` reads)."""
        from .exact import TeacherVectors

        valid = shifted_labels(labels) != -100
        parts = []
        for b, row in enumerate(rows):
            shard = bisect.bisect_right(self.shard_starts, row) - 1
            handle, offsets = self._shard(shard)
            local = row - self.shard_starts[shard]
            a, z = int(offsets[local]), int(offsets[local + 1])
            if z - a != int(valid[b].sum()):
                raise ValueError(f"{self.path}: row {row} has {z - a} cached positions, the batch {int(valid[b].sum())}"
                                 "; was the cache built with another max_length?")
            parts.append([handle.get_slice(k)[a:z] for k in TeacherVectors._fields])
        device = labels.device
        return TeacherVectors(*(torch.cat(p).to(device, torch.long if name == "top1" else torch.float32)
                                for name, p in zip(TeacherVectors._fields, zip(*parts))))

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


def head_fingerprint(head) -> str:
    """Identity of an output layer (`tiled.LMHead`): its weight, bias and scale."""
    h = hashlib.sha256()
    for t in (head.weight, head.bias):
        if t is not None:
            h.update(t.detach().float().cpu().contiguous().numpy().tobytes())
    h.update(repr((head.scale, head.softcap)).encode())
    return h.hexdigest()[:16]


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

    def entries(batch, device):
        logits = model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device)).logits
        top, idx, rest, counts = topk_entries(logits, batch["labels"].to(device), k)
        return {"logp": top, "idx": idx, "rest": rest}, counts

    meta = {"version": CACHE_VERSION, "k": k, "vocab_size": vocab_size, "model": model_name}
    return _build_cache(model, tokenizer, dataset, data_collator, out_dir, entries, meta, batch_size, rows_per_shard,
                        "caching the old model's top-k")


@torch.no_grad()
def build_vector_cache(model, tokenizer, dataset, data_collator, out_dir: str | Path, student_head, *,
                       temperature: float, dtype: torch.dtype = torch.float32, batch_size: int = 8,
                       rows_per_shard: int = 10_000, model_name: str = "") -> Path:
    """Run the old model once over a prepared dataset and write an exact cache of its teacher vectors
    (`exact.teacher_vectors`): per scored token m = s·W_sᵀ softmax(z_old / T) in `dtype` (H numbers), H(q), s·b·q,
    its argmax and its label log-probability — with `student_head` the output layer of the model to be trained (the
    cache is refused for any other, or another temperature)."""
    from .exact import check_reducible, teacher_vectors
    from .heads import last_hidden_state, output_head

    reason = check_reducible(student_head._replace(weight=student_head.weight.detach()))  # whether it trains: later
    if reason:
        raise ValueError(f"an exact cache needs a plain, frozen output layer: {reason}")
    old_head = output_head(model)

    def entries(batch, device):
        inputs = {"input_ids": batch["input_ids"].to(device), "attention_mask": batch["attention_mask"].to(device)}
        shifted = shifted_labels(batch["labels"].to(device))
        valid = shifted != -100
        hidden = last_hidden_state(model, inputs)[valid]
        v = teacher_vectors(hidden, old_head, student_head, shifted[valid], temperature)
        return {"m": v.m.to(dtype), "entropy": v.entropy.float(), "bias_dot": v.bias_dot.float(),
                "top1": v.top1.to(torch.int32), "label_logp": v.label_logp.float()}, valid.sum(-1)

    meta = {"version": VECTORS_VERSION, "kind": "vectors", "vocab_size": student_head.weight.shape[0],
            "hidden_size": student_head.weight.shape[1], "temperature": float(temperature),
            "head": head_fingerprint(student_head), "dtype": str(dtype).removeprefix("torch."), "model": model_name}
    return _build_cache(model, tokenizer, dataset, data_collator, out_dir, entries, meta, batch_size, rows_per_shard,
                        "caching the old model's teacher vectors")


def _build_cache(model, tokenizer, dataset, data_collator, out_dir, entries, meta: dict, batch_size: int,
                 rows_per_shard: int, what: str) -> Path:
    """The cache directory: `entries(batch, device) -> ({name: (n, ...) tensor}, counts (B,))` per batch, written in
    shards with their row offsets, `cache.json` last; all in a temporary directory renamed when complete."""
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
        buf: dict[str, list] = {"counts": []}

        def flush():
            if not buf["counts"]:
                return
            counts = torch.cat(buf["counts"])
            name = f"shard-{len(shards):05d}.safetensors"
            tensors = {k: torch.cat(v).contiguous() for k, v in buf.items() if k != "counts"}
            save_file({**tensors, "offsets": torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])},
                      str(tmp / name))
            shards.append(name)
            shard_rows.append(len(counts))
            for v in buf.values():
                v.clear()

        data = dataset.select_columns(["input_ids", "labels"])
        rows_in_shard = 0
        # transformers' tqdm: on by default, off with transformers.utils.logging.disable_progress_bar()
        for start in hf_tqdm(range(0, len(data), batch_size), desc=what, unit="batch"):
            chunk = data[start:start + batch_size]
            examples = [dict(zip(chunk, values)) for values in zip(*chunk.values())]
            fingerprints += [row_fingerprint(e["input_ids"], e["labels"]) for e in examples]
            values, counts = entries(data_collator(examples), device)
            for key, value in values.items():
                buf.setdefault(key, []).append(value.cpu())
            buf["counts"].append(counts.cpu())
            rows_in_shard += len(examples)
            if rows_in_shard >= rows_per_shard:
                flush()
                rows_in_shard = 0
        flush()
        meta = {**meta, "tokenizer": tokenizer_fingerprint(tokenizer), "rows": len(fingerprints),
                "shard_rows": shard_rows, "row_fingerprints": fingerprints, "shards": shards}
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
                              dataset_kwargs: dict | None = None, student_head=None, temperature: float | None = None,
                              dtype: torch.dtype = torch.float32, sft_kwargs: dict | None = None) -> Path:
    """Tokenize `train_dataset` exactly as `MUSCLETrainer`/`SFTTrainer` will (with `tokenizer`, the new
    model's), run the old model over it and write the cache to `out_dir`: its top-k log-probabilities, or, given
    `student_head` (the output layer of the model to be trained, `trainer.output_head`) and `temperature`, the
    exact cache of teacher vectors (`build_vector_cache`). `sft_kwargs`: the training's other `SFTConfig` fields that
    shape its rows (e.g. `completion_only_loss`), so that the cache's rows are the trainer's."""
    from trl import SFTConfig, SFTTrainer

    vocab = old_model.get_output_embeddings().weight.shape[0]
    if len(tokenizer) > vocab:  # ids past the model's logits: not this vocabulary (a padded model has more logits)
        raise ValueError(f"tokenizer: {len(tokenizer)} tokens, but the old model has {vocab} output logits; MUSCLE "
                         "needs the old and new models to share one vocabulary (is this the new model's tokenizer?)")
    if student_head is not None and (temperature is None or not temperature > 0):
        raise ValueError(f"an exact cache is built at the training's temperature: give temperature > 0, got "
                         f"{temperature}")
    if student_head is not None and student_head.weight.shape[0] != vocab:
        raise ValueError(f"the student's output layer has {student_head.weight.shape[0]} logits, the old model "
                         f"{vocab}: MUSCLE needs a shared vocabulary")
    with tempfile.TemporaryDirectory() as tmp:
        args = SFTConfig(output_dir=tmp, max_length=max_length, packing=False, bf16=False,
                         **no_activation_checkpointing(), report_to="none", use_cpu=not torch.cuda.is_available(),
                         dataset_kwargs=dataset_kwargs, **{k: v for k, v in (sft_kwargs or {}).items()
                                                           if k not in ("output_dir", "max_length", "packing")})
        preparer = SFTTrainer(model=old_model, args=args, train_dataset=train_dataset, processing_class=tokenizer)
        if student_head is not None:
            return build_vector_cache(old_model, tokenizer, preparer.train_dataset, preparer.data_collator, out_dir,
                                      student_head, temperature=temperature, dtype=dtype, batch_size=batch_size,
                                      model_name=model_name)
        return build_logit_cache(old_model, tokenizer, preparer.train_dataset, preparer.data_collator, out_dir,
                                 k=k, batch_size=batch_size, model_name=model_name)
