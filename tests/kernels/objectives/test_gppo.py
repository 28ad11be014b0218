"""gppo: PPO forward values, gradient-preserving bounds region by region, loop reference."""

import itertools
import math

import pytest
import torch
from torch.testing import assert_close

from policylab.errors import NonFiniteError, ShapeError
from policylab.kernels.objectives import METRIC_KEYS, gppo, ppo_clip

F64 = torch.float64
EPS = dict(eps_low=0.2, eps_high=0.28)


def tokens(rhos, advs, lp_old=-1.0):
    old = torch.full((1, len(rhos)), lp_old, dtype=F64)
    lp = (old + torch.log(torch.tensor([rhos], dtype=F64))).requires_grad_()
    return lp, old, torch.tensor([advs], dtype=F64), torch.ones(1, len(rhos), dtype=torch.bool)


def grad_of(loss, lp):
    (g,) = torch.autograd.grad(loss.sum(), lp)
    return g


def gppo_loop(lp, old, adv, mask, eps_low, eps_high):
    """Naive reference in the METHODS form: ℓ = −min(ρA, c(ρ)A) with differentiable bounds
    lo/hi = (1∓ε)·ρ/sg(ρ), selected by torch.maximum/minimum (not by region masks)."""
    B, T = lp.shape
    rows = []
    for b in range(B):
        row = []
        for t in range(T):
            if not mask[b, t]:
                row.append(torch.zeros((), dtype=lp.dtype))
                continue
            a = adv[b] if adv.dim() == 1 else adv[b, t]
            r = torch.exp(lp[b, t] - old[b, t])
            lo, hi = (1 - eps_low) * r / r.detach(), (1 + eps_high) * r / r.detach()
            c = torch.minimum(torch.maximum(r, lo), hi)
            row.append(-torch.minimum(r * a, c * a))
        rows.append(torch.stack(row))
    return torch.stack(rows)


# (A, ρ, GPPO coefficient, PPO coefficient); ∂ℓ/∂lp = −c·A, ε_low = 0.2, ε_high = 0.28
REGIONS = [
    (+1.0, 1.5, 1.28, 0.0),   # A>0 above: PPO 0, GPPO 1 + ε_high
    (-1.0, 0.5, 0.80, 0.0),   # A<0 below: PPO 0, GPPO 1 − ε_low
    (-1.0, 1.5, 1.50, 1.50),  # A<0 above: unclipped branch for both (CISPO would give 1.28)
    (+1.0, 0.5, 0.50, 0.50),  # A>0 below: unclipped branch for both
    (+1.0, 1.1, 1.10, 1.10),  # inside
    (-1.0, 1.1, 1.10, 1.10),  # inside
    (+3.0, 2.0, 1.28, 0.0),   # |A| = 3: ∂ℓ/∂lp = −1.28·3 = −3.84
]


@pytest.mark.parametrize("a, rho, c_gppo, c_ppo", REGIONS)
def test_gradient_regions(a, rho, c_gppo, c_ppo):
    lp, old, adv, mask = tokens([rho], [a])
    loss, _ = gppo(lp, old, adv, mask, **EPS)
    assert_close(grad_of(loss, lp), torch.tensor([[-c_gppo * a]], dtype=F64), rtol=1e-12, atol=0)
    ppo_loss, _ = ppo_clip(lp, old, adv, mask, **EPS)
    assert_close(grad_of(ppo_loss, lp), torch.tensor([[-c_ppo * a]], dtype=F64), rtol=1e-12, atol=0)


def test_forward_equals_ppo_on_a_grid_but_gradients_do_not():
    # equal loss values are NOT evidence of equal backward: the grid covers both zeroing
    # regions, where the gradients must differ.
    rhos = [0.3, 0.79, 0.81, 1.0, 1.27, 1.29, 2.5]
    advs = [-2.0, -0.5, 0.5, 2.0]
    grid = list(itertools.product(rhos, advs))
    lp, old, adv, mask = tokens([r for r, _ in grid], [a for _, a in grid])
    l_gppo, m_gppo = gppo(lp, old, adv, mask, **EPS)
    l_ppo, m_ppo = ppo_clip(lp, old, adv, mask, **EPS)
    assert_close(l_gppo, l_ppo, rtol=1e-14, atol=1e-15)
    g_gppo, g_ppo = grad_of(l_gppo, lp), grad_of(l_ppo, lp)
    differs = (g_gppo - g_ppo).abs() > 1e-9
    zeroed = torch.tensor([[(a > 0 and r > 1.28) or (a < 0 and r < 0.8) for r, a in grid]])
    # zeroing cells: ρ ∈ {0.3, 0.79} × A ∈ {−2, −0.5} and ρ ∈ {1.29, 2.5} × A ∈ {0.5, 2}: 4 + 4 = 8
    assert torch.equal(differs, zeroed) and zeroed.sum() == 8
    assert m_ppo["clip_frac"].item() == pytest.approx(8 / 28) and m_gppo["clip_frac"].item() == 0.0
    for key in ("low_pos", "low_neg", "high_pos", "high_neg"):  # same regions, same fractions
        assert m_gppo[f"clip_frac/{key}"].item() == m_ppo[f"clip_frac/{key}"].item()


def test_matches_loop_reference():
    torch.manual_seed(3)
    B, T = 4, 6
    old = torch.randn(B, T, dtype=F64) - 2
    lp = (old + 0.6 * torch.randn(B, T, dtype=F64)).requires_grad_()
    adv = torch.randn(B, T, dtype=F64)
    mask = torch.rand(B, T) > 0.25
    mask[:, 0] = True
    loss, m = gppo(lp, old, adv, mask, **EPS)
    assert m["clip_frac/high_pos"].item() > 0 and m["clip_frac/low_neg"].item() > 0
    ref = gppo_loop(lp, old, adv, mask, 0.2, 0.28)
    assert_close(loss, ref, rtol=1e-12, atol=1e-14)
    assert_close(grad_of(loss, lp), grad_of(ref, lp), rtol=1e-12, atol=1e-14)


def test_boundary_gradient_survives_extreme_log_ratios():
    # d = +200 with A = +1: ρ is guarded at e^20, but the bound's carrier uses the raw d,
    # so the gradient is exactly −1.28 (finite). d = −200 with A = −1: −0.8·(−1) = 0.8.
    # d = +200 with A = −1: the unclipped ρ branch passes the guard -> zero (documented).
    old = torch.tensor([[-230.0, -30.0, -230.0]], dtype=F64)
    lp = torch.tensor([[-30.0, -230.0, -30.0]], dtype=F64, requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, -1.0]], dtype=F64)
    loss, m = gppo(lp, old, adv, torch.ones(1, 3, dtype=torch.bool), **EPS)
    g = grad_of(loss, lp)
    assert torch.isfinite(loss).all()
    assert g.tolist() == [[-1.28, 0.8, 0.0]]
    assert m["log_ratio_clamped"].item() == 3
    assert loss[0, 2].item() == pytest.approx(math.exp(20.0))


def test_metric_keys():
    lp, old, adv, mask = tokens([1.0], [1.0])
    _, m = gppo(lp, old, adv, mask, **EPS)
    assert set(m) == set(METRIC_KEYS)
    assert all(v.dim() == 0 and not v.requires_grad for v in m.values())


@pytest.mark.parametrize("change, err, match", [
    (dict(mask=torch.ones(3, 3, dtype=torch.bool)), ShapeError, "`mask` has shape"),
    (dict(mask=torch.ones(2, 3, dtype=torch.uint8)), ShapeError, "must be a bool tensor"),
    (dict(logp=torch.tensor([[0.0, 0.0, 0.0], [float("-inf"), 0.0, 0.0]])), NonFiniteError, "`logp`"),
    (dict(eps_low=1.2), ValueError, "eps_low"),
    (dict(eps_high=-0.2), ValueError, "eps_high"),
])
def test_bad_inputs(change, err, match):
    kwargs = dict(logp=torch.zeros(2, 3), logp_old=torch.zeros(2, 3), adv=torch.ones(2),
                  mask=torch.ones(2, 3, dtype=torch.bool), **EPS)
    kwargs.update(change)
    with pytest.raises(err, match=match):
        gppo(**kwargs)


def test_empty_mask_contributes_exactly_zero():
    # a micro-batch whose sequences are all masked out: loss all 0 (finite, grad 0), metrics
    # finite counts 0, ratio/min|max = +inf|−inf (identities of min/max), no NaN anywhere.
    lp = torch.tensor([[-1.0, float("nan")]], requires_grad=True)
    mask = torch.zeros(1, 2, dtype=torch.bool)
    loss, m = gppo(lp, torch.zeros(1, 2), torch.ones(1), mask, **EPS)
    (g,) = torch.autograd.grad(loss.sum(), lp)
    assert (loss == 0).all() and (g == 0).all()
    assert m["clip_frac"].item() == 0 and m["log_ratio_clamped"].item() == 0
    assert m["ratio/min"].item() == float("inf") and m["ratio/max"].item() == float("-inf")
    assert not any(torch.isnan(v) for v in m.values())
