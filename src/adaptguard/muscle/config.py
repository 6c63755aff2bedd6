"""`MUSCLEConfig`: the settings of `MUSCLETrainer` (Echterhoff et al. §4.1), an `SFTConfig` with the teachers, the mask
and the distillation temperature."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from trl import SFTConfig

from ..trl_adapter import hardware_defaults
from ..utils.checks import check_finite

LossImplementation = Literal["auto", "exact", "tiled", "logits"]
LseKernel = Literal["auto", "torch", "cut_cross_entropy"]


@dataclass
class MUSCLEConfig(SFTConfig):
    r"""Configuration for [`MUSCLETrainer`]: MUSCLE (Echterhoff et al. §4.1), a compatibility LoRA adapter on the new
    base model, initialised from its task adapter and distilled from the old and new task models:

        L = (1/n) Σ_i m_i KL(σ(z_old,i/T) ‖ σ(z_c,i/T)) + (1 − m_i) KL(σ(z_new,i/T) ‖ σ(z_c,i/T)) [+ λ_CE CE]

    and, through `recipe` (`adaptguard.muscle.recipes`), the literature's other retraining recipes: the
    cross-entropy control, LL_L, focal distillation (a per-item weight α + β·1[v1 right]) and plain KD.
    """

    new_adapter: str | None = field(
        default=None,
        metadata={"help": "Path or Hub id of the new model's (v2) task LoRA adapter. The compatibility adapter is "
                  "initialised from it, and the frozen copy on the same base is the new teacher."},
    )
    old_model: str | None = field(
        default=None,
        metadata={"help": "Path or Hub id of the old (v1) task model (merged), or of its base when `old_adapter` is "
                  "given. Alternatively pass `old_model=` to the trainer, or use `old_logits_cache`."},
    )
    old_adapter: str | None = field(
        default=None,
        metadata={"help": "Path or Hub id of the old model's task adapter, applied to `old_model` (merged)."},
    )
    old_logits_cache: str | None = field(
        default=None,
        metadata={"help": "Directory written by `adaptguard cache-logits`: the old model's top-k log-probabilities "
                  "on the training set, used instead of the old model (which then need not be in memory)."},
    )
    temperature: float = field(default=2.0, metadata={"help": "Distillation temperature T (paper: 2)."})
    recipe: str | None = field(
        default=None,
        metadata={"help": "A named recipe that sets the fields below unless you set them: control (cross-entropy "
                  "alone), muscle (eq. 1), ll_l, focal (focal distillation), kd, or a plugin's "
                  "(adaptguard.muscle.recipes). None: eq. 1 without cross-entropy, as the fields' defaults say."},
    )
    mask: str | None = field(
        default=None,
        metadata={"help": "Masking strategy, by plugin name: student_wrong (eq. 1, the default without a recipe), "
                  "old_likelier_token (LL_L), old_likelier_sequence (LL_S), old_correct, old_only, new_only, or a "
                  "plugin's."},
    )
    ce_weight: float | None = field(
        default=None,
        metadata={"help": "Weight λ_CE of the auxiliary cross-entropy on the labels (paper: for large gaps); 0 "
                  "without a recipe."},
    )
    distill_weight: float | None = field(
        default=None,
        metadata={"help": "Weight λ of the distillation term; 1 without a recipe (the control recipe: 0)."},
    )
    focal_alpha: float | None = field(
        default=None,
        metadata={"help": "Focal distillation's α: every item's distillation weight is α + β·1[v1 right on it]; 1 "
                  "without a recipe."},
    )
    focal_beta: float | None = field(
        default=None,
        metadata={"help": "Focal distillation's β (v1 right = its greedy answer is the item's completion, token for "
                  "token); 0 without a recipe, 5 with recipe='focal'."},
    )
    loss_implementation: LossImplementation = field(
        default="auto",
        metadata={"help": "auto (default): exact where it applies, else tiled, saying why. exact: the forward KL "
                  "through each teacher's m = Wᵀq (KL = LSE(z/T) − h·m/T − H(q) with the output layer frozen; "
                  "adaptguard.muscle.exact): the student's pass costs what cross-entropy does, gradient taken in the "
                  "forward; not for soft-capped logits, a trained output layer or a top-k cache. tiled: the three "
                  "models' last hidden states and LM heads on (token x vocabulary) tiles, never building (batch, "
                  "length, vocabulary) logits; logits: the models' full logits, then a chunked KL (more memory; "
                  "for debugging and comparison).", "choices": list(get_args(LossImplementation))},
    )
    lse_kernel: LseKernel = field(
        default="auto",
        metadata={"help": "The exact loss's student log-sum-exp. auto (default): Apple's cut-cross-entropy kernel on "
                  "a GPU where it is installed (pip install cut-cross-entropy) and the run allows it (no output-layer "
                  "bias, a mask that reads only the teachers), else torch. cut_cross_entropy: that kernel or an error "
                  "saying why not (on a CPU its reference implementation). torch: chunks of tokens with the whole "
                  "vocabulary, everywhere; SFTTrainer's entropy and token-accuracy metrics are logged only on this "
                  "path (the kernel builds no logits to read them from).", "choices": list(get_args(LseKernel))},
    )
    kl_chunk_size: int | None = field(
        default=None,
        metadata={"help": "Scored tokens per chunk (tile height) of the loss computation. None: chosen per step "
                  "(muscle.tiled.tile_sizes: 1024 on CPU; on a GPU up to 4096, from its free memory); the logits "
                  "path uses 1024."},
    )
    vocab_chunk_size: int | None = field(
        default=None,
        metadata={"help": "Vocabulary entries per tile of the tiled loss: the extra memory is about 8 float32 "
                  "tensors of kl_chunk_size x vocab_chunk_size. None: chosen per step (8192 on CPU; on a GPU the "
                  "largest tile within 1/16 of its free memory and a quarter of the logits never built)."},
    )
    compile_loss: bool | None = field(
        default=None,
        metadata={"help": "Fuse each tile of the tiled loss with torch.compile (a few kernels per tile instead of "
                  "~100 small ones; the first step compiles, ~20 s). None: on a CUDA device only; True also helps "
                  "on CPU (measured: the per-tile fold ~6x faster)."},
    )

    def __post_init__(self):
        hardware_defaults(self)  # TRL's GPU defaults: bf16 would refuse to start on a CPU, pin_memory warn
        super().__post_init__()
        self._apply_recipe()
        check_finite(self, ("learning_rate", "temperature", "ce_weight", "distill_weight", "focal_alpha",
                            "focal_beta"))
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        for name in ("ce_weight", "distill_weight", "focal_alpha", "focal_beta"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be ≥ 0, got {getattr(self, name)}")
        if self.focal_beta > 0 and (self.packing or self.padding_free):
            raise ValueError("focal_beta weights each item by whether v1 gets it right: with packing or padding_free "
                             "a row is not one item; switch them off")
        if any(size is not None and size < 1 for size in (self.kl_chunk_size, self.vocab_chunk_size)):
            raise ValueError(f"kl_chunk_size and vocab_chunk_size must be ≥ 1, got {self.kl_chunk_size}, "
                             f"{self.vocab_chunk_size}")
        for name, choices in (("loss_implementation", LossImplementation), ("lse_kernel", LseKernel)):
            if getattr(self, name) not in get_args(choices):
                raise ValueError(f"{name} must be one of {', '.join(map(repr, get_args(choices)))}; got "
                                 f"{getattr(self, name)!r}")
        if self.old_logits_cache is not None and (self.packing or self.padding_free):
            raise ValueError("old_logits_cache identifies rows by their tokens: it cannot be used with packing or "
                             "padding_free")
        if self.old_adapter is not None and self.old_model is None:
            raise ValueError("old_adapter needs old_model (the old base it applies to)")

    def _apply_recipe(self) -> None:
        """Fill the recipe's fields the user left unset (None), then the plain defaults."""
        from ..plugins import get_update_recipe
        from .recipes import FIELD_DEFAULTS

        settings = get_update_recipe(self.recipe).settings if self.recipe is not None else {}
        for name, default in FIELD_DEFAULTS.items():
            if getattr(self, name) is None:
                setattr(self, name, settings.get(name, default))

