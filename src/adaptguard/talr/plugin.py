"""TALR's built-in token weightings, registered through the `adaptguard_token_weightings` hook (listed in
`adaptguard.plugins.manager.BUILTIN_PLUGINS`). Each adapts a trainer's config to a weight function of `losses`."""

from __future__ import annotations

import torch

from ..plugins.hookspecs import hookimpl
from .losses import dft_token_weights, talr_token_weights


def talr_weighting(token_nll: torch.Tensor, mask: torch.Tensor, args) -> tuple[torch.Tensor, dict]:
    weights, tau = talr_token_weights(token_nll, mask, tau=args.talr_tau, weight_floor=args.talr_weight_floor)
    return weights, {"tau": tau}


def plain_weighting(token_nll: torch.Tensor, mask: torch.Tensor, args) -> tuple[torch.Tensor, dict]:
    return mask.to(torch.float32), {}


def dft_weighting(token_nll: torch.Tensor, mask: torch.Tensor, args) -> tuple[torch.Tensor, dict]:
    return dft_token_weights(token_nll, mask), {}


@hookimpl
def adaptguard_token_weightings() -> dict:
    return {"talr": talr_weighting, "none": plain_weighting, "dft": dft_weighting}
