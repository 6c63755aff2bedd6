import math

import pytest
import torch

from adaptguard.muscle.losses import (
    apply_mask,
    muscle_mask_inputs,
    muscle_token_loss,
    muscle_token_loss_chunked,
)
from adaptguard.muscle.masks import student_wrong
from adaptguard.plugins import get_muscle_mask

MASKS = ["student_wrong", "old_likelier_token", "old_likelier_sequence", "old_correct", "old_only", "new_only"]


def kl(p, q):
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))


def softmax(z, t=1.0):
    e = [math.exp(v / t) for v in z]
    return [v / sum(e) for v in e]


def test_hand_worked_single_token():
    zs, zo, zn = [2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 1.0]
    labels = torch.tensor([[1, -100]])
    t = 2.0
    logits = [torch.tensor([[z, [0.0, 0.0, 0.0]]]) for z in (zs, zo, zn)]
    loss, m = muscle_token_loss(*logits, labels, mask=student_wrong, temperature=t)
    # student argmax 0 != label 1: wrong -> m = 1 -> KL(old || student)
    assert m.tolist() == [[1.0, 0.0]]
    assert loss[0, 0].item() == pytest.approx(kl(softmax(zo, t), softmax(zs, t)), rel=1e-5)
    assert loss[0, 1].item() == 0.0
    loss, m = muscle_token_loss(*logits, labels, mask=get_muscle_mask("new_only"), temperature=t)
    assert m.sum() == 0 and loss[0, 0].item() == pytest.approx(kl(softmax(zn, t), softmax(zs, t)), rel=1e-5)


def test_masks_follow_their_definitions():
    torch.manual_seed(0)
    s, o, n = (torch.randn(2, 6, 7) for _ in range(3))
    labels = torch.randint(0, 7, (2, 6))
    labels[0, :2] = -100
    x = muscle_mask_inputs(s, o, n, labels)
    valid = labels != -100
    lo = torch.log_softmax(o, -1).gather(-1, labels.clamp(min=0)[..., None])[..., 0]
    ln = torch.log_softmax(n, -1).gather(-1, labels.clamp(min=0)[..., None])[..., 0]
    expected = {
        "student_wrong": s.argmax(-1) != labels,
        "old_correct": o.argmax(-1) == labels,
        "old_likelier_token": ln < lo,
        "old_likelier_sequence": ((ln * valid).sum(-1) < (lo * valid).sum(-1))[:, None].expand(2, 6),
        "old_only": torch.ones(2, 6, dtype=torch.bool),
        "new_only": torch.zeros(2, 6, dtype=torch.bool),
    }
    for name, want in expected.items():
        torch.testing.assert_close(apply_mask(get_muscle_mask(name), x), (want & valid).float(), msg=name)


def test_a_mask_asking_for_what_masks_are_not_given_is_refused_by_name():
    """A plugin mask written for full logits fails with the field it asked for and the fields it can have; an
    AttributeError of the mask's own making is left as it is."""
    torch.manual_seed(0)
    x = muscle_mask_inputs(*(torch.randn(1, 3, 5) for _ in range(3)), torch.randint(0, 5, (1, 3)))

    def wants_logits(inputs):
        return inputs.old_logits.argmax(-1) == inputs.labels

    with pytest.raises(ValueError, match=r"'wants_logits' reads 'old_logits'.*labels, valid, student_top1"):
        apply_mask(wants_logits, x)

    def buggy(inputs):
        return inputs.labels.no_such_tensor_method()

    with pytest.raises(AttributeError, match="no_such_tensor_method"):
        apply_mask(buggy, x)


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_chunked_matches_reference_in_value_and_gradient(mask, chunk):
    torch.manual_seed(1)
    old, new = torch.randn(3, 5, 13), torch.randn(3, 5, 13)
    labels = torch.randint(0, 13, (3, 5))
    labels[1, 3:] = -100
    labels[2, 0] = -100
    s_ref = torch.randn(3, 5, 13, requires_grad=True)
    s_chk = s_ref.detach().clone().requires_grad_(True)
    loss_ref, m_ref = muscle_token_loss(s_ref, old, new, labels, mask=get_muscle_mask(mask), temperature=2.0)
    loss_chk, m_chk = muscle_token_loss_chunked(s_chk, old, new, labels, mask=get_muscle_mask(mask), temperature=2.0,
                                                chunk_size=chunk)
    torch.testing.assert_close(m_chk, m_ref)
    torch.testing.assert_close(loss_chk, loss_ref, rtol=1e-5, atol=1e-6)
    weights = torch.rand(3, 5)  # a non-uniform upstream gradient
    (loss_ref * weights).sum().backward()
    (loss_chk * weights).sum().backward()
    torch.testing.assert_close(s_chk.grad, s_ref.grad, rtol=1e-5, atol=1e-6)
    assert (loss_ref[labels == -100] == 0).all() and (m_ref[labels == -100] == 0).all()


def test_loss_is_zero_when_teachers_equal_student():
    z = torch.randn(2, 4, 9)
    labels = torch.randint(0, 9, (2, 4))
    loss, _ = muscle_token_loss_chunked(z.clone().requires_grad_(True), z, z, labels, student_wrong, chunk_size=2)
    assert loss.abs().max().item() < 1e-6


def test_bad_input():
    z = torch.randn(1, 2, 5)
    labels = torch.tensor([[1, 2]])
    with pytest.raises(ValueError, match="known masks: .*student_wrong"):
        get_muscle_mask("nope")
    with pytest.raises(ValueError, match="temperature"):
        muscle_token_loss_chunked(z, z, z, labels, student_wrong, temperature=0.0)
    with pytest.raises(ValueError, match="vocabulary sizes differ"):
        muscle_token_loss_chunked(z, torch.randn(1, 2, 6), z, labels, student_wrong)
    with pytest.raises(ValueError, match="MUSCLE mask 'flat' returned shape"):  # a plugin's mask of the wrong shape
        def flat(x):
            return x.valid.reshape(-1)
        muscle_token_loss(z, z, z, labels, flat)


def _topk_teacher(logits, k):
    from adaptguard.muscle.losses import TopKLogProbs

    logp = torch.log_softmax(logits, -1)
    top, idx = logp.topk(k, -1)
    vocab = logits.shape[-1]
    rest = torch.log1p(-top.exp().sum(-1).clamp(max=1.0)) if k < vocab else torch.full(top.shape[:-1], float("-inf"))
    dense = torch.full_like(logp, 0.0) + ((rest - math.log(vocab - k))[..., None] if k < vocab else float("-inf"))
    dense = dense.scatter(-1, idx, top)
    return TopKLogProbs(top, idx, rest), dense


@pytest.mark.parametrize("k", [3, 13])
@pytest.mark.parametrize("mask", ["student_wrong", "old_likelier_token", "old_correct", "old_only"])
def test_sparse_topk_teacher_equals_its_dense_form(k, mask):
    torch.manual_seed(4)
    old_logits, new = torch.randn(2, 6, 13), torch.randn(2, 6, 13)
    labels = torch.randint(0, 13, (2, 6))
    labels[0, :2] = -100
    sparse, dense = _topk_teacher(old_logits, k)
    s1 = torch.randn(2, 6, 13, requires_grad=True)
    s2 = s1.detach().clone().requires_grad_(True)
    l1, m1 = muscle_token_loss_chunked(s1, sparse, new, labels, mask=get_muscle_mask(mask), chunk_size=4)
    l2, m2 = muscle_token_loss_chunked(s2, dense, new, labels, mask=get_muscle_mask(mask), chunk_size=4)
    torch.testing.assert_close(m1, m2)
    torch.testing.assert_close(l1, l2, rtol=1e-5, atol=1e-6)
    w = torch.rand(2, 6)
    (l1 * w).sum().backward()
    (l2 * w).sum().backward()
    torch.testing.assert_close(s1.grad, s2.grad, rtol=1e-5, atol=1e-6)
    if k == 13:  # the full vocabulary is the exact teacher
        l3, _ = muscle_token_loss(s2.detach(), old_logits, new, labels, mask=get_muscle_mask(mask))
        torch.testing.assert_close(l1.detach(), l3, rtol=1e-5, atol=1e-6)
