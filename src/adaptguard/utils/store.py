"""A resumable store of finished steps: each step a folder written atomically with the settings that made it."""

from __future__ import annotations

import json
from pathlib import Path

from .files import finished_dir


class Store:
    """Finished steps under `root`, each a folder with `done.json` = the settings that made it: reused when they
    match, redone (replacing the folder only once the new one is complete) when they do not."""

    def __init__(self, root: Path):
        self.root = root

    def get(self, name: str, settings: dict, make) -> Path:
        target = self.root / name
        marker = target / "done.json"
        if marker.exists() and json.loads(marker.read_text()) == json.loads(json.dumps(settings, default=str)):
            return target
        with finished_dir(target) as tmp:
            make(tmp)
            (tmp / "done.json").write_text(json.dumps(settings, default=str))
        return target
