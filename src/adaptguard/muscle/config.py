"""`MUSCLEConfig`: the settings of `MUSCLETrainer` (paper 002 §4.1), an `SFTConfig` with the teachers, the mask
and the distillation temperature."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

from trl import SFTConfig

from ..trl_adapter import default_bf16
from ..utils.checks import check_finite


@dataclass
class MUSCLEConfig(SFTConfig):
    r"""Configuration for [`MUSCLETrainer`]: MUSCLE (paper 002 §4.1), a compatibility LoRA adapter on the new
    base model, initialised from its task adapter and distilled from the old and new task models:

        L = (1/n) Σ_i m_i KL(σ(z_old,i/T) ‖ σ(z_c,i/T)) + (1 − m_i) KL(σ(z_new,i/T) ‖ σ(z_c,i/T)) [+ λ_CE CE]
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
    mask: str = field(
        default="student_wrong",
        metadata={"help": "Masking strategy, by plugin name: student_wrong (eq. 1, default), old_likelier_token "
                  "(LL_L), old_likelier_sequence (LL_S), old_correct, old_only, new_only, or a plugin's."},
    )
    ce_weight: float = field(
        default=0.0,
        metadata={"help": "Weight λ_CE of the auxiliary cross-entropy on the labels (paper: for large gaps)."},
    )
    loss_implementation: str = field(
        default="tiled",
        metadata={"help": "tiled (default): the loss from the three models' last hidden states and LM heads on "
                  "(token x vocabulary) tiles, never building (batch, length, vocabulary) logits; logits: the "
                  "models' full logits, then a chunked KL (more memory; for debugging and comparison)."},
    )
    kl_chunk_size: int = field(
        default=1024,
        metadata={"help": "Scored tokens per chunk (tile height) of the loss computation."},
    )
    vocab_chunk_size: int = field(
        default=8192,
        metadata={"help": "Vocabulary entries per tile of the tiled loss: the extra memory is a few float32 tensors "
                  "of kl_chunk_size x vocab_chunk_size."},
    )

    def __post_init__(self):
        default_bf16(self)  # on a machine without bf16, TRL's default would refuse to start
        super().__post_init__()
        check_finite(self, ("learning_rate", "temperature", "ce_weight"))
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if self.ce_weight < 0:
            raise ValueError(f"ce_weight must be ≥ 0, got {self.ce_weight}")
        if self.kl_chunk_size < 1 or self.vocab_chunk_size < 1:
            raise ValueError(f"kl_chunk_size and vocab_chunk_size must be ≥ 1, got {self.kl_chunk_size}, "
                             f"{self.vocab_chunk_size}")
        if self.loss_implementation not in ("tiled", "logits"):
            raise ValueError(f"loss_implementation must be 'tiled' or 'logits', got {self.loss_implementation!r}")
        if self.old_logits_cache is not None and (self.packing or self.padding_free):
            raise ValueError("old_logits_cache identifies rows by their tokens: it cannot be used with packing or "
                             "padding_free")
        if self.old_adapter is not None and self.old_model is None:
            raise ValueError("old_adapter needs old_model (the old base it applies to)")


@dataclass
class CompatConfig(MUSCLEConfig):
    """Deprecated alias of `MUSCLEConfig` (kept for one release)."""

    def __post_init__(self):
        warnings.warn("CompatConfig is deprecated; use MUSCLEConfig", FutureWarning, stacklevel=3)
        super().__post_init__()
