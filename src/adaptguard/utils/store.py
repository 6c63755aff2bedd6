"""A resumable store of finished steps: each step a folder written atomically with the settings that made it."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from .files import finished_dir


def digest(value) -> str:
    """12 hex digits of the SHA-256 of `value` as JSON: the name of a stored step made with these settings."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]


class Store:
    """Finished steps under `root`, each a folder with `done.json` = the settings that made it: reused when they
    match, redone (replacing the folder only once the new one is complete) when they do not."""

    def __init__(self, root: Path):
        self.root = root

    def find(self, name: str, settings: dict) -> Path | None:
        """The step's folder if it is finished with these settings, else None (nothing is made)."""
        marker = self.root / name / "done.json"
        if marker.exists() and json.loads(marker.read_text()) == json.loads(json.dumps(settings, default=str)):
            return marker.parent
        return None

    def get(self, name: str, settings: dict, make) -> Path:
        if (found := self.find(name, settings)) is not None:
            return found
        target = self.root / name
        with finished_dir(target) as tmp:
            make(tmp)
            (tmp / "done.json").write_text(json.dumps(settings, default=str))
        return target


RECORD_NAMES = frozenset({"scores.json", "predictions.json", "seconds.json", "epochs.json", "regime.json",
                          "dev_choices.json", "budget.json", "report.json", "report.md"})


def export_records(out: Path, to: Path, names: frozenset[str] = RECORD_NAMES) -> int:
    """Copy the small records of an experiment's `out` — files named in `names` (per-item scores, choices, timings;
    never weights) and the `done.json` of each step that a copy back into `out` finds finished (a score step, under
    a `scores` folder, or a step made of records only), so that it resumes without redoing them — to `to`, keeping
    relative paths. Unfinished (`.partial`) steps are skipped. Returns the number of files copied."""

    def whole(step: Path) -> bool:
        return all(p.name in names or p.name == "done.json" for p in step.rglob("*") if p.is_file())

    n = 0
    for path in sorted(out.rglob("*")):
        rel = path.relative_to(out)
        record = path.name in names or (path.name == "done.json" and ("scores" in rel.parts or whole(path.parent)))
        if path.is_file() and record and ".partial" not in str(rel):
            target = to / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
            n += 1
    return n
