import functools
import math

import pytest
import torch

from policylab.kernels.corrections import tis as tis_kernel
from policylab.errors import MissingQuantityError, NonFiniteError, ShapeError

F64 = torch.float64


@pytest.fixture(params=[True, False], ids=["fast", "plain"])
def tis(request):
    """The tests below that take this fixture run on both paths: the fast one (default,
    what the trainer runs) and the plain equation (`fast=False`)."""
    return functools.partial(tis_kernel, fast=request.param)


def lp(*probs):
    return torch.log(torch.tensor([list(probs)], dtype=F64))


def ones_mask(t):
    return torch.ones(1, t, dtype=torch.bool)


def naive_tis(logp_old, logp_behavior, mask, cap):
    out = torch.zeros_like(logp_old)
    for i in range(logp_old.shape[0]):
        for t in range(logp_old.shape[1]):
            if mask[i, t]:
                out[i, t] = min(math.exp(logp_old[i, t] - logp_behavior[i, t]), cap)
    return out


def test_hand_worked(tis):
    # p_old 0.2, p_mu 0.05 -> k = 0.2/0.05 = 4 -> min(4, 2) = 2
    # p_old 0.05, p_mu 0.2 -> k = 0.25 -> kept as 0.25 (upper truncation only, not zeroed)
    # p_old = p_mu = 0.5 -> k = 1
    w, m = tis(lp(0.2, 0.05, 0.5), lp(0.05, 0.2, 0.5), ones_mask(3), cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.25, 1.0]], dtype=F64))
    # one of three tokens exceeds the cap (4 > 2)
    torch.testing.assert_close(m["tis/frac_capped"], torch.tensor(1 / 3, dtype=F64))
    # raw ratio stats before the cap: max 4, min 0.25, mean (4 + .25 + 1)/3 = 1.75
    torch.testing.assert_close(m["tis/ratio_max"], torch.tensor(4.0, dtype=F64))
    torch.testing.assert_close(m["tis/ratio_min"], torch.tensor(0.25, dtype=F64))
    torch.testing.assert_close(m["tis/ratio_mean"], torch.tensor(1.75, dtype=F64))
    assert all(v.dim() == 0 and not v.requires_grad for v in m.values())


def test_swapped_numerator_and_denominator_is_caught(tis):
    expected = torch.tensor([[2.0, 0.25, 1.0]], dtype=F64)
    # swapped roles: k = 0.25, 4 -> 2, 1 -> [0.25, 2, 1], which differs from the hand values
    w_swapped, _ = tis(lp(0.05, 0.2, 0.5), lp(0.2, 0.05, 0.5), ones_mask(3), cap=2.0)
    assert not torch.allclose(w_swapped, expected)
    torch.testing.assert_close(w_swapped, torch.tensor([[0.25, 2.0, 1.0]], dtype=F64))


def test_equal_engines_leave_host_loss_unchanged(tis):
    torch.manual_seed(0)
    lp_old = -torch.rand(2, 5, dtype=F64) * 3
    w, _ = tis(lp_old, lp_old.clone(), torch.ones(2, 5, dtype=torch.bool), cap=2.0)
    assert torch.equal(w, torch.ones_like(w))
    host = torch.randn(2, 5, dtype=F64)
    assert torch.equal(w * host, host)


def test_weights_are_detached_and_ignore_the_live_policy(tis):
    # even if a differentiable tensor is passed, the weight carries no graph
    lp_old = lp(0.2, 0.05).requires_grad_(True)
    w, _ = tis(lp_old, lp(0.05, 0.2), ones_mask(2), cap=2.0)
    assert not w.requires_grad


def test_gradient_through_host_is_weight_times_adv(tis):
    # host REINFORCE loss -A·lp; d/dlp of w·(-A·lp) = -w·A: here w = [2, 0.25], A = 3
    w, _ = tis(lp(0.2, 0.05), lp(0.05, 0.2), ones_mask(2), cap=2.0)
    logp = lp(0.3, 0.3).requires_grad_(True)
    (w * (-3.0 * logp)).sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[-6.0, -0.75]], dtype=F64))


def test_matches_naive_loop(tis):
    torch.manual_seed(1)
    lp_old = -torch.rand(4, 7, dtype=F64) * 4
    lp_mu = -torch.rand(4, 7, dtype=F64) * 4
    mask = torch.rand(4, 7) > 0.3
    w, _ = tis(lp_old, lp_mu, mask, cap=1.7)
    torch.testing.assert_close(w, naive_tis(lp_old, lp_mu, mask, 1.7))


def test_padding_garbage_does_not_leak(tis):
    lp_old = torch.tensor([[math.log(0.5), float("nan"), float("inf")]], dtype=F64)
    lp_mu = torch.tensor([[math.log(0.25), 3.0, float("-inf")]], dtype=F64)
    mask = torch.tensor([[True, False, False]])
    w, m = tis(lp_old, lp_mu, mask, cap=5.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.0, 0.0]], dtype=F64))
    assert all(torch.isfinite(v) for v in m.values())


def test_float32_follows_input_dtype(tis):
    w, m = tis(lp(0.2).float(), lp(0.05).float(), ones_mask(1), cap=2.0)
    assert w.dtype == torch.float32 and m["tis/ess"].dtype == torch.float32


@pytest.mark.parametrize("cap", [0.0, -1.0, float("nan")])
def test_refuses_bad_cap(tis, cap):
    with pytest.raises(ValueError, match="cap"):
        tis(lp(0.2), lp(0.1), ones_mask(1), cap=cap)


def test_refuses_missing_role(tis):
    with pytest.raises(MissingQuantityError, match="logp_old"):
        tis(None, lp(0.1), ones_mask(1), cap=2.0)
    with pytest.raises(MissingQuantityError, match="logp_behavior"):
        tis(lp(0.1), None, ones_mask(1), cap=2.0)


def test_refuses_bad_shapes_masks_and_values(tis):
    with pytest.raises(ShapeError, match="logp_behavior"):
        tis(lp(0.2, 0.3), lp(0.1), ones_mask(2), cap=2.0)
    with pytest.raises(ShapeError, match="bool"):
        tis(lp(0.2), lp(0.1), torch.ones(1, 1), cap=2.0)
    with pytest.raises(NonFiniteError, match="logp_old"):
        tis(torch.tensor([[float("nan")]], dtype=F64), lp(0.1), ones_mask(1), cap=2.0)
