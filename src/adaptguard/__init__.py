"""adaptguard: adapt and update language models without breaking what already works."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# Trainers import TRL (seconds) and the plugin marker pluggy; the maths and the CLI should not pay for them.
_LAZY = {
    "hookimpl": ".plugins.hookspecs",
    "TALRConfig": ".talr.config",
    "TALRTrainer": ".talr.trainer",
    "WiseFTCallback": ".talr.callbacks",
    "TokenAnalysisCallback": ".talr.callbacks",
    "LMEvalCallback": ".compat.harness.callback",
    "MUSCLEConfig": ".muscle.config",
    "MUSCLETrainer": ".muscle.trainer",
    "default_lora_targets": ".utils.lora",
}

__all__ = ["__version__", *_LAZY]

if TYPE_CHECKING:
    from .compat.harness.callback import LMEvalCallback
    from .muscle.config import MUSCLEConfig
    from .muscle.trainer import MUSCLETrainer
    from .plugins.hookspecs import hookimpl
    from .talr.callbacks import TokenAnalysisCallback, WiseFTCallback
    from .talr.config import TALRConfig
    from .talr.trainer import TALRTrainer
    from .utils.lora import default_lora_targets


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'adaptguard' has no attribute {name!r}")
