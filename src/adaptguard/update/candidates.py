"""Candidates of `adaptguard update`'s pick: recipes with small grids, expanded to settings, and the pick rule.

A candidate is `{"recipe": NAME, "learning_rate": [...], "epochs": [...], <recipe field>: [...]}` (a scalar is a
one-value list); the recipe fields are `MUSCLEConfig`'s `temperature`, `ce_weight`, `distill_weight`,
`focal_alpha`, `focal_beta`. Every candidate shares the control's learning rates and epochs: the same budget.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

BUDGET_KEYS = ("learning_rate", "epochs")
DISTILL_KEYS = ("temperature", "ce_weight", "distill_weight", "focal_alpha", "focal_beta")


@dataclass(frozen=True)
class Setting:
    """One trained setting: a recipe, a learning rate, the epoch whose adapter is kept, and the recipe's fields."""

    recipe: str
    learning_rate: float
    epochs: int
    fields: tuple = ()  # sorted (name, value) pairs of DISTILL_KEYS (and `mask`, without dev)

    @property
    def run(self) -> tuple:
        """What one training run shares: every setting of it but the epoch (adapters are kept after each epoch)."""
        return self.recipe, self.learning_rate, self.fields

    def label(self, epochs: bool = True) -> str:
        extra = "".join(f", {k} {v:g}" if isinstance(v, (int, float)) else f", {k} {v}" for k, v in self.fields)
        kept = f", {self.epochs} epoch{'s' if self.epochs != 1 else ''}" if epochs else ""
        return f"{self.recipe} (lr {self.learning_rate:g}{kept}{extra})"

    def as_dict(self) -> dict:
        return {"recipe": self.recipe, "learning_rate": self.learning_rate, "epochs": self.epochs, **dict(self.fields)}


def _values(candidate: dict, key: str, where: str) -> list:
    value = candidate[key]
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise ValueError(f"{where}.{key}: a number or a non-empty list of numbers, got {value!r}")
    if key == "epochs" and not all(float(v).is_integer() and v >= 1 for v in values):
        raise ValueError(f"{where}.epochs: whole numbers ≥ 1 (an adapter is kept after each epoch), got {value!r}")
    if key == "learning_rate" and not all(v > 0 for v in values):
        raise ValueError(f"{where}.learning_rate: every value must be > 0, got {value!r}")
    negative = key in DISTILL_KEYS and any(v < 0 for v in values)
    if negative or (key == "temperature" and 0 in values):
        raise ValueError(f"{where}.{key}: values must be ≥ 0 (temperature > 0), got {value!r}")
    return sorted({int(v) if key == "epochs" else float(v) for v in values})


def expand_candidates(candidates: list, where: str = "candidates") -> list[Setting]:
    """Every setting of every candidate, after checking them (unknown recipes, keys or values; no control; a budget
    grid that differs from the control's) — each error names the candidate."""
    from ..plugins import get_update_recipe

    if not isinstance(candidates, list) or not candidates:
        raise ValueError(f"{where}: a non-empty list of {{'recipe': ..., 'learning_rate': [...], 'epochs': [...]}}")
    grids = []
    for i, candidate in enumerate(candidates):
        name = f"{where}[{i}]"
        if not isinstance(candidate, dict) or "recipe" not in candidate:
            raise ValueError(f"{name}: a dict with 'recipe', 'learning_rate' and 'epochs', got {candidate!r}")
        recipe = get_update_recipe(candidate["recipe"])  # an unknown name fails with the known ones
        allowed = {"recipe", *BUDGET_KEYS, *(DISTILL_KEYS if recipe.distills else ())}
        unknown = set(candidate) - allowed
        if unknown:
            raise ValueError(f"{name} ({candidate['recipe']}): unknown keys {sorted(unknown)}; allowed: "
                             f"{sorted(allowed)}")
        missing = [k for k in BUDGET_KEYS if k not in candidate]
        if missing:
            raise ValueError(f"{name} ({candidate['recipe']}): missing {missing}")
        grids.append((candidate["recipe"], {k: _values(candidate, k, name) for k in candidate if k != "recipe"}))
    controls = [g for r, g in grids if r == "control"]
    if not controls:
        raise ValueError(f"{where}: no 'control' candidate; the pick compares every recipe with the cross-entropy "
                         "control trained on the same grid, so the grid must include it")
    budget = {k: controls[0][k] for k in BUDGET_KEYS}
    for i, (recipe, grid) in enumerate(grids):
        for k in BUDGET_KEYS:
            if grid[k] != budget[k]:
                raise ValueError(f"{where}[{i}] ({recipe}): {k} {grid[k]} differs from the control's {budget[k]}; "
                                 "every recipe gets the control's budget")
    settings = []
    for recipe, grid in grids:
        extra = sorted(k for k in grid if k in DISTILL_KEYS)
        for lr, epochs, *values in itertools.product(grid["learning_rate"], grid["epochs"], *(grid[k] for k in extra)):
            settings.append(Setting(recipe, lr, epochs, tuple(zip(extra, values))))
    if len(set(settings)) != len(settings):
        raise ValueError(f"{where}: a setting appears twice (two candidates with the same recipe and values)")
    return settings


def pick_setting(rows: list[dict], max_accuracy_drop: float, recipe: str | None = None) -> dict:
    """The registered rule, on each setting's dev scores (`rows`: `recipe`, `acc`, `nfr` each): the best control
    setting is the control's highest dev accuracy (ties: lower NFR, then the earlier row); the pick is the lowest dev
    NFR among all settings whose dev accuracy is at least the best control's minus `max_accuracy_drop` (ties: higher
    accuracy, then the control, then the earlier row), so a recipe cannot win by giving up v2's gains.

    With `recipe`, the pick is among that recipe's rows only (each arm of a study tuned by the same rule); when none
    of them reaches the floor it is the recipe's highest-accuracy row and `matched` is False.

    Returns `{"chosen": i, "best_control": j, "accuracy_floor": float, "matched": bool}` (row indices)."""
    controls = [i for i, r in enumerate(rows) if r["recipe"] == "control"]
    if not controls:
        raise ValueError("pick_setting: no control row")
    best_control = min(controls, key=lambda i: (-rows[i]["acc"], rows[i]["nfr"], i))
    floor = rows[best_control]["acc"] - max_accuracy_drop
    among = [i for i, r in enumerate(rows) if recipe is None or r["recipe"] == recipe]
    if not among:
        raise ValueError(f"pick_setting: no row of recipe {recipe!r}")
    eligible = [i for i in among if rows[i]["acc"] >= floor - 1e-12]
    if not eligible:
        chosen = min(among, key=lambda i: (-rows[i]["acc"], rows[i]["nfr"], i))
    else:
        chosen = min(eligible, key=lambda i: (rows[i]["nfr"], -rows[i]["acc"], rows[i]["recipe"] != "control", i))
    return {"chosen": chosen, "best_control": best_control, "accuracy_floor": floor, "matched": bool(eligible)}
