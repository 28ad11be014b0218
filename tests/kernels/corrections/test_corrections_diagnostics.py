import functools
import math

import pytest
import torch

from policylab.kernels.corrections import ess
from policylab.kernels.corrections import mismatch_stats as mismatch_stats_kernel
from policylab.errors import ShapeError

F64 = torch.float64


@pytest.fixture(params=[True, False], ids=["fast", "plain"])
def mismatch_stats(request):
    """The tests below that take this fixture run on both paths: the fast one (default,
    what the trainer runs) and the plain equation (`fast=False`)."""
    return functools.partial(mismatch_stats_kernel, fast=request.param)


def test_mismatch_stats_hand_worked(mismatch_stats):
    # r = lp_a - lp_b = [ln 2, -ln 2, 0]; ratios [2, 0.5, 1]
    # k1 = mean(-r) = 0; k3 = mean(e^r - 1 - r) = [(1 - .6931) + (-.5 + .6931) + 0] / 3
    #    = (0.30685 + 0.19315) / 3 = 0.16667
    # |Δ| mean = 2·0.6931/3 = 0.46210, max 0.6931; |ratio - 1| > 0.2 for 2 of 3
    lp_b = torch.full((1, 4), -1.0, dtype=F64)
    lp_a = lp_b + torch.tensor([[math.log(2), -math.log(2), 0.0, 50.0]], dtype=F64)
    mask = torch.tensor([[True, True, True, False]])  # the 50 at padding never enters
    m = mismatch_stats(lp_a, lp_b, mask)
    assert m["kl_k1"].item() == pytest.approx(0.0, abs=1e-15)
    assert m["kl_k3"].item() == pytest.approx(1 / 6, abs=1e-12)
    assert m["abs_dlogp_mean"].item() == pytest.approx(2 * math.log(2) / 3)
    assert m["abs_dlogp_max"].item() == pytest.approx(math.log(2))
    assert m["frac_far"].item() == pytest.approx(2 / 3)
    assert (m["ratio_min"].item(), m["ratio_max"].item()) == pytest.approx((0.5, 2.0))
    assert m["ratio_mean"].item() == pytest.approx(3.5 / 3)
    assert m["n_tokens"].item() == 3


def test_mismatch_stats_matches_naive_and_empty_mask(mismatch_stats):
    torch.manual_seed(30)
    a, b = -torch.rand(3, 7, dtype=F64), -torch.rand(3, 7, dtype=F64)
    mask = torch.rand(3, 7) > 0.3
    r = [float(a[i, t] - b[i, t]) for i in range(3) for t in range(7) if mask[i, t]]
    m = mismatch_stats(a, b, mask)
    assert m["kl_k3"].item() == pytest.approx(sum(math.exp(x) - 1 - x for x in r) / len(r))
    assert m["kl_k1"].item() == pytest.approx(-sum(r) / len(r))
    empty = mismatch_stats(a, b, torch.zeros(3, 7, dtype=torch.bool))
    assert all(v.item() == 0 for v in empty.values())


def test_ess_values():
    # equal weights -> 1; one weight carries everything among 4 -> (1)^2 / (4·1) = 0.25
    # [1, 2, 3]: (6)^2 / (3·14) = 36/42 = 0.857142
    assert ess(torch.ones(5, dtype=F64)).item() == pytest.approx(1.0)
    assert ess(torch.tensor([0.0, 0.0, 3.0, 0.0], dtype=F64)).item() == pytest.approx(0.25)
    assert ess(torch.tensor([1.0, 2.0, 3.0], dtype=F64)).item() == pytest.approx(36 / 42)
    w = torch.tensor([[1.0, 2.0, 3.0, 100.0]], dtype=F64)
    mask = torch.tensor([[True, True, True, False]])
    assert ess(w, mask).item() == pytest.approx(36 / 42)
    assert ess(torch.zeros(3, dtype=F64)).item() == 0.0


def test_ess_refusals():
    with pytest.raises(ValueError, match=">= 0"):
        ess(torch.tensor([1.0, -1.0]))
    with pytest.raises(ShapeError, match="differ"):
        ess(torch.ones(3), torch.ones(2, dtype=torch.bool))
