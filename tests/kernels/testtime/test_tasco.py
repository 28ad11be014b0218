"""TASCO's loss: confidence (token entropy) + λ × stability (a divergence between the
clean and the perturbed prefix), aggregated to exactly L(P) with `token_mean`."""

from __future__ import annotations

import math

import pytest
import torch

from policylab.kernels import aggregate as agg
from policylab.errors import PolicylabError, ShapeError
from policylab.kernels.testtime import tasco_loss


def _pair_case():
    # one reply (2 tokens) and its K = 1 copy under P + ξ
    logp = torch.tensor([[math.log(0.5), math.log(0.25)],
                         [math.log(0.4), math.log(0.25)]], dtype=torch.float64, requires_grad=True)
    ent = torch.tensor([[1.0, 2.0], [9.0, 9.0]], dtype=torch.float64, requires_grad=True)  # copy's entropy unread
    mask = torch.ones(2, 2, dtype=torch.bool)
    return logp, ent, mask, torch.tensor([0, 1]), torch.tensor([7, 7])


def test_hand_worked_value():
    logp, ent, mask, copy, pair = _pair_case()
    loss, m = tasco_loss(logp, ent, mask, copy, pair, lam=2.0, n_perturb=1, divergence="k3")
    # confidence: mean clean entropy (1 + 2)/2 = 1.5
    # k3 per token, x = lp_pert − lp_clean: x1 = log(0.4/0.5) = −0.22314, exp(x1) − x1 − 1 = 0.8 + 0.22314 − 1
    #   = 0.02314; x2 = 0: 0. Mean over the 2 tokens: 0.01157; λ · 0.01157 = 0.02314
    # L = 1.5 + 0.02314 = 1.52314; token_mean over the 4 counted tokens gives exactly that
    total = agg.aggregate(loss, mask, "token_mean", normalizer=agg.normalizer(mask, "token_mean"))
    k3 = 0.8 - math.log(0.8) - 1
    torch.testing.assert_close(total, torch.tensor(1.5 + 2.0 * k3 / 2, dtype=torch.float64))
    torch.testing.assert_close(m["tasco/entropy"], torch.tensor(1.5, dtype=torch.float64))
    torch.testing.assert_close(m["tasco/instability"], torch.tensor(k3 / 2, dtype=torch.float64))


def _naive(logp, ent, mask, copy, pair, lam, K, kind):
    """L = (1/N) Σ_clean H + λ (1/K) Σ_k (1/N) Σ D_k, by loops."""
    B, T = mask.shape
    clean = {int(pair[i]): i for i in range(B) if copy[i] == 0}
    n = sum(int(mask[i].sum()) for i in clean.values())
    conf = sum(float(ent[i, t]) for i in clean.values() for t in range(T) if mask[i, t]) / n
    stab = 0.0
    for i in range(B):
        if copy[i] == 0:
            continue
        c = clean[int(pair[i])]
        for t in range(T):
            if mask[i, t]:
                x = float(logp[i, t]) - float(logp[c, t])
                stab += (math.exp(x) - x - 1) if kind == "k3" else 0.5 * x * x
    return conf + lam * stab / (K * n)


@pytest.mark.parametrize("kind", ["k3", "k2"])
def test_aggregated_loss_matches_a_naive_loop(kind):
    g = torch.Generator().manual_seed(2)
    K, R, T = 2, 5, 6
    mask_r = torch.rand(R, T, generator=g) < 0.7
    mask_r[:, -1] = False  # a masked trailing position
    mask = mask_r.repeat(K + 1, 1)
    logp = -torch.rand((K + 1) * R, T, generator=g, dtype=torch.float64) * 2
    logp = torch.where(mask, logp, torch.full_like(logp, float("nan")))  # garbage outside the mask
    ent = torch.rand((K + 1) * R, T, generator=g, dtype=torch.float64) * 3
    copy = torch.arange(K + 1).repeat_interleave(R)
    pair = torch.arange(R).repeat(K + 1) * 3 + 11
    perm = torch.randperm((K + 1) * R, generator=g)  # rows in any order
    args = [t[perm] for t in (logp, ent, mask, copy, pair)]
    loss, _ = tasco_loss(*args, lam=0.7, n_perturb=K, divergence=kind)
    total = agg.aggregate(loss, args[2], "token_mean", normalizer=agg.normalizer(args[2], "token_mean"))
    assert math.isclose(float(total), _naive(*args, 0.7, K, kind), rel_tol=1e-12)


def test_gradient_reaches_both_sides_and_lambda_zero_leaves_only_confidence():
    logp, ent, mask, copy, pair = _pair_case()
    loss, _ = tasco_loss(logp, ent, mask, copy, pair, lam=1.0, n_perturb=1, divergence="k3")
    loss.sum().backward()
    # ∂k3/∂lp_pert = exp(x) − 1 and ∂k3/∂lp_clean = 1 − exp(x): at x = log 0.8: −0.2 and +0.2, × (K+1)/K · λ = 2
    torch.testing.assert_close(logp.grad[:, 0], torch.tensor([0.4, -0.4], dtype=torch.float64))
    assert logp.grad[:, 1].abs().max() == 0  # x = 0: no instability gradient
    torch.testing.assert_close(ent.grad, torch.tensor([[2.0, 2.0], [0.0, 0.0]], dtype=torch.float64))
    logp.grad = ent.grad = None
    loss, _ = tasco_loss(logp, ent, mask, copy, pair, lam=0.0, n_perturb=1, divergence="k3")
    loss.sum().backward()
    assert logp.grad.abs().max() == 0


def test_bad_input_is_refused():
    logp, ent, mask, copy, pair = _pair_case()
    with pytest.raises(PolicylabError, match="exactly one clean row and one copy for each k"):
        tasco_loss(logp, ent, mask, torch.tensor([0, 0]), pair, lam=1.0, n_perturb=1, divergence="k3")
    with pytest.raises(PolicylabError, match="exactly one clean row"):
        tasco_loss(logp, ent, mask, copy, pair, lam=1.0, n_perturb=2, divergence="k3")
    with pytest.raises(PolicylabError, match="mask differs"):
        tasco_loss(logp, ent, torch.tensor([[True, True], [True, False]]), copy, pair, lam=1.0, n_perturb=1,
                   divergence="k3")
    with pytest.raises(PolicylabError, match="`divergence` must be one of k3, k2"):
        tasco_loss(logp, ent, mask, copy, pair, lam=1.0, n_perturb=1, divergence="js")
    with pytest.raises(PolicylabError, match="`lam` must be"):
        tasco_loss(logp, ent, mask, copy, pair, lam=-1.0, n_perturb=1, divergence="k3")
    with pytest.raises(ShapeError, match="`copy_index` must be an integer"):
        tasco_loss(logp, ent, mask, copy.float(), pair, lam=1.0, n_perturb=1, divergence="k3")
    with pytest.raises(PolicylabError, match="`copy_index` must lie in 0..1"):
        tasco_loss(logp, ent, mask, torch.tensor([0, 2]), pair, lam=1.0, n_perturb=1, divergence="k3")


def test_no_advantage_is_zero_and_refuses_a_bad_size():
    from policylab.kernels.testtime.tasco import no_advantage
    a = no_advantage(3, torch.float64)
    torch.testing.assert_close(a, torch.zeros(3, dtype=torch.float64))
    assert no_advantage(0).shape == (0,)
    with pytest.raises(PolicylabError, match="`batch_size` must be an int >= 0"):
        no_advantage(-1)
    with pytest.raises(PolicylabError, match="`batch_size` must be an int >= 0"):
        no_advantage(True)
