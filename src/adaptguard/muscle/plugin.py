"""MUSCLE's built-in masking strategies, registered through the `adaptguard_muscle_masks` hook (listed in
`adaptguard.plugins.manager.BUILTIN_PLUGINS`)."""

from __future__ import annotations

from ..plugins.hookspecs import hookimpl
from .masks import MASKS


@hookimpl
def adaptguard_muscle_masks() -> dict:
    return dict(MASKS)


@hookimpl
def adaptguard_update_recipes() -> dict:
    from .recipes import RECIPES

    return dict(RECIPES)
