"""Greedy answers of a causal LM to prompt rows, in batches (left padding): what exact-match scoring compares."""

from __future__ import annotations

import torch


@torch.no_grad()
def generate_answers(model, tokenizer, rows: list[dict], max_new_tokens: int = 32, batch_size: int = 32
                     ) -> list[str]:
    """Greedy completions of each row's prompt (up to EOS), stripped."""
    side, was_training = tokenizer.padding_side, model.training
    tokenizer.padding_side = "left"
    model.eval()
    out = []
    try:
        for i in range(0, len(rows), batch_size):
            prompts = [r["prompt"] for r in rows[i:i + batch_size]]
            batch = tokenizer(prompts, return_tensors="pt", padding=True).to(model.device)
            gen = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
            out += [t.strip() for t in tokenizer.batch_decode(gen[:, batch["input_ids"].shape[1]:],
                                                               skip_special_tokens=True)]
    finally:
        tokenizer.padding_side = side
        model.train(was_training)
    return out
