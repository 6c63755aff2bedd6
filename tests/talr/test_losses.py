import math

import pytest
import torch

from adaptguard.talr.losses import (
    dft_token_weights,
    flow_sequence_weights,
    k3_kl,
    l2_to_init,
    median,
    talr_loss_func,
    talr_tau,
    talr_token_weights,
    weighted_nll,
    wise_ft_interpolate,
)
from adaptguard.utils.labels import shifted_token_nll


def test_talr_weights_hand_worked():
    # Row 0: supervised nll 1.0 and 3.0 (mean 2.0); row 1: nll 0.5 and masked 9.0 (mean 0.5);
    # row 2: nll 4.0, 4.0, 1.0 (mean 3.0). Median of {2.0, 0.5, 3.0} = 2.0.
    nll = torch.tensor([[1.0, 3.0, 0.0], [0.5, 9.0, 0.0], [4.0, 4.0, 1.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    w, tau = talr_token_weights(nll, mask)
    assert tau.item() == pytest.approx(2.0)
    expected = torch.tensor([
        [math.exp(-0.5), math.exp(-1.5), 0.0],
        [math.exp(-0.25), 0.0, 0.0],
        [math.exp(-2.0), math.exp(-2.0), math.exp(-0.5)],
    ])
    torch.testing.assert_close(w, expected)


def test_talr_weights_floor_and_fixed_tau():
    nll = torch.tensor([[0.1, 10.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    w, tau = talr_token_weights(nll, mask, tau=1.0, weight_floor=0.05)
    assert tau.item() == 1.0
    # p^(1/τ) with τ = 1 is p itself; exp(-10) < floor
    torch.testing.assert_close(w, torch.tensor([[math.exp(-0.1), 0.05]]))


def test_talr_weights_have_no_gradient():
    nll = torch.tensor([[0.3, 2.0]], requires_grad=True)
    w, _ = talr_token_weights(nll, torch.ones(1, 2, dtype=torch.bool))
    assert not w.requires_grad


def test_median_even_count_is_mean_of_middle_values():
    assert median(torch.tensor([4.0, 1.0, 3.0, 2.0])).item() == pytest.approx(2.5)
    assert median(torch.tensor([5.0, 1.0, 3.0])).item() == pytest.approx(3.0)
    # torch.median would return the lower middle value: make sure we are not that
    assert torch.tensor([4.0, 1.0, 3.0, 2.0]).median().item() == 2.0


def test_dynamic_tau_ignores_sequences_without_supervised_tokens():
    nll = torch.tensor([[1.0, 1.0], [7.0, 7.0], [3.0, 0.0]])
    mask = torch.tensor([[1, 1], [0, 0], [1, 0]], dtype=torch.bool)
    # sequences with tokens: means 1.0 and 3.0 -> median 2.0 (the empty row must not count as 0)
    assert talr_tau(nll, mask).item() == pytest.approx(2.0)


def test_tau_kept_away_from_zero():
    nll = torch.zeros(2, 3)
    w, tau = talr_token_weights(nll, torch.ones(2, 3, dtype=torch.bool))
    assert tau.item() > 0 and torch.isfinite(w).all()
    torch.testing.assert_close(w, torch.ones(2, 3))


def test_empty_mask_gives_zero_weights_and_zero_loss():
    nll = torch.rand(2, 4, requires_grad=True)
    mask = torch.zeros(2, 4, dtype=torch.bool)
    w, tau = talr_token_weights(nll, mask)
    assert torch.isnan(tau)
    assert (w == 0).all()
    loss = weighted_nll(nll, w, mask.sum())
    assert loss.item() == 0.0
    loss.backward()
    assert torch.isfinite(nll.grad).all()


@pytest.mark.parametrize("floor", [0.0, -0.1, 1.5])
def test_bad_weight_floor(floor):
    with pytest.raises(ValueError, match="weight_floor"):
        talr_token_weights(torch.ones(1, 1), torch.ones(1, 1, dtype=torch.bool), weight_floor=floor)


@pytest.mark.parametrize("tau", [0.0, -1.0])
def test_bad_tau(tau):
    with pytest.raises(ValueError, match="tau"):
        talr_token_weights(torch.ones(1, 1), torch.ones(1, 1, dtype=torch.bool), tau=tau)


def test_weighted_nll_divides_by_given_count():
    nll = torch.tensor([[1.0, 2.0], [3.0, 0.0]])
    w = torch.tensor([[0.5, 1.0], [0.1, 0.0]])
    assert weighted_nll(nll, w, 10).item() == pytest.approx((0.5 + 2.0 + 0.3) / 10)


def test_dft_weights_are_probabilities():
    nll = torch.tensor([[0.0, math.log(2.0)]])
    w = dft_token_weights(nll, torch.tensor([[True, True]]))
    torch.testing.assert_close(w, torch.tensor([[1.0, 0.5]]))


def test_k3_kl_matches_formula_and_is_nonnegative():
    policy = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    ref = torch.log(torch.tensor([[0.25, 0.4, 0.9]]))
    mask = torch.tensor([[True, True, False]])
    kl = k3_kl(policy, ref, mask)
    r = torch.tensor([0.5, 2.0])
    expected = r - torch.log(r) - 1
    torch.testing.assert_close(kl[0, :2], expected)
    assert kl[0, 2] == 0 and (kl >= 0).all()


def test_k3_is_unbiased_for_kl():
    # E_{x~π}[r − log r − 1] = KL(π‖ref) for r = ref/π
    pi = torch.tensor([0.6, 0.3, 0.1])
    ref = torch.tensor([0.2, 0.5, 0.3])
    per_x = k3_kl(pi.log()[None], ref.log()[None], torch.ones(1, 3, dtype=torch.bool))[0]
    kl = (pi * (pi / ref).log()).sum()
    assert (pi * per_x).sum().item() == pytest.approx(kl.item(), rel=1e-5)


def test_l2_to_init():
    p = [torch.tensor([1.0, 2.0]), torch.tensor([[3.0]])]
    p0 = [torch.tensor([0.0, 2.0]), torch.tensor([[1.0]])]
    assert l2_to_init(p, p0).item() == pytest.approx(1.0 + 4.0)


def test_flow_weights_use_median_tau():
    seq = torch.tensor([1.0, 2.0, 3.0, 4.0])
    w, tau = flow_sequence_weights(seq)
    assert tau.item() == pytest.approx(2.5)
    torch.testing.assert_close(w, torch.exp(-seq / 2.5))


def test_wise_ft_interpolation():
    mixed = wise_ft_interpolate({"a": torch.tensor([0.0, 2.0])}, {"a": torch.tensor([4.0, 4.0])}, 0.25)
    torch.testing.assert_close(mixed["a"], torch.tensor([1.0, 2.5]))
    with pytest.raises(ValueError, match="alpha"):
        wise_ft_interpolate({}, {}, 1.5)


def test_talr_loss_func_matches_manual_computation():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    labels = torch.randint(0, 11, (2, 5))
    labels[0, :2] = -100
    nll, mask = shifted_token_nll(logits, labels)
    # independent: log_softmax + gather
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, labels[:, 1:].clamp(min=0)[..., None])[..., 0]
    torch.testing.assert_close(nll, torch.where(mask, -logp, torch.zeros_like(logp)))

    class Out:
        pass

    out = Out()
    out.logits = logits
    loss = talr_loss_func(tau=0.7)(out, labels)
    w = torch.exp(-nll / 0.7).clamp(min=0.01) * mask
    assert loss.item() == pytest.approx(((w * nll).sum() / mask.sum()).item(), rel=1e-6)
