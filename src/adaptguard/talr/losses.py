"""TALR and its baselines (Lin et al.): token and sequence weights, the weighted loss, the KL and L2
regularisers, Wise-FT. Small pure functions, tensors in, tensors out; torch only.

Shapes: B = batch size, T = number of scored (shifted) positions. `token_nll` is the per-token negative
log-likelihood of the label token and `mask` marks supervised (completion) tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch

from ..utils.labels import shifted_token_nll

TAU_MIN = 1e-4  # keeps exp(-nll/τ) finite when a batch is already fitted (median NLL → 0)


def check_weight_floor(weight_floor: float) -> None:
    if not 0.0 < weight_floor <= 1.0:
        raise ValueError(f"weight_floor (talr_weight_floor) must be in (0, 1], got {weight_floor}")


def sequence_mean_nll(token_nll: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean supervised NLL of each sequence.

    Args:
        token_nll: (B, T) per-token NLL.
        mask: (B, T) bool, supervised tokens.
    Returns:
        `(mean_nll, has_tokens)`, both (B,): the mean (0 where a row has no supervised token) and
        whether the row has at least one supervised token.
    """
    mask = mask.bool()
    counts = mask.sum(-1)
    sums = torch.where(mask, token_nll, torch.zeros_like(token_nll)).sum(-1)
    return sums / counts.clamp(min=1), counts > 0


def median(values: torch.Tensor) -> torch.Tensor:
    """Statistical median of a 1-D tensor: the mean of the two middle values for an even count
    (`torch.median` returns the lower one)."""
    if values.numel() == 0:
        raise ValueError("median of an empty tensor")
    ordered = values.sort().values
    n = ordered.numel()
    return (ordered[(n - 1) // 2] + ordered[n // 2]) / 2


def talr_tau(token_nll: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Dynamic TALR temperature (Lin et al. App. D.2): the median over the sequences that have at least
    one supervised token of each sequence's mean supervised NLL, kept ≥ `TAU_MIN`.

    Returns a 0-d tensor; NaN when no sequence has a supervised token.
    """
    seq_nll, has_tokens = sequence_mean_nll(token_nll.detach().float(), mask)
    if not bool(has_tokens.any()):
        return torch.tensor(float("nan"), device=token_nll.device)
    return median(seq_nll[has_tokens]).clamp(min=TAU_MIN)


def talr_token_weights(
    token_nll: torch.Tensor, mask: torch.Tensor, tau: float | None = None, weight_floor: float = 0.01
) -> tuple[torch.Tensor, torch.Tensor]:
    """TALR token weights (Lin et al. §4.1, Algorithm 1): `w_t = max(sg(exp(-ℓ_t / τ)), w_min)`.

    Args:
        token_nll: (B, T) per-token NLL `ℓ_t = -log p_t`.
        mask: (B, T) bool, supervised tokens.
        tau: temperature; `None` = dynamic (see `talr_tau`); a float is used as given (must be > 0).
        weight_floor: `w_min`, in (0, 1].
    Returns:
        `(weights, tau)`: weights (B, T) float32 without gradient, 0 on masked-out tokens; tau a 0-d
        tensor (NaN when the batch has no supervised token, in which case every weight is 0).
    """
    check_weight_floor(weight_floor)
    mask = mask.bool()
    nll = token_nll.detach().float()
    if tau is None:
        tau_t = talr_tau(nll, mask)
    else:
        if not tau > 0:
            raise ValueError(f"tau (talr_tau) must be > 0 or None for the dynamic median, got {tau}")
        tau_t = torch.tensor(float(tau), device=nll.device)
    if bool(torch.isnan(tau_t)):
        return torch.zeros_like(nll), tau_t
    weights = torch.exp(-nll / tau_t).clamp(min=weight_floor)
    return torch.where(mask, weights, torch.zeros_like(weights)), tau_t


def dft_token_weights(token_nll: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """DFT weights (arXiv 2508.05629, TRL's `loss_type="dft"`): `w_t = sg(p_t)`, 0 off the mask. (B, T)."""
    weights = torch.exp(-token_nll.detach().float())
    return torch.where(mask.bool(), weights, torch.zeros_like(weights))


def weighted_nll(token_nll: torch.Tensor, weights: torch.Tensor, num_items: int | torch.Tensor) -> torch.Tensor:
    """`Σ_t w_t ℓ_t / N`. N is the supervised-token count; under gradient accumulation or DDP pass the
    global count (`num_items_in_batch`) so the loss equals the one of a single big batch.

    Args:
        token_nll: (B, T), carries the gradient.
        weights: (B, T), no gradient; 0 off the mask.
    Returns:
        0-d loss; 0 (not NaN) when N is 0.
    """
    total = (weights.to(token_nll.dtype) * token_nll).sum()
    return total / torch.as_tensor(num_items, device=total.device).clamp(min=1)


def k3_kl(policy_logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(π_θ ‖ π_ref) on the label token (Schulman; DeepSeek-R1):
    `r − log r − 1` with `r = π_ref / π_θ`. Always ≥ 0, unbiased under samples from π_θ.

    Args:
        policy_logp: (B, T) log π_θ(y_t), carries the gradient.
        ref_logp: (B, T) log π_ref(y_t), no gradient.
        mask: (B, T) bool.
    Returns:
        (B, T) per-token KL, 0 off the mask.
    """
    log_ratio = ref_logp.detach() - policy_logp
    kl = torch.exp(log_ratio) - log_ratio - 1
    return torch.where(mask.bool(), kl, torch.zeros_like(kl))


def l2_to_init(params: Iterable[torch.Tensor], init_params: Iterable[torch.Tensor]) -> torch.Tensor:
    """`Σ (θ − θ₀)²` over matching parameter tensors (0-d)."""
    terms = [((p - p0.to(p.device, p.dtype)) ** 2).sum() for p, p0 in zip(params, init_params, strict=True)]
    if not terms:
        raise ValueError("l2_to_init needs at least one parameter")
    return torch.stack(terms).sum()


def flow_sequence_weights(seq_nll: torch.Tensor, tau: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """FLOW static sequence weights (Sanyal et al., 2025): `w = exp(−ℓ̄_seq / τ)`, τ = median of ℓ̄_seq
    over the training set unless given.

    Args:
        seq_nll: (N,) mean NLL of each training sequence under the initial model.
    Returns:
        `(weights (N,), tau 0-d)`.
    """
    seq_nll = seq_nll.detach().float()
    if tau is None:
        tau_t = median(seq_nll).clamp(min=TAU_MIN)
    else:
        if not tau > 0:
            raise ValueError(f"flow_tau must be > 0 or None, got {tau}")
        tau_t = torch.tensor(float(tau))
    return torch.exp(-seq_nll / tau_t), tau_t


def wise_ft_interpolate(
    init: Mapping[str, torch.Tensor], finetuned: Mapping[str, torch.Tensor], alpha: float
) -> dict[str, torch.Tensor]:
    """Wise-FT (Wortsman et al., 2022): `θ = (1 − α) θ₀ + α θ_ft` for every key of `init`."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"wise_ft_alpha must be in [0, 1], got {alpha}")
    missing = set(init) - set(finetuned)
    if missing:
        raise ValueError(f"Wise-FT: fine-tuned weights lack {sorted(missing)[:3]}...")
    return {k: (1 - alpha) * init[k].to(finetuned[k].dtype) + alpha * finetuned[k] for k in init}


def talr_loss_func(tau: float | None = None, weight_floor: float = 0.01) -> Callable:
    """TALR as a `compute_loss_func` for a plain `transformers.Trainer` / `SFTTrainer`
    (`SFTTrainer(compute_loss_func=talr_loss_func())`). `TALRTrainer` is cheaper: it reuses the fused
    per-token log-probs instead of the full logits."""
    check_weight_floor(weight_floor)

    def compute_loss(outputs, labels, num_items_in_batch=None) -> torch.Tensor:
        nll, mask = shifted_token_nll(outputs.logits, labels)
        weights, _ = talr_token_weights(nll, mask, tau=tau, weight_floor=weight_floor)
        n = mask.sum() if num_items_in_batch is None else num_items_in_batch
        return weighted_nll(nll, weights, n)

    return compute_loss
