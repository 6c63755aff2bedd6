"""Named recipes for retraining after a model update: each fixes some `MUSCLEConfig` fields by default (the user's
explicit values win). Built-ins are registered through the `adaptguard_update_recipes` hook
(`adaptguard.muscle.plugin`), so a third party adds one by name, typically with a mask plugin of its own.

Every recipe is one case of the loss `MUSCLETrainer` computes per scored token t of item i:

    L = λ · w_i · [m_t · KL(p_old,T ‖ p_θ,T) + (1 − m_t) · KL(p_new,T ‖ p_θ,T)] + λ_CE · CE(y_t)

with m the mask (1 = follow v1), w_i = α + β·1[v1 right on i] and λ = `distill_weight`, summed over tokens and
divided by their number.
"""

from __future__ import annotations

from dataclasses import dataclass, field

RECIPE_FIELDS = ("mask", "ce_weight", "distill_weight", "focal_alpha", "focal_beta")
FIELD_DEFAULTS = {"mask": "student_wrong", "ce_weight": 0.0, "distill_weight": 1.0, "focal_alpha": 1.0,
                  "focal_beta": 0.0}  # what a field is when neither the user nor a recipe sets it


@dataclass(frozen=True)
class UpdateRecipe:
    """`settings`: values of `RECIPE_FIELDS`; `distills`: False for a recipe that never reads v1 (the control)."""

    settings: dict = field(default_factory=dict)
    formula: str = ""
    source: str = ""
    distills: bool = True

    def __post_init__(self):
        unknown = set(self.settings) - set(RECIPE_FIELDS)
        if unknown:
            raise ValueError(f"a recipe sets only {', '.join(RECIPE_FIELDS)}; got {sorted(unknown)}")


RECIPES = {
    "control": UpdateRecipe(
        {"distill_weight": 0.0, "ce_weight": 1.0}, "L = CE(y)",
        "the equal-budget control: the same adapter training on the task's labels, without v1", distills=False),
    "muscle": UpdateRecipe(
        {"mask": "student_wrong"}, "L = Σ m·KL_old + (1 − m)·KL_new + λ_CE·CE, m = 1[student's argmax ≠ label]",
        "MUSCLE, Echterhoff et al. 2024 (arXiv 2407.09435) eq. 1–2 (λ_CE 0 unless set; `muscle_ce` sets it to 1)"),
    "muscle_ce": UpdateRecipe(
        {"mask": "student_wrong", "ce_weight": 1.0}, "L = Σ m·KL_old + (1 − m)·KL_new + CE, m = 1[student's argmax ≠ "
        "label]", "MUSCLE eq. 1 with the auxiliary cross-entropy at weight 1 (Echterhoff et al. 2024, §5)"),
    "ll_l": UpdateRecipe(
        {"mask": "old_likelier_token"}, "L = Σ m·KL_old + (1 − m)·KL_new + λ_CE·CE, m = 1[p_old(y) > p_new(y)]",
        "MUSCLE, Echterhoff et al. 2024 (arXiv 2407.09435) §6.5, the LL_L mask"),
    "ll_l_ce": UpdateRecipe(
        {"mask": "old_likelier_token", "ce_weight": 1.0}, "L = Σ m·KL_old + (1 − m)·KL_new + CE, m = 1[p_old(y) > "
        "p_new(y)]", "the LL_L mask (§6.5) with the auxiliary cross-entropy at weight 1"),
    "focal": UpdateRecipe(
        {"mask": "old_only", "ce_weight": 1.0, "focal_alpha": 1.0, "focal_beta": 5.0},
        "L = CE(y) + λ·(α + β·1[v1 right on i])·KL(p_old,T ‖ p_θ,T)",
        "focal distillation (positive-congruent training), Yan et al., CVPR 2021; α = 1, β = 5 as the authors' "
        "example"),
    "kd": UpdateRecipe(
        {"mask": "old_only", "ce_weight": 1.0, "focal_alpha": 1.0, "focal_beta": 0.0},
        "L = CE(y) + λ·KL(p_old,T ‖ p_θ,T)", "knowledge distillation from v1 (focal distillation with β = 0)"),
}
