"""Distillation at the cost of cross-entropy (issue 64): with the output layer frozen, z = s·(W h) + b, the forward KL
to any teacher distribution q over the vocabulary is, at temperature T,

    KL(q ‖ softmax(z/T)) = LSE(z/T) − (s·h·m + s·b·q) / T − H(q),      m = Wᵀ q  (one vector of the hidden size H)
    ∂/∂h = s·(Wᵀ softmax(z/T) − m) / T

so a teacher enters the loss through m, H(q) and b·q alone: any per-token weights and mix of teachers (MUSCLE's masks,
LL_L, focal and KD weights) is a weighted sum of them. The student side is the cross-entropy computation with a soft
target — one log-sum-exp over the vocabulary and its gradient. Exact, not a top-k approximation.

`teacher_vectors` computes a teacher's (m, H(q), b·q) and what the masks read (its argmax, its label log-probability)
from its hidden states — for the exact cache (`logit_cache.build_vector_cache`), or online. `exact_token_loss` is the
student's pass: per chunk of tokens with the whole vocabulary, the value and the gradient together (no recompute in the
backward), two vocabulary products per token as SFT's cross-entropy; a teacher given online (hidden states) adds its
logits and is mixed in logit space (one more product each). Masks that read the student's own answer take it from the
same pass.

`kernel_token_loss` is the same loss with the student's log-sum-exp taken by Apple's cut-cross-entropy kernel (CUDA,
`pip install cut-cross-entropy`), which never builds the logits: LSE(z/T) = CE(h/T, y) + z_y/T for any index y, so a
kernel for hard-label cross-entropy gives the soft-target loss exactly (its gradient filter off), with the gradient
from the kernel's own backward. It serves heads without a bias and masks that read only the teachers.

Not reducible this way (they keep `tiled`): soft-capped logits (Gemma-2's tanh), a trained output layer, reverse KL
and JSD. Pure torch. N = scored tokens, H = hidden size, V = vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .tiled import LMHead


class TeacherVectors(NamedTuple):
    """A teacher on N tokens, as the exact loss reads it (no gradient): `m` (N, H) = s·Wᵀq with W the *student's*
    head; `entropy` (N,) = H(q); `bias_dot` (N,) = s·b·q (0 without a bias); `top1` (N,) its argmax at temperature 1;
    `label_logp` (N,) its log-probability of the label at temperature 1 (0 where the label is −100)."""

    m: torch.Tensor
    entropy: torch.Tensor
    bias_dot: torch.Tensor
    top1: torch.Tensor
    label_logp: torch.Tensor


def _wide(dtype: torch.dtype) -> torch.dtype:
    """The dtype the loss computes in: float32, or float64 for float64 inputs (gradcheck)."""
    return torch.promote_types(dtype, torch.float32)


def _logits(hidden: torch.Tensor, head: LMHead) -> torch.Tensor:
    """Logits (n, V) in `_wide` precision of a head without soft-capping; the matmul in the model's dtype."""
    z = hidden @ head.weight.T
    if head.bias is not None:
        z = z + head.bias
    z = z.to(_wide(z.dtype))
    return z * head.scale if head.scale != 1.0 else z


def _log_softmax(z: torch.Tensor) -> torch.Tensor:
    """log softmax over the last dimension, with Σ q = 1 to float32's rounding: the loss reads q through m = Wᵀq, and
    LSE(z/T) − h·m/T − H(q) holds only for Σ q = 1 (an excess δ costs δ·h·m/T, the logits' size: ~35 on SmolLM2).
    Not `torch.log_softmax`: its float32 CPU kernel adds exp(z − max) one after another in a few SIMD lanes, so over
    a vocabulary of 49,152 the terms below half an ulp of a lane's sum are lost and Σ q exceeds 1 by up to 3e-5 near
    T = 1 (their mass is small at T = 0.5, and none is lost at T = 2): the KL was 2.5e-4 low (issue 74). Nor
    z − logsumexp(z), whose normaliser is rounded at the logits' size (δ ~ 3e-6 at T = 0.5). Here the sum is
    `torch.sum`'s (a cascade on a CPU) of terms ≤ 1, and the normaliser, log Σ, lies in [0, log V]."""
    shifted = z - z.amax(-1, keepdim=True)
    return shifted.sub_(shifted.exp().sum(-1, keepdim=True).log())


def check_reducible(head: LMHead, trainable: bool = False) -> str | None:
    """Why the exact loss cannot use this student head (None when it can): soft-capping is not linear in h, and a
    trained head would need W's gradient as well."""
    if head.softcap:
        return f"the output layer soft-caps its logits (final_logit_softcapping {head.softcap})"
    if trainable or head.weight.requires_grad:
        return "the output layer is trained"
    return None


def default_token_chunk(vocab: int, budget: int = 1 << 25) -> int:
    """Tokens per chunk: about `budget` float32 logits (128 MiB) in one (chunk, V) tile."""
    return max(8, budget // max(vocab, 1))


@torch.no_grad()
def teacher_vectors(hidden: torch.Tensor, head: LMHead, student_head: LMHead, labels: torch.Tensor,
                    temperature: float, token_chunk: int | None = None) -> TeacherVectors:
    """(m, H(q), b·q, argmax, label log-prob) of a teacher from its hidden states (N, H_t) and head, with q =
    softmax(z_t / T) and m = s·W_sᵀ q taken with the student's head (the teacher's own head may differ: another
    base)."""
    if head.softcap:
        raise ValueError("teacher_vectors: the teacher's head soft-caps its logits; the exact loss needs plain logits")
    n = hidden.shape[0]
    chunk = token_chunk or default_token_chunk(head.weight.shape[0])
    w = student_head.weight.detach()
    wide = _wide(hidden.dtype)
    out = TeacherVectors(torch.empty(n, w.shape[1], dtype=wide, device=hidden.device),
                         *(torch.empty(n, dtype=dt, device=hidden.device) for dt in (wide, wide, torch.long, wide)))
    for a in range(0, n, chunk):
        z = _logits(hidden[a:a + chunk], head)
        log_q = _log_softmax(z / temperature)
        q = log_q.exp()
        out.m[a:a + chunk] = (q.to(w.dtype) @ w).to(wide) * student_head.scale
        out.entropy[a:a + chunk] = -(q * log_q).sum(-1)
        out.bias_dot[a:a + chunk] = 0.0 if student_head.bias is None else (q @ student_head.bias.to(wide)) * \
            student_head.scale
        out.top1[a:a + chunk] = z.argmax(-1)
        y = labels[a:a + chunk]
        logp = _log_softmax(z).gather(1, y.clamp(min=0)[:, None])[:, 0]
        out.label_logp[a:a + chunk] = torch.where(y != -100, logp, torch.zeros_like(logp))
    return out


class StudentChunk(NamedTuple):
    """What a mask may read of the student on a chunk of tokens: `top1` (c,) and `label_logp` (c,)."""

    top1: torch.Tensor
    label_logp: torch.Tensor


# weights(rows, student) -> (c, J) per-teacher weights a_j of the chunk's tokens: the loss is Σ_j a_j KL(q_j ‖ p)
Weights = Callable[[torch.Tensor, StudentChunk], torch.Tensor]


class ExactOutput(NamedTuple):
    """Per scored token (N,), float32: `loss` = Σ_j a_j KL_j + λ_CE·CE carries the gradient; the parts `kl` and `ce`,
    `student_top1` (long), `student_entropy` (temperature 1) and `weights` (N, J) do not."""

    loss: torch.Tensor
    kl: torch.Tensor
    ce: torch.Tensor
    student_top1: torch.Tensor
    student_entropy: torch.Tensor
    weights: torch.Tensor


@dataclass(frozen=True)
class _ExactSpec:
    """What `_ExactLoss` reads besides the student's hidden states: no gradient flows into any of it (`exact_token_loss`
    documents each)."""

    head: LMHead  # the student's, detached
    labels: torch.Tensor  # (N,)
    weights: Weights
    cached: TeacherVectors | None
    online: tuple  # ((N, H_t) detached hidden states, LMHead) pairs
    ce_weight: torch.Tensor | None  # (N,)
    temperature: float
    token_chunk: int


class _ExactLoss(torch.autograd.Function):
    """Forward: per chunk of tokens, the loss and its gradient in h, kept for the backward, which only scales it."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, spec: _ExactSpec):
        head, labels, cached, temperature, chunk = spec.head, spec.labels, spec.cached, spec.temperature, spec.token_chunk
        n, dev, wide = hidden.shape[0], hidden.device, _wide(hidden.dtype)
        kl, ce = torch.zeros(n, device=dev, dtype=wide), torch.zeros(n, device=dev, dtype=wide)
        top1, entropy = torch.zeros(n, dtype=torch.long, device=dev), torch.zeros(n, device=dev, dtype=wide)
        n_teachers = (0 if cached is None else cached.m.shape[1]) + len(spec.online)
        all_weights = torch.zeros(n, n_teachers, device=dev, dtype=wide)
        grad = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        for a in range(0, n, chunk):
            h = hidden[a:a + chunk]
            rows = torch.arange(a, min(a + chunk, n), device=dev)
            y = labels[a:a + chunk]
            z = _logits(h, head)  # (c, V)
            lse1 = torch.logsumexp(z, -1)
            label_z = z.gather(1, y.clamp(min=0)[:, None])[:, 0]
            student = StudentChunk(z.argmax(-1), label_z - lse1)
            wts = spec.weights(rows, student).to(wide)  # (c, J)
            all_weights[a:a + chunk] = wts
            top1[a:a + chunk] = student.top1
            p1 = torch.exp(z - lse1[:, None])
            entropy[a:a + chunk] = lse1 - (p1 * z).sum(-1)
            ce[a:a + chunk] = lse1 - label_z
            zt = z / temperature
            lse_t = torch.logsumexp(zt, -1)
            total = wts.sum(-1)
            # the cached teachers: Σ_j a_j [LSE(z/T) − (h·m_j + b·q_j)/T − H(q_j)]
            j = 0
            value = torch.zeros_like(lse_t)
            target = None
            if cached is not None:
                j = cached.m.shape[1]
                wc = wts[:, :j]
                target = (wc[:, :, None] * cached.m[a:a + chunk]).sum(1)  # (c, H)
                value = wc.sum(-1) * lse_t - ((h.to(wide) * target).sum(-1) + (wc * cached.bias_dot[a:a + chunk]).sum(-1)
                                              ) / temperature - (wc * cached.entropy[a:a + chunk]).sum(-1)
            # the online teachers, in logit space: Σ_j a_j [Σ_v q_jv (log q_jv − log p_v)]
            p_mix = None
            for k, (t_hidden, t_head) in enumerate(spec.online):
                log_q = _log_softmax(_logits(t_hidden[a:a + chunk], t_head) / temperature)
                q = log_q.exp()
                wk = wts[:, j + k]
                value = value + wk * ((q * log_q).sum(-1) - (q * zt).sum(-1) + lse_t)
                p_mix = wk[:, None] * q if p_mix is None else p_mix + wk[:, None] * q
            kl[a:a + chunk] = value
            if grad is not None:
                # ∂/∂z: Σ_j a_j p_T / T − (online mix) / T + λ_CE (p_1 − onehot(y)); the cached teachers' −m/T acts on
                # h directly
                g = (total / temperature)[:, None] * torch.exp(zt - lse_t[:, None])
                if p_mix is not None:
                    g = g - p_mix / temperature
                if spec.ce_weight is not None:
                    cw = spec.ce_weight[a:a + chunk][:, None]
                    g = g + cw * p1
                    g.scatter_add_(1, y.clamp(min=0)[:, None], -cw * (y != -100).float()[:, None])
                gh = (g.to(head.weight.dtype) @ head.weight).to(wide) * head.scale
                if target is not None:
                    gh = gh - target / temperature
                grad[a:a + chunk] = gh.to(grad.dtype)
        ctx.save_for_backward(grad)
        loss = kl + (0.0 if spec.ce_weight is None else spec.ce_weight * ce)
        ctx.mark_non_differentiable(kl, ce, top1, entropy, all_weights)
        return loss, kl, ce, top1, entropy, all_weights

    @staticmethod
    def backward(ctx, g_loss, *_):
        (grad,) = ctx.saved_tensors
        return grad * g_loss[:, None].to(grad.dtype), None  # hidden's; the spec takes none


def exact_token_loss(hidden: torch.Tensor, head: LMHead, labels: torch.Tensor, weights: Weights, *,
                     cached: TeacherVectors | None = None, online: tuple = (), temperature: float = 2.0,
                     ce_weight: torch.Tensor | None = None, token_chunk: int | None = None) -> ExactOutput:
    """The distillation loss Σ_j a_j KL(q_j,T ‖ p_T) per scored token, from the student's hidden states, exact, with the
    gradient taken in the forward.

    Args:
        hidden: (N, H) the student's last hidden states at the scored tokens (requires grad).
        head: the student's output layer (frozen, no soft-capping: `check_reducible`).
        labels: (N,) the tokens' labels (−100: not scored: all weights should be 0 there).
        weights: per chunk, `weights(rows (c,), StudentChunk) -> (c, J)` teacher weights a_j, J = cached teachers
            (`cached.m` is (N, J, H)) then online ones; it sees the student's argmax and label log-prob of the chunk,
            so a mask that reads them is exact in one pass.
        cached: teachers as vectors (`teacher_vectors`, stacked on dim 1: m (N, J, H), the rest (N, J)).
        online: teachers as ((N, H_t) hidden states, LMHead) pairs, mixed in logit space.
        ce_weight: (N,) per-token cross-entropy weight folded into the gradient (None: no cross-entropy term).
    Returns:
        `ExactOutput`: `loss` (N,) = kl + ce_weight·ce is the differentiable one (its gradient, computed in the
        forward, is scaled by whatever multiplies it: a normalisation, gradient accumulation).
    """
    reason = check_reducible(head)
    if reason:
        raise ValueError(f"exact_token_loss: {reason}; use the tiled loss")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    frozen = LMHead(head.weight.detach(), None if head.bias is None else head.bias.detach(), None, float(head.scale))
    spec = _ExactSpec(frozen, labels, weights, cached, tuple((h.detach(), head_) for h, head_ in online), ce_weight,
                      float(temperature), int(token_chunk or default_token_chunk(head.weight.shape[0])))
    return ExactOutput(*_ExactLoss.apply(hidden, spec))


def lse_kernel_reason(head: LMHead, reads_student: bool) -> str | None:
    """Why `kernel_token_loss` cannot serve this run (None when it can)."""
    import importlib.util

    if importlib.util.find_spec("cut_cross_entropy") is None:
        return "cut-cross-entropy is not installed (pip install cut-cross-entropy)"
    if head.bias is not None:
        return "the output layer has a bias (the kernel takes a weight only)"
    if reads_student:
        return "the mask reads the student's answer (the kernel returns no logits to read it from)"
    return None


def kernel_token_loss(hidden: torch.Tensor, head: LMHead, labels: torch.Tensor, weights: torch.Tensor,
                      cached: TeacherVectors, *, temperature: float = 2.0, ce_weight: torch.Tensor | None = None,
                      impl: str | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`exact_token_loss`'s value with the student's log-sum-exp from cut-cross-entropy (never the (N, V) logits):
    LSE(s·W h / T) = CE(s·h/T, y) + s·h·W[y] / T, for the labels y (any index would do), gradient filter off.

    Args:
        hidden: (N, H) the student's hidden states at the scored tokens; `labels`: (N,) their labels (no −100).
        head: a frozen output layer without bias or soft-capping (`lse_kernel_reason`).
        weights: (N, J) the teachers' weights a_j; `cached`: their vectors, m (N, J, H), the rest (N, J).
        impl: cut-cross-entropy's implementation: "cce" (its Triton kernel, CUDA; the default on a GPU) or
            "torch_compile" (its reference, any device; the default elsewhere).
    Returns: (loss, kl, ce), each (N,) float32; `loss` = kl + ce_weight·ce carries the gradient (autograd through the
        kernel's backward); `ce` is 0 without `ce_weight`.
    """
    from cut_cross_entropy import linear_cross_entropy

    impl = impl or ("cce" if hidden.is_cuda else "torch_compile")
    weight, wide = head.weight.detach(), _wide(hidden.dtype)
    exact = {"filter_eps": None} if impl == "cce" else {}  # the kernel's default drops small gradient entries

    def lse(factor: float) -> torch.Tensor:  # LSE(factor·W h) per row
        e = hidden * factor
        ce = linear_cross_entropy(e, weight, labels, reduction="none", impl=impl, **exact).to(wide)
        return ce + (e.to(wide) * weight[labels].to(wide)).sum(-1)

    lse_t = lse(head.scale / temperature)
    w = weights.to(wide)
    target = (w[:, :, None] * cached.m.to(wide)).sum(1)  # (N, H)
    kl = w.sum(-1) * lse_t - ((hidden.to(wide) * target).sum(-1) + (w * cached.bias_dot).sum(-1)) \
        / temperature - (w * cached.entropy).sum(-1)
    if ce_weight is None:
        return kl, kl.detach(), torch.zeros_like(kl).detach()
    lse_1 = lse_t if temperature == 1 else lse(head.scale)
    ce = lse_1 - head.scale * (hidden.to(wide) * weight[labels].to(wide)).sum(-1)
    return kl + ce_weight.to(wide) * ce, kl.detach(), ce.detach()


def stack(vectors: list[TeacherVectors]) -> TeacherVectors:
    """Several teachers' vectors on the same tokens as one `TeacherVectors` with a teacher dimension: m (N, J, H),
    the others (N, J)."""
    return TeacherVectors(*(torch.stack(parts, 1) for parts in zip(*vectors)))


class _StudentNeeded(Exception):
    """A mask read the student's answer (raised by `_TeachersOnly`)."""


class _TeachersOnly:
    """`MaskInputs` without the student's fields: a mask that reads none of them is computed once for the batch."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    def __getattr__(self, name):
        if name.startswith("student_"):
            raise _StudentNeeded(name)
        raise AttributeError(name)


def reads_student(mask) -> bool | None:
    """Whether `mask` reads the student's answer, from one call on a one-token probe (None: the probe does not tell,
    as for a mask that needs real inputs)."""
    probe = torch.zeros(1, 1, dtype=torch.long)
    try:
        mask(_TeachersOnly(labels=probe, valid=probe.bool(), old_top1=probe, new_top1=probe,
                           old_label_logp=probe.float(), new_label_logp=probe.float()))
    except _StudentNeeded:
        return True
    except Exception:  # noqa: BLE001 - a mask that needs real inputs
        return None
    return False


def mask_weights(mask, labels: torch.Tensor, scored: torch.Tensor, old: TeacherVectors, new: TeacherVectors,
                 item_weight: torch.Tensor) -> Weights:
    """The (old, new) teacher weights (λ·w_i·m, λ·w_i·(1 − m)) of MUSCLE's mask m, as `exact_token_loss` reads them.

    Args:
        mask: a MUSCLE mask (`masks.py`, plugins), `mask(MaskInputs) -> (B, T)`.
        labels: (B, T) shifted labels; `scored`: (N,) the flat indices of the scored positions in B·T.
        old, new: the teachers' `top1` and `label_logp` at the N scored tokens (the rest is not read).
        item_weight: (N,) λ·w_i of each token's item (focal distillation; λ for the others).
    A mask that reads only the teachers is computed once, on the whole batch (so sequence masks stay exact); one
    that reads the student's answer is computed per chunk from the student's pass, and must be per token (marked
    `per_token = True`, as `student_wrong` is): `ValueError` otherwise, for the caller to use the tiled loss.
    """
    from .losses import MaskInputs, apply_mask

    shape, valid = labels.shape, labels != -100

    def grid(values: torch.Tensor) -> torch.Tensor:
        out = torch.zeros(labels.numel(), dtype=values.dtype, device=values.device)
        out[scored] = values
        return out.view(shape)

    teachers = dict(labels=labels, valid=valid, old_top1=grid(old.top1), new_top1=grid(new.top1),
                    old_label_logp=grid(old.label_logp), new_label_logp=grid(new.label_logp))
    try:
        m = apply_mask(mask, _TeachersOnly(**teachers)).reshape(-1)[scored]
    except _StudentNeeded:
        m = None
        if not getattr(mask, "per_token", False):
            raise ValueError(f"mask {getattr(mask, '__name__', mask)!r} reads the student's answer and is not marked "
                             "per_token: its value on a token may depend on other tokens") from None

    def weights(rows: torch.Tensor, student: StudentChunk) -> torch.Tensor:
        if m is not None:
            mc = m[rows]
        else:
            y = labels.reshape(-1)[scored[rows]][None]
            inputs = MaskInputs(labels=y, valid=y != -100, student_top1=student.top1[None],
                                old_top1=old.top1[rows][None], new_top1=new.top1[rows][None],
                                student_label_logp=student.label_logp[None], old_label_logp=old.label_logp[rows][None],
                                new_label_logp=new.label_logp[rows][None])
            mc = apply_mask(mask, inputs)[0]
        w = item_weight[rows]
        return torch.stack([w * mc, w * (1 - mc)], 1)

    weights.reads_student = m is None
    return weights
