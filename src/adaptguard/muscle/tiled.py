"""MUSCLE's loss without vocabulary-sized logits (issue 16): from the last hidden states and the LM heads of the
student, the new teacher and the old teacher, the logits are projected on (token × vocabulary) tiles, and every
per-token quantity the loss and the masks need is accumulated over the vocabulary with an online log-sum-exp (as
TRL's `chunked_divergence` does for two models). Nothing of size (B, L, V) is ever built; the extra memory is
O(token_chunk × vocab_chunk) plus a few (N,) vectors. The backward pass recomputes the tiles.

For a teacher with a = z_t/T and the student with b = z_s/T, over the vocabulary:
    KL(σ(a) ‖ σ(b)) = Σ_v σ(a)_v (a_v − b_v) − lse(a) + lse(b),
so one pass keeps, per token and model, a running maximum, Σ e^(a−max) and Σ e^(a−max)(a − b), rescaled when the
maximum grows. The gradient with respect to z_s is (σ(b) − p_mix)/T with p_mix = m σ(a_old) + (1 − m) σ(a_new),
plus (σ(z_s) − onehot(y)) for the cross-entropy. Pure torch; `losses.muscle_token_loss` is the reference.

Shapes: N = B·T positions (flattened), H = hidden size, V = vocabulary, k = cached top-k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .losses import MaskFn, MaskInputs, TopKLogProbs, apply_mask, sparse_kl, sparse_log_probs, topk_label_stats


class LMHead(NamedTuple):
    """An output layer: logits = softcap(scale·(hidden @ weight.T + bias)), softcap(x) = c·tanh(x/c) (Gemma-2) or
    none, `scale` a model's logit multiplier (Cohere's `logit_scale`, Granite's 1/`logits_scaling`; TRL reads the
    same config fields). `weight` (V, H) may carry gradient (full fine-tuning, LoRA on the head: pass W + s·B@A,
    tied embeddings)."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None
    softcap: float | None = None
    scale: float = 1.0


class TiledMuscleOutput(NamedTuple):
    """All (B, T) float32 but `student_top1` (long); 0 off the scored positions. `kl` = m·KL_old + (1 − m)·KL_new
    and `ce` (the cross-entropy of the label) carry gradient; `m`, `student_top1` and `student_entropy` (of the
    student's next-token distribution at temperature 1, the `entropy` SFTTrainer logs) do not."""

    kl: torch.Tensor
    ce: torch.Tensor
    m: torch.Tensor
    student_top1: torch.Tensor
    student_entropy: torch.Tensor


@dataclass(frozen=True)
class _Spec:
    mask: MaskFn
    temperature: float
    token_chunk: int
    vocab_chunk: int
    post: tuple  # (softcap, scale) of the student, new and old heads
    labels: torch.Tensor  # (B, T)


def _tile(hidden: torch.Tensor, weight: torch.Tensor, bias, post: tuple, v0: int, v1: int) -> torch.Tensor:
    """float32 logits (n, v1 − v0) of the vocabulary slice [v0, v1); the matmul in the model's dtype, as its head.
    `post` = (softcap, scale)."""
    softcap, scale = post
    z = hidden @ weight[v0:v1].T
    if bias is not None:
        z = z + bias[v0:v1]
    z = z.float() * scale if scale != 1.0 else z.float()
    return softcap * torch.tanh(z / softcap) if softcap else z


def _rescale(state_max: torch.Tensor, tile_max: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    new_max = torch.maximum(state_max, tile_max)
    return new_max, torch.exp(state_max - new_max)  # exp(−inf) = 0 on the first tile


class _Stats:
    """Running per-token statistics of one model's logits over vocabulary tiles (n rows)."""

    def __init__(self, n: int, device, teacher: bool):
        def full(v):
            return torch.full((n,), v, dtype=torch.float32, device=device)

        self.max1, self.sum1 = full(-math.inf), full(0.0)  # lse of z (temperature 1): label log-prob, CE
        self.top_value, self.top1 = full(-math.inf), torch.zeros(n, dtype=torch.long, device=device)
        self.label_logit = full(0.0)
        self.z_sum = None if teacher else full(0.0)  # Σ e^(z − max1)·z: the student's entropy = lse1 − z_sum/sum1
        self.max_t, self.sum_t = full(-math.inf), full(0.0)  # lse of z/T
        self.cross = full(0.0) if teacher else None  # Σ e^(a − max_t)(a − b)

    def update(self, z: torch.Tensor, labels: torch.Tensor, v0: int, temperature: float, student_b=None) -> None:
        width = z.shape[1]
        tile_max, tile_arg = z.max(-1)
        better = tile_max > self.top_value  # strict: the first maximum wins, as torch.argmax
        self.top_value = torch.where(better, tile_max, self.top_value)
        self.top1 = torch.where(better, tile_arg + v0, self.top1)
        self.max1, scale = _rescale(self.max1, tile_max)
        e1 = torch.exp(z - self.max1[:, None])
        self.sum1 = self.sum1 * scale + e1.sum(-1)
        if self.z_sum is not None:
            self.z_sum = self.z_sum * scale + (e1 * z).sum(-1)
        here = (labels >= v0) & (labels < v0 + width)
        picked = z.gather(1, (labels - v0).clamp(0, width - 1)[:, None])[:, 0]
        self.label_logit = torch.where(here, picked, self.label_logit)
        a = z / temperature
        self.max_t, scale = _rescale(self.max_t, tile_max / temperature)
        e = torch.exp(a - self.max_t[:, None])
        self.sum_t = self.sum_t * scale + e.sum(-1)
        if self.cross is not None:
            self.cross = self.cross * scale + (e * (a - student_b)).sum(-1)

    def lse1(self) -> torch.Tensor:
        return self.max1 + torch.log(self.sum1)

    def lse_t(self) -> torch.Tensor:
        return self.max_t + torch.log(self.sum_t)


class _TiledMuscle(torch.autograd.Function):
    """Forward: one pass over the vocabulary tiles → mask inputs, mask, KLs and CE. Backward: a second pass that
    recomputes the tiles and accumulates the gradients of the student's hidden states, head weight and bias."""

    @staticmethod
    def forward(ctx, h_s, w_s, b_s, h_new, w_new, b_new, h_old, w_old, b_old, top_logp, top_idx, top_rest,
                spec: _Spec):
        labels = spec.labels
        valid = labels != -100
        rows = valid.reshape(-1).nonzero().squeeze(1)
        y = labels.reshape(-1)[rows]
        n, vocab, device = len(rows), w_s.shape[0], h_s.device
        temperature = spec.temperature
        post_s, post_new, post_old = spec.post
        sparse = top_logp is not None
        out = {name: torch.zeros(n, dtype=torch.float32, device=device)
               for name in ("lse1_s", "entropy_s", "lse_b", "lse_new", "lse_old", "kl_new", "kl_old", "logp_s", "logp_new",
                            "logp_old")}
        top1 = {name: torch.zeros(n, dtype=torch.long, device=device) for name in ("s", "new", "old")}
        for start in range(0, n, spec.token_chunk):
            idx = rows[start:start + spec.token_chunk]
            yc = y[start:start + len(idx)]
            hs, hn = h_s[idx], h_new[idx]
            s, new = _Stats(len(idx), device, False), _Stats(len(idx), device, True)
            old = None if sparse else _Stats(len(idx), device, True)
            if sparse:  # the student's b at the cached indices, and Σ_v b_v, for the sparse KL
                k_idx = top_idx[idx].long()
                b_top = torch.zeros(k_idx.shape, dtype=torch.float32, device=device)
                b_sum = torch.zeros(len(idx), dtype=torch.float32, device=device)
            else:
                ho = h_old[idx]
            for v0 in range(0, vocab, spec.vocab_chunk):
                v1 = min(v0 + spec.vocab_chunk, vocab)
                zs = _tile(hs, w_s, b_s, post_s, v0, v1)
                b = zs / temperature
                s.update(zs, yc, v0, temperature)
                new.update(_tile(hn, w_new, b_new, post_new, v0, v1), yc, v0, temperature, b)
                if sparse:
                    here = (k_idx >= v0) & (k_idx < v1)
                    b_top = torch.where(here, b.gather(1, (k_idx - v0).clamp(0, v1 - v0 - 1)), b_top)
                    b_sum += b.sum(-1)
                else:
                    old.update(_tile(ho, w_old, b_old, post_old, v0, v1), yc, v0, temperature, b)
            sl = slice(start, start + len(idx))
            lse_b = s.lse_t()
            out["lse1_s"][sl], out["lse_b"][sl] = s.lse1(), lse_b
            out["entropy_s"][sl] = s.lse1() - s.z_sum / s.sum1
            out["logp_s"][sl], top1["s"][sl] = s.label_logit - s.lse1(), s.top1
            out["lse_new"][sl] = new.lse_t()
            out["kl_new"][sl] = new.cross / new.sum_t - new.lse_t() + lse_b
            out["logp_new"][sl], top1["new"][sl] = new.label_logit - new.lse1(), new.top1
            if sparse:
                logp, rest = top_logp[idx], top_rest[idx]
                out["kl_old"][sl] = sparse_kl(b_top - lse_b[:, None], b_sum - vocab * lse_b, logp, rest, temperature,
                                              vocab)
                top1["old"][sl], out["logp_old"][sl] = topk_label_stats(logp, k_idx, rest, yc, vocab)
            else:
                out["lse_old"][sl] = old.lse_t()
                out["kl_old"][sl] = old.cross / old.sum_t - old.lse_t() + lse_b
                out["logp_old"][sl], top1["old"][sl] = old.label_logit - old.lse1(), old.top1

        def grid(values, dtype=torch.float32):  # (n,) on the scored rows → (B, T), 0 elsewhere
            full = torch.zeros(labels.numel(), dtype=dtype, device=device)
            full[rows] = values
            return full.view(labels.shape)

        inputs = MaskInputs(labels=labels, valid=valid, student_top1=grid(top1["s"], torch.long),
                            old_top1=grid(top1["old"], torch.long), new_top1=grid(top1["new"], torch.long),
                            student_label_logp=grid(out["logp_s"]), old_label_logp=grid(out["logp_old"]),
                            new_label_logp=grid(out["logp_new"]))
        m_grid = apply_mask(spec.mask, inputs)
        m = m_grid.reshape(-1)[rows]
        kl = m * out["kl_old"] + (1 - m) * out["kl_new"]
        ce = -out["logp_s"]
        ctx.save_for_backward(h_s, w_s, b_s, h_new, w_new, b_new, h_old, w_old, b_old, top_logp, top_idx, top_rest,
                              rows, y, m, out["lse1_s"], out["lse_b"], out["lse_new"], out["lse_old"])
        ctx.spec = spec
        student_top1, entropy = inputs.student_top1, grid(out["entropy_s"])
        ctx.mark_non_differentiable(m_grid, student_top1, entropy)
        return grid(kl), grid(ce), m_grid, student_top1, entropy

    @staticmethod
    def backward(ctx, g_kl, g_ce, _g_m, _g_top1, _g_entropy):
        (h_s, w_s, b_s, h_new, w_new, b_new, h_old, w_old, b_old, top_logp, top_idx, top_rest,
         rows, y, m, lse1_s, lse_b, lse_new, lse_old) = ctx.saved_tensors
        spec = ctx.spec
        temperature, (post_s, post_new, post_old) = spec.temperature, spec.post
        sparse = top_logp is not None
        vocab = w_s.shape[0]
        g_kl, g_ce = g_kl.reshape(-1)[rows].float(), g_ce.reshape(-1)[rows].float()
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.zeros(h_s.shape, dtype=torch.float32, device=h_s.device) if need_h else None
        grad_w = torch.zeros(w_s.shape, dtype=torch.float32, device=w_s.device) if need_w else None
        grad_b = torch.zeros(b_s.shape, dtype=torch.float32, device=b_s.device) if need_b else None
        for start in range(0, len(rows), spec.token_chunk):
            sl = slice(start, start + spec.token_chunk)
            idx, yc, mc = rows[sl], y[sl], m[sl][:, None]
            hs, hn = h_s[idx], h_new[idx]
            gk, gc = g_kl[sl][:, None] / temperature, g_ce[sl][:, None]
            if sparse:
                log_pj, log_pt = sparse_log_probs(top_logp[idx], top_rest[idx], temperature, vocab)
                pt = torch.nan_to_num(log_pt.exp())[:, None]
                k_idx, pj = top_idx[idx].long(), log_pj.exp()
            else:
                ho = h_old[idx]
            grad_hc = torch.zeros(hs.shape, dtype=torch.float32, device=hs.device) if need_h else None
            for v0 in range(0, vocab, spec.vocab_chunk):
                v1 = min(v0 + spec.vocab_chunk, vocab)
                zs = _tile(hs, w_s, b_s, post_s, v0, v1)
                q = torch.exp(zs / temperature - lse_b[sl][:, None])
                p_mix = (1 - mc) * torch.exp(_tile(hn, w_new, b_new, post_new, v0, v1) / temperature
                                             - lse_new[sl][:, None])
                if sparse:
                    here = (k_idx >= v0) & (k_idx < v1)
                    p_mix = p_mix + mc * pt
                    p_mix.scatter_add_(1, (k_idx - v0).clamp(0, v1 - v0 - 1), mc * (pj - pt) * here)
                else:
                    p_mix = p_mix + mc * torch.exp(_tile(ho, w_old, b_old, post_old, v0, v1) / temperature
                                                   - lse_old[sl][:, None])
                grad_z = gk * (q - p_mix) + gc * torch.exp(zs - lse1_s[sl][:, None])
                here_y = (yc >= v0) & (yc < v1)
                grad_z.scatter_add_(1, (yc - v0).clamp(0, v1 - v0 - 1)[:, None], -(gc * here_y[:, None]))
                softcap, scale = post_s
                if softcap:  # z = c·tanh(u/c): dz/du = 1 − (z/c)²
                    grad_z = grad_z * (1 - (zs / softcap) ** 2)
                if scale != 1.0:
                    grad_z = grad_z * scale
                grad_z = grad_z.to(w_s.dtype)  # as autograd of the head's matmul would see it
                if need_h:
                    grad_hc += (grad_z @ w_s[v0:v1]).float()
                if need_w:
                    grad_w[v0:v1] += (grad_z.T @ hs).float()
                if need_b:
                    grad_b[v0:v1] += grad_z.float().sum(0)
            if need_h:
                grad_h[idx] = grad_hc
        return (None if grad_h is None else grad_h.to(h_s.dtype), None if grad_w is None else grad_w.to(w_s.dtype),
                None if grad_b is None else grad_b.to(b_s.dtype), *([None] * 10))


def muscle_token_loss_tiled(student_hidden: torch.Tensor, student_head: LMHead, new_hidden: torch.Tensor,
                            new_head: LMHead, old: tuple[torch.Tensor, LMHead] | TopKLogProbs, labels: torch.Tensor,
                            mask: MaskFn, temperature: float = 2.0, token_chunk: int = 1024,
                            vocab_chunk: int = 8192) -> TiledMuscleOutput:
    """MUSCLE per-token loss (paper 002 eq. 2) and the label cross-entropy from hidden states, never building
    (B, T, V) logits: the same values and gradients as `losses.muscle_token_loss` on the heads' logits.

    Args:
        student_hidden, new_hidden: (B, T, H) last hidden states (after the final norm), position t predicting
            `labels[:, t]` (shift the labels, `adaptguard.utils.labels.shifted_labels`). Only the student's
            carries gradient, into it and into `student_head`'s weight and bias.
        student_head, new_head: `LMHead`s, weight (V, H).
        old: the old teacher as `(hidden (B, T, H), LMHead)`, or its cached `TopKLogProbs` ((B, T, k) each).
        labels: (B, T), −100 = not scored.
        mask: `mask(MaskInputs) -> (B, T)`; it sees exactly what `losses.muscle_mask_inputs` gives (argmax and
            label log-probability of each model), computed here from the tiles.
        token_chunk, vocab_chunk: the tile; peak extra memory ≈ a few × token_chunk × vocab_chunk float32.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if token_chunk < 1 or vocab_chunk < 1:
        raise ValueError(f"token_chunk and vocab_chunk must be ≥ 1, got {token_chunk}, {vocab_chunk}")
    vocab, width = student_head.weight.shape
    sparse = isinstance(old, TopKLogProbs)
    heads = {"new": new_head} if sparse else {"new": new_head, "old": old[1]}
    for name, head in heads.items():
        if head.weight.shape[0] != vocab:
            raise ValueError(f"vocabulary sizes differ: student {vocab}, {name} {head.weight.shape[0]}")
    hiddens = {"student": student_hidden, "new": new_hidden, **({} if sparse else {"old": old[0]})}
    for name, h in hiddens.items():
        if h.shape[:2] != labels.shape or h.shape[-1] != (width if name == "student" else heads[name].weight.shape[1]):
            raise ValueError(f"{name} hidden states {tuple(h.shape)} do not match labels {tuple(labels.shape)} and "
                             f"the head's hidden size")
    flat = {name: h.reshape(-1, h.shape[-1]) for name, h in hiddens.items()}
    if sparse:
        k = old.logp.shape[-1]
        old_args = (None, None, None, old.logp.reshape(-1, k), old.idx.reshape(-1, k), old.rest.reshape(-1))
        old_cap = (None, 1.0)
    else:
        old_args = (flat["old"].detach(), old[1].weight.detach(), _detached(old[1].bias), None, None, None)
        old_cap = (old[1].softcap, float(old[1].scale))
    spec = _Spec(mask, float(temperature), int(token_chunk), int(vocab_chunk),
                 tuple((h.softcap, float(h.scale)) for h in (student_head, new_head)) + (old_cap,), labels)
    return TiledMuscleOutput(*_TiledMuscle.apply(
        flat["student"], student_head.weight, student_head.bias, flat["new"].detach(), new_head.weight.detach(),
        _detached(new_head.bias), *old_args, spec))


def _detached(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach()
