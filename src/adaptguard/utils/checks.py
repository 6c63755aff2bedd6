"""Validation shared by the configs and the CLI."""

from __future__ import annotations

import math


def check_finite(obj, names: tuple[str, ...] | list[str]) -> None:
    """Refuse NaN and ±inf in the numeric fields `names` of a config (None is left to the field's own check):
    a NaN compares false with everything, so `l2_lambda=nan` would silently act as "off"."""
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value}")
