"""adaptguard: adapt and update language models without breaking what already works."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from .hookspecs import hookimpl

__version__ = "0.1.0"

# Trainers import TRL (seconds); the maths and the CLI should not pay for it.
_LAZY = {
    "TALRConfig": ".talr_config",
    "TALRTrainer": ".talr_trainer",
    "WiseFTCallback": ".callbacks",
    "TokenAnalysisCallback": ".callbacks",
    "LMEvalCallback": ".lm_eval_callback",
    "CompatConfig": ".compat_config",
    "CompatTrainer": ".compat_trainer",
}

__all__ = ["hookimpl", "__version__", *_LAZY]

if TYPE_CHECKING:
    from .callbacks import TokenAnalysisCallback, WiseFTCallback
    from .compat_config import CompatConfig
    from .compat_trainer import CompatTrainer
    from .lm_eval_callback import LMEvalCallback
    from .talr_config import TALRConfig
    from .talr_trainer import TALRTrainer


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'adaptguard' has no attribute {name!r}")
