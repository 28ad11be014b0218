import math

import pytest
import torch

from policylab.kernels.corrections import BatchLedger, icepop
from policylab.errors import BatchReuseError, MissingQuantityError

from method_loss import method_loss


def online_icepop(logp, lp_mu, adv, mask, *, low, high):
    """The registered `online_icepop` composition: −A·𝟙 (unit carrier) x IcePop's band on sg(lp)/μ."""
    return method_loss("online_icepop", {"icepop_low": low, "icepop_high": high}, logp, adv, mask, logp_behavior=lp_mu)

F64 = torch.float64


def naive_online(logp, lp_mu, adv, mask, low, high):
    out = torch.zeros_like(logp)
    for i in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if mask[i, t]:
                k = math.exp(logp[i, t] - lp_mu[i, t])
                out[i, t] = -(k if low <= k <= high else 0.0) * adv[i]
    return out


def test_ledger_refuses_second_use_and_redelivered_copy():
    ledger = BatchLedger()
    ledger.consume("b-1", 3, 3)
    assert "b-1" in ledger and len(ledger) == 1
    with pytest.raises(BatchReuseError, match="already used"):
        ledger.consume("b-1", 3, 3)
    # a re-delivered copy of the same batch arrives later, at the next version: still refused
    with pytest.raises(BatchReuseError, match="already used"):
        ledger.check("b-1", 4, 4)


def test_ledger_refuses_stale_version_and_does_not_record_it():
    ledger = BatchLedger()
    with pytest.raises(BatchReuseError, match="version 2 but the current weights are version 3"):
        ledger.consume("b-2", 2, 3)
    assert "b-2" not in ledger
    # per-sequence version tensor: all must equal the current version
    with pytest.raises(BatchReuseError, match="mixes policy versions"):
        ledger.consume("b-3", torch.tensor([3, 3, 2]), 3)
    ledger.consume("b-3", torch.tensor([3, 3, 3]), 3)
    assert "b-3" in ledger


def test_ledger_state_roundtrip():
    ledger = BatchLedger()
    ledger.consume("a", 0, 0)
    ledger.consume("b", 1, 1)
    restored = BatchLedger()
    restored.load_state_dict(ledger.state_dict())
    with pytest.raises(BatchReuseError):
        restored.consume("a", 1, 1)
    restored.consume("c", 1, 1)
    with pytest.raises(ValueError, match="consumed"):
        restored.load_state_dict({})


def test_hand_worked_and_gradient_equals_icepop_at_rho_one():
    # lp = log 0.4 for both; lp_mu = log 0.05 (k = 8, out of band), log 0.2 (k = 2)
    # loss value = -M(k)·A·1 = [0, -2·A]; gradient dL/dlp = [0, -2·A]; A = 1.5
    logp = torch.log(torch.tensor([[0.4, 0.4]], dtype=F64)).requires_grad_(True)
    lp_mu = torch.log(torch.tensor([[0.05, 0.2]], dtype=F64))
    mask = torch.ones(1, 2, dtype=torch.bool)
    adv = torch.tensor([1.5], dtype=F64)
    loss, m = online_icepop(logp, lp_mu, adv, mask, low=0.5, high=5.0)
    torch.testing.assert_close(loss.detach(), torch.tensor([[0.0, -3.0]], dtype=F64))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -3.0]], dtype=F64))
    # IcePop weights (with lp_old = lp in value) times a REINFORCE host at rho = 1: same grad
    w, _ = icepop(logp.detach(), lp_mu, mask, low=0.5, high=5.0)
    lp2 = logp.detach().clone().requires_grad_(True)
    (w * -(torch.exp(lp2 - lp2.detach())) * 1.5).sum().backward()
    torch.testing.assert_close(lp2.grad, logp.grad)
    torch.testing.assert_close(m["correction/online_icepop/frac_masked"], torch.tensor(0.5, dtype=F64))


def test_matches_naive_loop_and_zero_at_padding():
    torch.manual_seed(3)
    logp = -torch.rand(3, 6, dtype=F64) * 2
    lp_mu = -torch.rand(3, 6, dtype=F64) * 2
    adv = torch.randn(3, dtype=F64)
    mask = torch.rand(3, 6) > 0.3
    logp_pad = torch.where(mask, logp, torch.full_like(logp, float("nan")))
    loss, _ = online_icepop(logp_pad, lp_mu, adv, mask, low=0.5, high=2.0)
    torch.testing.assert_close(loss, naive_online(logp, lp_mu, adv, mask, 0.5, 2.0))
    assert torch.equal(loss[~mask], torch.zeros(int((~mask).sum()), dtype=F64))


def test_refusals():
    m = torch.ones(1, 1, dtype=torch.bool)
    with pytest.raises(MissingQuantityError, match="logp_behavior"):
        online_icepop(torch.zeros(1, 1), None, torch.ones(1), m, low=0.5, high=2)
    with pytest.raises(ValueError, match="low"):
        online_icepop(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), m, low=2.0, high=2.0)
