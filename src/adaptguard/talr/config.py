from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trl import SFTConfig

from ..trl_adapter import hardware_defaults
from ..utils.checks import check_finite
from .losses import check_weight_floor


@dataclass
class TALRConfig(SFTConfig):
    r"""Configuration for [`TALRTrainer`]: everything of `SFTConfig` plus TALR and the domain-SFT baselines
    of Lin et al., *SFT Doesn't Always Hurt General Capabilities*.

    TALR (`weighting="talr"`) minimises `(1/N) Σ_t w_t ℓ_t` with `w_t = max(sg(exp(-ℓ_t/τ)), w_min)` and
    τ the median over the batch's sequences of their mean token loss. `weighting="none"` is plain SFT.
    The baselines combine with any weighting: `l2_lambda` (L2-to-init), `kl_beta` (k3 KL to the
    reference), `flow` (static sequence weights), `wise_ft_alpha` (weight interpolation after training).
    """

    _VALID_DICT_FIELDS = SFTConfig._VALID_DICT_FIELDS + ["weighting_kwargs"]

    weighting: str = field(
        default="talr",
        metadata={"help": "Token-weighting scheme, by plugin name: `talr` (default), `none` (plain SFT), `dft`, "
                  "or any scheme registered through the `adaptguard_token_weightings` hook. SFTConfig's "
                  "`loss_type='dft'` selects `dft`."},
    )
    weighting_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata={"help": "Options for a third-party weighting plugin, read from `args.weighting_kwargs`."},
    )
    talr_tau: float | None = field(
        default=None,
        metadata={"help": "TALR temperature τ. None (default) = dynamic: median over the batch's sequences of each "
                  "sequence's mean supervised-token loss, recomputed every step. A float is used as given (> 0)."},
    )
    talr_weight_floor: float = field(
        default=0.01,
        metadata={"help": "Lower bound w_min of TALR token weights, in (0, 1] (paper: 0.01)."},
    )
    l2_lambda: float = field(
        default=0.0,
        metadata={"help": "L2-to-init baseline: adds λ Σ (θ − θ₀)² over the trainable parameters (0 = off)."},
    )
    kl_beta: float = field(
        default=0.0,
        metadata={"help": "KL baseline: adds β · KL_k3(π_θ ‖ π_ref) on supervised tokens, k3 = r − log r − 1 with "
                  "r = π_ref/π_θ of the label token (Lin et al. App. C.4 uses 0.001; 0 = off). The reference is the "
                  "model with its adapters disabled under PEFT, else a frozen copy of the initial model."},
    )
    flow: bool = field(
        default=False,
        metadata={"help": "FLOW baseline: weight each sequence by exp(−ℓ̄_seq/τ), computed once before training "
                  "from the initial model, τ = median ℓ̄_seq over the training set. Saved with checkpoints."},
    )
    flow_tau: float | None = field(
        default=None,
        metadata={"help": "FLOW temperature; None = median of the sequence losses."},
    )
    wise_ft_alpha: float | None = field(
        default=None,
        metadata={"help": "Wise-FT baseline: after training, save θ = (1 − α) θ₀ + α θ_ft to "
                  "`<output_dir>/wise-ft` (None = off; the paper's comparison uses 0.5)."},
    )
    token_analysis: bool = field(
        default=False,
        metadata={"help": "Token-level analysis (Lin et al. §4.3): at each epoch end, the token-probability "
                  "distribution over the training set, the fraction of tokens with p > 0.2 (curriculum signal) "
                  "and heatmap PNGs, written to `<output_dir>/token_analysis/`."},
    )
    token_analysis_examples: list[int] = field(
        default_factory=lambda: [0],
        metadata={"help": "Training-set indices of the examples drawn in the per-epoch token-probability heatmap."},
    )
    token_analysis_max_examples: int = field(
        default=512,
        metadata={"help": "How many training examples (from the start) the epoch-end analysis scores."},
    )

    def __post_init__(self):
        hardware_defaults(self)  # TRL's GPU defaults: bf16 would refuse to start on a CPU, pin_memory warn
        super().__post_init__()
        if self.loss_type == "dft":  # SFTConfig's DFT is the `dft` weighting here: the same loss and gradient
            if self.weighting not in ("talr", "dft"):
                raise ValueError(f"loss_type='dft' selects weighting='dft'; it cannot combine with "
                                 f"weighting={self.weighting!r} (drop one of the two)")
            self.weighting, self.loss_type = "dft", "nll"
        check_finite(self, ("learning_rate", "talr_tau", "talr_weight_floor", "l2_lambda", "kl_beta", "flow_tau",
                            "wise_ft_alpha"))
        check_weight_floor(self.talr_weight_floor)
        if self.talr_tau is not None and not self.talr_tau > 0:
            raise ValueError(f"talr_tau must be > 0, or None for the dynamic median; got {self.talr_tau}")
        if self.flow_tau is not None and not self.flow_tau > 0:
            raise ValueError(f"flow_tau must be > 0, or None for the median; got {self.flow_tau}")
        if self.l2_lambda < 0:
            raise ValueError(f"l2_lambda must be ≥ 0, got {self.l2_lambda}")
        if self.kl_beta < 0:
            raise ValueError(f"kl_beta must be ≥ 0, got {self.kl_beta}")
        if self.wise_ft_alpha is not None and not 0.0 <= self.wise_ft_alpha <= 1.0:
            raise ValueError(f"wise_ft_alpha must be in [0, 1], got {self.wise_ft_alpha}")
        if self.token_analysis_max_examples < 1:
            raise ValueError(f"token_analysis_max_examples must be ≥ 1, got {self.token_analysis_max_examples}")
