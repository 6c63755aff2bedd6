"""`adaptguard update`: what a model update breaks on the user's task, and the adapters that get it back.

`config` (`UpdateConfig`, one JSON file), `pipeline` (`run_update`: the task adapters on v1 and v2, the MUSCLE
compatibility adapter and the cross-entropy control, their flips; `run_update_seeds`), `report` (`report.md`,
`seeds.md`), `presets` (`tiny_preset`: the experiment on the embedded bases)."""

from .config import UpdateConfig
from .pipeline import run_update, run_update_seeds
from .presets import paraphrase_split, tiny_preset

__all__ = ["UpdateConfig", "paraphrase_split", "run_update", "run_update_seeds", "tiny_preset"]
