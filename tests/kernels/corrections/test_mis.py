import math

import pytest
import torch

from policylab.kernels.corrections import mis, seq_log_ratio_sum, seq_ratio_geomean, seq_ratio_product
from policylab.errors import MissingQuantityError

F64 = torch.float64


def naive_seq(lp_num, lp_den, mask, kind):
    out = []
    for i in range(lp_num.shape[0]):
        s, n = 0.0, 0
        for t in range(lp_num.shape[1]):
            if mask[i, t]:
                s += float(lp_num[i, t] - lp_den[i, t])
                n += 1
        out.append(s if kind == "product" else (s / n if n else 0.0))
    return torch.tensor(out, dtype=F64)


def naive_mis(lp_num, lp_den, mask, low, high, kind, mode):
    out = []
    for log_r in naive_seq(lp_num, lp_den, mask, kind).tolist():
        r = math.exp(log_r)
        if r < low or (mode == "mask" and r > high):
            out.append(0.0)
        else:
            out.append(min(r, high))
    return torch.tensor(out, dtype=F64)


def test_hand_worked_product_vs_geomean():
    # token log ratios d = [0.1, -0.1, 0.3] (+ one padded position with garbage)
    # product:  log R = 0.3, R = e^0.3 = 1.3499
    # geomean:  log R = 0.3 / 3 = 0.1, R = e^0.1 = 1.1052
    lp_num = torch.tensor([[0.1, -0.1, 0.3, 99.0]], dtype=F64) - 1.0
    lp_den = torch.full_like(lp_num, -1.0)
    mask = torch.tensor([[True, True, True, False]])
    prod = seq_ratio_product(lp_num, lp_den, mask)
    geo = seq_ratio_geomean(lp_num, lp_den, mask)
    torch.testing.assert_close(prod.log_ratio, torch.tensor([0.3], dtype=F64))
    torch.testing.assert_close(prod.ratio, torch.tensor([1.3499], dtype=F64), atol=1e-4, rtol=0)
    torch.testing.assert_close(geo.log_ratio, torch.tensor([0.1], dtype=F64))
    torch.testing.assert_close(geo.ratio, torch.tensor([1.1052], dtype=F64), atol=1e-4, rtol=0)
    # band [0.8, 1.2]: product 1.35 masked, geomean 1.105 kept with value 1.105
    w_p, _ = mis(lp_num, lp_den, mask, low=0.8, high=1.2, kind="product")
    w_g, _ = mis(lp_num, lp_den, mask, low=0.8, high=1.2, kind="geomean")
    assert w_p.item() == 0.0
    assert w_g.item() == pytest.approx(math.exp(0.1))
    # truncate mode: product 1.35 -> min(1.35, 1.2) = 1.2
    w_t, _ = mis(lp_num, lp_den, mask, low=0.8, high=1.2, kind="product", mode="truncate")
    assert w_t.item() == pytest.approx(1.2)


def test_long_sequence_product_no_underflow_no_nan():
    # 20000 tokens with log ratio -0.05 each: log R = -1000 (finite), while R = e^-1000
    # underflows to 0 even in float64 (and a float32 running product would hit 0 -> log = -inf)
    T = 20_000
    lp_den = torch.zeros(1, T, dtype=torch.float32)
    lp_num = torch.full((1, T), -0.05, dtype=torch.float32)
    mask = torch.ones(1, T, dtype=torch.bool)
    prod = seq_ratio_product(lp_num, lp_den, mask, log_clamp=30.0)
    assert torch.isfinite(prod.log_ratio).all()
    assert prod.log_ratio.item() == pytest.approx(-1000.0, rel=1e-4)
    assert prod.clamped.item() and prod.ratio.item() == pytest.approx(math.exp(-30.0), rel=1e-5)
    w, m = mis(lp_num, lp_den, mask, low=0.5, high=2.0, kind="product")
    assert w.item() == 0.0 and all(torch.isfinite(v) for v in m.values())
    assert m["mis/frac_guard_clamped"].item() == 1.0
    # the geometric mean of the same sequence is e^-0.05, in band, kept
    w_g, _ = mis(lp_num, lp_den, mask, low=0.5, high=2.0, kind="geomean")
    assert w_g.item() == pytest.approx(math.exp(-0.05), rel=1e-5)
    # the naive float32 product really does collapse (what the log-space version avoids)
    assert torch.exp(lp_num[0]).prod().item() == 0.0


def test_sum_matches_naive_and_weights_match_naive():
    torch.manual_seed(6)
    lp_num = -torch.rand(5, 12, dtype=F64) * 2
    lp_den = lp_num + 0.05 * torch.randn(5, 12, dtype=F64)
    mask = torch.rand(5, 12) > 0.3
    mask[4] = False  # an empty sequence: log R = 0 for both kinds
    torch.testing.assert_close(seq_log_ratio_sum(lp_num, lp_den, mask), naive_seq(lp_num, lp_den, mask, "product"))
    for kind in ("product", "geomean"):
        for mode in ("mask", "truncate"):
            w, _ = mis(lp_num, lp_den, mask, low=0.9, high=1.05, kind=kind, mode=mode)
            torch.testing.assert_close(w, naive_mis(lp_num, lp_den, mask, 0.9, 1.05, kind, mode))


def test_weights_broadcast_over_tokens_and_are_detached():
    lp_num = torch.zeros(2, 3, dtype=F64, requires_grad=True)
    w, _ = mis(lp_num, torch.zeros(2, 3, dtype=F64), torch.ones(2, 3, dtype=torch.bool),
               low=0.5, high=2.0, kind="product")
    assert w.shape == (2,) and not w.requires_grad
    assert (w[:, None] * torch.ones(2, 3, dtype=F64)).shape == (2, 3)


def test_refusals():
    m = torch.ones(1, 2, dtype=torch.bool)
    z = torch.zeros(1, 2, dtype=F64)
    with pytest.raises(ValueError, match="kind"):
        mis(z, z, m, low=0.5, high=2.0, kind="sum")
    with pytest.raises(ValueError, match="mode"):
        mis(z, z, m, low=0.5, high=2.0, kind="product", mode="clip")
    with pytest.raises(ValueError, match="low"):
        mis(z, z, m, low=2.0, high=0.5, kind="product")
    with pytest.raises(ValueError, match="log_clamp"):
        seq_ratio_product(z, z, m, log_clamp=0.0)
    with pytest.raises(MissingQuantityError, match="logp_behavior"):
        mis(z, None, m, low=0.5, high=2.0, kind="product")
