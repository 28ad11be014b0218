import math

import pytest
import torch

from policylab.kernels.corrections import binary_kl, kpop
from policylab.errors import MissingQuantityError

F64 = torch.float64


def lp(*probs):
    return torch.log(torch.tensor([list(probs)], dtype=F64))


def bkl(p, q):
    return p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))


def naive_kpop(lp_tr, lp_sv, mask, delta, eps, weight):
    out = torch.zeros_like(lp_tr)
    for i in range(lp_tr.shape[0]):
        for t in range(lp_tr.shape[1]):
            if not mask[i, t]:
                continue
            p = min(max(math.exp(lp_tr[i, t]), eps), 1 - eps)
            q = min(max(math.exp(lp_sv[i, t]), eps), 1 - eps)
            if bkl(p, q) <= delta and bkl(q, p) <= delta:
                out[i, t] = math.exp(lp_tr[i, t] - lp_sv[i, t]) if weight == "ratio" else 1.0
    return out


def test_hand_worked_same_ratio_different_decision():
    # (p_tr, p_sv) = (0.02, 0.01): ratio 2
    #   D_f = 0.02 ln 2 + 0.98 ln(0.98/0.99) = 0.013863 - 0.009950 = 0.00391 <= 0.01
    #   D_r = 0.01 ln 0.5 + 0.99 ln(0.99/0.98) = -0.006931 + 0.010051 = 0.00312 <= 0.01 -> kept
    # (0.8, 0.4): ratio 2
    #   D_f = 0.8 ln 2 + 0.2 ln(0.2/0.6) = 0.5545 - 0.2197 = 0.3348 > 0.01 -> masked
    #   D_r = 0.4 ln 0.5 + 0.6 ln 3 = -0.2773 + 0.6592 = 0.3819
    assert bkl(0.02, 0.01) == pytest.approx(0.00391, abs=1e-5)
    assert bkl(0.01, 0.02) == pytest.approx(0.00312, abs=1e-5)
    assert bkl(0.8, 0.4) == pytest.approx(0.3348, abs=1e-4)
    assert bkl(0.4, 0.8) == pytest.approx(0.3819, abs=1e-4)
    mask = torch.ones(1, 2, dtype=torch.bool)
    w, m = kpop(lp(0.02, 0.8), lp(0.01, 0.4), mask, delta=0.01, in_region_weight="ratio")
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.0]], dtype=F64))
    w1, _ = kpop(lp(0.02, 0.8), lp(0.01, 0.4), mask, delta=0.01, in_region_weight="one")
    torch.testing.assert_close(w1, torch.tensor([[1.0, 0.0]], dtype=F64))
    torch.testing.assert_close(m["kpop/kl_forward_max"], torch.tensor(bkl(0.8, 0.4), dtype=F64))
    assert m["kpop/eps"].item() == pytest.approx(1e-6)


def test_one_direction_within_delta_other_not_is_masked():
    # (0.02, 0.01): D_f = 0.00391, D_r = 0.00312. With delta = 0.0035 only D_r passes -> masked;
    # inclusive boundary: delta = D_f exactly keeps it.
    mask = torch.ones(1, 1, dtype=torch.bool)
    w, m = kpop(lp(0.02), lp(0.01), mask, delta=0.0035, in_region_weight="one")
    assert w.item() == 0.0
    assert m["kpop/frac_masked_forward"].item() == 1.0 and m["kpop/frac_masked_reverse"].item() == 0.0
    d_f = binary_kl(*[torch.tensor(x, dtype=F64) for x in (0.02, 0.98, 0.01, 0.99)]).item()
    w_edge, _ = kpop(lp(0.02), lp(0.01), mask, delta=d_f, in_region_weight="one")
    assert w_edge.item() == 1.0


def test_extreme_probabilities_are_finite_and_kl_nonnegative():
    # p = 1 (lp = 0) and p ~ 0 (lp = -800): clamped to [eps, 1 - eps], finite everywhere
    lp_tr = torch.tensor([[0.0, -800.0, -1e-12]], dtype=F64)
    lp_sv = torch.tensor([[-800.0, 0.0, 0.0]], dtype=F64)
    w, m = kpop(lp_tr, lp_sv, torch.ones(1, 3, dtype=torch.bool), delta=0.01, in_region_weight="ratio")
    assert torch.isfinite(w).all()
    # every metric is finite except the raw ratio max/mean and k3 (which uses e^r): they are
    # honestly e^800 = inf in float64 (reported before any clamping); log_ratio_max carries it
    raw = {"kpop/ratio_max", "kpop/ratio_mean", "kpop/kl_k3"}
    assert all(torch.isfinite(v) for k, v in m.items() if k not in raw)
    assert m["kpop/log_ratio_max"].item() == 800.0
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0, 1.0]], dtype=F64))
    torch.manual_seed(4)
    p, q = torch.rand(1000, dtype=F64).clamp(1e-6, 1 - 1e-6), torch.rand(1000, dtype=F64).clamp(1e-6, 1 - 1e-6)
    assert bool((binary_kl(p, 1 - p, q, 1 - q) >= 0).all())


def test_matches_naive_loop():
    torch.manual_seed(5)
    lp_tr = -torch.rand(4, 8, dtype=F64) * 4
    lp_sv = lp_tr + 0.3 * torch.randn(4, 8, dtype=F64)
    lp_sv = lp_sv.clamp(max=0)
    mask = torch.rand(4, 8) > 0.2
    for weight in ("ratio", "one"):
        w, _ = kpop(lp_tr, lp_sv, mask, delta=0.01, eps=1e-6, in_region_weight=weight)
        torch.testing.assert_close(w, naive_kpop(lp_tr, lp_sv, mask, 0.01, 1e-6, weight))


def test_refusals():
    m = torch.ones(1, 1, dtype=torch.bool)
    with pytest.raises(ValueError, match="delta"):
        kpop(lp(0.5), lp(0.5), m, delta=0.0, in_region_weight="one")
    with pytest.raises(ValueError, match="in_region_weight"):
        kpop(lp(0.5), lp(0.5), m, delta=0.1, in_region_weight="k")
    with pytest.raises(ValueError, match="eps"):
        kpop(lp(0.5), lp(0.5), m, delta=0.1, eps=0.7, in_region_weight="one")
    with pytest.raises(TypeError):
        kpop(lp(0.5), lp(0.5), m, delta=0.1)  # in_region_weight is required (unconfirmed)
    with pytest.raises(MissingQuantityError, match="logp_old"):
        kpop(None, lp(0.5), m, delta=0.1, in_region_weight="one")
