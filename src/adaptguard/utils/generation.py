"""Greedy answers of a causal LM to prompt rows, in batches (left padding): what exact-match scoring compares.

Rows are TRL's prompt-completion rows, standard (`"prompt"`/`"completion"` strings) or conversational (lists of
`{"role", "content"}` messages; the prompt is rendered with the tokenizer's chat template, as SFTTrainer renders it).
"""

from __future__ import annotations

import json

import torch


def answer_text(completion) -> str:
    """A completion's text, stripped: the string, or the messages' contents joined (conversational rows)."""
    if isinstance(completion, list):
        return "".join(str(m.get("content", "")) for m in completion).strip()
    return str(completion).strip()


def prompt_key(prompt) -> str:
    """A hashable form of a prompt (string or messages), to compare splits."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True)


def exact_match(predictions: list[str], rows: list[dict]) -> list[bool]:
    """Per row: the greedy answer equals the completion's text."""
    return [p == answer_text(r["completion"]) for p, r in zip(predictions, rows)]


@torch.no_grad()
def generate_answers(model, tokenizer, rows: list[dict], max_new_tokens: int = 32, batch_size: int = 32,
                     stop_strings: list[str] | None = None, with_finished: bool = False):
    """Greedy completions of each row's prompt, stripped: up to EOS, or up to (not including) the first of
    `stop_strings` (e.g. the start of a next item a model may go on to invent). With `with_finished`, returns
    `(texts, finished)`: finished[i] is False when row i ran out of `max_new_tokens` instead."""
    side, pad, was_training = tokenizer.padding_side, tokenizer.pad_token, model.training
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:  # e.g. Llama's tokenizer: pad with EOS, which attention masks out
        tokenizer.pad_token = tokenizer.eos_token
    model.eval()
    out, finished = [], []
    stops = {"stop_strings": list(stop_strings), "tokenizer": tokenizer} if stop_strings else {}
    try:
        for i in range(0, len(rows), batch_size):
            chat = [isinstance(r["prompt"], list) for r in rows[i:i + batch_size]]
            prompts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
                       if c else r["prompt"] for r, c in zip(rows[i:i + batch_size], chat)]
            # a rendered chat template already holds the special tokens (BOS) the tokenizer would add again
            batch = tokenizer(prompts, return_tensors="pt", padding=True,
                              add_special_tokens=not any(chat)).to(model.device)
            gen = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, **stops)
            new = gen[:, batch["input_ids"].shape[1]:]
            for ids, text in zip(new, tokenizer.batch_decode(new, skip_special_tokens=True)):
                cut = [text.index(s) for s in stop_strings or () if s in text]
                out.append(text[:min(cut)].strip() if cut else text.strip())
                # stopped early: a stop string, room left, or EOS among the new tokens (finished rows are padded)
                eos = tokenizer.eos_token_id is not None and bool((ids == tokenizer.eos_token_id).any())
                finished.append(bool(cut) or len(ids) < max_new_tokens or eos)
    finally:
        tokenizer.padding_side, tokenizer.pad_token = side, pad
        model.train(was_training)
    return (out, finished) if with_finished else out
