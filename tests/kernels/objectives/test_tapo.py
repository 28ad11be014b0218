import math

import pytest
import torch

from policylab.errors import MissingQuantityError, ShapeError
from policylab.kernels.objectives import METRIC_KEYS
from policylab.kernels.objectives.tapo import prefix_geometric_ratio, tapo

F64 = torch.float64


def const_eps(value):
    return lambda pos: torch.full(pos.shape, value, dtype=F64)


def naive_tapo(lp, lp_old, adv, mask, eps_fn):
    out = torch.zeros_like(lp)
    for i in range(lp.shape[0]):
        s, n = 0.0, 0
        for t in range(lp.shape[1]):
            if not mask[i, t]:
                continue
            s += float(lp[i, t] - lp_old[i, t])
            n += 1
            g = math.exp(s / n)
            e = eps_fn(t)
            a = float(adv[i])
            out[i, t] = -min(g * a, min(max(g, 1 - e), 1 + e) * a)
    return out


def test_hand_worked_prefix_ratio():
    # u = [0.2, -0.1, 0.4]: prefix means 0.2, 0.1/2 = 0.05, 0.5/3 = 0.1667
    # G = [e^0.2, e^0.05, e^0.1667] = [1.2214, 1.0513, 1.1814]  (product e^0.5 = 1.6487 is wrong)
    u = torch.tensor([[0.2, -0.1, 0.4]], dtype=F64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    G, _ = prefix_geometric_ratio(u, torch.zeros_like(u), mask)
    torch.testing.assert_close(G, torch.tensor([[1.2214, 1.0513, 1.1814]], dtype=F64), atol=1e-4, rtol=0)
    assert abs(G[0, 2].item() - math.exp(0.5)) > 0.4
    # position t excluded from its own prefix: [1 (empty), e^0.2, e^0.05]
    G_ex, _ = prefix_geometric_ratio(u, torch.zeros_like(u), mask, include_current=False)
    torch.testing.assert_close(G_ex, torch.tensor([[1.0, math.exp(0.2), math.exp(0.05)]], dtype=F64))


def test_gradient_only_through_own_token_with_weight_G():
    # unclipped (eps large): d loss_t / d lp_t = -G_t·A, d loss_t / d lp_j = 0 for j != t
    lp_old = torch.log(torch.full((1, 3), 0.3, dtype=F64))
    lp = (lp_old + torch.tensor([[0.2, -0.1, 0.4]], dtype=F64)).requires_grad_(True)
    mask = torch.ones(1, 3, dtype=torch.bool)
    A = 2.0
    loss, _ = tapo(lp, lp_old, torch.tensor([A], dtype=F64), mask, eps_schedule=const_eps(10.0))
    G = [math.exp(0.2), math.exp(0.05), math.exp(0.5 / 3)]
    for t in range(3):
        (g,) = torch.autograd.grad(loss[0, t], lp, retain_graph=True)
        expected = torch.zeros(1, 3, dtype=F64)
        expected[0, t] = -G[t] * A  # not -G_t·A/t
        torch.testing.assert_close(g, expected)


def test_padding_excluded_from_prefix_count():
    # a masked position in the middle (with garbage) changes neither n_t nor G_t
    u = torch.tensor([[0.2, 55.0, -0.1, 0.4]], dtype=F64)
    mask = torch.tensor([[True, False, True, True]])
    G, _ = prefix_geometric_ratio(u, torch.zeros_like(u), mask)
    torch.testing.assert_close(G[0, [0, 2, 3]], torch.tensor([1.2214, 1.0513, 1.1814], dtype=F64),
                               atol=1e-4, rtol=0)


def test_position_dependent_clip_region():
    # G = [e^0.2, e^0.05, e^0.1667] = [1.221, 1.051, 1.181]; eps(t) = 0.3 / (1 + t) -> 0.3, 0.15, 0.1
    # A = +1: t=0 inside (1.221 < 1.3) -> grad -1.221; t=1 inside (1.051 < 1.15) -> -1.051;
    # t=2: 1.181 > 1.1 -> clipped flat -> 0
    lp_old = torch.zeros(1, 3, dtype=F64) - 1.0
    lp = (lp_old + torch.tensor([[0.2, -0.1, 0.4]], dtype=F64)).requires_grad_(True)
    sched = lambda pos: 0.3 / (1.0 + pos.to(F64))  # noqa: E731
    loss, m = tapo(lp, lp_old, torch.tensor([1.0], dtype=F64), torch.ones(1, 3, dtype=torch.bool),
                   eps_schedule=sched)
    loss.sum().backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[-math.exp(0.2), -math.exp(0.05), 0.0]], dtype=F64))
    assert set(METRIC_KEYS) <= set(m) and m["clip_frac"].item() == pytest.approx(1 / 3)


def test_matches_naive_loop():
    torch.manual_seed(50)
    lp_old = -torch.rand(3, 7, dtype=F64) * 2
    lp = lp_old + 0.2 * torch.randn(3, 7, dtype=F64)
    adv = torch.randn(3, dtype=F64)
    mask = torch.rand(3, 7) > 0.2
    mask[:, 0] = True
    eps_fn = lambda t: 0.25 / math.sqrt(1 + t)  # noqa: E731
    loss, _ = tapo(lp, lp_old, adv, mask, eps_schedule=lambda pos: 0.25 / torch.sqrt(1 + pos.to(F64)))
    torch.testing.assert_close(loss, naive_tapo(lp, lp_old, adv, mask, eps_fn))


def test_refusals():
    z = torch.zeros(1, 2, dtype=F64)
    m = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="negative"):
        tapo(z, z, torch.ones(1, dtype=F64), m, eps_schedule=const_eps(-0.1))
    with pytest.raises(ShapeError, match="positions"):
        tapo(z, z, torch.ones(1, dtype=F64), m, eps_schedule=const_eps(0.1), positions=torch.zeros(1, 3))
    with pytest.raises(ShapeError, match="broadcastable"):
        tapo(z, z, torch.ones(1, dtype=F64), m, eps_schedule=lambda p: torch.ones(5, dtype=F64))
    with pytest.raises(MissingQuantityError, match="logp_old"):
        tapo(z, None, torch.ones(1, dtype=F64), m, eps_schedule=const_eps(0.1))
    with pytest.raises(TypeError):
        tapo(z, z, torch.ones(1, dtype=F64), m)  # the schedule is required (unconfirmed)
