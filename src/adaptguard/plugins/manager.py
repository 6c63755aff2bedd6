"""The plugin manager: built-ins plus everything in the entry-point group `adaptguard`."""

from __future__ import annotations

import functools
from collections.abc import Callable
from importlib import import_module

import pluggy

from ..extras import missing_extra
from . import hookspecs

# adaptguard's own hook implementations, one module per method, registered by name as pytest registers its
# default plugins: the manager sits below the methods (their trainers resolve names through it) and never
# imports them statically.
BUILTIN_PLUGINS = ("adaptguard.talr.plugin", "adaptguard.muscle.plugin", "adaptguard.compat.harness.plugin",
                   "adaptguard.selection.plugin")


@functools.lru_cache(maxsize=1)
def get_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for name in BUILTIN_PLUGINS:
        try:
            module = import_module(name)
        except ModuleNotFoundError as err:
            if missing_extra(err) is None:
                raise
            continue  # its extra is not installed (TALR's weightings need torch): what it names cannot run here
        pm.register(module, name=name)
    pm.load_setuptools_entrypoints(hookspecs.PROJECT)
    return pm


def _collect(results: list[dict], kind: str) -> dict[str, Callable]:
    merged: dict[str, Callable] = {}
    # pluggy calls the last-registered plugin first: reverse so built-ins come first and a
    # duplicate name from a third party is reported rather than silently shadowing.
    for mapping in reversed(results):
        for name, impl in mapping.items():
            if name in merged and merged[name] is not impl:
                raise ValueError(f"Two plugins register the {kind} {name!r}")
            merged[name] = impl
    return merged


def _named(hook: str, kind: str) -> dict[str, Callable]:
    return _collect(getattr(get_plugin_manager().hook, hook)(), kind)


def _lookup(known: dict[str, Callable], name: str, kind: str, plural: str) -> Callable:
    if name not in known:
        raise ValueError(f"Unknown {kind} {name!r}; known {plural}: {', '.join(sorted(known))}")
    return known[name]


def token_weightings() -> dict[str, Callable]:
    """All registered token-weighting schemes, by name."""
    return _named("adaptguard_token_weightings", "token weighting")


def get_token_weighting(name: str) -> Callable:
    return _lookup(token_weightings(), name, "weighting", "weightings")


def similarities() -> dict[str, Callable]:
    """All registered similarity functions for generative flips, by name."""
    return _named("adaptguard_similarities", "similarity")


def get_similarity(name: str) -> Callable:
    return _lookup(similarities(), name, "similarity", "similarities")


def lm_eval_task_dirs() -> list:
    """Every lm-eval task directory contributed through the hook (built-ins first), de-duplicated."""
    from pathlib import Path

    dirs: list[Path] = []
    for result in reversed(get_plugin_manager().hook.adaptguard_lm_eval_task_dirs()):
        for d in result:
            d = Path(d).resolve()
            if not d.is_dir():
                raise ValueError(f"A plugin contributed the lm-eval task directory {d}, which does not exist")
            if d not in dirs:
                dirs.append(d)
    return dirs


def muscle_masks() -> dict[str, Callable]:
    """All registered MUSCLE masking strategies, by name."""
    return _named("adaptguard_muscle_masks", "MUSCLE mask")


def get_muscle_mask(name: str) -> Callable:
    return _lookup(muscle_masks(), name, "MUSCLE mask", "masks")


def update_recipes() -> dict:
    """All registered update recipes (`adaptguard.muscle.recipes.UpdateRecipe`), by name."""
    return _named("adaptguard_update_recipes", "update recipe")


def get_update_recipe(name: str):
    return _lookup(update_recipes(), name, "update recipe", "recipes")


def embedders() -> dict[str, Callable]:
    """All registered task embedders for task selection, by name."""
    return _named("adaptguard_embedders", "embedder")


def get_embedder(name: str) -> Callable:
    return _lookup(embedders(), name, "embedder", "embedders")
