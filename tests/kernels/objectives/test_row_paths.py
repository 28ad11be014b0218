"""Advantages given per sequence [B] take a faster path in ppo_clip and cispo (one-sided
clamps per row, region counts from per-row sums, no bool [B, T] masks). These tests pin it
to the per-token path (the same advantage broadcast to [B, T]) in value, gradient and
every metric, on ratios on and past the bounds, padding with NaN, the log-ratio guard and
an empty mask; and check the counting helpers on hand-worked cases and a naive loop."""

import math

import pytest
import torch
from torch.testing import assert_close

from policylab.errors import NonFiniteError
from policylab.kernels.objectives import cispo, ppo_clip
from policylab.kernels.objectives.fast import band_counts, row_flag_count

F64 = torch.float64


def batch(seed=0, B=12, T=9, nan_pad=True):
    """Random fp64 batch with padding (NaN there), a row without counted tokens (NaN
    advantage), A = +1, −1, 0 rows, a log-ratio past the guard, and bounds placed exactly
    on ratios of the batch: `eps` has eps_high = ρ[0,0] − 1, eps_low = 1 − ρ[1,1] and
    dual clip c = ρ[1,2], with ρ computed the way the kernels compute it."""
    g = torch.Generator().manual_seed(seed)
    old = torch.randn(B, T, generator=g, dtype=F64) - 2
    d = 0.5 * torch.randn(B, T, generator=g, dtype=F64)
    d[0, :4] = torch.tensor([math.log(1.28), math.log(0.8), math.log(3.0), 0.0], dtype=F64)
    d[1, :4] = torch.tensor([math.log(1.28), math.log(0.8), math.log(3.0), 25.0], dtype=F64)  # 25: past the guard
    mask = torch.rand(B, T, generator=g) > 0.3
    mask[:2, :4] = True
    mask[2] = False  # a row without a counted token
    lp = old + d
    rho = torch.exp((lp - old) * mask.to(F64))  # as the kernels form it (same shape, same ops)
    eps = dict(eps_high=float(rho[0, 0]) - 1.0, eps_low=1.0 - float(rho[1, 1]))
    assert 1.0 + eps["eps_high"] == float(rho[0, 0]) and 1.0 - eps["eps_low"] == float(rho[1, 1])
    if nan_pad:
        lp = torch.where(mask, lp, torch.full_like(lp, float("nan")))
    adv = torch.randn(B, generator=g, dtype=F64)
    adv[0], adv[1], adv[3] = 1.0, -1.0, 0.0
    adv[2] = float("nan")  # never reaches a counted position
    return lp.requires_grad_(), old, adv, mask, eps, float(rho[1, 2])


def _both(fn, lp, old, adv, mask, **kw):
    loss_r, m_r = fn(lp, old, adv, mask, **kw)
    (g_r,) = torch.autograd.grad(loss_r.sum(), lp)
    adv_tok = torch.where(mask, adv[:, None].expand_as(mask), torch.zeros((), dtype=adv.dtype))
    loss_t, m_t = fn(lp, old, adv_tok, mask, **kw)
    (g_t,) = torch.autograd.grad(loss_t.sum(), lp)
    return (loss_r, g_r, m_r), (loss_t, g_t, m_t)


@pytest.mark.parametrize("dual", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_ppo_row_path_equals_token_path(dual, seed):
    lp, old, adv, mask, eps, c = batch(seed)
    dual_clip = c if dual else None
    (lr, gr, mr), (lt, gt, mt) = _both(ppo_clip, lp, old, adv, mask, **eps, dual_clip=dual_clip)
    assert torch.isfinite(lr).all() and torch.isfinite(gr).all()
    assert_close(lr, lt, rtol=1e-13, atol=1e-15)
    assert_close(gr, gt, rtol=1e-13, atol=1e-15)
    assert set(mr) == set(mt)
    for k in mt:
        assert_close(mr[k], mt[k], rtol=1e-12, atol=1e-15, msg=k)
    assert mr["log_ratio_clamped"].item() == 1
    # on-bound ratios are inside: full gradient −ρA (row 0: A = +1 on the upper bound;
    # row 1: A = −1 on the lower bound and, with the dual clip, on c)
    assert gr[0, 0].item() == pytest.approx(-(1 + eps["eps_high"]), rel=1e-12)
    assert gr[1, 1].item() == pytest.approx(1 - eps["eps_low"], rel=1e-12)
    assert gr[1, 2].item() == pytest.approx(c, rel=1e-12)


@pytest.mark.parametrize("eps_low", ["batch", None, 1.5])
def test_cispo_row_path_equals_token_path(eps_low):
    lp, old, adv, mask, eps, _ = batch(2)
    low = eps["eps_low"] if eps_low == "batch" else eps_low
    (lr, gr, mr), (lt, gt, mt) = _both(cispo, lp, old, adv, mask, eps_low=low, eps_high=eps["eps_high"])
    assert_close(lr, lt, rtol=1e-13, atol=1e-15)
    assert_close(gr, gt, rtol=1e-13, atol=1e-15)
    for k in mt:
        assert_close(mr[k], mt[k], rtol=1e-12, atol=1e-15, msg=k)
    assert lr[~mask].eq(0).all() and gr[~mask].eq(0).all()


def test_row_paths_empty_mask():
    lp, old, adv, _, _, _ = batch(3)
    mask = torch.zeros_like(lp, dtype=torch.bool)
    for fn, kw in ((ppo_clip, dict(eps_low=0.2, eps_high=0.28)), (cispo, dict(eps_low=None, eps_high=0.28))):
        loss, m = fn(lp, old, adv, mask, **kw)
        assert (loss == 0).all()
        assert m["ratio/min"].item() == math.inf and m["ratio/max"].item() == -math.inf
        assert m["clip_frac"].item() == 0 and m["ratio/mean"].item() == 0


def test_row_path_refuses_nan_advantage_of_a_counted_row():
    lp, old, adv, mask, eps, _ = batch(4)
    adv[5] = float("nan")
    with pytest.raises(NonFiniteError, match=r"`adv` has 1 non-finite value\(s\), first at index \[5\]"):
        ppo_clip(lp, old, adv, mask, **eps)


def test_band_counts_hand_case():
    # rows: A = +1, −1, 0; ρ with bounds [0.8, 1.28]; masked positions hold ρ = 1
    ratio = torch.tensor([[0.5, 1.28, 1.5, 1.0],
                          [0.8, 0.79, 2.0, 3.0],
                          [0.1, 9.0, 1.0, 1.0]], dtype=F64)
    adv = torch.tensor([1.0, -1.0, 0.0], dtype=F64)
    c = {k: v.item() for k, v in band_counts(ratio, adv, 0.8, 1.28).items()}
    # row 0: below {0.5}, above {1.5} (1.28 is on the bound); row 1: below {0.79}, above {2, 3}
    assert c == {"low_pos": 1, "low_neg": 1, "high_pos": 1, "high_neg": 2}
    assert row_flag_count(ratio, 2.0, adv).item() == 1  # A < 0 and ρ > 2: only 3.0 (2.0 is on it)
    no_low = {k: v.item() for k, v in band_counts(ratio, adv, None, 1.28).items()}
    assert no_low == {"low_pos": 0, "low_neg": 0, "high_pos": 1, "high_neg": 2}


def test_band_counts_matches_a_loop():
    g = torch.Generator().manual_seed(5)
    ratio = torch.exp(0.4 * torch.randn(20, 7, generator=g))
    adv = torch.randn(20, generator=g)
    adv[::4] = 0.0
    got = band_counts(ratio, adv, 0.8, 1.2)
    want = dict(low_pos=0, low_neg=0, high_pos=0, high_neg=0)
    for b in range(20):
        for t in range(7):
            r, a = float(ratio[b, t]), float(adv[b])
            side = "low" if r < 0.8 else "high" if r > 1.2 else None
            sign = "pos" if a > 0 else "neg" if a < 0 else None
            if side and sign:
                want[f"{side}_{sign}"] += 1
    assert {k: int(v) for k, v in got.items()} == want


def test_band_counts_refuses_a_band_without_one():
    with pytest.raises(ValueError, match="lower <= 1 <= upper"):
        band_counts(torch.ones(1, 2), torch.ones(1), 1.1, 2.0)
