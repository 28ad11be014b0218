"""ppo_clip: hand cases, loop reference, gradient regions, metrics, guard and bad inputs."""

import functools
import math

import pytest
import torch
from torch.testing import assert_close

from policylab.errors import NonFiniteError, ShapeError
from policylab.kernels.objectives import METRIC_KEYS
from policylab.kernels.objectives import ppo_clip as ppo_clip_kernel

F64 = torch.float64


@pytest.fixture(params=[True, False], ids=["fast", "plain"])
def ppo_clip(request):
    """Every test below runs on both paths: the fast one (default, what the trainer runs)
    and the plain equation (`fast=False`)."""
    return functools.partial(ppo_clip_kernel, fast=request.param)
EPS = dict(eps_low=0.2, eps_high=0.28)


def tokens(rhos, advs, lp_old=-1.0):
    """One sequence, one token per (ρ, A): lp_old = -1, lp = -1 + log ρ (fp64)."""
    old = torch.full((1, len(rhos)), lp_old, dtype=F64)
    lp = (old + torch.log(torch.tensor([rhos], dtype=F64))).requires_grad_()
    adv = torch.tensor([advs], dtype=F64)
    return lp, old, adv, torch.ones(1, len(rhos), dtype=torch.bool)


def grad_of(loss, lp):
    (g,) = torch.autograd.grad(loss.sum(), lp)
    return g


def ppo_loop(lp, old, adv, mask, eps_low, eps_high, dual_clip=None):
    """Naive reference: python loop over b, t with the textbook formula."""
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
            obj = torch.minimum(r * a, torch.clamp(r, 1 - eps_low, 1 + eps_high) * a)
            if dual_clip is not None and a < 0:
                obj = torch.maximum(obj, dual_clip * a)
            row.append(-obj)
        rows.append(torch.stack(row))
    return torch.stack(rows)


# (A, ρ, coefficient c with ∂ℓ/∂lp = −c·A), ε_low = 0.2, ε_high = 0.28
REGIONS = [
    (+1.0, 1.10, 1.10),  # inside: unclipped, c = ρ
    (+1.0, 1.50, 0.0),   # A>0, ρ > 1.28: clipped branch is constant -> zero gradient
    (+1.0, 0.50, 0.50),  # A>0, ρ < 0.8: min picks ρA (0.5 < 0.8), gradient flows, c = ρ
    (-1.0, 1.10, 1.10),  # inside
    (-1.0, 1.50, 1.50),  # A<0, ρ > 1.28: min picks ρA (−1.5 < −1.28), c = ρ
    (-1.0, 0.50, 0.0),   # A<0, ρ < 0.8: min picks −0.8 (constant) -> zero gradient
    (+2.0, 1.10, 1.10),  # scaling with |A|: ∂ℓ/∂lp = −1.1·2 = −2.2
]


@pytest.mark.parametrize("a, rho, coef", REGIONS)
def test_gradient_regions(ppo_clip, a, rho, coef):
    lp, old, adv, mask = tokens([rho], [a])
    loss, _ = ppo_clip(lp, old, adv, mask, **EPS)
    assert_close(grad_of(loss, lp), torch.tensor([[-coef * a]], dtype=F64), rtol=1e-12, atol=0)


@pytest.mark.parametrize("a, rho, coef", [
    (-1.0, 4.0, 0.0),   # ρ > c = 3: loss −c·A = 3, zero gradient
    (-1.0, 2.0, 2.0),   # 1.28 < ρ < c: still the unclipped branch, c = ρ = 2
    (+1.0, 4.0, 0.0),   # dual clip is for A < 0 only; A>0 above 1.28 is clipped anyway
])
def test_dual_clip_regions(ppo_clip, a, rho, coef):
    lp, old, adv, mask = tokens([rho], [a])
    loss, m = ppo_clip(lp, old, adv, mask, **EPS, dual_clip=3.0)
    assert_close(grad_of(loss, lp), torch.tensor([[-coef * a]], dtype=F64), rtol=1e-12, atol=0)
    if rho == 4.0 and a < 0:
        assert_close(loss, torch.tensor([[3.0]], dtype=F64))  # −c·A = −3·(−1)
        assert m["dual_clip_frac"].item() == 1.0 and m["clip_frac"].item() == 1.0


def test_hand_values(ppo_clip):
    # A=+1, ρ=1.5: −min(1.5, 1.28) = −1.28 ; A=−1, ρ=0.5: −min(−0.5, −0.8) = 0.8
    # A=+1, ρ=0.5: −min(0.5, 0.8) = −0.5   ; A=−1, ρ=1.5: −min(−1.5, −1.28) = 1.5
    lp, old, adv, mask = tokens([1.5, 0.5, 0.5, 1.5], [1.0, -1.0, 1.0, -1.0])
    loss, _ = ppo_clip(lp, old, adv, mask, **EPS)
    assert_close(loss, torch.tensor([[-1.28, 0.8, -0.5, 1.5]], dtype=F64), rtol=1e-12, atol=1e-15)


def test_dapo_clip_higher_invariant(ppo_clip):
    # METHODS dapo #2: A>0, ρ=1.25 still has gradient (1.25 < 1.28), ρ=1.30 has none;
    # the lower side still cuts at 0.8 for A<0: ρ=0.79 none, ρ=0.81 gradient 0.81.
    lp, old, adv, mask = tokens([1.25, 1.30, 0.79, 0.81], [1.0, 1.0, -1.0, -1.0])
    loss, _ = ppo_clip(lp, old, adv, mask, **EPS)
    expected = torch.tensor([[-1.25, 0.0, 0.0, 0.81]], dtype=F64)
    assert_close(grad_of(loss, lp), expected, rtol=1e-12, atol=0)


def test_first_minibatch_is_vanilla_policy_gradient(ppo_clip):
    # METHODS ppo #5: lp = lp_old -> ρ = 1 everywhere, loss = −A, ∂ℓ/∂lp = −A
    torch.manual_seed(0)
    old = torch.randn(3, 5, dtype=F64) - 2
    lp = old.clone().requires_grad_()
    adv = torch.randn(3, 5, dtype=F64)
    mask = torch.rand(3, 5) > 0.3
    mask[:, 0] = True
    loss, m = ppo_clip(lp, old, adv, mask, **EPS)
    assert_close(loss, torch.where(mask, -adv, 0.0), rtol=0, atol=0)
    assert_close(grad_of(loss, lp), torch.where(mask, -adv, 0.0), rtol=0, atol=0)
    assert m["clip_frac"].item() == 0.0 and m["ratio/max"].item() == 1.0


@pytest.mark.parametrize("adv_shape", ["seq", "tok"])
@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_matches_loop_reference(ppo_clip, adv_shape, dual_clip):
    torch.manual_seed(1)
    B, T = 6, 8
    old = torch.randn(B, T, dtype=F64) - 2
    lp = (old + 0.6 * torch.randn(B, T, dtype=F64)).requires_grad_()  # ratios ~ 0.3 .. 3
    signs = torch.tensor([1.0, -1.0] * (B // 2), dtype=F64)  # both signs present
    adv = signs * torch.rand(B, dtype=F64) + signs * 0.1
    if adv_shape == "tok":
        adv = torch.randn(B, T, dtype=F64)
    mask = torch.rand(B, T) > 0.25
    mask[:, 0] = True
    loss, m = ppo_clip(lp, old, adv, mask, eps_low=0.2, eps_high=0.28, dual_clip=dual_clip)
    for key in ("low_pos", "low_neg", "high_pos", "high_neg"):  # every region is exercised
        assert m[f"clip_frac/{key}"].item() > 0
    ref = ppo_loop(lp, old, adv, mask, 0.2, 0.28, dual_clip)
    assert_close(loss, ref, rtol=1e-12, atol=1e-14)
    assert_close(grad_of(loss, lp), grad_of(ref, lp), rtol=1e-12, atol=1e-14)


def test_metrics_hand_case(ppo_clip):
    # valid tokens (A, ρ): (+1,1.5) high_pos | (+1,0.5) low_pos | (−1,0.5) low_neg |
    # (−1,1.5) high_neg | (+1,1.0) inside | (−1,4.0) high_neg and dual (c=3);
    # a masked (+1,1.5) must not count. n = 6.
    lp, old, adv, _ = tokens([1.5, 0.5, 0.5, 1.5, 1.0, 4.0, 1.5], [1, 1, -1, -1, 1, -1, 1])
    mask = torch.tensor([[True] * 6 + [False]])
    _, m = ppo_clip(lp, old, adv, mask, **EPS, dual_clip=3.0)
    assert set(m) == set(METRIC_KEYS)
    got = {k: v.item() for k, v in m.items()}
    assert got["clip_frac/high_pos"] == pytest.approx(1 / 6)
    assert got["clip_frac/low_pos"] == pytest.approx(1 / 6)
    assert got["clip_frac/low_neg"] == pytest.approx(1 / 6)
    assert got["clip_frac/high_neg"] == pytest.approx(2 / 6)
    assert got["dual_clip_frac"] == pytest.approx(1 / 6)
    assert got["clip_frac"] == pytest.approx(3 / 6)  # low_neg + high_pos + dual
    assert got["ratio/min"] == pytest.approx(0.5)
    assert got["ratio/max"] == pytest.approx(4.0)
    assert got["ratio/mean"] == pytest.approx((1.5 + 0.5 + 0.5 + 1.5 + 1.0 + 4.0) / 6)
    assert got["log_ratio_clamped"] == 0
    assert all(v.dim() == 0 and not v.requires_grad for v in m.values())


def test_extreme_log_ratios_stay_finite(ppo_clip):
    # log-ratios ±200 would give exp(200) = inf in fp32; the guard clamps at ±20.
    old = torch.tensor([[-230.0, -30.0, -230.0, -30.0]])
    lp = torch.tensor([[-30.0, -230.0, -30.0, -230.0]]).requires_grad_()  # d = +200, −200, ...
    adv = torch.tensor([[-1.0, -1.0, 1.0, 1.0]])
    mask = torch.ones(1, 4, dtype=torch.bool)
    loss, m = ppo_clip(lp, old, adv, mask, **EPS)
    g = grad_of(loss, lp)
    assert torch.isfinite(loss).all() and torch.isfinite(g).all()
    assert m["log_ratio_clamped"].item() == 4
    assert m["ratio/max"].item() == pytest.approx(math.exp(20.0), rel=1e-6)
    # A<0 with ρ past the guard: loss e^20 (finite), zero gradient (documented, dual-clip-like);
    # the others are in PPO's zero-gradient regions or have ρ ≈ 2e-9.
    assert loss[0, 0].item() == pytest.approx(math.exp(20.0), rel=1e-6)
    assert g[0, 0].item() == 0.0 and g[0, 2].item() == 0.0


def test_nan_in_padding_does_not_leak(ppo_clip):
    lp = torch.tensor([[-1.0, float("nan")]], dtype=F64, requires_grad=True)
    old = torch.tensor([[-1.0, float("inf")]], dtype=F64)
    adv = torch.tensor([[1.0, float("nan")]], dtype=F64)
    mask = torch.tensor([[True, False]])
    loss, m = ppo_clip(lp, old, adv, mask, **EPS)
    g = grad_of(loss, lp)
    assert loss[0, 1].item() == 0.0 and g[0, 1].item() == 0.0
    assert torch.isfinite(loss).all() and torch.isfinite(g).all()
    assert all(torch.isfinite(v) for v in m.values())


def test_dtype_follows_input(ppo_clip):
    lp = torch.zeros(2, 3, dtype=torch.float32, requires_grad=True)
    loss, m = ppo_clip(lp, torch.zeros(2, 3), torch.ones(2), torch.ones(2, 3, dtype=torch.bool), **EPS)
    assert loss.dtype == torch.float32 and m["ratio/mean"].dtype == torch.float32


def _ok_inputs():
    return torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2), torch.ones(2, 3, dtype=torch.bool)


@pytest.mark.parametrize("change, err, match", [
    (dict(mask=torch.ones(2, 4, dtype=torch.bool)), ShapeError, "`mask` has shape"),
    (dict(logp_old=torch.zeros(2, 4)), ShapeError, "`logp_old` has shape"),
    (dict(mask=torch.ones(2, 3)), ShapeError, "must be a bool tensor"),
    (dict(adv=torch.ones(3)), ShapeError, "`adv` must be"),
    (dict(logp=torch.zeros(6)), ShapeError, "`logp` must be a"),
    (dict(logp=torch.tensor([[0.0, float("nan"), 0.0], [0.0, 0.0, 0.0]])), NonFiniteError, "`logp`"),
    (dict(logp_old=torch.tensor([[0.0, 0.0, 0.0], [float("inf"), 0.0, 0.0]])), NonFiniteError, "`logp_old`"),
    (dict(adv=torch.tensor([1.0, float("nan")])), NonFiniteError, "`adv`"),
    (dict(eps_low=1.0), ValueError, "eps_low"),
    (dict(eps_low=-0.1), ValueError, "eps_low"),
    (dict(eps_low=float("nan")), ValueError, "eps_low"),
    (dict(eps_high=-0.01), ValueError, "eps_high"),
    (dict(eps_high=True), ValueError, "eps_high"),
    (dict(dual_clip=1.0), ValueError, "dual_clip"),
    (dict(log_ratio_clamp=0.0), ValueError, "log_ratio_clamp"),
    (dict(log_ratio_clamp=100.0), ValueError, "overflows"),  # exp(100) > fp32 max
])
def test_bad_inputs(ppo_clip, change, err, match):
    logp, logp_old, adv, mask = _ok_inputs()
    kwargs = dict(logp=logp, logp_old=logp_old, adv=adv, mask=mask, **EPS)
    kwargs.update(change)
    with pytest.raises(err, match=match):
        ppo_clip(**kwargs)


def test_fp16_needs_a_smaller_guard(ppo_clip):
    lp = torch.zeros(1, 2, dtype=torch.float16)
    mask = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="overflows torch.float16"):
        ppo_clip(lp, lp, torch.ones(1), mask, **EPS)  # default 20 > log(65504) = 11.09
    loss, _ = ppo_clip(lp, lp, torch.ones(1), mask, **EPS, log_ratio_clamp=10.0)
    assert loss.dtype == torch.float16


def test_empty_mask_contributes_exactly_zero(ppo_clip):
    # a micro-batch whose sequences are all masked out: loss all 0 (finite, grad 0), metrics
    # finite counts 0, ratio/min|max = +inf|−inf (identities of min/max), no NaN anywhere.
    lp = torch.tensor([[-1.0, float("nan")]], requires_grad=True)
    mask = torch.zeros(1, 2, dtype=torch.bool)
    loss, m = ppo_clip(lp, torch.zeros(1, 2), torch.ones(1), mask, **EPS)
    (g,) = torch.autograd.grad(loss.sum(), lp)
    assert (loss == 0).all() and (g == 0).all()
    assert m["clip_frac"].item() == 0 and m["log_ratio_clamped"].item() == 0
    assert m["ratio/min"].item() == float("inf") and m["ratio/max"].item() == float("-inf")
    assert not any(torch.isnan(v) for v in m.values())
