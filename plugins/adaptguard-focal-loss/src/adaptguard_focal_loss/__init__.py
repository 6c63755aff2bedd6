"""Focal-loss token weighting (Lin et al., 2017) as an adaptguard plugin: `w_t = (1 − p_t)^γ`.

The opposite of TALR — it up-weights hard tokens — and a template for third-party weightings.
Use it as `TALRConfig(weighting="focal_loss", weighting_kwargs={"gamma": 2.0})`. (The update recipe `focal` is
another thing: focal distillation, Yan et al. 2021.)
"""

import torch

from adaptguard import hookimpl


def focal_loss_weighting(token_nll: torch.Tensor, mask: torch.Tensor, args) -> tuple[torch.Tensor, dict]:
    gamma = float((args.weighting_kwargs or {}).get("gamma", 2.0))
    if gamma < 0:
        raise ValueError(f"weighting_kwargs['gamma'] must be >= 0, got {gamma}")
    weights = (1 - torch.exp(-token_nll.detach().float())).pow(gamma)
    return torch.where(mask.bool(), weights, torch.zeros_like(weights)), {}


@hookimpl
def adaptguard_token_weightings():
    return {"focal_loss": focal_loss_weighting}
