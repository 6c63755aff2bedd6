"""pluggy hook specifications: the extension points of adaptguard.

A plugin is a module or object with functions marked `@adaptguard.hookimpl`, advertised through the
entry-point group `adaptguard`::

    [project.entry-points.adaptguard]
    my_plugin = "my_package.my_module"

adaptguard's own built-ins register through the same hooks (`adaptguard.<method>.plugin`, listed in
`adaptguard.plugins.manager.BUILTIN_PLUGINS`), as pytest's do.
"""

from __future__ import annotations

import pluggy

PROJECT = "adaptguard"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def adaptguard_token_weightings() -> dict:
    """Return `{name: weighting}` token-weighting schemes for `TALRTrainer(weighting=name)`.

    A weighting is called as `weighting(token_nll, mask, args)` with `token_nll` (B, T) the detached
    per-token NLL of the label tokens, `mask` (B, T) bool the supervised tokens and `args` the
    `TALRConfig` (plugin options live in `args.weighting_kwargs`). It returns `(weights, stats)`:
    weights (B, T) without gradient and 0 off the mask; stats a dict of 0-d tensors logged as
    `talr/<key>` (e.g. `{"tau": tau}`). The loss is then `Σ w·nll / N`.
    """


@hookspec
def adaptguard_similarities() -> dict:
    """Return `{name: similarity}` for generative compatibility metrics (`D(x) = S(new) − S(old)`).

    A similarity is called as `similarity(predictions, references)` with `predictions` a list of N
    strings and `references` a list of N lists of reference strings; it returns N floats (higher =
    more similar; the best over an item's references).
    """


@hookspec
def adaptguard_lm_eval_task_dirs() -> list:
    """Return directories of lm-eval task YAMLs to include in `adaptguard lm-eval` runs (and to print
    with `adaptguard tasks-dir`)."""


@hookspec
def adaptguard_muscle_masks() -> dict:
    """Return `{name: mask}` MUSCLE masking strategies (Echterhoff et al. §4.1, §6.5) for `MUSCLEConfig(mask=name)`.

    A mask is called as `mask(inputs)` with `inputs` an `adaptguard.muscle.losses.MaskInputs` (per-position
    labels, validity, argmax tokens and label log-probabilities of the student, old and new models,
    all (B, T)) and returns (B, T) booleans or 0/1 floats: 1 = align that token to the old model.
    """


@hookspec
def adaptguard_update_recipes() -> dict:
    """Return `{name: recipe}` retraining recipes for `MUSCLEConfig(recipe=name)` and `adaptguard update`'s
    candidates: each an `adaptguard.muscle.recipes.UpdateRecipe`, the `MUSCLEConfig` fields it sets by default (the
    mask, `ce_weight`, `distill_weight`, `focal_alpha`, `focal_beta`) with its formula and source.
    """


@hookspec
def adaptguard_embedders() -> dict:
    """Return `{name: embedder}` task embedders for task selection (`adaptguard select --embedder name`).

    An embedder is called as `embedder(texts, *, model, batch_size, device)` with `texts` a list of N
    strings and `model` a Hub id or local path, and returns an (N, d) numpy array, one row per text.
    """
