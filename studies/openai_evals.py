"""Real multiple-choice QA sets offline, from the PyPI wheel of OpenAI's `evals` registry.

The wheel `evals==3.0.1.post1` (46 MB, MIT code; each data set keeps its own licence) ships chat-format JSONL
samples (`{"input": [messages], "ideal": answer}`). It is fetched once with `pip download --no-deps` (installing it
would pull its many dependencies), each file is read with `zipfile` and checked against the wheel's RECORD hash,
and the parsed items are cached in `$ADAPTGUARD_CACHE/openai_evals/<name>.jsonl`. Nothing is vendored.

Sets (source, licence):
- `medmcqa`: 300 questions of MedMCQA (Pal et al., 2022, CHIL; MIT), four options `a) …`–`d) …`.
- `logiqa`: 1,354 passages of LogiQA (Liu et al., 2020, IJCAI; CC BY-NC-SA 4.0), four options `A. …`–`D. …`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from adaptguard.models.wheels import downloaded_wheel, read_member
from adaptguard.utils.files import atomic_write_text

WHEEL_NAME, WHEEL_VERSION = "evals", "3.0.1.post1"
MEMBERS = {"medmcqa": "evals/registry/data/medmcqa/samples.jsonl",
           "logiqa": "evals/registry/data/logiqa/logiqa.jsonl"}
# an option line: "a) text" (medmcqa) or "A. text" (logiqa)
_OPTION = re.compile(r"^\s*([a-dA-D])[).]\s*\S")


def parse_sample(sample: dict, where: str) -> dict:
    """One chat-format sample → {"input", "choices", "label"}: the system and user messages joined as plain text
    ending in "Answer:", the option texts (letter kept, "c) Atrophy"), and the index of the `ideal` option."""
    messages = sample.get("input")
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "content" in m for m in messages):
        raise ValueError(f"{where}: field 'input' must be a list of chat messages")
    text = "\n\n".join(m["content"].strip() for m in messages)
    text = re.sub(r"\s*Answer:\s*$", "", text)
    options = [line.strip() for line in text.splitlines() if _OPTION.match(line)]
    letters = [line[0].lower() for line in options]
    if letters != list("abcd"[:len(letters)]) or len(letters) < 2:
        raise ValueError(f"{where}: expected options a)…d) or A.…D. in the prompt, found {letters}")
    ideal = str(sample.get("ideal", "")).strip()
    letter = ideal[:1].lower()
    if letter not in letters:
        raise ValueError(f"{where}: field 'ideal' {ideal!r} names no option")
    return {"input": text + "\nAnswer:", "choices": options,
            "label": letters.index(letter)}


def load_set(name: str, wheel: Path | None = None) -> list[dict]:
    """The items of set `name` (see the module docstring) as {"input", "choices", "label"} rows (the
    layout of `bigbench.load_tasks`, so `bigbench.write_lm_eval_tasks` writes them as lm-eval tasks), in file order,
    read from the cache or, once, from the wheel (downloaded to `$ADAPTGUARD_CACHE/downloads/` unless given)."""
    from adaptguard.models.embedded import cache_root

    if name not in MEMBERS:
        raise ValueError(f"unknown evals set {name!r}; known: {sorted(MEMBERS)}")
    cache = cache_root() / "openai_evals" / f"{name}.jsonl"
    if not cache.exists():
        wheel = wheel or downloaded_wheel(WHEEL_NAME, WHEEL_VERSION, cache_root() / "downloads", "46 MB")
        lines = read_member(wheel, MEMBERS[name]).decode().splitlines()
        rows = [parse_sample(json.loads(line), f"{MEMBERS[name]} line {i + 1}")
                for i, line in enumerate(lines) if line.strip()]
        cache.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(cache, "".join(json.dumps(r) + "\n" for r in rows))
    return [json.loads(line) for line in cache.read_text().splitlines()]


def as_prompt_completion(rows: list[dict]) -> list[dict]:
    """Training rows for SFT/TALR: the prompt and, as completion, the right option's text after a space (the same
    continuation lm-eval scores for that choice, so training and evaluation see one format)."""
    return [{"prompt": r["input"], "completion": " " + r["choices"][r["label"]]} for r in rows]


def as_letter_choices(rows: list[dict]) -> list[dict]:
    """The rows with the option letters as choices ("a" … "d" as the prompt writes them): lm-eval then scores one
    token after the prompt per choice, a single forward per item (its logits cache), and the decision is the
    first token of the trained completion."""
    return [{**r, "choices": [c[0] for c in r["choices"]]} for r in rows]
