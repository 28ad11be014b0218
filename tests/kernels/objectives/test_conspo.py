"""ConSPO kernel: the specification's hand-worked InfoNCE values, a naive loop reference,
the gradient of each side (positive / negative), the margin schedule, masked positions,
degenerate groups and bad input."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from policylab.errors import PolicylabError, ShapeError
from policylab.kernels.objectives.conspo import conspo, conspo_scores, margin_at

F = torch.float64


def _one_token(scores, positive, group=None, **kw):
    lp = torch.tensor(scores, dtype=F).reshape(-1, 1).requires_grad_(True)
    mask = torch.ones_like(lp, dtype=torch.bool)
    g = torch.zeros(len(scores), dtype=torch.long) if group is None else torch.tensor(group)
    loss, m = conspo(lp, mask, g, torch.tensor(positive), tau=kw.pop("tau", 1.0), margin=kw.pop("margin", 0.0), **kw)
    return lp, loss, m


def test_hand_worked_values_and_the_shared_denominator():
    # s = [-0.5 (pos), -1.0, -2.0], τ = 1, m = 0: softmax(e^-0.5, e^-1, e^-2) = [0.6065, 0.3679, 0.1353]/1.1097
    # = [0.5465, 0.3315, 0.1220]; loss = −log 0.5465 = 0.6041
    lp, loss, m = _one_token([-0.5, -1.0, -2.0], [True, False, False])
    assert math.isclose(float(loss.sum()), 0.6041, abs_tol=1e-4)
    assert math.isclose(float(m["conspo/positive_softmax_mean"]), 0.5465, abs_tol=1e-4)
    # gradients: ∂L/∂s_p = −(1 − 0.5465)/τ = −0.4535; ∂L/∂s_n = softmax_n/τ = 0.3315, 0.1220
    loss.sum().backward()
    assert_close(lp.grad.reshape(-1), torch.tensor([-0.4535, 0.3315, 0.1220], dtype=F), atol=1e-4, rtol=0)
    # a fourth response, a negative at −0.8, joins the denominator: e^-0.8 = 0.4493, the sum 1.5590,
    # softmax_p = 0.6065/1.5590 = 0.3890, loss = −log 0.3890 = 0.9441
    _, loss2, _ = _one_token([-0.5, -1.0, -2.0, -0.8], [True, False, False, False])
    assert math.isclose(float(loss2.sum()), 0.9441, abs_tol=1e-4)


def test_temperature_and_margin_scale_the_gradient():
    # τ = 0.5 doubles the scaled score gaps and divides the gradient by τ: ∂L/∂s_n = softmax_n/τ
    lp, loss, _ = _one_token([-0.5, -1.0], [True, False], tau=0.5)
    sm_n = math.exp(-2.0) / (math.exp(-1.0) + math.exp(-2.0))  # e^{s_n/τ} / (e^{s_p/τ} + e^{s_n/τ}) = 0.2689
    loss.sum().backward()
    assert math.isclose(float(lp.grad[1, 0]), sm_n / 0.5, abs_tol=1e-9)
    assert math.isclose(float(lp.grad[0, 0]), -sm_n / 0.5, abs_tol=1e-9)  # −(1 − softmax_p)/τ
    # a margin m lowers the positive's scaled score by m/τ: loss = log(1 + e^{(s_n − s_p + m)/τ})
    _, lm, _ = _one_token([-0.5, -1.0], [True, False], margin=0.3)
    assert math.isclose(float(lm.sum()), math.log(1 + math.exp(-0.5 + 0.3)), abs_tol=1e-12)


def _naive(logp, mask, group, positive, tau, margin):
    B = logp.shape[0]
    s = [sum(float(logp[i, t]) for t in range(logp.shape[1]) if mask[i, t]) / max(int(mask[i].sum()), 1)
         for i in range(B)]
    out = [0.0] * B
    for i in range(B):
        if not positive[i] or not mask[i].any():
            continue
        negs = [s[j] for j in range(B) if group[j] == group[i] and not positive[j] and mask[j].any()]
        if not negs:
            continue
        zp = (s[i] - margin) / tau
        out[i] = -(zp - math.log(math.exp(zp) + sum(math.exp(x / tau) for x in negs)))
    return out


def test_matches_a_naive_loop_over_groups_with_padding():
    g = torch.Generator().manual_seed(3)
    B, T = 9, 6
    logp = -torch.rand(B, T, generator=g, dtype=F) * 3
    mask = torch.zeros(B, T, dtype=torch.bool)
    for i, (a, b) in enumerate([(0, 6), (1, 4), (2, 6), (0, 2), (3, 5), (0, 6), (0, 1), (1, 6), (0, 3)]):
        mask[i, a:b] = True  # leading and trailing masked positions
    logp = torch.where(mask, logp, torch.tensor(-30.0, dtype=F))  # garbage where masked
    group = torch.tensor([7, 7, 7, 2, 2, 2, 9, 9, 9])
    positive = torch.tensor([True, False, False, True, True, False, True, True, True])  # group 9: all positive
    loss, _ = conspo(logp, mask, group, positive, tau=0.7, margin=0.2)
    want = _naive(logp, mask, group, positive, 0.7, 0.2)
    per_row = torch.tensor([float(loss[i][mask[i]][0]) if mask[i].any() else 0.0 for i in range(B)], dtype=F)
    assert_close(per_row, torch.tensor(want, dtype=F))
    assert bool((loss[~mask] == 0).all())
    assert bool((loss[6:] == 0).all())  # an all-positive group contributes exactly 0
    # the loss is the same on every valid token of a row (seq_mean_token_mean then gives ℓ_i)
    for i in range(B):
        v = loss[i][mask[i]]
        assert bool((v == v[0]).all())


def test_degenerate_groups_give_exact_zero_and_no_nan():
    for pos in ([True, True, True], [False, False, False]):
        lp, loss, m = _one_token([-0.5, -1.0, -2.0], pos)
        assert float(loss.abs().sum()) == 0.0 and float(m["conspo/eligible_group_frac"]) == 0.0
        loss.sum().backward()
        assert bool(torch.isfinite(lp.grad).all()) and float(lp.grad.abs().sum()) == 0.0


def test_doubling_a_response_at_equal_per_token_log_probs_leaves_its_score():
    lp1 = torch.tensor([[-0.4, -1.2, 0.0, 0.0]], dtype=F)
    m1 = torch.tensor([[True, True, False, False]])
    lp2 = torch.tensor([[-0.4, -1.2, -0.4, -1.2]], dtype=F)  # the same token pattern twice
    m2 = torch.ones_like(m1)
    assert_close(conspo_scores(lp1, m1), conspo_scores(lp2, m2))


def test_gradient_regions_positive_up_negative_down():
    # every valid token of a positive gets a negative gradient (descending raises it), of a
    # negative a positive one; a token's share is 1/|y_i| of its response's score gradient
    logp = torch.tensor([[-0.5, -0.7, 0.0], [-1.0, -1.1, -1.2], [-2.0, 0.0, 0.0]], dtype=F, requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, True, True], [True, False, False]])
    loss, _ = conspo(logp, mask, torch.zeros(3, dtype=torch.long), torch.tensor([True, False, False]), tau=1.0,
                     margin=0.0)
    from policylab.kernels import aggregate
    aggregate.aggregate(loss, mask, "seq_mean_token_mean").backward()
    gr = logp.grad
    assert bool((gr[0][mask[0]] < 0).all()) and bool((gr[1][mask[1]] > 0).all()) and bool((gr[2][mask[2]] > 0).all())
    assert bool((gr[~mask] == 0).all())
    assert math.isclose(float(gr[1, 0]), float(gr[1, 2]))  # equal shares inside a response


def test_margin_schedule():
    assert margin_at(0, margin_max=0.2, ramp_steps=10) == 0.0
    assert math.isclose(margin_at(5, margin_max=0.2, ramp_steps=10), 0.1)
    assert margin_at(50, margin_max=0.2, ramp_steps=10) == 0.2
    assert margin_at(0, margin_max=0.2, ramp_steps=0) == 0.2


def test_bad_input():
    lp = torch.zeros(2, 1)
    mask = torch.ones(2, 1, dtype=torch.bool)
    g = torch.zeros(2, dtype=torch.long)
    with pytest.raises(ShapeError, match="`positive` must be a bool"):
        conspo(lp, mask, g, torch.tensor([1, 0]), tau=1.0, margin=0.0)
    with pytest.raises(PolicylabError, match="`tau` must be > 0"):
        conspo(lp, mask, g, torch.tensor([True, False]), tau=0.0, margin=0.0)
    with pytest.raises(PolicylabError, match="`margin` must be >= 0"):
        conspo(lp, mask, g, torch.tensor([True, False]), tau=1.0, margin=-1.0)
    with pytest.raises(ShapeError, match="`logp` must be"):
        conspo(torch.zeros(2, 2), mask, g, torch.tensor([True, False]), tau=1.0, margin=0.0)
