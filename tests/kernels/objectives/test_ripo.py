import math

import pytest
import torch

from policylab.errors import MissingQuantityError
from policylab.kernels.objectives.ripo import clip_to_bounds, ripo, ripo_bounds

F64 = torch.float64


def naive_bounds(p, delta):
    a = math.asin(math.sqrt(p))
    lo = math.sin(max(0.0, a - delta / 2)) ** 2 / p
    hi = math.sin(min(math.pi / 2, a + delta / 2)) ** 2 / p
    return lo, hi


def naive_ripo(lp, lp_old, adv, mask, delta):
    out = torch.zeros_like(lp)
    for i in range(lp.shape[0]):
        for t in range(lp.shape[1]):
            if mask[i, t]:
                lo, hi = naive_bounds(math.exp(lp_old[i, t]), delta)
                r = math.exp(lp[i, t] - lp_old[i, t])
                a = float(adv[i])
                out[i, t] = -min(r * a, min(max(r, lo), hi) * a)
    return out


def test_hand_worked_bounds():
    # delta = 0.2, half-radius 0.1 in arcsin-sqrt space:
    # p 0.5: a = pi/4 = 0.7854; sin^2(0.6854)/0.5 = 0.40067/0.5 = 0.8013; sin^2(0.8854)/0.5 = 1.1987
    # p 0.9: a = 1.2490; sin^2(1.1490)/0.9 = 0.9249; sin^2(1.3490)/0.9 = 1.0574
    # p 0.1: a = 0.3218; sin^2(0.2218)/0.1 = 0.4837; sin^2(0.4218)/0.1 = 1.6757
    # p 0.01: a = 0.1002; sin^2(0.0002)/0.01 ~ 2.8e-6 ~ 0; sin^2(0.2002)/0.01 = 3.9535
    lp_old = torch.log(torch.tensor([[0.5, 0.9, 0.1, 0.01]], dtype=F64))
    lo, hi = ripo_bounds(lp_old, delta=0.2)
    torch.testing.assert_close(lo, torch.tensor([[0.8013, 0.9249, 0.4837, 0.0]], dtype=F64), atol=1e-4, rtol=0)
    torch.testing.assert_close(hi, torch.tensor([[1.1987, 1.0574, 1.6757, 3.9535]], dtype=F64), atol=1e-4, rtol=0)
    assert not lo.requires_grad and not hi.requires_grad


def test_bound_shape_properties_on_a_grid():
    p = torch.linspace(1e-4, 1.0, 2001, dtype=F64)
    lo, hi = ripo_bounds(torch.log(p).unsqueeze(0), delta=0.3)
    assert bool((lo <= 1).all()) and bool((hi >= 1).all())
    assert bool((hi[0, 1:] <= hi[0, :-1]).all())  # r_hi decreases with p_old
    assert bool((hi * p <= 1 + 1e-12).all())  # r_hi·p_old <= 1


def test_matches_naive_loop_and_padding():
    torch.manual_seed(40)
    lp_old = -torch.rand(3, 6, dtype=F64) * 4
    lp = lp_old + 0.3 * torch.randn(3, 6, dtype=F64)
    adv = torch.randn(3, dtype=F64)
    mask = torch.rand(3, 6) > 0.25
    lp_pad = torch.where(mask, lp, torch.full_like(lp, float("nan")))
    old_pad = torch.where(mask, lp_old, torch.full_like(lp, float("inf")))
    loss, _ = ripo(lp_pad, old_pad, adv, mask, delta=0.25)
    torch.testing.assert_close(loss, naive_ripo(lp, lp_old, adv, mask, 0.25))
    assert bool((loss[~mask] == 0).all())


def test_gradient_regions():
    # p_old = 0.5, delta 0.2 -> bounds [0.8013, 1.1987]; dL/dlp = -c·A
    # rho 1.3, A=+1: clipped flat -> 0        rho 1.3, A=-1: unclipped, c = 1.3 -> +1.3
    # rho 0.7, A=-1: clipped flat -> 0        rho 0.7, A=+1: unclipped, c = 0.7 -> -0.7
    # rho 1.1, A=+1: inside -> -1.1
    # same rho 1.5, A=+1 at p_old = 0.1 (hi 1.6757): inside -> -1.5 (probability-dependent)
    p_old = torch.tensor([[0.5, 0.5, 0.5, 0.5, 0.5, 0.1]], dtype=F64)
    rho = torch.tensor([[1.3, 1.3, 0.7, 0.7, 1.1, 1.5]], dtype=F64)
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0, 1.0, 1.0]], dtype=F64)
    lp_old = torch.log(p_old)
    lp = (lp_old + torch.log(rho)).requires_grad_(True)
    loss, m = ripo(lp, lp_old, adv, torch.ones(1, 6, dtype=torch.bool), delta=0.2)
    loss.sum().backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[0.0, 1.3, 0.0, -0.7, -1.1, -1.5]], dtype=F64))
    assert m["clip_frac"].item() == pytest.approx(2 / 6)


def test_bounds_frozen_across_an_optimizer_step():
    torch.manual_seed(41)
    logits = torch.randn(2, 4, 5, dtype=F64, requires_grad=True)
    tokens = torch.randint(0, 5, (2, 4))
    opt = torch.optim.SGD([logits], lr=1.0)

    def logp_of():
        return torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)

    lp_old = logp_of().detach()
    lo, hi = ripo_bounds(lp_old, delta=0.2)
    lo0, hi0 = lo.clone(), hi.clone()
    mask = torch.ones(2, 4, dtype=torch.bool)
    loss, _ = clip_to_bounds(logp_of(), lp_old, torch.tensor([1.0, -1.0], dtype=F64), mask, lo=lo, hi=hi)
    loss.sum().backward()
    opt.step()
    assert not torch.equal(logp_of().detach(), lp_old)  # the learner moved
    assert torch.equal(lo, lo0) and torch.equal(hi, hi0)  # the bounds did not
    lo1, hi1 = ripo_bounds(lp_old, delta=0.2)
    assert torch.equal(lo1, lo0) and torch.equal(hi1, hi0)
    # the bounds are inputs, outside every optimizer group
    assert all(q is logits for g in opt.param_groups for q in g["params"])


def test_refusals():
    lp_old = torch.log(torch.tensor([[0.5]], dtype=F64))
    m = torch.ones(1, 1, dtype=torch.bool)
    with pytest.raises(ValueError, match="delta"):
        ripo_bounds(lp_old, delta=0.0)
    with pytest.raises(ValueError, match="> 0"):
        ripo_bounds(torch.tensor([[0.1]], dtype=F64), delta=0.2)
    with pytest.raises(MissingQuantityError, match="logp_old"):
        ripo(lp_old, None, torch.ones(1, dtype=F64), m, delta=0.2)
    lo, hi = ripo_bounds(lp_old, delta=0.2)
    with pytest.raises(ValueError, match="detached"):
        clip_to_bounds(lp_old, lp_old, torch.ones(1, dtype=F64), m, lo=lo.requires_grad_(True), hi=hi)
    with pytest.raises(ValueError, match="lo <= 1 <= hi"):
        clip_to_bounds(lp_old, lp_old, torch.ones(1, dtype=F64), m, lo=hi, hi=hi + 1)
