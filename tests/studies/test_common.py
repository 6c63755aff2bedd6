"""What the studies share (studies/common.py): the records a session commits from the experiments' store of finished
steps (`export_records`)."""

import json

from adaptguard.utils.store import Store
from studies.common import export_records


def test_exported_records_resume_only_the_steps_they_hold_whole(tmp_path):
    out, made = tmp_path / "out", []
    store = Store(out)

    def step(files: dict):
        def make(tmp):
            made.append(tmp)
            for name, text in files.items():
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                (tmp / name).write_text(text)
        return make

    store.get("scores/dev/arm", {"lr": 1}, step({"scores.json": "[true]", "task/data.jsonl": "{}"}))
    store.get("regime/set0", {"set": 0}, step({"regime.json": "{}"}))
    store.get("models/arm", {"lr": 1}, step({"epochs.json": "{}", "model/model.safetensors": "weights"}))
    (out / "scores" / "dev" / ".other.partial").mkdir()
    (out / "scores" / "dev" / ".other.partial" / "scores.json").write_text("[]")
    copy = tmp_path / "copy"
    assert export_records(out, copy) == 5
    assert sorted(str(p.relative_to(copy)) for p in copy.rglob("*") if p.is_file()) == [
        "models/arm/epochs.json", "regime/set0/done.json", "regime/set0/regime.json", "scores/dev/arm/done.json",
        "scores/dev/arm/scores.json"]
    # back in an out dir: the score step and the records-only step are found finished, the model is made again
    again = Store(copy)
    n = len(made)
    again.get("scores/dev/arm", {"lr": 1}, step({"scores.json": "[false]"}))
    again.get("regime/set0", {"set": 0}, step({"regime.json": "{}"}))
    assert len(made) == n and json.loads((copy / "scores/dev/arm/scores.json").read_text()) == [True]
    again.get("models/arm", {"lr": 1}, step({"epochs.json": "{}", "model/model.safetensors": "weights"}))
    assert len(made) == n + 1 and (copy / "models/arm/model/model.safetensors").exists()
