"""tlm-DRE: turn confidence and weights (λ decreasing in c, merging turns changes them,
doubling a turn's tokens leaves c), the asymmetric token terms and the symmetric limit,
gradients per polarity, a naive loop reference, missing / bad turn ids."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from policylab.errors import MissingQuantityError, PolicylabError, ShapeError
from policylab.kernels import aggregate as agg
from policylab.kernels.objectives.tlm_dre import psi, tlm_dre, turn_confidence, turn_weights

F = torch.float64


def test_weights_decrease_with_reference_confidence():
    # c = [−0.5, −2.0]: λ = 2·softmax([0.5, 2.0]) = 2·[0.1824, 0.8176] = [0.3648, 1.6352] (τ = 1)
    lam = turn_weights(torch.tensor([[-0.5, -2.0]], dtype=F), torch.ones(1, 2, dtype=torch.bool), tau=1.0)
    assert_close(lam, torch.tensor([[0.3648, 1.6352]], dtype=F), atol=1e-4, rtol=0)
    assert float(lam[0, 0]) < float(lam[0, 1]) and math.isclose(float(lam.mean()), 1.0)


def test_confidence_is_length_normalized_and_merging_turns_changes_the_weights():
    lp_ref = torch.tensor([[-0.2, -0.4, -1.0, -3.0, -2.0, -2.0]], dtype=F)
    mask = torch.ones(1, 6, dtype=torch.bool)
    three = torch.tensor([[0, 0, 1, 1, 2, 2]])
    c, present = turn_confidence(lp_ref, three, mask)
    assert_close(c, torch.tensor([[-0.3, -2.0, -2.0]], dtype=F))  # means of (−0.2, −0.4), (−1, −3), (−2, −2)
    # doubling turn 0's tokens at the same log-probs leaves c_0
    doubled = torch.tensor([[-0.2, -0.4, -0.2, -0.4, -1.0, -3.0, -2.0, -2.0]], dtype=F)
    c2, _ = turn_confidence(doubled, torch.tensor([[0, 0, 0, 0, 1, 1, 2, 2]]), torch.ones(1, 8, dtype=torch.bool))
    assert_close(c2, c)
    # merging the three turns into one gives weight 1 everywhere instead of three different weights
    lam3 = turn_weights(c, present, tau=1.0)
    c1, p1 = turn_confidence(lp_ref, torch.zeros(1, 6, dtype=torch.long), mask)
    lam1 = turn_weights(c1, p1, tau=1.0)
    assert float(lam1[0, 0]) == 1.0 and not torch.allclose(lam3, torch.ones_like(lam3))


def _naive(lp, lp_ref, pol, tid, mask, tau, kp, kn, turn_norm="turn"):
    B, T = lp.shape
    out = torch.zeros(B, T, dtype=F)
    for i in range(B):
        turns = sorted({int(tid[i, t]) for t in range(T) if mask[i, t]})
        size = {k: sum(1 for t in range(T) if mask[i, t] and tid[i, t] == k) for k in turns}
        c = {k: sum(float(lp_ref[i, t]) for t in range(T) if mask[i, t] and tid[i, t] == k) / size[k] for k in turns}
        z = {k: math.exp(-c[k] / tau) for k in turns}
        lam = {k: len(turns) * z[k] / sum(z.values()) for k in turns}
        n_i = sum(size.values())
        for t in range(T):
            if not mask[i, t]:
                continue
            u = float(lp[i, t] - lp_ref[i, t])
            f = (lambda x, k: x if k == 0 else math.tanh(k * x) / k)
            k = int(tid[i, t])
            w = lam[k] * (n_i / (len(turns) * size[k]) if turn_norm == "turn" else 1.0)
            out[i, t] = -w * f(u, kp) if pol[i] > 0 else (w * f(u, kn) if pol[i] < 0 else 0.0)
    return out


def _case():
    g = torch.Generator().manual_seed(5)
    B, T = 4, 7
    lp_ref = -torch.rand(B, T, generator=g, dtype=F) * 3
    lp = lp_ref + 0.5 * torch.randn(B, T, generator=g, dtype=F)
    tid = torch.tensor([[0, 0, -1, -1, 1, 1, -1], [0, 0, 0, -1, 1, -1, -1], [0, -1, 1, 1, 1, 2, 2],
                        [0, 0, 0, 0, 0, 0, 0]])
    mask = tid >= 0
    mask[3, 5:] = False  # trailing padding of a one-turn row
    return lp, lp_ref, tid, mask


@pytest.mark.parametrize("turn_norm", ["turn", "token"])
def test_matches_a_naive_loop(turn_norm):
    lp, lp_ref, tid, mask = _case()
    pol = torch.tensor([1.0, -1.0, 1.0, 0.0], dtype=F)
    loss, _ = tlm_dre(lp, lp_ref, pol, tid, mask, tau=0.8, kappa_pos=0.0, kappa_neg=1.5, turn_norm=turn_norm)
    assert_close(loss, _naive(lp, lp_ref, pol, tid, mask, 0.8, 0.0, 1.5, turn_norm))
    assert bool((loss[~mask] == 0).all()) and bool((loss[3] == 0).all())


def _two_turns():
    # one positive dialogue: [masked lead] turn 0 (2 tokens) [user message, turn id −1] turn 1 (10 tokens)
    # [masked trailing pad]; equal reference log-probs −1 everywhere, so c_0 = c_1 = −1 and λ = [1, 1];
    # lp = lp_ref (u = 0), κ₊ = 0: ψ' = 1, each token's ∂ℓ/∂lp = −λ·ω
    tid = torch.tensor([[-1, 0, 0, -1] + [1] * 10 + [-1]])
    mask = tid >= 0
    lp_ref = torch.full(tid.shape, -1.0, dtype=F)
    lp = torch.where(mask, lp_ref, torch.tensor(9.0, dtype=F))  # garbage at masked positions
    return lp, lp_ref, tid, mask


def test_a_short_decisive_turn_is_not_drowned_by_a_verbose_one():
    # token_mean over N_tok = 12 counted tokens, K = 2 turns, |y| = 12:
    #   turn_norm = turn:  ω = 12/(2·2) = 3 on turn 0, 12/(2·10) = 0.6 on turn 1
    #                      ∂L/∂lp = −3/12 = −0.25 per turn-0 token, −0.6/12 = −0.05 per turn-1 token
    #                      per turn: 2·(−0.25) = −0.5 and 10·(−0.05) = −0.5: equal
    #   turn_norm = token: ∂L/∂lp = −1/12 per token; per turn −2/12 and −10/12 (5× for the verbose turn)
    want = {"turn": (-0.25, -0.05, -0.5, -0.5), "token": (-1 / 12, -1 / 12, -2 / 12, -10 / 12)}
    for norm, (g0, g1, t0, t1) in want.items():
        lp, lp_ref, tid, mask = _two_turns()
        lp.requires_grad_(True)
        loss, _ = tlm_dre(lp, lp_ref, torch.ones(1, dtype=F), tid, mask, tau=1.0, kappa_pos=0.0, kappa_neg=1.0,
                          turn_norm=norm)
        agg.aggregate(loss, mask, "token_mean").backward()
        gr = lp.grad[0]
        assert_close(gr[1:3], torch.full((2,), g0, dtype=F), rtol=1e-12, atol=0)
        assert_close(gr[4:14], torch.full((10,), g1, dtype=F), rtol=1e-12, atol=0)
        assert math.isclose(float(gr[1:3].sum()), t0, rel_tol=1e-12)
        assert math.isclose(float(gr[4:14].sum()), t1, rel_tol=1e-12)
        assert float(gr[0]) == 0.0 and float(gr[3]) == 0.0 and float(gr[14]) == 0.0  # masked positions


def test_the_method_normalizes_per_turn_by_default():
    from policylab import methods

    m = methods.get("tlm_dre")
    assert m.p.turn_norm == "turn"
    with pytest.raises(PolicylabError, match="turn_norm"):
        methods.get("tlm_dre").with_params({"turn_norm": "sequence"})


def test_equal_turn_lengths_give_the_per_token_form():
    # ω = |y|/(K·|turn|) = 1 when every turn of a row has the same length: both forms agree
    lp_ref = torch.tensor([[-0.2, -0.4, -1.0, -3.0, 0.0]], dtype=F)
    lp = lp_ref + torch.tensor([[0.1, -0.3, 0.2, 0.5, 0.0]], dtype=F)
    tid = torch.tensor([[0, 0, 1, 1, -1]])
    mask = tid >= 0
    a, _ = tlm_dre(lp, lp_ref, -torch.ones(1, dtype=F), tid, mask, tau=1.0, kappa_pos=0.0, kappa_neg=1.0)
    b, _ = tlm_dre(lp, lp_ref, -torch.ones(1, dtype=F), tid, mask, tau=1.0, kappa_pos=0.0, kappa_neg=1.0,
                   turn_norm="token")
    assert torch.equal(a, b)


def test_symmetric_limit_and_gradients_by_polarity():
    lp, lp_ref, tid, mask = _case()
    pos = tlm_dre(lp, lp_ref, torch.ones(4, dtype=F), tid, mask, tau=1.0, kappa_pos=2.0, kappa_neg=2.0)[0]
    neg = tlm_dre(lp, lp_ref, -torch.ones(4, dtype=F), tid, mask, tau=1.0, kappa_pos=2.0, kappa_neg=2.0)[0]
    assert_close(neg, -pos)  # ψ₊ = ψ₋: the symmetric variant
    leaf = lp.clone().requires_grad_(True)
    pol = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=F)
    loss, _ = tlm_dre(leaf, lp_ref, pol, tid, mask, tau=1.0, kappa_pos=0.0, kappa_neg=1.0, turn_norm="token")
    loss.sum().backward()
    c, present = turn_confidence(lp_ref, tid, mask)
    lam = turn_weights(c, present, tau=1.0)
    lam_t = torch.gather(lam, 1, tid.clamp(min=0))
    u = (lp - lp_ref)
    # positive rows: −λ (linear ψ); negative rows: +λ·sech²(u) (κ₋ = 1)
    want = torch.where(pol.unsqueeze(-1) > 0, -lam_t, lam_t / torch.cosh(u) ** 2)
    assert_close(leaf.grad, torch.where(mask, want, 0.0))
    assert bool((leaf.grad[0][mask[0]] < 0).all()) and bool((leaf.grad[1][mask[1]] > 0).all())
    assert bool((leaf.grad[~mask] == 0).all())


def test_psi_saturates_with_slope_one_at_zero():
    u = torch.tensor([-5.0, 0.0, 5.0], dtype=F, requires_grad=True)
    psi(u, 2.0).sum().backward()
    assert math.isclose(float(u.grad[1]), 1.0) and float(u.grad[0]) < 1e-3
    assert bool(torch.equal(psi(u.detach(), 0.0), u.detach()))


def test_missing_and_bad_turn_ids():
    lp = torch.zeros(1, 3, dtype=F)
    m = torch.ones(1, 3, dtype=torch.bool)
    with pytest.raises(MissingQuantityError, match="turn_ids.*two_turn_arithmetic"):
        tlm_dre(lp, lp, torch.ones(1), None, m, tau=1.0, kappa_pos=0.0, kappa_neg=1.0)
    with pytest.raises(ShapeError, match="no turn"):
        tlm_dre(lp, lp, torch.ones(1), torch.tensor([[0, -1, 1]]), m, tau=1.0, kappa_pos=0.0, kappa_neg=1.0)
    with pytest.raises(ShapeError, match="integer"):
        tlm_dre(lp, lp, torch.ones(1), torch.zeros(1, 3), m, tau=1.0, kappa_pos=0.0, kappa_neg=1.0)
    with pytest.raises(PolicylabError, match="kappa"):
        tlm_dre(lp, lp, torch.ones(1), torch.zeros(1, 3, dtype=torch.long), m, tau=1.0, kappa_pos=-1.0, kappa_neg=1.0)
