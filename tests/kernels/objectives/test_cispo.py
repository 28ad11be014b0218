"""cispo: METHODS invariants (vs PPO), no lower bound, detach, loop reference, bad inputs."""

import functools
import math

import pytest
import torch
from torch.testing import assert_close

from policylab.errors import NonFiniteError, ShapeError
from policylab.kernels.objectives import METRIC_KEYS, ppo_clip
from policylab.kernels.objectives import cispo as cispo_kernel

F64 = torch.float64


@pytest.fixture(params=[True, False], ids=["fast", "plain"])
def cispo(request):
    """Every test below runs on both paths: the fast one (default, what the trainer runs)
    and the plain equation (`fast=False`)."""
    return functools.partial(cispo_kernel, fast=request.param)


def tokens(rhos, advs, lp_old=-1.0):
    old = torch.full((1, len(rhos)), lp_old, dtype=F64)
    lp = (old + torch.log(torch.tensor([rhos], dtype=F64))).requires_grad_()
    return lp, old, torch.tensor([advs], dtype=F64), torch.ones(1, len(rhos), dtype=torch.bool)


def grad_of(loss, lp):
    (g,) = torch.autograd.grad(loss.sum(), lp)
    return g


def cispo_loop(lp, old, adv, mask, eps_low, eps_high):
    """Naive reference: python loop, w from plain floats (no autograd path possible)."""
    B, T = lp.shape
    rows = []
    for b in range(B):
        row = []
        for t in range(T):
            if not mask[b, t]:
                row.append(torch.zeros((), dtype=lp.dtype))
                continue
            a = float(adv[b] if adv.dim() == 1 else adv[b, t])
            r = math.exp(float(lp[b, t].detach()) - float(old[b, t]))
            w = min(r, 1 + eps_high) if eps_low is None else min(max(r, 1 - eps_low), 1 + eps_high)
            row.append(-w * a * lp[b, t])
        rows.append(torch.stack(row))
    return torch.stack(rows)


# (A, ρ, eps_low, PPO coefficient, CISPO coefficient); ∂ℓ/∂lp = −c·A; ε_high = 0.28
CASES = [
    (+1.0, 1.5, 0.2, 0.0, 1.28),   # METHODS #1: PPO zeroes, CISPO keeps w = 1 + 0.28
    (-1.0, 1.5, 0.2, 1.5, 1.28),   # METHODS #2: PPO unclipped branch 1.5, CISPO capped 1.28
    (+1.0, 0.5, 0.2, 0.5, 0.8),    # METHODS #3: PPO 0.5, CISPO floor 1 − 0.2 = 0.8
    (+1.0, 0.5, None, 0.5, 0.5),   # no lower bound (the paper's setting): w = ρ = 0.5
    (-1.0, 0.5, 0.2, 0.0, 0.8),    # PPO zeroes (A<0 below), CISPO 0.8
    (-1.0, 0.5, None, 0.0, 0.5),   # no lower bound: 0.5
    (+1.0, 1.1, 0.2, 1.1, 1.1),    # inside: both ρ
    (-2.0, 1.1, None, 1.1, 1.1),   # inside, |A| = 2: ∂ℓ/∂lp = −1.1·(−2) = 2.2
]


@pytest.mark.parametrize("a, rho, eps_low, c_ppo, c_cispo", CASES)
def test_gradient_coefficients_vs_ppo(cispo, a, rho, eps_low, c_ppo, c_cispo):
    lp, old, adv, mask = tokens([rho], [a])
    loss, _ = cispo(lp, old, adv, mask, eps_low=eps_low, eps_high=0.28)
    assert_close(grad_of(loss, lp), torch.tensor([[-c_cispo * a]], dtype=F64), rtol=1e-12, atol=0)
    ppo_loss, _ = ppo_clip(lp, old, adv, mask, eps_low=0.2 if eps_low is None else eps_low, eps_high=0.28)
    assert_close(grad_of(ppo_loss, lp), torch.tensor([[-c_ppo * a]], dtype=F64), rtol=1e-12, atol=0)


def test_loss_value_is_a_weighted_log_prob(cispo):
    # METHODS #5: lp = lp_old = −2, A = 1: ρ = 1, w = 1, ℓ = −1·1·(−2) = 2.0, while the PPO
    # surrogate loss is −ρA = −1.0. Values are not comparable.
    lp, old, adv, mask = tokens([1.0], [1.0], lp_old=-2.0)
    loss, _ = cispo(lp, old, adv, mask, eps_low=None, eps_high=0.28)
    assert loss.item() == pytest.approx(2.0, abs=1e-15)
    assert ppo_clip(lp, old, adv, mask, eps_low=0.2, eps_high=0.28)[0].item() == pytest.approx(-1.0)


def test_no_autograd_path_through_the_ratio(cispo):
    # METHODS #4: the gradient is exactly −w·A with w computed from detached numbers, and
    # logp_old (even if it requires grad) receives nothing.
    torch.manual_seed(0)
    old = (torch.randn(3, 4, dtype=F64) - 2).requires_grad_()
    lp = (old.detach() + 0.5 * torch.randn(3, 4, dtype=F64)).requires_grad_()
    adv = torch.randn(3, 4, dtype=F64)
    mask = torch.ones(3, 4, dtype=torch.bool)
    loss, _ = cispo(lp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    g_lp, g_old = torch.autograd.grad(loss.sum(), [lp, old], allow_unused=True)
    w = torch.exp(lp.detach() - old.detach()).clamp(0.8, 1.28)
    assert_close(g_lp, -w * adv, rtol=1e-12, atol=0)
    assert g_old is None


@pytest.mark.parametrize("eps_low", [0.2, None])
def test_matches_loop_reference(cispo, eps_low):
    torch.manual_seed(1)
    B, T = 4, 6
    old = torch.randn(B, T, dtype=F64) - 2
    lp = (old + 0.6 * torch.randn(B, T, dtype=F64)).requires_grad_()
    adv = torch.randn(B, dtype=F64)
    mask = torch.rand(B, T) > 0.25
    mask[:, 0] = True
    loss, m = cispo(lp, old, adv, mask, eps_low=eps_low, eps_high=0.28)
    assert 0 < m["clip_frac/high_pos"].item() + m["clip_frac/high_neg"].item() < 1  # caps do bind
    ref = cispo_loop(lp, old, adv, mask, eps_low, 0.28)
    assert_close(loss, ref, rtol=1e-12, atol=1e-14)
    assert_close(grad_of(loss, lp), grad_of(ref, lp), rtol=1e-12, atol=1e-14)


def test_no_lower_bound_equals_eps_low_at_least_one(cispo):
    torch.manual_seed(2)
    old = torch.randn(2, 5, dtype=F64) - 2
    lp = (old + torch.randn(2, 5, dtype=F64)).requires_grad_()
    adv, mask = torch.randn(2, dtype=F64), torch.ones(2, 5, dtype=torch.bool)
    a, ma = cispo(lp, old, adv, mask, eps_low=None, eps_high=0.28)
    b, mb = cispo(lp, old, adv, mask, eps_low=1.0, eps_high=0.28)
    assert_close(a, b, rtol=0, atol=0)
    assert ma["clip_frac/low_pos"].item() == 0 and ma["clip_frac/low_neg"].item() == 0


def test_metrics_never_report_zeroed_tokens(cispo):
    # (A, ρ): (+1, 1.5) high_pos, (−1, 1.5) high_neg, (+1, 0.5) low_pos, (−1, 0.5) low_neg
    lp, old, adv, mask = tokens([1.5, 1.5, 0.5, 0.5], [1.0, -1.0, 1.0, -1.0])
    _, m = cispo(lp, old, adv, mask, eps_low=0.2, eps_high=0.28)
    assert set(m) == set(METRIC_KEYS)
    assert m["clip_frac"].item() == 0.0  # CISPO never zeroes a gradient
    for key in ("high_pos", "high_neg", "low_pos", "low_neg"):
        assert m[f"clip_frac/{key}"].item() == 0.25
    assert m["ratio/max"].item() == pytest.approx(1.5)  # the raw ratio, not the capped weight


def test_extreme_log_ratios_stay_finite(cispo):
    old = torch.tensor([[-230.0, -30.0]])
    lp = torch.tensor([[-30.0, -230.0]], requires_grad=True)  # d = +200, −200
    loss, m = cispo(lp, old, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2, dtype=torch.bool),
                    eps_low=None, eps_high=0.28)
    g = grad_of(loss, lp)
    assert torch.isfinite(loss).all() and torch.isfinite(g).all()
    assert m["log_ratio_clamped"].item() == 2
    assert g[0, 0].item() == pytest.approx(-1.28)  # capped weight, gradient kept


@pytest.mark.parametrize("change, err, match", [
    (dict(mask=torch.ones(2, 4, dtype=torch.bool)), ShapeError, "`mask` has shape"),
    (dict(mask=torch.ones(2, 3, dtype=torch.float32)), ShapeError, "must be a bool tensor"),
    (dict(logp=torch.tensor([[0.0, float("nan"), 0.0], [0.0] * 3])), NonFiniteError, "`logp`"),
    (dict(eps_low=-0.5), ValueError, "eps_low"),
    (dict(eps_high=None), ValueError, "eps_high"),
    (dict(eps_high=-1.0), ValueError, "eps_high"),
])
def test_bad_inputs(cispo, change, err, match):
    kwargs = dict(logp=torch.zeros(2, 3), logp_old=torch.zeros(2, 3), adv=torch.ones(2),
                  mask=torch.ones(2, 3, dtype=torch.bool), eps_low=None, eps_high=0.28)
    kwargs.update(change)
    with pytest.raises(err, match=match):
        cispo(**kwargs)


def test_empty_mask_contributes_exactly_zero(cispo):
    # a micro-batch whose sequences are all masked out: loss all 0 (finite, grad 0), metrics
    # finite counts 0, ratio/min|max = +inf|−inf (identities of min/max), no NaN anywhere.
    lp = torch.tensor([[-1.0, float("nan")]], requires_grad=True)
    mask = torch.zeros(1, 2, dtype=torch.bool)
    loss, m = cispo(lp, torch.zeros(1, 2), torch.ones(1), mask, eps_low=None, eps_high=0.28)
    (g,) = torch.autograd.grad(loss.sum(), lp)
    assert (loss == 0).all() and (g == 0).all()
    assert m["clip_frac"].item() == 0 and m["log_ratio_clamped"].item() == 0
    assert m["ratio/min"].item() == float("inf") and m["ratio/max"].item() == float("-inf")
    assert not any(torch.isnan(v) for v in m.values())
