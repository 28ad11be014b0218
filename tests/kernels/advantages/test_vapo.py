"""VAPO pieces (advantages/vapo.py)."""

import pytest
import torch
from torch.testing import assert_close

from policylab.kernels.advantages import gae, length_adaptive_lambda, mc_returns, positive_nll, vapo_advantages
from policylab.errors import NonFiniteError, PolicylabError, ShapeError

F64 = torch.float64


def test_length_adaptive_lambda_hand_values_and_clamp_count():
    # α = 0.05: λ(100) = 1 − 1/5 = 0.8 ; λ(1000) = 1 − 1/50 = 0.98 ; λ(20) = 1 − 1/1 = 0
    # λ(19) = 1 − 1/0.95 = −0.0526 → clamped to 0 ; λ(0) = −inf → clamped to 0
    lam, n = length_adaptive_lambda(torch.tensor([100, 1000, 20, 19, 0]))
    assert_close(lam, torch.tensor([0.8, 0.98, 0.0, 0.0, 0.0]), rtol=0, atol=1e-6)
    assert n == 2 and isinstance(n, int)
    lam64, n64 = length_adaptive_lambda(torch.tensor([40.0], dtype=F64), alpha=0.1)
    assert lam64.dtype == F64 and n64 == 0
    assert_close(lam64, torch.tensor([0.75], dtype=F64), rtol=0, atol=1e-12)  # 1 − 1/4


def test_lambda_bad_inputs():
    with pytest.raises(PolicylabError, match="`alpha` must be a finite number > 0"):
        length_adaptive_lambda(torch.tensor([10]), alpha=0.0)
    with pytest.raises(PolicylabError, match="`lengths` must be >= 0"):
        length_adaptive_lambda(torch.tensor([10, -1]))
    with pytest.raises(ShapeError, match="`lengths` must be a \\[B\\]"):
        length_adaptive_lambda(torch.tensor([[10]]))
    with pytest.raises(NonFiniteError, match="`lengths`"):
        length_adaptive_lambda(torch.tensor([float("nan")]))


def case(seed=0):
    g = torch.Generator().manual_seed(seed)
    B, T = 3, 10
    r = torch.zeros(B, T, dtype=F64)
    lengths = torch.tensor([4, 8, 10])
    mask = torch.arange(T) < lengths.unsqueeze(1)
    r[torch.arange(B), lengths - 1] = torch.tensor([1.0, 0.0, 1.0], dtype=F64)  # terminal reward
    v = torch.rand(B, T, generator=g, dtype=F64)
    return r, v, mask


def test_policy_advantages_use_per_sequence_lambda():
    r, v, mask = case()
    # α = 0.25: λ(4) = 1 − 1/1 = 0, λ(8) = 1 − 1/2 = 0.5, λ(10) = 1 − 1/2.5 = 0.6
    adv, _, info = vapo_advantages(r, v, mask, alpha=0.25)
    for b, lam in enumerate([0.0, 0.5, 0.6]):
        ref, _ = gae(r[b : b + 1], v[b : b + 1], mask[b : b + 1], gamma=1.0, lam=lam)
        assert_close(adv[b : b + 1], ref)
    assert_close(info["lam_policy_mean"], torch.tensor(1.1 / 3, dtype=F64))
    assert_close(info["lam_policy_min"], torch.tensor(0.0, dtype=F64))
    assert info["n_lambda_clamped"].item() == 0


def test_critic_targets_never_depend_on_policy_lambda():
    r, v, mask = case(1)
    _, ret_a, _ = vapo_advantages(r, v, mask, alpha=0.05)
    adv_b, ret_b, _ = vapo_advantages(r, v, mask, alpha=0.9)
    adv_a, _, _ = vapo_advantages(r, v, mask, alpha=0.05)
    assert_close(ret_a, ret_b, rtol=0, atol=0)
    assert (adv_a - adv_b).abs().max() > 1e-3  # the policy side did change
    # λ_critic = 1, γ = 1: targets are the Monte-Carlo returns
    assert_close(ret_a, mc_returns(r, mask, gamma=1.0))


def test_mc_returns_hand_case_with_hole():
    # valid tokens 0, 2, 3 (1 is masked, holds 5.0 that must not count); r = [0, _, 0, 1], γ = 0.9
    # R_3 = 1 ; R_2 = 0 + 0.9·1 = 0.9 ; R_0 = 0 + 0.9·0.9 = 0.81
    r = torch.tensor([[0.0, 5.0, 0.0, 1.0]], dtype=F64)
    m = torch.tensor([[True, False, True, True]])
    assert_close(mc_returns(r, m, gamma=0.9), torch.tensor([[0.81, 0.0, 0.9, 1.0]], dtype=F64), rtol=0, atol=1e-12)


def test_positive_nll_touches_correct_responses_only():
    nan = float("nan")
    logp = torch.tensor([[-0.5, -1.0, nan], [-2.0, nan, -3.0]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    correct = torch.tensor([True, False])
    loss = positive_nll(logp, mask, correct)
    # row 0 correct: −lp on its 2 valid tokens; row 1 wrong: all 0 (its NaN never counts)
    assert_close(loss.detach(), torch.tensor([[0.5, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=F64), rtol=0, atol=0)
    loss.sum().backward()
    assert_close(logp.grad, torch.tensor([[-1.0, -1.0, 0.0], [0.0, 0.0, 0.0]], dtype=F64), rtol=0, atol=0)


def test_positive_nll_bad_inputs():
    logp = torch.zeros(2, 3)
    mask = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ShapeError, match="`correct` must be a bool"):
        positive_nll(logp, mask, torch.tensor([1.0, 0.0]))
    with pytest.raises(ShapeError, match=r"`correct` must be \[B\] = \(2,\)"):
        positive_nll(logp, mask, torch.tensor([True]))
    bad = logp.clone()
    bad[0, 2] = float("-inf")
    with pytest.raises(NonFiniteError, match=r"`logp`.*index \[0, 2\]"):
        positive_nll(bad, mask, torch.tensor([True, False]))
    with pytest.raises(ShapeError, match="`mask` has shape"):
        positive_nll(logp, mask[:, :2], torch.tensor([True, False]))
