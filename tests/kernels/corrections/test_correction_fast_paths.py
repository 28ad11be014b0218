"""The fast paths of icepop, tis and mismatch_stats (`corrections.fast`, the default) equal
the plain equations (`fast=False`) in fp64: the weights, every metric, and the gradient
of a host loss multiplied by the weights, exactly.

Each batch has NaN in `logp_old` and +inf / huge values in `logp_behavior` at masked
positions, engine ratios placed exactly on IcePop's band bounds and on the TIS cap, ratios
far outside (e^±100, one past float64's exp range), a row without a counted token, and
a fully masked batch. The plain kernels themselves are checked against hand-worked
values and loop references in test_icepop.py / test_tis.py /
test_corrections_diagnostics.py (which run both paths).
"""

import math

import pytest
import torch

from policylab.kernels.corrections import icepop, mismatch_stats, tis
from policylab.kernels.objectives import ppo_clip

F64 = torch.float64


def batch(seed, B=9, T=8):
    """(lp_old, lp_mu, mask, k): k = the engine ratio exp(lp_old − lp_mu) as both kernels
    form it (0 log-ratio at masked positions); row 0 holds ratios ≈ 0.5, 2, e^±100, e^800."""
    g = torch.Generator().manual_seed(seed)
    lp_mu = -torch.rand(B, T, generator=g, dtype=F64) * 3 - 0.1
    d = 0.6 * torch.randn(B, T, generator=g, dtype=F64)
    d[0, :5] = torch.tensor([math.log(0.5), math.log(2.0), 100.0, -100.0, 800.0], dtype=F64)
    lp_old = lp_mu + d
    mask = torch.rand(B, T, generator=g) > 0.3
    mask[0, :5] = True
    mask[4] = False
    k = torch.exp(torch.where(mask, lp_old - lp_mu, torch.zeros((), dtype=F64)))
    lp_old = torch.where(mask, lp_old, torch.full((), math.nan, dtype=F64))
    lp_mu = torch.where(mask, lp_mu, torch.full((), math.inf, dtype=F64))
    lp_mu[5, ~mask[5]] = 1e300
    return lp_old, lp_mu, mask, k


def assert_same(fast, plain, mask):
    (wf, mf), (wp, mp) = fast, plain
    assert torch.equal(wf, wp), (wf - wp).abs().max()
    assert not wf.requires_grad and not wp.requires_grad
    assert list(mf) == list(mp)
    for key in mp:
        assert torch.equal(mf[key], mp[key]), (key, mf[key], mp[key])
    for w in (wf, wp):  # masked garbage reached no weight
        assert torch.isfinite(w).all() and w[~mask].eq(0).all()


def host_grad(weight, lp_old, mask):
    """Gradient of Σ w·ℓ_PPO with ρ = 1 (lp = lp_old at counted positions), A = +1."""
    lp = torch.where(mask, lp_old, torch.full((), math.nan, dtype=F64)).requires_grad_()
    loss, _ = ppo_clip(lp, torch.where(mask, lp_old, torch.zeros((), dtype=F64)), torch.ones(lp.shape[0], dtype=F64),
                       mask, eps_low=0.2, eps_high=0.2)
    (g,) = torch.autograd.grad((weight * loss).sum(), lp)
    return g


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_icepop_fast_equals_plain(seed):
    lp_old, lp_mu, mask, k = batch(seed)
    low, high = float(k[0, 0]), float(k[0, 1])  # exactly two of the batch's ratios
    fast = icepop(lp_old, lp_mu, mask, low=low, high=high)
    plain = icepop(lp_old, lp_mu, mask, low=low, high=high, fast=False)
    assert_same(fast, plain, mask)
    w, m = plain
    # both bounds are inclusive: the tokens on them keep their weight k (≈ 0.5 and ≈ 2)
    assert w[0, 0].item() == low and w[0, 1].item() == high
    # e^100 and e^800 (inf in float64) are above, e^-100 below: weight 0, no NaN
    assert w[0, 2:5].eq(0).all()
    assert m["icepop/frac_masked_high"].item() > 0 and m["icepop/frac_masked_low"].item() > 0
    assert torch.equal(host_grad(fast[0], lp_old, mask), host_grad(w, lp_old, mask))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tis_fast_equals_plain(seed):
    lp_old, lp_mu, mask, k = batch(seed)
    finite = mask.clone()
    finite[0, 4] = False  # without a cap, e^800 would be an inf weight (in both paths)
    for cap, m in ((float(k[0, 1]), mask), (2.0, mask), (0.5, mask), (math.inf, finite)):
        fast = tis(lp_old, lp_mu, m, cap=cap)
        plain = tis(lp_old, lp_mu, m, cap=cap, fast=False)
        assert_same(fast, plain, m)
        if cap < math.inf:  # e^800 truncated to C, never inf; the token on the cap keeps it
            assert plain[0][0, 4].item() == cap and plain[0][0, 1].item() == min(cap, float(k[0, 1]))
        assert torch.equal(host_grad(fast[0], lp_old, m), host_grad(plain[0], lp_old, m))


@pytest.mark.parametrize("seed", [0, 1])
def test_mismatch_stats_fast_equals_plain(seed):
    lp_old, lp_mu, mask, _ = batch(seed)
    keep = mask.clone()
    keep[0, 4] = False  # r = 800 would make ratio_max inf: compare a finite case as well
    r = torch.where(keep, lp_old - lp_mu, torch.zeros((), dtype=F64))
    on = float(torch.expm1(r[0, 1]))  # a threshold exactly on a token's |e^r − 1| (strict: not far)
    for m, thr in ((mask, 0.2), (keep, 0.2), (keep, on)):
        fast = mismatch_stats(lp_old, lp_mu, m, far_threshold=thr)
        plain = mismatch_stats(lp_old, lp_mu, m, far_threshold=thr, fast=False)
        assert list(fast) == list(plain)
        for key in plain:
            assert torch.equal(fast[key], plain[key]), (key, fast[key], plain[key])
    n_far = sum(abs(math.expm1(float(r[i, t]))) > on for i in range(r.shape[0]) for t in range(r.shape[1]) if keep[i, t])
    assert plain["frac_far"].item() == pytest.approx(n_far / int(keep.sum()), rel=1e-15)


def test_fast_equals_plain_on_an_empty_mask():
    lp_old, lp_mu, _, _ = batch(3)
    mask = torch.zeros_like(lp_old, dtype=torch.bool)
    assert_same(icepop(lp_old, lp_mu, mask, low=0.5, high=2.0), icepop(lp_old, lp_mu, mask, low=0.5, high=2.0,
                                                                          fast=False), mask)
    assert_same(tis(lp_old, lp_mu, mask, cap=2.0), tis(lp_old, lp_mu, mask, cap=2.0, fast=False), mask)
