"""The three ways `MUSCLETrainer` computes a batch's loss (`MUSCLEConfig.loss_implementation`): `choose_loss` picks one
per run, and every one is called the same way, `loss(model, inputs, labels) -> MUSCLELossOutput`.

- `ExactLoss`: the forward KL through each teacher's m = Wᵀq (`exact`), the default wherever it is exact; it picks
  the student's log-sum-exp (`lse_kernel`: cut-cross-entropy's kernel or torch) when it is built.
- `TiledLoss`: the three models' last hidden states and heads on (token × vocabulary) tiles (`tiled`).
- `LogitsLoss`: the three models' (B, L, V) logits, then a chunked KL (`losses`): for debugging, prompt learning.

They read the teachers through the trainer (`teacher_hidden`, `teacher_logits`). B rows, L positions, N scored
tokens, H hidden size, V vocabulary.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import NamedTuple

import torch

from ..utils.labels import IGNORE_INDEX, shifted_labels
from .exact import (
    ExactOutput,
    TeacherVectors,
    check_reducible,
    exact_token_loss,
    kernel_token_loss,
    lse_kernel_reason,
    mask_weights,
    reads_student,
    stack,
    teacher_vectors,
)
from .heads import backbone_outputs, output_head
from .losses import muscle_token_loss_chunked
from .masks import focal_item_weights, old_right_items
from .tiled import muscle_token_loss_tiled

logger = logging.getLogger(__name__)


class MUSCLELossOutput(NamedTuple):
    """A batch's loss and the sums its metrics are made of, over its scored tokens, each (); only `loss` carries
    gradient."""

    loss: torch.Tensor  # Σ_t λ·w_i·KL_t + λ_CE·CE_t, before the trainer's normalisation
    tokens: torch.Tensor  # the scored tokens
    aligned_old: torch.Tensor  # Σ_t m_t: the tokens distilled from the old model
    kl: torch.Tensor  # Σ_t KL_t, the mask's mix of the two KLs, without λ·w_i
    ce: torch.Tensor  # Σ_t CE_t, the cross-entropy of the labels
    correct: torch.Tensor | None  # the tokens whose label is the student's argmax; None where no logits were built
    entropy: torch.Tensor | None  # Σ_t the student's entropy at temperature 1; None as `correct`
    aux: torch.Tensor | None  # an MoE model's router load-balancing loss; None for other models
    outputs: object = None  # the student's model outputs, where the loss built them (`LogitsLoss`)


class MUSCLELoss:
    """One way to compute MUSCLE's loss, built once per run from its trainer (the config, the mask, the teachers)."""

    def __init__(self, trainer):
        self.trainer, self.args, self.mask = trainer, trainer.args, trainer.mask

    def __call__(self, model, inputs: dict, labels: torch.Tensor) -> MUSCLELossOutput:
        """`model`: the student as the Trainer wraps it; `inputs`: its batch without labels; `labels`: (B, L), unshifted."""
        raise NotImplementedError

    def _in_student_forward(self, compute, model, inputs: dict, labels: torch.Tensor) -> MUSCLELossOutput:
        """`compute(unwrapped student, inputs, labels, shifted labels)` inside the wrapper's forward, where DDP prepares
        its gradient reduction, and under accelerate's mixed precision: an autocast around the model's forward, which
        the redirection replaces and the backbones bypass (without it, bf16=True would train and distil in fp32)."""
        with self.trainer.accelerator.autocast():
            return self.trainer.in_forward(model, compute, inputs, labels, shifted_labels(labels))

    def _backbone(self, model, inputs: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The student's last hidden states (B, L, H) and its router load-balancing loss (an MoE model; else None)."""
        moe = self.trainer.aux_loss_enabled
        out = backbone_outputs(model, {**inputs, **({"output_router_logits": True} if moe else {})})
        return out.last_hidden_state, router_aux_loss(model, out.router_logits, inputs.get("attention_mask")) \
            if moe else None


class ExactLoss(MUSCLELoss):
    """The forward KL through each teacher's m = Wᵀq (`exact`): the student's pass costs what cross-entropy's does.
    The student's log-sum-exp is chosen here, once (`MUSCLEConfig.lse_kernel`): cut-cross-entropy's kernel, which
    builds no logits (so no argmax or entropy to log), on a GPU where it serves the run; else torch, by chunks."""

    def __init__(self, trainer):
        super().__init__(trainer)
        head = output_head(trainer.accelerator.unwrap_model(trainer.model))
        if trainer.old_cache is not None:  # once: the output layer is frozen and the temperature fixed
            trainer.old_cache.check_vectors(head, self.args.temperature)
        # a mask the probe cannot tell about is taken to read the student: the torch path serves every mask
        reason = lse_kernel_reason(head, reads_student(self.mask) is not False)
        kernel = self.args.lse_kernel
        if kernel == "cut_cross_entropy" and reason:
            raise ValueError(f"lse_kernel='cut_cross_entropy': {reason}; use lse_kernel='torch' or 'auto'")
        use_kernel = kernel == "cut_cross_entropy" or (kernel == "auto" and head.weight.is_cuda and reason is None)
        self._student_loss = self._kernel_loss if use_kernel else self._torch_loss

    def __call__(self, model, inputs: dict, labels: torch.Tensor) -> MUSCLELossOutput:
        return self._in_student_forward(self._compute, model, inputs, labels)

    def _compute(self, model, inputs: dict, labels: torch.Tensor, shifted: torch.Tensor) -> MUSCLELossOutput:
        """Inside the student's forward (`_in_student_forward`): the teachers' vectors at the N scored tokens of
        `shifted` (B, L), the mask's per-teacher weights, then the student's pass."""
        args = self.args
        valid = shifted != IGNORE_INDEX
        scored = valid.reshape(-1).nonzero()[:, 0]
        y = shifted.reshape(-1)[scored]
        head = output_head(model)  # here, inside the forward: whole under FSDP2
        at_scored = lambda h: h.reshape(-1, h.shape[-1])[scored]  # noqa: E731
        vectors = lambda hidden, teacher_head: teacher_vectors(  # noqa: E731
            at_scored(hidden), teacher_head, head, y, args.temperature, args.kl_chunk_size)
        old, new = self.trainer.teacher_hidden(model, inputs, labels)
        new = vectors(*new)
        old = old if isinstance(old, TeacherVectors) else vectors(*old)  # an exact cache's, or from v1's hidden states
        hidden, aux = self._backbone(model, inputs)
        item = self._item_weights(old.top1, shifted, scored)
        weights = mask_weights(self.mask, shifted, scored, old, new, item)
        ce = torch.full_like(item, args.ce_weight) if args.ce_weight > 0 else None
        out = self._student_loss(at_scored(hidden), head, y, weights, stack([old, new]), ce)
        w = out.weights.sum(-1)
        m = torch.where(w > 0, out.weights[:, 0] / w.clamp(min=1e-30), (item == 0) * 0.0)
        # the KL mix without λ·w_i, as the other paths log it (0 where λ·w_i is 0: nothing distils there)
        kl = torch.where(item > 0, out.kl / item.clamp(min=1e-30), torch.zeros_like(out.kl))
        read = out.student_top1 is not None
        return MUSCLELossOutput(out.loss.sum(), valid.sum(), m.sum(), kl.sum(), out.ce.sum(),
                                (out.student_top1 == y).sum() if read else None,
                                out.student_entropy.sum() if read else None, aux)

    def _item_weights(self, old_top1: torch.Tensor, shifted: torch.Tensor, scored: torch.Tensor) -> torch.Tensor:
        """(N,) λ·w_i of each scored token's item: w_i = α + β·1[v1 right on item i] (focal distillation), v1 right
        when its argmax (`old_top1`, (N,)) is the label on every scored token of the row (`shifted`, (B, T))."""
        args = self.args
        if args.focal_beta == 0:
            return torch.full((len(scored),), args.distill_weight * args.focal_alpha, device=shifted.device)
        grid = torch.zeros(shifted.numel(), dtype=torch.long, device=shifted.device)
        grid[scored] = old_top1
        right = old_right_items(SimpleNamespace(old_top1=grid.view(shifted.shape), labels=shifted,
                                                valid=shifted != IGNORE_INDEX))
        rows = torch.div(scored, shifted.shape[1], rounding_mode="floor")
        return args.distill_weight * (args.focal_alpha + args.focal_beta * right[rows].float())

    def _torch_loss(self, hidden, head, y, weights, teachers, ce) -> ExactOutput:
        return exact_token_loss(hidden, head, y, weights, cached=teachers, temperature=self.args.temperature,
                                ce_weight=ce, token_chunk=self.args.kl_chunk_size)

    def _kernel_loss(self, hidden, head, y, weights, teachers, ce) -> ExactOutput:
        all_weights = weights(torch.arange(len(y), device=y.device), None)  # the mask reads only the teachers
        loss, kl, ce_part = kernel_token_loss(hidden, head, y, all_weights, teachers,
                                              temperature=self.args.temperature, ce_weight=ce)
        return ExactOutput(loss, kl, ce_part, None, None, all_weights)  # no logits: no argmax, no entropy


class _GridLoss(MUSCLELoss):
    """A loss whose autograd function gives per-token (B, T) grids, weighted here by λ·w_i (`TiledLoss`,
    `LogitsLoss`)."""

    def __init__(self, trainer):
        super().__init__(trainer)
        if self.args.focal_beta > 0:  # w_i reads v1's per-item correctness from the mask's own inputs
            self.mask = _SeenInputs(self.mask)

    def _output(self, kl: torch.Tensor, m: torch.Tensor, ce: torch.Tensor, shifted: torch.Tensor,
                student_top1: torch.Tensor, entropy: torch.Tensor, aux, outputs=None) -> MUSCLELossOutput:
        """`kl`, `m`, `student_top1`, `entropy`: (B, T) grids, 0 off the scored tokens; `ce`: () Σ CE."""
        args, valid = self.args, shifted != IGNORE_INDEX
        loss = self._distillation_weights(kl).sum()
        if args.ce_weight > 0:
            loss = loss + args.ce_weight * ce
        with torch.no_grad():
            correct = ((student_top1 == shifted) & valid).sum()
        return MUSCLELossOutput(loss, valid.sum(), m.sum(), kl.detach().sum(), ce.detach(), correct, entropy.sum(),
                                aux, outputs)

    def _distillation_weights(self, per_token: torch.Tensor) -> torch.Tensor:
        """λ·w_i times each token's KL (B, T): w_i = α + β·1[v1 right on item i] (focal distillation)."""
        args = self.args
        if args.focal_beta > 0:
            weights = focal_item_weights(self.mask.inputs, args.focal_alpha, args.focal_beta)[:, None]
            return args.distill_weight * weights * per_token
        scale = args.distill_weight * args.focal_alpha
        return per_token if scale == 1 else scale * per_token


class TiledLoss(_GridLoss):
    """The three models' last hidden states and heads on (token × vocabulary) tiles (`tiled`): no (B, L, V) logits."""

    def __call__(self, model, inputs: dict, labels: torch.Tensor) -> MUSCLELossOutput:
        return self._in_student_forward(self._compute, model, inputs, labels)

    def _compute(self, model, inputs: dict, labels: torch.Tensor, shifted: torch.Tensor) -> MUSCLELossOutput:
        """Inside the student's forward (`_in_student_forward`); `shifted`: (B, L)."""
        args = self.args
        old, (new_hidden, new_head) = self.trainer.teacher_hidden(model, inputs, labels)
        hidden, aux = self._backbone(model, inputs)
        out = muscle_token_loss_tiled(hidden, output_head(model), new_hidden, new_head, old, shifted, mask=self.mask,
                                      temperature=args.temperature, token_chunk=args.kl_chunk_size,
                                      vocab_chunk=args.vocab_chunk_size, compile=args.compile_loss)
        return self._output(out.kl, out.m, out.ce.sum(), shifted, out.student_top1, out.student_entropy, aux)


class LogitsLoss(_GridLoss):
    """The three models' (B, L, V) logits, then a chunked KL (`losses.muscle_token_loss_chunked`): more memory; for
    debugging and comparison, and for prompt-learning adapters, which act in `PeftModel.forward`."""

    def __call__(self, model, inputs: dict, labels: torch.Tensor) -> MUSCLELossOutput:
        args, shifted = self.args, shifted_labels(labels)  # shift the labels, not the (large) logits
        moe = self.trainer.aux_loss_enabled
        old_logits, new_logits = self.trainer.teacher_logits(model, inputs, labels)
        outputs = model(**inputs, **({"output_router_logits": True} if moe else {}))
        student = outputs.logits[:, -labels.shape[1]:]  # a prompt-learning adapter's virtual tokens dropped
        kl, m = muscle_token_loss_chunked(student, old_logits, new_logits, shifted, mask=self.mask,
                                          temperature=args.temperature, chunk_size=args.kl_chunk_size or 1024)
        with torch.no_grad():
            entropy = torch.distributions.Categorical(logits=student.float()).entropy() * (shifted != IGNORE_INDEX)
        ce = torch.nn.functional.cross_entropy(student.reshape(-1, student.shape[-1]).float(), shifted.reshape(-1),
                                               ignore_index=IGNORE_INDEX, reduction="sum") if args.ce_weight > 0 \
            else torch.zeros((), device=student.device)
        return self._output(kl, m, ce, shifted, student.argmax(-1), entropy, outputs.aux_loss if moe else None,
                            outputs)


def choose_loss(implementation: str, model, mask, old_cache) -> type[MUSCLELoss]:
    """The loss of `MUSCLEConfig.loss_implementation` for this run, chosen once, saying why in one line where it is
    not the one asked for: "auto" is the exact loss where it applies (`exact_reason`), else the tiled one; the
    hidden-state losses skip `PeftModel.forward`, so a prompt-learning adapter takes the logits. `model`: the
    unwrapped student; `old_cache`: the old model's `LogitCache`, or None."""
    reason = exact_reason(model, mask, old_cache)
    if implementation == "exact" and reason:
        raise ValueError(f"loss_implementation='exact': {reason}; use 'auto' or 'tiled'")
    if implementation in ("auto", "exact"):
        if reason is None:
            return ExactLoss
        logger.info(f"MUSCLE: {reason}, so the loss is computed on vocabulary tiles (loss_implementation='tiled')")
    if old_cache is not None and old_cache.kind == "vectors":
        raise ValueError(f"old_logits_cache holds teacher vectors, which only the exact loss reads "
                         f"({reason or f'loss_implementation={implementation!r}'}): cache the old model's top-k "
                         "log-probabilities instead (adaptguard cache-logits without --kind vectors)")
    if implementation == "logits":
        return LogitsLoss
    if is_prompt_learning(model):
        logger.info("MUSCLE: a prompt-learning adapter acts before the backbone, so the loss is computed from the "
                    "models' logits (loss_implementation='logits')")
        return LogitsLoss
    return TiledLoss


def exact_reason(model, mask, old_cache) -> str | None:
    """Why the exact loss from teacher vectors (`exact`) cannot serve this run (None when it can)."""
    if is_prompt_learning(model):
        return "a prompt-learning adapter acts before the backbone"
    if old_cache is not None and old_cache.kind != "vectors":
        return "old_logits_cache holds top-k log-probabilities (an exact cache: adaptguard cache-logits --kind vectors)"
    reason = check_reducible(output_head(model), model.get_output_embeddings().weight.requires_grad)
    if reason:
        return reason
    if not getattr(mask, "per_token", False) and reads_student(mask):  # None: decided on the first batch
        return f"mask {getattr(mask, '__name__', repr(mask))!r} reads the student's answer across tokens"
    return None


def is_prompt_learning(model) -> bool:
    """Whether `model` is a `PeftModel` whose adapter acts on the inputs (prompt / prefix tuning, prompt encoder)."""
    from peft import PeftModel

    return isinstance(model, PeftModel) and model.peft_config[model.active_adapter].is_prompt_learning


def router_aux_loss(model, router_logits, attention_mask) -> torch.Tensor:
    """An MoE model's load-balancing loss from its router logits, as SFTTrainer's fused head computes it (Mixtral's
    `load_balancing_loss_func`, which every MoE family of transformers shares)."""
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    config = model.config.get_text_config()
    return load_balancing_loss_func(router_logits, config.num_experts, config.num_experts_per_tok, attention_mask)


class _SeenInputs:
    """A mask that keeps the `MaskInputs` it was last called with, so that focal distillation reads v1's per-item
    correctness from the very statistics the loss computed (the tiled loss builds no logits to recompute them from)."""

    def __init__(self, mask):
        self.mask, self.__name__, self.inputs = mask, getattr(mask, "__name__", repr(mask)), None

    def __call__(self, inputs):
        self.inputs = inputs
        return self.mask(inputs)
