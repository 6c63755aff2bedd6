"""adaptguard: adapt and update language models without breaking what already works."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

__version__ = "0.1.0"

# Trainers import TRL (seconds) and the plugin marker pluggy; the maths and the CLI should not pay for them. Each name
# with the extra that installs what it imports (`pip install adaptguard` alone is the gate: adaptguard.extras).
_LAZY = {
    "hookimpl": (".plugins.hookspecs", None),
    "TALRConfig": (".talr.config", "train"),
    "TALRTrainer": (".talr.trainer", "train"),
    "WiseFTCallback": (".talr.callbacks", "train"),
    "TokenAnalysisCallback": (".talr.callbacks", "train"),
    "LMEvalCallback": (".compat.harness.callback", "eval"),
    "MUSCLEConfig": (".muscle.config", "train"),
    "MUSCLETrainer": (".muscle.trainer", "train"),
    "default_lora_targets": (".utils.lora", "train"),
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
        module, extra = _LAZY[name]
        try:
            return getattr(import_module(module, __name__), name)
        except ModuleNotFoundError as err:
            from .extras import missing_extra

            friendly = missing_extra(err, f"adaptguard.{name}", extra)
            if friendly is None:
                raise
            raise friendly from None  # one line: the pip command
    raise AttributeError(f"module 'adaptguard' has no attribute {name!r}")
