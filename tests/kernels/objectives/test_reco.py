"""ReCo weights: the hand-worked variance ratio and expected counts, the ε_v floor, a
naive loop reference, gradient regions through the host (the weight only scales), masked
positions, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from policylab import methods
from policylab.errors import PolicylabError, ShapeError
from policylab.methods.loss import policy_loss, tensor_inputs
from policylab.kernels.objectives.reco import expected_counts, reco_weights

F = torch.float64
KW = dict(eps_v=1e-3, g_min=0.1, g_max=4.0)


def test_variance_ratio_uses_the_old_probability():
    # p_old = 0.5, p = 0.9: v = 0.9·0.1 / (0.5·0.5) = 0.09/0.25 = 0.36 (current on both sides would give 1)
    lp, lp_old = torch.log(torch.tensor([[0.9]], dtype=F)), torch.log(torch.tensor([[0.5]], dtype=F))
    w, m = reco_weights(lp, lp_old, torch.ones(1, 1, dtype=torch.bool), group_size=1, **KW)
    # expected count n̂ = 1·0.5 = 0.5 <= 1: response weight 1, so the weight is g(0.36) = 0.36
    assert math.isclose(float(w), 0.36, rel_tol=1e-12)
    same, _ = reco_weights(lp, lp, torch.ones(1, 1, dtype=torch.bool), group_size=1, **KW)
    assert float(same) == 1.0  # current on both sides: v = 1 exactly (and n̂ = 0.9 <= 1: w = 1)


def test_expected_counts_are_continuous_not_deduplication():
    # two distinct responses with probability 0.5 and 0.01, G = 8: n̂ = 4 and 0.08 → w = 0.25 and 1.0
    # (deduplication would give 1 and 1)
    lp_old = torch.log(torch.tensor([[0.5, 1.0], [0.1, 0.1]], dtype=F))  # 0.01 = 0.1·0.1 over two tokens
    mask = torch.ones(2, 2, dtype=torch.bool)
    assert_close(expected_counts(lp_old, mask, 8).exp(), torch.tensor([4.0, 0.08], dtype=F))
    w, _ = reco_weights(lp_old, lp_old, mask, group_size=8, **KW)
    assert_close(w[:, 0], torch.tensor([0.25, 1.0], dtype=F))


def test_floor_at_extreme_old_probabilities():
    lp_old = torch.tensor([[math.log(1 - 1e-12), -40.0]], dtype=F)  # p_old → 1 and → 0
    lp = torch.log(torch.tensor([[0.5, 0.5]], dtype=F))
    w, m = reco_weights(lp, lp_old, torch.ones(1, 2, dtype=torch.bool), group_size=1, **KW)
    # v = 0.25/ε_v = 250, bounded by g_max = 4
    assert bool(torch.isfinite(w).all()) and torch.allclose(w, torch.tensor([[4.0, 4.0]], dtype=F))
    assert float(m["reco/frac_variance_floor"]) == 1.0


def test_matches_a_naive_loop_with_padding():
    g = torch.Generator().manual_seed(4)
    B, T = 5, 6
    lp_old = -torch.rand(B, T, generator=g, dtype=F) * 0.3
    lp = lp_old + 0.2 * torch.randn(B, T, generator=g, dtype=F)
    lp = lp.clamp(max=-1e-4)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[0, :2] = False  # leading
    mask[3, 4:] = False  # trailing
    lp_old = torch.where(mask, lp_old, torch.tensor(-30.0, dtype=F))
    w, _ = reco_weights(lp, lp_old, mask, group_size=8, **KW)
    for i in range(B):
        seq = sum(float(lp_old[i, t]) for t in range(T) if mask[i, t])
        wi = 1 / max(1.0, 8 * math.exp(seq))
        for t in range(T):
            if not mask[i, t]:
                assert float(w[i, t]) == 0.0
                continue
            p, po = math.exp(float(lp[i, t])), math.exp(float(lp_old[i, t]))
            v = p * (1 - p) / max(po * (1 - po), 1e-3)
            assert math.isclose(float(w[i, t]), wi * min(max(v, 0.1), 4.0), rel_tol=1e-9)


def test_the_method_weight_only_scales_the_host_gradient():
    # reco = PPO clip × detached weight: per token, grad = weight × the host's grad (sign of A kept)
    lp_old = torch.log(torch.tensor([[0.5, 0.3], [0.4, 0.6]], dtype=F))
    lp = (lp_old + torch.tensor([[0.1, -0.05], [0.02, 0.03]], dtype=F)).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0], dtype=F)
    mask = torch.ones(2, 2, dtype=torch.bool)
    reco = methods.get("reco").with_params({"reco_group_size": 4})
    loss, _ = policy_loss(reco, tensor_inputs(lp, adv, mask, logp_old=lp_old))
    (g,) = torch.autograd.grad(loss.sum(), lp)
    host, _ = policy_loss(methods.get("grpo").with_params({"kl_coef": 0.0}), tensor_inputs(lp, adv, mask, logp_old=lp_old))
    (gh,) = torch.autograd.grad(host.sum(), lp)
    w, _ = reco_weights(lp, lp_old, mask, group_size=4, **KW)
    assert_close(g, w * gh)
    assert bool((g[0] < 0).all()) and bool((g[1] > 0).all())  # A > 0 raises, A < 0 lowers (inside the clip)


def test_bad_input():
    x = torch.zeros(1, 2, dtype=F) - 1
    m = torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(PolicylabError, match="eps_v"):
        reco_weights(x, x, m, group_size=2, eps_v=0.0, g_min=0.1, g_max=4.0)
    with pytest.raises(PolicylabError, match="g_min <= 1 <= g_max"):
        reco_weights(x, x, m, group_size=2, eps_v=1e-3, g_min=0.1, g_max=0.5)
    with pytest.raises(PolicylabError, match="group_size"):
        reco_weights(x, x, m, group_size=0, **KW)
    with pytest.raises(ShapeError):
        reco_weights(x, x[:, :1], m, group_size=2, **KW)
