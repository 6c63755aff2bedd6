"""adaptguard's plugin system (pluggy): hook specifications, the manager that loads every plugin of the
entry-point group `adaptguard`, and the built-ins, which register through the same hooks. Trainers and the
CLI resolve the names users write (`weighting="talr"`, `mask="student_wrong"`) to functions here."""

from .hookspecs import hookimpl
from .manager import (
    embedders,
    get_embedder,
    get_muscle_mask,
    get_plugin_manager,
    get_similarity,
    get_token_weighting,
    get_update_recipe,
    lm_eval_task_dirs,
    muscle_masks,
    similarities,
    token_weightings,
    update_recipes,
)

__all__ = ["hookimpl", "embedders", "get_embedder", "get_muscle_mask", "get_plugin_manager", "get_similarity",
           "get_token_weighting", "get_update_recipe", "lm_eval_task_dirs", "muscle_masks", "similarities",
           "token_weightings", "update_recipes"]
