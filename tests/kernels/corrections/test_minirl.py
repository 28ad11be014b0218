import math

import pytest
import torch

from policylab.kernels.corrections import RoutingRecord, check_routing
from policylab.errors import MissingQuantityError, ShapeError

from method_loss import method_loss

F64 = torch.float64


def minirl_loss(lp, lp_old, lp_mu, adv, mask, *, eps_low, eps_high, engine_cap):
    """The registered `minirl` composition: PPO clip on ρ = π_θ/π_old x sg(min(π_old/μ, C))."""
    return method_loss("minirl", dict(eps_low=eps_low, eps_high=eps_high, engine_cap=engine_cap), lp, adv, mask,
                       logp_old=lp_old, logp_behavior=lp_mu)


def naive_minirl(lp, lp_old, lp_mu, adv, mask, eps_low, eps_high, cap):
    out = torch.zeros_like(lp)
    for i in range(lp.shape[0]):
        for t in range(lp.shape[1]):
            if mask[i, t]:
                w = math.exp(lp_old[i, t] - lp_mu[i, t])
                w = min(w, cap) if cap is not None else w
                r = math.exp(lp[i, t] - lp_old[i, t])
                a = float(adv[i, t])
                out[i, t] = -w * min(r * a, min(max(r, 1 - eps_low), 1 + eps_high) * a)
    return out


def roles(seed, B=3, T=6):
    torch.manual_seed(seed)
    lp_old = -torch.rand(B, T, dtype=F64) * 2
    lp_mu = (lp_old + 0.5 * torch.randn(B, T, dtype=F64)).clamp(max=-1e-3)  # a log-probability
    lp = lp_old + 0.3 * torch.randn(B, T, dtype=F64)
    return lp, lp_old, lp_mu, torch.randn(B, T, dtype=F64), torch.rand(B, T) > 0.2


def test_matches_naive_loop_with_and_without_cap():
    lp, lp_old, lp_mu, adv, mask = roles(20)
    for cap in (None, 1.3):
        loss, _ = minirl_loss(lp, lp_old, lp_mu, adv, mask, eps_low=0.2, eps_high=0.28, engine_cap=cap)
        torch.testing.assert_close(loss, naive_minirl(lp, lp_old, lp_mu, adv, mask, 0.2, 0.28, cap))


def test_first_minibatch_is_engine_corrected_reinforce():
    # rho = 1 (lp = lp_old in value): gradient must equal that of -sg(w)·A·lp
    _, lp_old, lp_mu, adv, mask = roles(21)
    lp = lp_old.clone().requires_grad_(True)
    loss, m = minirl_loss(lp, lp_old, lp_mu, adv, mask, eps_low=0.2, eps_high=0.2, engine_cap=2.0)
    loss.sum().backward()
    w = torch.exp(lp_old - lp_mu).clamp(max=2.0)
    lp2 = lp_old.clone().requires_grad_(True)
    torch.where(mask, -w * adv * lp2, torch.zeros_like(lp2)).sum().backward()
    torch.testing.assert_close(lp.grad, lp2.grad, rtol=1e-12, atol=1e-12)
    assert m["policy/clip_frac"].item() == 0.0


def test_gradient_regions_hand_worked():
    # engine k = 4 capped at 2 on every token; A = +1 / -1; eps 0.2
    # rho 1.5, A=+1 -> clipped flat -> 0
    # rho 1.5, A=-1 -> unclipped branch -> -w·rho·A = -2·1.5·(-1) = +3
    # rho 0.5, A=-1 -> clipped flat -> 0
    # rho 0.5, A=+1 -> unclipped -> -2·0.5·1 = -1
    lp_old = torch.log(torch.full((1, 4), 0.2, dtype=F64))
    lp_mu = lp_old - math.log(4.0)
    lp = (lp_old + torch.log(torch.tensor([[1.5, 1.5, 0.5, 0.5]], dtype=F64))).requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0]], dtype=F64)
    loss, m = minirl_loss(lp, lp_old, lp_mu, adv, torch.ones(1, 4, dtype=torch.bool),
                          eps_low=0.2, eps_high=0.2, engine_cap=2.0)
    loss.sum().backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[0.0, 3.0, 0.0, -1.0]], dtype=F64))
    assert m["policy/clip_frac"].item() == 0.5 and m["correction/minirl/frac_engine_capped"].item() == 1.0


def test_routing_checks():
    rec = RoutingRecord(torch.zeros(2, 5, 3, 2, dtype=torch.long), model_id="moe-a")
    check_routing(rec, model_is_moe=True, n_layers=3, k=2, batch_shape=(2, 5), model_id="moe-a")
    check_routing(None, model_is_moe=False, n_layers=0, k=0)
    with pytest.raises(MissingQuantityError, match="routing"):
        check_routing(None, model_is_moe=True, n_layers=3, k=2)
    with pytest.raises(ValueError, match="dense"):
        check_routing(rec, model_is_moe=False, n_layers=3, k=2)
    with pytest.raises(ShapeError, match="layers"):
        check_routing(rec, model_is_moe=True, n_layers=4, k=2)
    with pytest.raises(ShapeError, match="batch"):
        check_routing(rec, model_is_moe=True, n_layers=3, k=2, batch_shape=(2, 6))
    with pytest.raises(ValueError, match="moe-b"):
        check_routing(rec, model_is_moe=True, n_layers=3, k=2, model_id="moe-b")
    with pytest.raises(ShapeError, match="integer"):
        RoutingRecord(torch.zeros(2, 5, 3, 2), model_id="m")
    with pytest.raises(ShapeError, match=r"\[B, T, layers, k\]"):
        RoutingRecord(torch.zeros(2, 5, 3, dtype=torch.long), model_id="m")


def test_refusals():
    lp, lp_old, lp_mu, adv, mask = roles(22)
    with pytest.raises(MissingQuantityError, match="logp_old"):
        minirl_loss(lp, None, lp_mu, adv, mask, eps_low=0.2, eps_high=0.2, engine_cap=2.0)
    with pytest.raises(ValueError, match="engine_cap"):
        minirl_loss(lp, lp_old, lp_mu, adv, mask, eps_low=0.2, eps_high=0.2, engine_cap=0.0)
    with pytest.raises(ValueError, match="eps_low"):
        minirl_loss(lp, lp_old, lp_mu, adv, mask, eps_low=-0.2, eps_high=0.2, engine_cap=2.0)
