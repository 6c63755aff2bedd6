"""The tiled MUSCLE loss (from hidden states and LM heads, never (B, T, V) logits) against the reference
`muscle_token_loss` on the heads' full logits: values, masks and gradients, for every built-in mask, uneven tiles,
soft-capping, biases, LoRA on the head, tied embeddings and a top-k cached old teacher; fp32 and bf16."""

import pytest
import torch
from test_muscle_loss import MASKS, _topk_teacher

from adaptguard.muscle.losses import muscle_token_loss, muscle_token_loss_chunked
from adaptguard.muscle.masks import student_wrong
from adaptguard.muscle.tiled import TILE_TENSORS, LMHead, muscle_token_loss_tiled, tile_sizes
from adaptguard.plugins import get_muscle_mask

B, T, H, V = 3, 5, 8, 13


def logits_of(h, head: LMHead):
    z = h @ head.weight.T + (0 if head.bias is None else head.bias)
    z = z.float() * head.scale
    return head.softcap * torch.tanh(z / head.softcap) if head.softcap else z


def setup(seed=0, dtype=torch.float32, bias=False, softcap=None, scale=1.0):
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    labels = torch.randint(0, V, (B, T), generator=g)
    labels[1, 3:] = -100
    labels[2, 0] = -100
    heads = [LMHead(rand(V, H), rand(V) if bias else None, softcap, scale) for _ in range(3)]
    hiddens = [rand(B, T, H) * 2 for _ in range(3)]
    return labels, hiddens, heads


def leaf(t):
    return None if t is None else t.detach().clone().requires_grad_(True)


def run_both(labels, hiddens, heads, mask, token_chunk, vocab_chunk, temperature=2.0):
    """(tiled outputs, reference loss, reference m, reference ce, the student leaves of each)."""
    (hs, hn, ho), (s_head, n_head, o_head) = hiddens, heads
    tiled_leaves = [leaf(hs), leaf(s_head.weight), leaf(s_head.bias)]
    ref_leaves = [leaf(hs), leaf(s_head.weight), leaf(s_head.bias)]
    student_head = LMHead(tiled_leaves[1], tiled_leaves[2], s_head.softcap, s_head.scale)
    out = muscle_token_loss_tiled(tiled_leaves[0], student_head, hn, n_head, (ho, o_head), labels,
                                  mask=get_muscle_mask(mask), temperature=temperature,
                                  token_chunk=token_chunk, vocab_chunk=vocab_chunk)
    zs = logits_of(ref_leaves[0], student_head._replace(weight=ref_leaves[1], bias=ref_leaves[2]))
    loss, m = muscle_token_loss(zs, logits_of(ho, o_head), logits_of(hn, n_head), labels, get_muscle_mask(mask),
                                temperature)
    ce = torch.nn.functional.cross_entropy(zs.reshape(-1, V), labels.reshape(-1), ignore_index=-100,
                                           reduction="none").view(B, T)
    return out, (loss, m, ce, zs), tiled_leaves, ref_leaves


def backward_both(out, ref, seed=1):
    g = torch.Generator().manual_seed(seed)
    w_kl, w_ce = torch.rand(B, T, generator=g), torch.rand(B, T, generator=g)  # non-uniform upstream gradients
    ((out.kl * w_kl).sum() + (out.ce * w_ce).sum()).backward()
    ((ref[0] * w_kl).sum() + (ref[2] * w_ce).sum()).backward()


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("token_chunk, vocab_chunk", [(1, 1), (4, 5), (100, 100), (None, None)])  # None: tile_sizes
def test_tiled_equals_reference_in_value_and_gradient(mask, token_chunk, vocab_chunk):
    labels, hiddens, heads = setup(bias=True)
    out, ref, tiled, reference = run_both(labels, hiddens, heads, mask, token_chunk, vocab_chunk)
    loss, m, ce, zs = ref
    torch.testing.assert_close(out.m, m)
    torch.testing.assert_close(out.kl, loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.ce, ce, rtol=1e-5, atol=1e-5)
    assert torch.equal(out.student_top1[labels != -100], zs.argmax(-1)[labels != -100])
    entropy = torch.distributions.Categorical(logits=zs.float()).entropy()  # independent of the tiles' algebra
    torch.testing.assert_close(out.student_entropy[labels != -100], entropy[labels != -100], rtol=1e-5, atol=1e-5)
    assert (out.kl[labels == -100] == 0).all() and (out.ce[labels == -100] == 0).all()
    assert (out.student_entropy[labels == -100] == 0).all()
    backward_both(out, ref)
    for mine, theirs, name in zip(tiled, reference, ("hidden", "weight", "bias")):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_tile_sizes_from_free_memory():
    """The tile: fixed without a memory figure; on a GPU the largest within its budget, worked by hand at the
    issue's sizes (8 × 1,024 tokens, V 131,072, 75 GB free: a quarter of the fp32 logits, 1 GiB, is the budget →
    33,554,432 float32 per tile → 4,096 × 8,192), a small step (one tile), and scarce memory (1 GB free)."""
    assert tile_sizes(8192, 131072, None) == (1024, 8192)
    assert tile_sizes(10, 500, None) == (10, 500)
    assert tile_sizes(8192, 131072, 75 * 10**9) == (4096, 8192)
    assert tile_sizes(64, 4096, 80 * 10**9) == (64, 4096)
    assert tile_sizes(8192, 131072, 10**9) == (1907, 1024)  # 62.5 MB / 32 B = 1,953,125 elements, by 1,024
    for tokens in (1, 300, 8192, 65536):
        for vocab in (50, 32000, 131072, 262144):
            for free in (10**8, 10**9, 8 * 10**10):
                t, v = tile_sizes(tokens, vocab, free)
                budget = min(free // 16, max(tokens * vocab, 2**28))
                assert 1 <= t <= min(tokens, 4096) and 1 <= v <= vocab
                if v > min(1024, vocab):  # above the floor of one 1,024-wide tile, the budget holds ...
                    assert TILE_TENSORS * 4 * t * v <= budget
                    # ... and the tile is the widest that fits: one more 1,024 columns would not
                    assert v == vocab or TILE_TENSORS * 4 * t * (v + 1024) > budget or t < min(tokens, 4096)


def test_softcapping_and_logit_scale():
    labels, hiddens, heads = setup(seed=2, softcap=3.0, scale=0.7)
    out, ref, tiled, reference = run_both(labels, hiddens, heads, "old_likelier_token", 4, 5)
    torch.testing.assert_close(out.kl, ref[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.m, ref[1])
    backward_both(out, ref)
    for mine, theirs in zip(tiled[:2], reference[:2]):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-4, atol=1e-5)


def test_lora_on_the_head_and_tied_embeddings():
    """The head weight as an expression of parameters: LoRA (W + s·B@A) whose A and B get gradients, and a
    weight tied to the input embeddings (it receives gradient from both of its uses)."""
    labels, (_, hn, ho), (_, n_head, o_head) = setup(seed=3)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, V, (B, T), generator=g)
    base = [torch.randn(V, H, generator=g), torch.randn(2, H, generator=g) * 0.3, torch.randn(V, 2, generator=g) * 0.3]
    grads = []
    for tiled in (True, False):
        emb, lora_a, lora_b = (leaf(t) for t in base)
        weight = emb + 0.5 * lora_b @ lora_a  # tied to `emb`, with LoRA on top
        hs = torch.tanh(emb[ids])  # the "decoder": hidden states from the same embeddings
        if tiled:
            out = muscle_token_loss_tiled(hs, LMHead(weight), hn, n_head, (ho, o_head), labels, student_wrong,
                                          token_chunk=4, vocab_chunk=3)
            loss = out.kl.sum() + 0.3 * out.ce.sum()
        else:
            zs = logits_of(hs, LMHead(weight))
            kl, _ = muscle_token_loss(zs, logits_of(ho, o_head), logits_of(hn, n_head), labels, student_wrong)
            loss = kl.sum() + 0.3 * torch.nn.functional.cross_entropy(zs.reshape(-1, V), labels.reshape(-1),
                                                                         ignore_index=-100, reduction="sum")
        loss.backward()
        grads.append([emb.grad, lora_a.grad, lora_b.grad])
    for mine, theirs, name in zip(*grads, ("embedding", "lora_A", "lora_B")):
        assert theirs.abs().sum() > 0
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("k", [3, V])
@pytest.mark.parametrize("mask", ["student_wrong", "old_likelier_token", "old_correct", "old_only"])
def test_cached_topk_old_teacher(k, mask):
    """A top-k cache of the old teacher joins the tiles: equal to the chunked loss on the same cache (which is
    tested equal to its dense form) in value, mask and gradient."""
    labels, (hs, hn, ho), (s_head, n_head, o_head) = setup(seed=4)
    sparse, _ = _topk_teacher(logits_of(ho, o_head), k)
    h1, h2 = leaf(hs), leaf(hs)
    out = muscle_token_loss_tiled(h1, s_head, hn, n_head, sparse, labels, get_muscle_mask(mask), token_chunk=4,
                                  vocab_chunk=5)
    loss, m = muscle_token_loss_chunked(logits_of(h2, s_head), sparse, logits_of(hn, n_head), labels,
                                        get_muscle_mask(mask), chunk_size=4)
    torch.testing.assert_close(out.m, m)
    torch.testing.assert_close(out.kl, loss, rtol=1e-5, atol=1e-5)
    w = torch.rand(B, T, generator=torch.Generator().manual_seed(6))
    (out.kl * w).sum().backward()
    (loss * w).sum().backward()
    torch.testing.assert_close(h1.grad, h2.grad, rtol=1e-4, atol=1e-5)


def test_bf16_within_stated_tolerance():
    """bf16 hidden states and heads (the matmul in bf16, the rest in float32, as the reference on the bf16 model's
    logits): loss within 1e-2 relative, gradients within 2e-2 relative (of the largest entry)."""
    labels, hiddens, heads = setup(seed=7, dtype=torch.bfloat16)
    out, ref, tiled, reference = run_both(labels, hiddens, heads, "student_wrong", 4, 5)
    torch.testing.assert_close(out.m, ref[1])
    torch.testing.assert_close(out.kl, ref[0], rtol=1e-2, atol=1e-2)
    backward_both(out, ref)
    for mine, theirs in zip(tiled[:2], reference[:2]):
        assert mine.dtype == torch.bfloat16
        scale = theirs.float().abs().max()
        assert (mine.float() - theirs.float()).abs().max() <= 2e-2 * scale


def test_bad_input():
    labels, (hs, hn, ho), (s_head, n_head, o_head) = setup()
    with pytest.raises(ValueError, match="temperature"):
        muscle_token_loss_tiled(hs, s_head, hn, n_head, (ho, o_head), labels, student_wrong, temperature=0)
    with pytest.raises(ValueError, match="vocabulary sizes differ: student 13, old 12"):
        muscle_token_loss_tiled(hs, s_head, hn, n_head, (ho, LMHead(o_head.weight[:12])), labels, student_wrong)
    with pytest.raises(ValueError, match=r"new hidden states \(3, 4, 8\) do not match labels \(3, 5\)"):
        muscle_token_loss_tiled(hs, s_head, hn[:, :4], n_head, (ho, o_head), labels, student_wrong)
    with pytest.raises(ValueError, match="vocab_chunk"):
        muscle_token_loss_tiled(hs, s_head, hn, n_head, (ho, o_head), labels, student_wrong, vocab_chunk=0)


def test_argmax_ties_go_to_the_first_token_across_tiles():
    """torch.argmax picks the first maximum; so must the tiled argmax when the tied tokens sit in different tiles
    (it feeds the student_wrong mask)."""
    labels, (hs, hn, ho), (s_head, n_head, o_head) = setup(seed=8)
    weight = s_head.weight.clone()
    weight[2] = weight[9] = 10.0  # tokens 2 and 9 tie for the largest logit wherever the hidden state is positive
    out = muscle_token_loss_tiled(hs.abs(), LMHead(weight), hn, n_head, (ho, o_head), labels, student_wrong,
                                  vocab_chunk=5)
    assert (out.student_top1[labels != -100] == 2).all()


def test_compiled_tiles_equal_the_reference():
    """`compile=True` (the default on a GPU): each tile's fold and gradient through torch.compile — the same values
    and gradients as the reference, dense (fp32, bias, soft-capping, uneven tiles) and with a top-k cached old
    teacher; fp32 tolerances as the eager path's."""
    labels, hiddens, heads = setup(seed=8, bias=True, softcap=3.0, scale=0.7)
    (hs, hn, ho), (s_head, n_head, o_head) = hiddens, heads
    tiled, reference = [leaf(hs), leaf(s_head.weight), leaf(s_head.bias)], [leaf(hs), leaf(s_head.weight),
                                                                            leaf(s_head.bias)]
    student = LMHead(tiled[1], tiled[2], s_head.softcap, s_head.scale)
    out = muscle_token_loss_tiled(tiled[0], student, hn, n_head, (ho, o_head), labels, student_wrong, token_chunk=4,
                                  vocab_chunk=5, compile=True)
    zs = logits_of(reference[0], student._replace(weight=reference[1], bias=reference[2]))
    loss, m = muscle_token_loss(zs, logits_of(ho, o_head), logits_of(hn, n_head), labels, student_wrong)
    ce = torch.nn.functional.cross_entropy(zs.reshape(-1, V), labels.reshape(-1), ignore_index=-100,
                                           reduction="none").view(B, T)
    torch.testing.assert_close(out.m, m)
    torch.testing.assert_close(out.kl, loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.ce, ce, rtol=1e-5, atol=1e-5)
    assert torch.equal(out.student_top1[labels != -100], zs.argmax(-1)[labels != -100])
    backward_both(out, (loss, m, ce, zs))
    for mine, theirs, name in zip(tiled, reference, ("hidden", "weight", "bias")):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-4, atol=1e-5, msg=name)
    # the cached old teacher
    labels, (hs, hn, ho), (s_head, n_head, o_head) = setup(seed=9)
    sparse, _ = _topk_teacher(logits_of(ho, o_head), 3)
    h1, h2 = leaf(hs), leaf(hs)
    out = muscle_token_loss_tiled(h1, s_head, hn, n_head, sparse, labels, student_wrong, token_chunk=4, vocab_chunk=5,
                                  compile=True)
    loss, m = muscle_token_loss_chunked(logits_of(h2, s_head), sparse, logits_of(hn, n_head), labels, student_wrong,
                                        chunk_size=4)
    torch.testing.assert_close(out.kl, loss, rtol=1e-5, atol=1e-5)
    w = torch.rand(B, T, generator=torch.Generator().manual_seed(6))
    (out.kl * w).sum().backward()
    (loss * w).sum().backward()
    torch.testing.assert_close(h1.grad, h2.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (benchmarks/gpu.sh runs it on one)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_cuda_the_default_path_equals_the_reference(dtype):
    """On a GPU the defaults (compiled tiles, tile sizes from the free memory) against the reference on the same card,
    at a vocabulary of several tiles: dense old teacher and top-k cached one; the tolerances of the CPU tests above."""
    b, t, h, v = 2, 96, 64, 50_000
    g = torch.Generator().manual_seed(11)
    labels = torch.randint(0, v, (b, t), generator=g)
    labels[1, 40:] = -100
    hs, hn, ho = (torch.randn(b, t, h, generator=g).to(dtype).cuda() for _ in range(3))
    s_head, n_head, o_head = (LMHead((torch.randn(v, h, generator=g) / 4).to(dtype).cuda()) for _ in range(3))
    labels = labels.cuda()
    w = torch.rand(b, t, generator=g).cuda()
    rtol, atol = (1e-5, 1e-5) if dtype == torch.float32 else (1e-2, 1e-2)
    for old in ("dense", "cached"):
        h1, h2, w1, w2 = leaf(hs), leaf(hs), leaf(s_head.weight), leaf(s_head.weight)
        zo = logits_of(ho, o_head)
        teacher = (ho, o_head) if old == "dense" else _topk_teacher(zo, 64)[0]
        out = muscle_token_loss_tiled(h1, LMHead(w1), hn, n_head, teacher, labels, student_wrong)
        zs = logits_of(h2, LMHead(w2))
        if old == "dense":
            ref, m = muscle_token_loss(zs, zo, logits_of(hn, n_head), labels, student_wrong)
        else:
            ref, m = muscle_token_loss_chunked(zs, teacher, logits_of(hn, n_head), labels, student_wrong, chunk_size=32)
        torch.testing.assert_close(out.m, m, msg=old)
        torch.testing.assert_close(out.kl, ref, rtol=rtol, atol=atol, msg=old)
        (out.kl * w).sum().backward()
        (ref * w).sum().backward()
        for mine, theirs in ((h1.grad, h2.grad), (w1.grad, w2.grad)):
            if dtype == torch.float32:
                torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5, msg=old)
            else:  # bf16: within 2e-2 of the largest entry, as test_bf16_within_stated_tolerance
                assert (mine.float() - theirs.float()).abs().max() <= 2e-2 * theirs.float().abs().max(), old


def test_backward_keeps_the_forwards_autocast():
    """Mixed precision (bf16=True) is an autocast around the forward, and autograd runs backward outside it: the
    backward's recomputed tiles and gradient matmuls must still run in bf16, as autograd's own backward of the
    reference's matmuls does (on a GPU, fp32 there made a bf16 step 5.5x SFT's). Every matrix product of the backward
    gets bf16 operands; the gradients match the reference's under the same autocast within the bf16 tolerance."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class MatmulDtypes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm):
                self.seen |= {a.dtype for a in args if isinstance(a, torch.Tensor) and a.dim() >= 2}
            return func(*args, **(kwargs or {}))

    labels, hiddens, heads = setup(seed=12)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, ref, tiled, reference = run_both(labels, hiddens, heads, "student_wrong", 4, 5)
    mode = MatmulDtypes()
    with mode:
        ((out.kl * 0.7).sum() + (out.ce * 0.3).sum()).backward()
    assert mode.seen == {torch.bfloat16}, mode.seen
    ((ref[0] * 0.7).sum() + (ref[2] * 0.3).sum()).backward()
    for mine, theirs in zip(tiled[:2], reference[:2]):
        assert (mine - theirs).abs().max() <= 2e-2 * theirs.abs().max()
