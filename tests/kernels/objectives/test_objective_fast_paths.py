"""The fast paths of ppo_clip and cispo (`objectives.fast`, the default) equal the plain
equations (`fast=False`) in fp64: the loss matrix, the gradient and every metric, exactly.

Each batch has advantages per token [B, T] and per sequence [B]; garbage at masked
positions (NaN in `logp`, +inf in `logp_old`, NaN / 1e300 in per-token advantages, a
huge `logp` of 1e300); ratios placed exactly on 1 − ε_low and 1 + ε_high (and on the dual
clip c); a log-ratio past the guard; a row without a counted token (NaN advantage) and
rows with A = 0. The plain kernels themselves are checked against hand-worked values and
a loop reference in test_ppo.py / test_cispo.py (which run both paths).
"""

import math

import pytest
import torch

from policylab.kernels.objectives import cispo, ppo_clip

F64 = torch.float64


def batch(seed=0, B=12, T=9):
    """(lp, old, adv_row, adv_tok, mask, eps, c): bounds placed exactly on ratios of the
    batch, ρ computed the way both kernels form it (exp of the masked log-ratio)."""
    g = torch.Generator().manual_seed(seed)
    old = torch.randn(B, T, generator=g, dtype=F64) - 2
    d = 0.5 * torch.randn(B, T, generator=g, dtype=F64)
    d[0, :4] = torch.tensor([math.log(1.28), math.log(0.8), math.log(3.0), 0.0], dtype=F64)
    d[1, :4] = torch.tensor([math.log(1.28), math.log(0.8), math.log(3.0), 25.0], dtype=F64)  # 25: past the guard
    mask = torch.rand(B, T, generator=g) > 0.3
    mask[:2, :4] = True
    mask[2] = False  # a row without a counted token
    lp = old + d
    rho = torch.exp(torch.where(mask, lp - old, torch.zeros((), dtype=F64)))
    eps = dict(eps_high=float(rho[0, 0]) - 1.0, eps_low=1.0 - float(rho[1, 1]))
    assert 1.0 + eps["eps_high"] == float(rho[0, 0]) and 1.0 - eps["eps_low"] == float(rho[1, 1])
    adv = torch.randn(B, generator=g, dtype=F64)
    adv[0], adv[1], adv[3] = 1.0, -1.0, 0.0
    adv_tok = torch.where(mask, adv[:, None].expand(B, T), torch.full((), 1e300, dtype=F64))
    adv_tok[5, ~mask[5]] = float("nan")
    adv[2] = float("nan")  # the empty row: never reaches a counted position
    lp = torch.where(mask, lp, torch.full((), float("nan"), dtype=F64))
    lp[6, ~mask[6]] = 1e300
    old = torch.where(mask, old, torch.full((), math.inf, dtype=F64))
    return lp, old, adv, adv_tok, mask, eps, float(rho[1, 2])


def run(fn, lp, *args, **kw):
    x = lp.clone().requires_grad_()
    loss, metrics = fn(x, *args, **kw)
    (grad,) = torch.autograd.grad(loss.sum(), x)
    return loss.detach(), grad, metrics


def assert_same(fast, plain, mask):
    (lf, gf, mf), (lp, gp, mp) = fast, plain
    assert torch.equal(lf, lp), (lf - lp).abs().max()
    assert torch.equal(gf, gp), (gf - gp).abs().max()
    assert set(mf) == set(mp)
    for k in mp:
        assert torch.equal(mf[k], mp[k]), (k, mf[k], mp[k])
    for loss, grad in ((lf, gf), (lp, gp)):  # masked garbage reached neither
        assert torch.isfinite(loss).all() and torch.isfinite(grad).all()
        assert loss[~mask].eq(0).all() and grad[~mask].eq(0).all()


@pytest.mark.parametrize("dual", [False, True])
@pytest.mark.parametrize("per", ["row", "token"])
@pytest.mark.parametrize("seed", [0, 1])
def test_ppo_fast_equals_plain(seed, per, dual):
    lp, old, adv, adv_tok, mask, eps, c = batch(seed)
    a = adv if per == "row" else adv_tok
    kw = dict(eps, dual_clip=c if dual else None)
    fast = run(ppo_clip, lp, old, a, mask, **kw)
    plain = run(ppo_clip, lp, old, a, mask, fast=False, **kw)
    assert_same(fast, plain, mask)
    m = plain[2]
    for key in ("low_pos", "low_neg", "high_pos", "high_neg"):  # every region is exercised
        assert m[f"clip_frac/{key}"].item() > 0, key
    assert m["log_ratio_clamped"].item() == 1
    # on-bound ratios are inside (full gradient −ρA): row 0, A = +1, ρ = 1 + ε_high exactly:
    # ∂ℓ/∂lp = −ρ·A = −(1 + ε_high); row 1, A = −1, ρ = 1 − ε_low: −ρ·(−1) = 1 − ε_low; and
    # with the dual clip, row 1's ρ = c (strict ρ > c): −c·(−1) = c
    grad = plain[1]
    assert grad[0, 0].item() == pytest.approx(-(1 + eps["eps_high"]), rel=1e-12)
    assert grad[1, 1].item() == pytest.approx(1 - eps["eps_low"], rel=1e-12)
    assert grad[1, 2].item() == pytest.approx(c, rel=1e-12)


@pytest.mark.parametrize("eps_low", ["batch", None, 1.5])
@pytest.mark.parametrize("per", ["row", "token"])
@pytest.mark.parametrize("seed", [0, 1])
def test_cispo_fast_equals_plain(seed, per, eps_low):
    lp, old, adv, adv_tok, mask, eps, _ = batch(seed)
    a = adv if per == "row" else adv_tok
    kw = dict(eps_low=eps["eps_low"] if eps_low == "batch" else eps_low, eps_high=eps["eps_high"])
    fast = run(cispo, lp, old, a, mask, **kw)
    plain = run(cispo, lp, old, a, mask, fast=False, **kw)
    assert_same(fast, plain, mask)
    assert plain[2]["clip_frac/high_pos"].item() > 0 and plain[2]["clip_frac"].item() == 0
    # the weight on a bound is the bound: row 0, A = +1, ρ = 1 + ε_high, lp = −2 + log ρ:
    # ℓ = −w·A·lp, ∂ℓ/∂lp = −w·A = −(1 + ε_high)
    assert plain[1][0, 0].item() == pytest.approx(-(1 + eps["eps_high"]), rel=1e-12)


@pytest.mark.parametrize("per", ["row", "token"])
def test_fast_equals_plain_on_an_empty_mask(per):
    lp, old, adv, adv_tok, _, eps, _ = batch(3)
    mask = torch.zeros_like(lp, dtype=torch.bool)
    a = adv if per == "row" else adv_tok  # NaN advantages of rows with nothing counted: allowed
    for fn in (ppo_clip, cispo):
        fast = run(fn, lp, old, a, mask, **eps)
        plain = run(fn, lp, old, a, mask, fast=False, **eps)
        assert_same(fast, plain, mask)
        assert plain[2]["ratio/min"].item() == math.inf and plain[2]["ratio/max"].item() == -math.inf
