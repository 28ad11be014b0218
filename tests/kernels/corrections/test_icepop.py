import functools
import math

import pytest
import torch

from policylab.kernels.corrections import icepop as icepop_kernel
from policylab.kernels.corrections import icepop_normalizer_mask, tis
from policylab.errors import MissingQuantityError

F64 = torch.float64


@pytest.fixture(params=[True, False], ids=["fast", "plain"])
def icepop(request):
    """The tests below that take this fixture run on both paths: the fast one (default,
    what the trainer runs) and the plain equation (`fast=False`)."""
    return functools.partial(icepop_kernel, fast=request.param)


def naive_icepop(lp_old, lp_mu, mask, low, high):
    out = torch.zeros_like(lp_old)
    for i in range(lp_old.shape[0]):
        for t in range(lp_old.shape[1]):
            if mask[i, t]:
                k = math.exp(lp_old[i, t] - lp_mu[i, t])
                out[i, t] = k if low <= k <= high else 0.0
    return out


def from_k(*ks):
    """lp_mu = 0 and lp_old = log k, so exp(lp_old - lp_mu) = k."""
    lp_old = torch.log(torch.tensor([list(ks)], dtype=F64))
    return lp_old, torch.zeros_like(lp_old)


def host_ppo(logp, logp_old, adv, eps=0.2):
    rho = torch.exp(logp - logp_old)
    return -torch.minimum(rho * adv, rho.clamp(1 - eps, 1 + eps) * adv)


def test_hand_worked(icepop):
    # alpha = 0.5, beta = 5:
    # k = 0.3 -> 0 (TIS would keep 0.3); k = 7 -> 0 (TIS would give C = 2)
    # k = 2 -> 2 (the weight is k, not 1); k = 0.5 = alpha exactly -> kept (inclusive)
    # k = 5 = beta exactly -> kept; k = 1 -> 1
    lp_old, lp_mu = from_k(0.3, 7.0, 2.0, 0.5, 5.0, 1.0)
    mask = torch.ones(1, 6, dtype=torch.bool)
    w, m = icepop(lp_old, lp_mu, mask, low=0.5, high=5.0)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0, 2.0, 0.5, 5.0, 1.0]], dtype=F64))
    w_tis, _ = tis(lp_old, lp_mu, mask, cap=2.0)
    torch.testing.assert_close(w_tis[0, :2], torch.tensor([0.3, 2.0], dtype=F64))
    # 2 of 6 masked: one below (0.3), one above (7)
    torch.testing.assert_close(m["icepop/frac_masked"], torch.tensor(2 / 6, dtype=F64))
    torch.testing.assert_close(m["icepop/frac_masked_low"], torch.tensor(1 / 6, dtype=F64))
    torch.testing.assert_close(m["icepop/frac_masked_high"], torch.tensor(1 / 6, dtype=F64))


def test_gradient_out_of_band_zero_in_band_weight_k(icepop):
    # host PPO at rho = 1 (logp = logp_old): unclipped gradient of -rho·A is -A per token.
    # weighted: token 0 (k = 7, out of band) -> 0; token 1 (k = 2) -> -2·A = -2
    lp_old_eng, lp_mu = from_k(7.0, 2.0)
    w, _ = icepop(lp_old_eng, lp_mu, torch.ones(1, 2, dtype=torch.bool), low=0.5, high=5.0)
    logp_old = torch.log(torch.tensor([[0.4, 0.4]], dtype=F64))
    logp = logp_old.clone().requires_grad_(True)
    (w * host_ppo(logp, logp_old, torch.tensor(1.0, dtype=F64))).sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -2.0]], dtype=F64))


def test_large_policy_ratio_never_masked_by_icepop(icepop):
    # k = 1 and rho = e^3 ~ 20: IcePop reads only lp_old / lp_mu, so the weight is 1.
    # (A test that would catch passing the live logp as `logp_old`: then k = 20 > 5 -> 0.)
    logp_old = torch.log(torch.tensor([[0.01]], dtype=F64))
    logp = logp_old + 3.0
    mask = torch.ones(1, 1, dtype=torch.bool)
    w, _ = icepop(logp_old, logp_old.clone(), mask, low=0.5, high=5.0)
    assert w.item() == 1.0
    w_wrong, _ = icepop(logp, logp_old, mask, low=0.5, high=5.0)
    assert w_wrong.item() == 0.0


def test_matches_naive_loop(icepop):
    torch.manual_seed(2)
    lp_old = -torch.rand(5, 9, dtype=F64) * 3
    lp_mu = -torch.rand(5, 9, dtype=F64) * 3
    mask = torch.rand(5, 9) > 0.25
    w, _ = icepop(lp_old, lp_mu, mask, low=0.4, high=3.0)
    torch.testing.assert_close(w, naive_icepop(lp_old, lp_mu, mask, 0.4, 3.0))


def test_masked_tokens_stay_in_normalizer_by_default(icepop):
    lp_old, lp_mu = from_k(7.0, 2.0)
    mask = torch.tensor([[True, True]])
    w, _ = icepop(lp_old, lp_mu, mask, low=0.5, high=5.0)
    # default: the zero-weighted token still counts: normalizer 2, not 1
    assert int(icepop_normalizer_mask(w, mask).sum()) == 2
    assert int(icepop_normalizer_mask(w, mask, masked_in_normalizer=False).sum()) == 1


def test_huge_ratio_is_masked_without_nan(icepop):
    lp_old = torch.tensor([[0.0, -1.0]], dtype=torch.float32)
    lp_mu = torch.tensor([[-200.0, -1.0]], dtype=torch.float32)  # k = e^200 = inf in fp32
    w, m = icepop(lp_old, lp_mu, torch.ones(1, 2, dtype=torch.bool), low=0.5, high=5.0)
    assert torch.equal(w, torch.tensor([[0.0, 1.0]]))
    assert torch.isfinite(m["icepop/ess"])


@pytest.mark.parametrize("low,high", [(2.0, 2.0), (3.0, 1.0), (-0.1, 2.0)])
def test_refuses_bad_band(icepop, low, high):
    lp_old, lp_mu = from_k(1.0)
    with pytest.raises(ValueError, match="low"):
        icepop(lp_old, lp_mu, torch.ones(1, 1, dtype=torch.bool), low=low, high=high)


def test_refuses_missing_role(icepop):
    with pytest.raises(MissingQuantityError, match="logp_behavior"):
        icepop(torch.zeros(1, 1), None, torch.ones(1, 1, dtype=torch.bool), low=0.5, high=5)
