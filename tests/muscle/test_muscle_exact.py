"""The exact loss from teacher vectors (issue 64): KL(q ‖ softmax(z/T)) = LSE(z/T) − h·Wᵀq/T − H(q) with a frozen head —
value and gradient equal to the dense reference (`losses.muscle_token_loss` and a cross-entropy on full logits) for
every mask, recipe weight, teacher placement (cached vectors or online hidden states), head bias and logit scale;
torch's gradcheck in float64; what is not reducible is refused."""

import pytest
import torch
from in_process import run_cli

from adaptguard.muscle.exact import (
    check_reducible,
    exact_token_loss,
    mask_weights,
    stack,
    teacher_vectors,
)
from adaptguard.muscle.losses import muscle_token_loss
from adaptguard.muscle.masks import MASKS, focal_item_weights
from adaptguard.muscle.tiled import LMHead

B, T, H, V = 3, 7, 12, 53


def setup(seed=0, bias=False, scale=1.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dtype)  # noqa: E731
    head = LMHead(rand(V, H) * 0.5, rand(V) * 0.3 if bias else None, None, scale)
    old_head = LMHead(rand(V, H) * 0.5, None, None, 1.0)  # v1 on another base: its own head
    labels = torch.randint(0, V, (B, T), generator=g)
    labels[0, :2] = -100
    labels[2, -1] = -100
    h_s, h_old, h_new = rand(B, T, H), rand(B, T, H), rand(B, T, H)
    # the student's argmax is the label on some tokens, so student_wrong is neither all 0 nor all 1
    labels[1, :4] = logits(h_s, head)[1, :4].argmax(-1)
    return head, old_head, labels, h_s, h_old, h_new


def logits(h, head):
    z = h @ head.weight.T
    if head.bias is not None:
        z = z + head.bias
    return z * head.scale


def reference(mask, head, old_head, labels, h_s, h_old, h_new, temperature, ce_weight, item_weight):
    """The dense reference: MUSCLE's per-token KL mix on full logits, item weights, and the cross-entropy."""
    z_s = logits(h_s, head)
    per_token, m = muscle_token_loss(z_s, logits(h_old, old_head), logits(h_new, head), labels, mask, temperature)
    value = (item_weight * per_token).sum()
    if ce_weight:
        ce = torch.nn.functional.cross_entropy(z_s.reshape(-1, V).float(), labels.reshape(-1), ignore_index=-100,
                                               reduction="sum")
        value = value + ce_weight * ce
    return value, m


def exact(mask, head, old_head, labels, h_s, h_old, h_new, temperature, ce_weight, item_weight, placement):
    scored = (labels.reshape(-1) != -100).nonzero()[:, 0]
    y = labels.reshape(-1)[scored]
    hs = h_s.reshape(-1, H)[scored]
    ho, hn = h_old.reshape(-1, H)[scored], h_new.reshape(-1, H)[scored]
    old = teacher_vectors(ho, old_head, head, y, temperature)
    new = teacher_vectors(hn, head, head, y, temperature)
    weights = mask_weights(mask, labels, scored, old, new, item_weight.reshape(-1)[scored])
    kwargs = {"cached": stack([old]), "online": ((hn, head),)} if placement == "old cached" else \
        {"cached": stack([old, new])} if placement == "both cached" else {"online": ((ho, old_head), (hn, head))}
    ce = None if not ce_weight else torch.full((len(y),), float(ce_weight), dtype=torch.float32)
    out = exact_token_loss(hs, head, y, weights, temperature=temperature, ce_weight=ce, token_chunk=5, **kwargs)
    return out.loss.sum(), out


@pytest.mark.parametrize("mask_name", sorted(MASKS))
@pytest.mark.parametrize("placement", ["old cached", "both cached", "online"])
def test_value_and_gradient_equal_the_dense_reference_for_every_mask(mask_name, placement):
    head, old_head, labels, h_s, h_old, h_new = setup(seed=sorted(MASKS).index(mask_name))
    mask = MASKS[mask_name]
    item_weight = torch.ones(B, T)
    h1 = h_s.clone().requires_grad_()
    want, m = reference(mask, head, old_head, labels, h1, h_old, h_new, 2.0, 1.0, item_weight)
    want.backward()
    h2 = h_s.clone().requires_grad_()
    got, out = exact(mask, head, old_head, labels, h2, h_old, h_new, 2.0, 1.0, item_weight, placement)
    got.backward()
    assert got.item() == pytest.approx(want.item(), rel=1e-5, abs=1e-5)
    torch.testing.assert_close(h2.grad, h1.grad, rtol=1e-5, atol=1e-6)
    scored = labels.reshape(-1) != -100
    assert torch.equal(out.weights[:, 0], m.reshape(-1)[scored])  # the same mask decisions
    if mask_name == "student_wrong":  # it read the student's argmax from the loss's own pass
        assert 0 < m[labels != -100].mean() < 1


@pytest.mark.parametrize("recipe", ["kd", "focal"])
def test_recipe_weights_kd_and_focal_with_bias_scale_and_temperature_one(recipe):
    head, old_head, labels, h_s, h_old, h_new = setup(seed=5, bias=True, scale=0.7)
    mask = MASKS["old_only"]
    from adaptguard.muscle.losses import muscle_mask_inputs

    inputs = muscle_mask_inputs(logits(h_s, head), logits(h_old, old_head), logits(h_new, head), labels)
    beta = 5.0 if recipe == "focal" else 0.0
    item = focal_item_weights(inputs, 1.0, beta)[:, None].expand(B, T) * 0.5  # λ = 0.5
    for temperature in (1.0, 3.0):
        h1, h2 = h_s.clone().requires_grad_(), h_s.clone().requires_grad_()
        want, _ = reference(mask, head, old_head, labels, h1, h_old, h_new, temperature, 1.0, item)
        want.backward()
        got, _ = exact(mask, head, old_head, labels, h2, h_old, h_new, temperature, 1.0, item, "old cached")
        got.backward()
        assert got.item() == pytest.approx(want.item(), rel=1e-5)
        torch.testing.assert_close(h2.grad, h1.grad, rtol=1e-5, atol=1e-6)


def test_gradcheck_in_float64():
    head, old_head, labels, h_s, h_old, h_new = setup(seed=9, bias=True, scale=1.3, dtype=torch.float64)
    scored = (labels.reshape(-1) != -100).nonzero()[:, 0]
    y = labels.reshape(-1)[scored]
    ho, hn = h_old.reshape(-1, H)[scored], h_new.reshape(-1, H)[scored]
    old, new = teacher_vectors(ho, old_head, head, y, 2.0), teacher_vectors(hn, head, head, y, 2.0)
    weights = mask_weights(MASKS["old_likelier_token"], labels, scored, old, new, torch.ones(len(y), dtype=torch.float64))
    ce = torch.full((len(y),), 0.5, dtype=torch.float64)

    def f(h):
        return exact_token_loss(h, head, y, weights, cached=stack([old]), online=((hn, head),), ce_weight=ce,
                                token_chunk=4).loss

    assert torch.autograd.gradcheck(f, (h_s.reshape(-1, H)[scored].clone().requires_grad_(),), eps=1e-6, atol=1e-6)


def test_bf16_stays_within_its_stated_tolerance():
    """bf16 hidden states and head (the matmuls in bf16, the rest in float32): within 2 % of the float32 value."""
    head, old_head, labels, h_s, h_old, h_new = setup(seed=3)
    item = torch.ones(B, T)
    want, _ = exact(MASKS["student_wrong"], head, old_head, labels, h_s, h_old, h_new, 2.0, 1.0, item, "old cached")
    bf = lambda hd: LMHead(hd.weight.bfloat16(), None, None, hd.scale)  # noqa: E731
    got, _ = exact(MASKS["old_likelier_token"], bf(head), bf(old_head), labels, h_s.bfloat16(), h_old.bfloat16(),
                   h_new.bfloat16(), 2.0, 1.0, item, "old cached")
    ref, _ = exact(MASKS["old_likelier_token"], head, old_head, labels, h_s, h_old, h_new, 2.0, 1.0, item, "old cached")
    assert got.item() == pytest.approx(ref.item(), rel=2e-2)


def test_what_is_not_reducible_is_refused():
    head, _, labels, h_s, *_ = setup()
    assert "soft-caps" in check_reducible(LMHead(head.weight, None, 30.0, 1.0))
    assert "trained" in check_reducible(LMHead(head.weight.clone().requires_grad_(), None, None, 1.0))
    with pytest.raises(ValueError, match="soft-caps its logits .*; use the tiled loss"):
        exact_token_loss(h_s.reshape(-1, H), LMHead(head.weight, None, 30.0, 1.0), labels.reshape(-1),
                         lambda rows, s: torch.zeros(len(rows), 0))

    def sequence_of_student(x):  # reads the student across tokens: not per token
        return (x.student_top1 != x.labels).any(-1, keepdim=True).expand_as(x.labels)

    scored = (labels.reshape(-1) != -100).nonzero()[:, 0]
    y = labels.reshape(-1)[scored]
    v = teacher_vectors(h_s.reshape(-1, H)[scored], head, head, y, 2.0)
    with pytest.raises(ValueError, match="reads the student's answer and is not marked per_token"):
        mask_weights(sequence_of_student, labels, scored, v, v, torch.ones(len(y)))


# ------------------------------------------------------------------------------ the trainer and the exact cache
def test_the_exact_cache_gives_the_online_loss_and_is_refused_for_another_head_or_temperature(embedded_path, update,
                                                                                                tiny_v2_path, tmp_path):
    """`cache-logits --kind vectors`: v1 read once into m = Wᵀq vectors; MUSCLETrainer's loss from the cache equals the
    loss with v1 online (float32 vectors, the default: 1e-5; bfloat16: 1e-3), m is stored in the dtype asked, and a
    cache built at another temperature or for another output layer is refused in one line."""
    import json

    from datasets import Dataset
    from safetensors import safe_open
    from test_compat_trainer import make_trainer
    from trainer_rows import ROWS, compat_args
    from transformers import AutoTokenizer

    from adaptguard import MUSCLETrainer

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    tok = AutoTokenizer.from_pretrained(embedded_path)
    online = make_trainer(embedded_path, update, tmp_path / "online", ce_weight=0.3, mask="old_likelier_token")
    assert online._exact
    batch = next(iter(online.get_train_dataloader()))
    online.model.train()
    want = online.compute_loss(online.model, dict(batch)).item()
    for dtype, rel in (("float32", 1e-5), ("bfloat16", 1e-3)):
        cache = tmp_path / f"cache-{dtype}"
        proc = run_cli("cache-logits", "--kind", "vectors", "--old-model", update / "v1_task", "--tokenizer",
                       embedded_path, "--student-model", embedded_path, "--dataset", rows, "--out", cache, "--dtype",
                       dtype)
        assert proc.returncode == 0, proc.stderr[-3000:]
        meta = json.loads((cache / "cache.json").read_text())
        assert meta["kind"] == "vectors" and meta["temperature"] == 2.0 and meta["rows"] == len(ROWS)
        with safe_open(str(cache / meta["shards"][0]), framework="pt") as f:
            m = f.get_tensor("m")
            assert str(m.dtype) == f"torch.{dtype}" and m.shape[1] == meta["hidden_size"]
        cached = MUSCLETrainer(model=str(embedded_path), args=compat_args(tmp_path / f"c-{dtype}", update / "v2_adapter",
                                                                          old_logits_cache=str(cache), ce_weight=0.3,
                                                                          mask="old_likelier_token"),
                               train_dataset=Dataset.from_list(ROWS), processing_class=tok)
        assert cached.old_model is None and cached._exact
        cached.model.train()
        assert cached.compute_loss(cached.model, dict(batch)).item() == pytest.approx(want, rel=rel)
    hot = MUSCLETrainer(model=str(embedded_path), args=compat_args(tmp_path / "hot", update / "v2_adapter",
                                                                   old_logits_cache=str(cache), temperature=1.0),
                        train_dataset=Dataset.from_list(ROWS), processing_class=tok)
    with pytest.raises(ValueError, match="built at temperature 2.0, the training uses 1.0"):
        hot.compute_loss(hot.model, dict(batch))
    other = MUSCLETrainer(model=str(tiny_v2_path), args=compat_args(tmp_path / "other", None,  # another base's head
                                                                    old_logits_cache=str(cache)),
                          peft_config=__import__("peft").LoraConfig(r=2, target_modules=["q_proj"],
                                                                    task_type="CAUSAL_LM"),
                          train_dataset=Dataset.from_list(ROWS), processing_class=tok)
    with pytest.raises(ValueError, match="built for another output layer"):
        other.compute_loss(other.model, dict(batch))


def kernel_inputs(mask, head, old_head, labels, h_s, h_old, h_new, temperature, item_weight):
    scored = (labels.reshape(-1) != -100).nonzero()[:, 0]
    y = labels.reshape(-1)[scored]
    ho, hn = h_old.reshape(-1, H)[scored], h_new.reshape(-1, H)[scored]
    old, new = teacher_vectors(ho, old_head, head, y, temperature), teacher_vectors(hn, head, head, y, temperature)
    weights = mask_weights(mask, labels, scored, old, new, item_weight.reshape(-1)[scored])
    return scored, y, weights, stack([old, new])


@pytest.mark.parametrize("mask_name", sorted(set(MASKS) - {"student_wrong"}))
def test_cut_cross_entropy_path_equals_the_dense_reference(mask_name, monkeypatch):
    """The kernel path (cut-cross-entropy's own reference implementation, as on a machine without CUDA; torch.compile
    off) gives the dense reference's value and gradient: LSE from a hard-label cross-entropy plus z_y is exact."""
    pytest.importorskip("cut_cross_entropy")
    import cut_cross_entropy.torch_compile as reference_impl

    from adaptguard.muscle.exact import kernel_token_loss, lse_kernel_reason

    # torch.compile off: the reference implementation's own function, run eagerly
    monkeypatch.setattr(reference_impl, "torch_compile_linear_cross_entropy_apply",
                        reference_impl.torch_compile_linear_cross_entropy_apply.__wrapped__)
    head, old_head, labels, h_s, h_old, h_new = setup(seed=11, scale=0.8)
    mask, item = MASKS[mask_name], torch.full((B, T), 0.5)
    for temperature, ce_weight in ((2.0, 1.0), (1.0, 0.3), (3.0, 0.0)):
        h1, h2 = h_s.clone().requires_grad_(), h_s.clone().requires_grad_()
        want, _ = reference(mask, head, old_head, labels, h1, h_old, h_new, temperature, ce_weight, item)
        want.backward()
        scored, y, weights, cached = kernel_inputs(mask, head, old_head, labels, h_s, h_old, h_new, temperature, item)
        assert not weights.reads_student and lse_kernel_reason(head, weights.reads_student) is None
        ce = torch.full((len(y),), ce_weight) if ce_weight else None
        loss, kl, ce_part = kernel_token_loss(h2.reshape(-1, H)[scored], head, y, weights(torch.arange(len(y)), None),
                                              cached, temperature=temperature, ce_weight=ce)
        loss.sum().backward()
        assert loss.sum().item() == pytest.approx(want.item(), rel=1e-5, abs=1e-5)
        torch.testing.assert_close(h2.grad, h1.grad, rtol=1e-5, atol=1e-6)
        assert (ce_part > 0).all() if ce_weight else (ce_part == 0).all()


def test_cut_cross_entropy_path_refuses_what_it_cannot_serve():
    pytest.importorskip("cut_cross_entropy")
    from adaptguard.muscle.exact import lse_kernel_reason

    head, *_ = setup(bias=True)
    assert "bias" in lse_kernel_reason(head, False)
    assert "student's answer" in lse_kernel_reason(LMHead(head.weight, None, None, 1.0), True)
    head, old_head, labels, h_s, h_old, h_new = setup()
    *_, weights, _ = kernel_inputs(MASKS["student_wrong"], head, old_head, labels, h_s, h_old, h_new, 2.0,
                                   torch.ones(B, T))
    assert weights.reads_student
