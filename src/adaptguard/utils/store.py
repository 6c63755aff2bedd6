"""A resumable store of finished steps: each step a folder written atomically with the settings that made it."""

from __future__ import annotations

import hashlib
import json
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
