"""Built-in implementations of adaptguard's hooks, registered like any third-party plugin. Each hook maps
names to the functions of a method's package; nothing here is maths of its own except the adapters from a
trainer's config to a weighting's arguments."""

from __future__ import annotations

from pathlib import Path

from .hookspecs import hookimpl


def talr_weighting(token_nll, mask, args):
    from ..talr.losses import talr_token_weights

    weights, tau = talr_token_weights(token_nll, mask, tau=args.talr_tau, weight_floor=args.talr_weight_floor)
    return weights, {"tau": tau}


def plain_weighting(token_nll, mask, args):
    import torch

    return mask.to(torch.float32), {}


def dft_weighting(token_nll, mask, args):
    from ..talr.losses import dft_token_weights

    return dft_token_weights(token_nll, mask), {}


@hookimpl
def adaptguard_token_weightings() -> dict:
    return {"talr": talr_weighting, "none": plain_weighting, "dft": dft_weighting}


@hookimpl
def adaptguard_similarities() -> dict:
    from ..compat.similarities import SIMILARITIES

    return dict(SIMILARITIES)


@hookimpl
def adaptguard_lm_eval_task_dirs() -> list:
    from .. import lm_eval_tasks

    return [Path(lm_eval_tasks.__file__).parent]


@hookimpl
def adaptguard_muscle_masks() -> dict:
    from ..muscle.masks import MASKS

    return dict(MASKS)


@hookimpl
def adaptguard_embedders() -> dict:
    from ..selection.embedders import mean_pooled, sentence

    return {"mean_pooled": mean_pooled, "sentence": sentence}
