"""Local copies of the compat_* datasets in their real Hub formats (PIQA, HellaSwag, GSM8K, SAMSum),
written by the tests, never downloaded. Content the embedded tiny model can partly answer."""

import json
from pathlib import Path

from lm_eval_runs import ANTONYMS


def write_compat_data(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)

    def write(name, rows):
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in rows))

    n = len(ANTONYMS)
    write("compat_piqa.jsonl", [{"goal": f"the opposite of {a} is", "sol1": f"{b} .",
                                 "sol2": f"{ANTONYMS[(i + 3) % n][1]} .", "label": 0}
                                for i, (a, b) in enumerate(ANTONYMS)])
    write("compat_hellaswag.jsonl", [
        {"ind": i, "activity_label": "Opposites", "ctx_a": f"the opposite of {a}", "ctx_b": "is",
         "ctx": f"the opposite of {a} is", "endings": [f"{ANTONYMS[(i + k) % n][1]} ." for k in range(4)],
         "source_id": f"fixture~{i}", "split": "val", "split_type": "indomain", "label": "0"}
        for i, (a, b) in enumerate(ANTONYMS)])
    write("compat_gsm8k.jsonl", [{"question": f"count : {i} {i + 1} {i + 2}", "answer": f"add one\n#### {i + 3}"}
                                 for i in range(3, 63, 5)])
    write("compat_gsm8k.train.jsonl", [{"question": f"count : {i} {i + 1} {i + 2}", "answer": f"#### {i + 3}"}
                                       for i in range(70, 80)])
    write("compat_samsum.jsonl", [{"id": f"1{i:04d}", "dialogue": f"Ann: what is the opposite of {a} ?\nBob: {b} .",
                                   "summary": f"the opposite of {a} is {b} ."} for i, (a, b) in enumerate(ANTONYMS[:8])])
    return root
