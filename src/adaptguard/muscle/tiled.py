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


class _Teacher(NamedTuple):
    """A frozen teacher as the tiled loss reads it: its last hidden states (N, H_t) and head, detached."""

    hidden: torch.Tensor
    head: LMHead


@dataclass(frozen=True)
class _Spec:
    """What `_TiledMuscle` reads besides the student's hidden states (N, H) and head weight and bias: no gradient
    flows into any of it. N = B·T positions, flattened."""

    mask: MaskFn
    temperature: float
    token_chunk: int
    vocab_chunk: int
    labels: torch.Tensor  # (B, T)
    student_post: tuple  # (softcap, scale) of the student's head
    new: _Teacher
    old: _Teacher | TopKLogProbs  # or its cached top-k: logp, idx (N, k), rest (N,)
    compiled: bool = False  # the per-tile folds through torch.compile

    @property
    def topk(self) -> TopKLogProbs | None:
        return self.old if isinstance(self.old, TopKLogProbs) else None


class _Scored(NamedTuple):
    """The forward's per scored token (n,) values that the backward reads: `rows` their flat positions in B·T, `y`
    their labels, `m` the mask, and the log-sum-exps (`lse1_s` the student's at temperature 1, `lse_b` at T, those of
    the teachers at T; `lse_old` 0 with a top-k cache)."""

    rows: torch.Tensor
    y: torch.Tensor
    m: torch.Tensor
    lse1_s: torch.Tensor
    lse_b: torch.Tensor
    lse_new: torch.Tensor
    lse_old: torch.Tensor


def _tile(hidden: torch.Tensor, head: LMHead, v0: int, v1: int) -> torch.Tensor:
    """float32 logits (n, v1 − v0) of the vocabulary slice [v0, v1); the matmul in the model's dtype, as its head."""
    z = hidden @ head.weight[v0:v1].T
    if head.bias is not None:
        z = z + head.bias[v0:v1]
    z = z.float() * head.scale if head.scale != 1.0 else z.float()
    return head.softcap * torch.tanh(z / head.softcap) if head.softcap else z


def _fold(max1, sum1, top_value, top1, label_logit, z_sum, max_t, sum_t, cross, z, labels, v0, temperature: float,
          student_b):
    """One vocabulary tile (n, w) folded into one model's running per-token statistics (see `_Stats`); pure, so a
    compiler can fuse its ~30 elementwise ops and reductions into a few kernels. `v0` (0-d long tensor) is the tile's
    first vocabulary index; `z_sum` / `cross` / `student_b` are None where unused (teacher / student)."""
    width = z.shape[1]
    tile_max, tile_arg = z.max(-1)
    better = tile_max > top_value  # strict: the first maximum wins, as torch.argmax
    top_value = torch.where(better, tile_max, top_value)
    top1 = torch.where(better, tile_arg + v0, top1)
    new_max = torch.maximum(max1, tile_max)
    scale = torch.exp(max1 - new_max)  # exp(−inf) = 0 on the first tile
    e1 = torch.exp(z - new_max[:, None])
    sum1 = sum1 * scale + e1.sum(-1)
    if z_sum is not None:
        z_sum = z_sum * scale + (e1 * z).sum(-1)
    offset = labels - v0
    here = (offset >= 0) & (offset < width)
    label_logit = torch.where(here, z.gather(1, offset.clamp(0, width - 1)[:, None])[:, 0], label_logit)
    a = z / temperature
    new_max_t = torch.maximum(max_t, tile_max / temperature)
    scale = torch.exp(max_t - new_max_t)
    e = torch.exp(a - new_max_t[:, None])
    sum_t = sum_t * scale + e.sum(-1)
    if cross is not None:
        cross = cross * scale + (e * (a - student_b)).sum(-1)
    return new_max, sum1, top_value, top1, label_logit, z_sum, new_max_t, sum_t, cross


_COMPILED: dict = {}


def _compiled(fn):
    """`fn` compiled once per process (dynamic shapes: the tiles' sizes vary at the edges)."""
    if fn not in _COMPILED:
        _COMPILED[fn] = torch.compile(fn, dynamic=True)
    return _COMPILED[fn]


class _Stats:
    """Running per-token statistics of one model's logits over vocabulary tiles (n rows)."""

    FIELDS = ("max1", "sum1", "top_value", "top1", "label_logit", "z_sum", "max_t", "sum_t", "cross")

    def __init__(self, n: int, device, teacher: bool, compiled: bool = False):
        def full(v):
            return torch.full((n,), v, dtype=torch.float32, device=device)

        self.max1, self.sum1 = full(-math.inf), full(0.0)  # lse of z (temperature 1): label log-prob, CE
        self.top_value, self.top1 = full(-math.inf), torch.zeros(n, dtype=torch.long, device=device)
        self.label_logit = full(0.0)
        self.z_sum = None if teacher else full(0.0)  # Σ e^(z − max1)·z: the student's entropy = lse1 − z_sum/sum1
        self.max_t, self.sum_t = full(-math.inf), full(0.0)  # lse of z/T
        self.cross = full(0.0) if teacher else None  # Σ e^(a − max_t)(a − b)
        self.fold = _compiled(_fold) if compiled else _fold

    def update(self, z: torch.Tensor, labels: torch.Tensor, v0: int, temperature: float, student_b=None) -> None:
        state = self.fold(*(getattr(self, f) for f in self.FIELDS), z, labels,
                          torch.tensor(v0, device=z.device), temperature, student_b)
        for name, value in zip(self.FIELDS, state):
            setattr(self, name, value)

    def lse1(self) -> torch.Tensor:
        return self.max1 + torch.log(self.sum1)

    def lse_t(self) -> torch.Tensor:
        return self.max_t + torch.log(self.sum_t)


def _grad_tile(zs, zn, zo, lse_b, lse_new, lse_old, lse1_s, mc, gk, gc, yc, v0, temperature: float, post: tuple,
               pt, pj, k_idx):
    """d loss / d z_s on one tile (n, w): gk·(σ(z_s/T) − p_mix) + gc·(σ(z_s) − onehot(y)), through the student's
    softcap and scale. p_mix = (1 − m)·σ(z_new/T) + m·p_old, p_old from the old tile `zo`, or, from the top-k cache,
    `pt` off the cached indices `k_idx` and `pj` on them; a teacher no token of the tile reads is None.
    Pure, so a compiler can fuse it."""
    width = zs.shape[1]
    q = torch.exp(zs / temperature - lse_b[:, None])
    # zn None: every token of the tile reads v1 (m = 1); v1 none when `zo` and `pt` are None
    p_mix = torch.zeros_like(q) if zn is None else (1 - mc) * torch.exp(zn / temperature - lse_new[:, None])
    if zo is not None:
        p_mix = p_mix + mc * torch.exp(zo / temperature - lse_old[:, None])
    elif pt is not None:
        offset = k_idx - v0
        here = (offset >= 0) & (offset < width)
        p_mix = p_mix + mc * pt
        p_mix = p_mix.scatter_add(1, offset.clamp(0, width - 1), mc * (pj - pt) * here)
    grad_z = gk * (q - p_mix) + gc * torch.exp(zs - lse1_s[:, None])
    offset = yc - v0
    here_y = (offset >= 0) & (offset < width)
    grad_z = grad_z.scatter_add(1, offset.clamp(0, width - 1)[:, None], -(gc * here_y[:, None]))
    softcap, scale = post
    if softcap:  # z = c·tanh(u/c): dz/du = 1 − (z/c)²
        grad_z = grad_z * (1 - (zs / softcap) ** 2)
    if scale != 1.0:
        grad_z = grad_z * scale
    return grad_z


class _TiledMuscle(torch.autograd.Function):
    """Forward: one pass over the vocabulary tiles → mask inputs, mask, KLs and CE. Backward: a second pass that
    recomputes the tiles and accumulates the gradients of the student's hidden states, head weight and bias."""

    @staticmethod
    def forward(ctx, h_s: torch.Tensor, w_s: torch.Tensor, b_s: torch.Tensor | None, spec: _Spec):
        labels = spec.labels
        valid = labels != -100
        rows = valid.reshape(-1).nonzero().squeeze(1)
        y = labels.reshape(-1)[rows]
        n, vocab, device = len(rows), w_s.shape[0], h_s.device
        temperature = spec.temperature
        student, new_teacher, old_teacher, topk = LMHead(w_s, b_s, *spec.student_post), spec.new, spec.old, spec.topk
        sparse = topk is not None
        out = {name: torch.zeros(n, dtype=torch.float32, device=device)
               for name in ("lse1_s", "entropy_s", "lse_b", "lse_new", "lse_old", "kl_new", "kl_old", "logp_s", "logp_new",
                            "logp_old")}
        top1 = {name: torch.zeros(n, dtype=torch.long, device=device) for name in ("s", "new", "old")}
        for start in range(0, n, spec.token_chunk):
            idx = rows[start:start + spec.token_chunk]
            yc = y[start:start + len(idx)]
            hs, hn = h_s[idx], new_teacher.hidden[idx]
            s, new = _Stats(len(idx), device, False, spec.compiled), _Stats(len(idx), device, True, spec.compiled)
            old = None if sparse else _Stats(len(idx), device, True, spec.compiled)
            if sparse:  # the student's b at the cached indices, and Σ_v b_v, for the sparse KL
                k_idx = topk.idx[idx].long()
                b_top = torch.zeros(k_idx.shape, dtype=torch.float32, device=device)
                b_sum = torch.zeros(len(idx), dtype=torch.float32, device=device)
            else:
                ho = old_teacher.hidden[idx]
            for v0 in range(0, vocab, spec.vocab_chunk):
                v1 = min(v0 + spec.vocab_chunk, vocab)
                zs = _tile(hs, student, v0, v1)
                b = zs / temperature
                s.update(zs, yc, v0, temperature)
                new.update(_tile(hn, new_teacher.head, v0, v1), yc, v0, temperature, b)
                if sparse:
                    here = (k_idx >= v0) & (k_idx < v1)
                    b_top = torch.where(here, b.gather(1, (k_idx - v0).clamp(0, v1 - v0 - 1)), b_top)
                    b_sum += b.sum(-1)
                else:
                    old.update(_tile(ho, old_teacher.head, v0, v1), yc, v0, temperature, b)
            sl = slice(start, start + len(idx))
            lse_b = s.lse_t()
            out["lse1_s"][sl], out["lse_b"][sl] = s.lse1(), lse_b
            out["entropy_s"][sl] = s.lse1() - s.z_sum / s.sum1
            out["logp_s"][sl], top1["s"][sl] = s.label_logit - s.lse1(), s.top1
            out["lse_new"][sl] = new.lse_t()
            out["kl_new"][sl] = new.cross / new.sum_t - new.lse_t() + lse_b
            out["logp_new"][sl], top1["new"][sl] = new.label_logit - new.lse1(), new.top1
            if sparse:
                logp, rest = topk.logp[idx], topk.rest[idx]
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
        ctx.save_for_backward(h_s, w_s, b_s)
        ctx.spec = spec
        ctx.scored = _Scored(rows, y, m, out["lse1_s"], out["lse_b"], out["lse_new"], out["lse_old"])
        # autograd runs backward outside the forward's autocast: the recomputed tiles and the gradient matmuls
        # must use the forward's precision (as `torch.amp.custom_bwd`, for whichever device the tensors are on)
        kind = h_s.device.type
        ctx.autocast = kind, torch.is_autocast_enabled(kind), torch.get_autocast_dtype(kind)
        student_top1, entropy = inputs.student_top1, grid(out["entropy_s"])
        ctx.mark_non_differentiable(m_grid, student_top1, entropy)
        return grid(kl), grid(ce), m_grid, student_top1, entropy

    @staticmethod
    def backward(ctx, g_kl, g_ce, _g_m, _g_top1, _g_entropy):
        kind, enabled, dtype = ctx.autocast
        with torch.autocast(kind, dtype=dtype, enabled=enabled):
            return _TiledMuscle._backward(ctx, g_kl, g_ce)

    @staticmethod
    def _backward(ctx, g_kl, g_ce):
        h_s, w_s, b_s = ctx.saved_tensors
        spec, temperature = ctx.spec, ctx.spec.temperature
        student, new_teacher, old_teacher, topk = LMHead(w_s, b_s, *spec.student_post), spec.new, spec.old, spec.topk
        sparse = topk is not None
        vocab = w_s.shape[0]
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.zeros(h_s.shape, dtype=torch.float32, device=h_s.device) if need_h else None
        grad_w = torch.zeros(w_s.shape, dtype=torch.float32, device=w_s.device) if need_w else None
        grad_b = torch.zeros(b_s.shape, dtype=torch.float32, device=b_s.device) if need_b else None
        # a token's gradient reads only the teacher its mask gives it (m is 0 or 1, `apply_mask`): with the tokens
        # ordered by teacher, a chunk recomputes only its teacher's tiles (one head matmul less per token)
        order = torch.argsort(ctx.scored.m, stable=True)
        rows, y, m, lse1_s, lse_b, lse_new, lse_old = (t[order] for t in ctx.scored)
        g_kl, g_ce = (g.reshape(-1)[rows].float() for g in (g_kl, g_ce))
        bounds = [0, int((m == 0).sum()), len(rows)]  # tokens [0, b) read v2, [b, n) v1; one sync a step
        grad_tile = _compiled(_grad_tile) if spec.compiled else _grad_tile
        for group in range(2):
            use_new, use_old = group == 0, group == 1
            for start in range(bounds[group], bounds[group + 1], spec.token_chunk):
                sl = slice(start, min(start + spec.token_chunk, bounds[group + 1]))
                idx, yc, mc = rows[sl], y[sl], m[sl][:, None]
                hs = h_s[idx]
                gk, gc = g_kl[sl][:, None] / temperature, g_ce[sl][:, None]
                pt = pj = k_idx = None
                if sparse and use_old:
                    log_pj, log_pt = sparse_log_probs(topk.logp[idx], topk.rest[idx], temperature, vocab)
                    pt = torch.nan_to_num(log_pt.exp())[:, None]
                    k_idx, pj = topk.idx[idx].long(), log_pj.exp()
                hn = new_teacher.hidden[idx] if use_new else None
                ho = old_teacher.hidden[idx] if use_old and not sparse else None
                grad_hc = torch.zeros(hs.shape, dtype=torch.float32, device=hs.device) if need_h else None
                for v0 in range(0, vocab, spec.vocab_chunk):
                    v1 = min(v0 + spec.vocab_chunk, vocab)
                    zs = _tile(hs, student, v0, v1)
                    zn = None if hn is None else _tile(hn, new_teacher.head, v0, v1)
                    zo = None if ho is None else _tile(ho, old_teacher.head, v0, v1)
                    grad_z = grad_tile(zs, zn, zo, lse_b[sl], lse_new[sl], lse_old[sl], lse1_s[sl], mc, gk, gc, yc,
                                       torch.tensor(v0, device=zs.device), temperature, spec.student_post, pt, pj,
                                       k_idx)
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
                None if grad_b is None else grad_b.to(b_s.dtype), None)  # h_s, w_s, b_s; the spec takes none


# float32 (token_chunk, vocab_chunk) tensors alive at once in a tile step (the three models' tiles, the gradient,
# the fold's temporaries): the working set the memory rule below budgets for
TILE_TENSORS = 8


def tile_sizes(tokens: int, vocab: int, free_bytes: int | None) -> tuple[int, int]:
    """The tile (token_chunk, vocab_chunk) of the tiled loss for a step of `tokens` positions.

    Without a memory figure (`free_bytes` None: a CPU), 1,024 × 8,192: measured there, larger tiles are not faster.
    On a GPU, where each tile costs a few kernel launches whatever its size, the largest tile whose working set
    (`TILE_TENSORS` float32 tiles) stays within 1/16 of the free memory and within a quarter of the (tokens, vocab)
    float32 logits the loss never builds — or within the CPU tile's working set (256 MiB), if that is larger:
    up to 4,096 tokens (TRL's `chunked_divergence` tile height) × a multiple of 1,024 vocabulary entries, fewer
    tokens where even 1,024 entries do not fit.
    """
    if free_bytes is None:
        return min(1024, max(1, tokens)), min(8192, vocab)
    budget = min(free_bytes // 16, max(tokens * vocab, TILE_TENSORS * 4 * 1024 * 8192))  # bytes
    elements = max(1, budget // (TILE_TENSORS * 4))
    token_chunk = max(1, min(tokens, 4096, elements // min(1024, vocab)))
    vocab_chunk = min(vocab, max(min(1024, vocab), elements // token_chunk // 1024 * 1024))
    return token_chunk, vocab_chunk


def muscle_token_loss_tiled(student_hidden: torch.Tensor, student_head: LMHead, new_hidden: torch.Tensor,
                            new_head: LMHead, old: tuple[torch.Tensor, LMHead] | TopKLogProbs, labels: torch.Tensor,
                            mask: MaskFn, temperature: float = 2.0, token_chunk: int | None = None,
                            vocab_chunk: int | None = None, compile: bool | None = None) -> TiledMuscleOutput:
    """MUSCLE per-token loss (Echterhoff et al. eq. 2) and the label cross-entropy from hidden states, never building
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
        token_chunk, vocab_chunk: the tile; peak extra memory ≈ `TILE_TENSORS` × token_chunk × vocab_chunk
            float32. None: `tile_sizes` (on a GPU, from its free memory).
        compile: fuse each tile's elementwise work and reductions with `torch.compile` (a few kernels per tile
            instead of ~100 launches; the first call compiles, ~20 s); None: on a CUDA device only.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    vocab, width = student_head.weight.shape
    device = student_hidden.device
    auto = tile_sizes(labels.numel(), vocab, torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None)
    token_chunk = auto[0] if token_chunk is None else token_chunk
    vocab_chunk = auto[1] if vocab_chunk is None else vocab_chunk
    if token_chunk < 1 or vocab_chunk < 1:
        raise ValueError(f"token_chunk and vocab_chunk must be ≥ 1, got {token_chunk}, {vocab_chunk}")
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
    flat = {name: h.reshape(-1, h.shape[-1]).detach() for name, h in hiddens.items()}
    if sparse:
        k = old.logp.shape[-1]
        old = TopKLogProbs(old.logp.reshape(-1, k), old.idx.reshape(-1, k), old.rest.reshape(-1))
    else:
        old = _Teacher(flat["old"], _detached(old[1]))
    compiled = student_hidden.device.type == "cuda" if compile is None else bool(compile)
    spec = _Spec(mask, float(temperature), int(token_chunk), int(vocab_chunk), labels,
                 (student_head.softcap, float(student_head.scale)), _Teacher(flat["new"], _detached(new_head)), old,
                 compiled)
    return TiledMuscleOutput(*_TiledMuscle.apply(student_hidden.reshape(-1, width), student_head.weight,
                                                 student_head.bias, spec))


def _detached(head: LMHead) -> LMHead:
    """A teacher's head without its autograd history: the tiled loss trains only the student's."""
    return LMHead(head.weight.detach(), None if head.bias is None else head.bias.detach(), head.softcap,
                  float(head.scale))
