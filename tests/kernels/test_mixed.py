"""Kernels of the mixed-policy methods: hand-worked invariants (arithmetic in comments),
naive loop references, gradient regions, refusals, masked positions."""

import math

import pytest
import torch

from policylab.errors import PolicylabError, ShapeError
from policylab.kernels import mixed as K

F64 = torch.float64


def t(x):
    return torch.tensor(x, dtype=F64)


# ----------------------------------------------------------------------------- LUFFY


@pytest.mark.parametrize("p, coef", [(0.01, 0.0826), (0.1, 0.25), (0.5, 0.1389), (0.9, 0.09)])
def test_luffy_demo_token_gradient_coefficient(p, coef):
    # d/dlp [p/(p+γ)] = p·γ/(p+γ)², γ = 0.1:
    # 0.01·0.1/0.11² = 0.001/0.0121 = 0.0826; 0.1·0.1/0.2² = 0.25 (the maximum, at p = γ)
    # 0.5·0.1/0.6² = 0.05/0.36 = 0.1389;      0.9·0.1/1.0² = 0.09
    lp = torch.log(t([[p]])).requires_grad_()
    loss, _ = K.luffy_loss(lp, torch.zeros(1, 1, dtype=F64), t([1.0]), torch.ones(1, 1, dtype=torch.bool),
                           torch.tensor([True]), gamma=0.1, eps_low=0.2, eps_high=0.2)
    loss.sum().backward()
    # ∂ℓ/∂lp = −A·coef with A = 1
    assert -lp.grad.item() == pytest.approx(coef, abs=5e-5)
    assert loss.item() == pytest.approx(-p / (p + 0.1))  # value −A·f(p)


def test_luffy_native_rows_keep_the_clip_and_demos_ignore_logp_old():
    # row 0 native, ratio 1.5 > 1 + 0.2 with A > 0: clipped, zero gradient
    # row 1 demonstration, "logp_old" garbage (−50): ignored, no clip, shaped weight applies
    lp = torch.log(t([[0.6], [0.5]])).requires_grad_()
    old = torch.log(t([[0.4], [1e-22]]))
    loss, m = K.luffy_loss(lp, old, t([1.0, 2.0]), torch.ones(2, 1, dtype=torch.bool), torch.tensor([False, True]),
                           gamma=0.1, eps_low=0.2, eps_high=0.2)
    loss.sum().backward()
    assert lp.grad[0, 0].item() == 0.0
    # demo: −A·p·γ/(p+γ)² = −2·0.5·0.1/0.36 = −0.2778
    assert lp.grad[1, 0].item() == pytest.approx(-2 * 0.05 / 0.36)
    assert loss[0, 0].item() == pytest.approx(-1.2)  # −A·(1+ε) on the clipped native token
    assert m["luffy/off_policy_tokens"].item() == 1.0


def naive_luffy(lp, old, adv, mask, off, gamma, eps):
    out = torch.zeros_like(lp)
    for i in range(lp.shape[0]):
        for j in range(lp.shape[1]):
            if not mask[i, j]:
                continue
            a = float(adv[i])
            if off[i]:
                p = math.exp(lp[i, j])
                out[i, j] = -a * p / (p + gamma)
            else:
                r = math.exp(lp[i, j] - old[i, j])
                out[i, j] = -min(r * a, min(max(r, 1 - eps), 1 + eps) * a)
    return out


def test_luffy_matches_a_naive_loop_and_leaves_masked_positions_zero():
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(4, 6, generator=g, dtype=F64) * 3
    old = lp + 0.3 * torch.randn(4, 6, generator=g, dtype=F64)
    adv = torch.randn(4, generator=g, dtype=F64)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[0, :2] = False  # leading masked positions
    mask[2, 4:] = False  # trailing
    lp_garbage = torch.where(mask, lp, torch.full_like(lp, 7.0))
    off = torch.tensor([False, True, False, True])
    loss, _ = K.luffy_loss(lp_garbage, old, adv, mask, off, gamma=0.1, eps_low=0.2, eps_high=0.2)
    torch.testing.assert_close(loss, naive_luffy(lp_garbage, old, adv, mask, off, 0.1, 0.2))
    assert bool((loss[~mask] == 0).all())


def test_luffy_refuses_bad_input():
    one = torch.zeros(1, 1, dtype=F64)
    m = torch.ones(1, 1, dtype=torch.bool)
    with pytest.raises(PolicylabError, match="`gamma` must be a finite number > 0"):
        K.luffy_loss(one, one, t([1.0]), m, torch.tensor([True]), gamma=0.0, eps_low=0.2, eps_high=0.2)
    with pytest.raises(ShapeError, match="`off_policy` must be \\[B\\]"):
        K.luffy_loss(one, one, t([1.0]), m, torch.tensor([True, False]), gamma=0.1, eps_low=0.2, eps_high=0.2)


# ----------------------------------------------------------------------------- GRIN


def test_grin_mixture_denominator_hand_case():
    # α = 0.25, π_old = 0.2:
    #   on the gold path: q = 0.75·0.2 + 0.25·1 = 0.4
    #   off the gold path: q = 0.75·0.2 = 0.15
    #   a group without injection (α = 0): q = π_old = 0.2 exactly
    old = torch.log(t([[0.2, 0.2], [0.2, 0.2]]))
    match = torch.tensor([[True, False], [True, True]])
    q = K.grin_mixture_logp(old, t([0.25, 0.0]), match, torch.ones(2, 2, dtype=torch.bool)).exp()
    torch.testing.assert_close(q, t([[0.4, 0.15], [0.2, 0.2]]))
    assert not q.requires_grad


def test_grin_denominator_is_the_mixture_not_the_reference():
    # the same ratio with π_ref in the denominator differs: a test that would catch the swap
    old = torch.log(t([[0.2]]))
    ref = torch.log(t([[0.6]]))
    mix = K.grin_mixture_logp(old, t([0.25]), torch.tensor([[True]]), torch.ones(1, 1, dtype=torch.bool))
    assert not torch.allclose(mix, ref)
    assert mix.exp().item() == pytest.approx(0.4)


def test_grin_mixture_naive_loop_and_masked_positions():
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(3, 5, generator=g, dtype=F64) * 2
    alpha = t([0.5, 0.0, 0.2])
    match = torch.rand(3, 5, generator=g) > 0.5
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1, 3:] = False
    out = K.grin_mixture_logp(old, alpha, match, mask)
    ref = torch.zeros(3, 5, dtype=F64)
    for i in range(3):
        for j in range(5):
            if mask[i, j]:
                q = (1 - alpha[i]) * math.exp(old[i, j]) + (alpha[i] if match[i, j] else 0.0)
                ref[i, j] = math.log(q)
    torch.testing.assert_close(out, ref)


def test_grin_refuses_an_all_gold_group():
    with pytest.raises(PolicylabError, match="alpha` must be in \\[0, 1\\)"):
        K.grin_mixture_logp(torch.zeros(1, 1, dtype=F64), t([1.0]), torch.tensor([[True]]),
                            torch.ones(1, 1, dtype=torch.bool))


# ----------------------------------------------------------------------------- MOER


def test_unit_ratio_has_value_one_and_gradient_grad_lp():
    from policylab.kernels import objectives as O

    # off-policy row: ratio π_θ/sg(π_θ) = 1 exactly, even 5 nats away from logp_old; the
    # PPO host then gives −A·𝟙: value −A, ∂ℓ/∂lp = −A (not zero, not clipped)
    lp = t([[-1.0], [-1.0]]).requires_grad_()
    old = t([[-6.0], [-1.0]])
    denom = K.unit_ratio_denominator(lp, old, torch.tensor([True, False]))
    loss, m = O.ppo_clip(lp, denom, t([2.0, 2.0]), torch.ones(2, 1, dtype=torch.bool), eps_low=0.2, eps_high=0.2)
    loss.sum().backward()
    assert loss[0, 0].item() == pytest.approx(-2.0)
    assert lp.grad[0, 0].item() == pytest.approx(-2.0)
    assert torch.equal(denom[1], old[1])  # native rows keep π_old


# ----------------------------------------------------------------------------- Off-Context GRPO


def test_behavior_denominator_replaces_pi_old_on_hinted_rows_only():
    old, beh = t([[-1.0], [-1.0]]), t([[-0.1], [-0.1]])
    d = K.behavior_denominator(old, beh, torch.tensor([True, False]))
    assert d.tolist() == [[-0.1], [-1.0]]


def test_context_separation_refuses_both_sides_with_or_without_the_hint():
    x, h = [1, 2, 3], [9, 9]
    K.check_context_separation([x], [x + h], [h], [True])  # learner on x, behavior on x ⊕ h: fine
    K.check_context_separation([x], [x], [[]], [False])  # a native row
    with pytest.raises(K.ContextError, match="both computed without the hint"):
        K.check_context_separation([x], [x], [h], [True])
    with pytest.raises(K.ContextError, match="both computed with the hint"):
        K.check_context_separation([x + h], [x + h], [h], [True])
    with pytest.raises(K.ContextError, match="learner's prompt contains the hint"):
        K.check_context_separation([x + h + [4]], [x + h], [h], [True])
    with pytest.raises(K.ContextError, match="labelled hinted but records no hint"):
        K.check_context_separation([x], [x + h], [[]], [True])
    # the per-row fingerprints a batch keeps give the same verdicts
    fp = K.fingerprint
    K.check_context_fingerprints([x], [fp(x + h)], [fp(h)], [2], [True])
    with pytest.raises(K.ContextError, match="same context"):
        K.check_context_fingerprints([x + h], [fp(x + h)], [fp(h)], [2], [True])
    with pytest.raises(K.ContextError, match="contains the hint"):
        K.check_context_fingerprints([[0] + h], [fp(x + h)], [fp(h)], [2], [True])


# ----------------------------------------------------------------------------- GRAFT


def test_graft_borrows_only_for_an_all_fail_receiver_and_a_mixed_peer():
    fail, mixed, win = t([0, 0, 0, 0]), t([1, 0, 0, 1]), t([1, 1, 1, 1])
    assert K.graft_should_borrow(fail, mixed)
    assert not K.graft_should_borrow(t([0, 1, 0, 0]), mixed)  # the receiver has a success
    assert not K.graft_should_borrow(fail, win)  # a uniform peer group: no relative signal
    assert not K.graft_should_borrow(fail, fail)


def test_graft_compatibility_uses_each_tokenizations_own_mean():
    # receiver: 3 tokens of log-prob −1 (mean −1); peer: 2 tokens of −0.5 (mean −0.5)
    # c = exp(−1 − (−0.5)) = exp(−0.5) = 0.6065
    lr, mr = t([[-1.0, -1.0, -1.0, 5.0]]), torch.tensor([[True, True, True, False]])
    lpp, mp = t([[-0.5, -0.5]]), torch.tensor([[True, True]])
    c = K.graft_compatibility(lr, mr, lpp, mp)
    assert c.item() == pytest.approx(math.exp(-0.5))
    with pytest.raises(ShapeError, match="position-wise log-ratio across tokenizations of different lengths"):
        K.tokenwise_log_ratio(lr[:, :2], torch.tensor([[True, True]]), lpp, torch.tensor([[True, False]]))
    assert K.tokenwise_log_ratio(lpp, mp, lpp, mp).abs().sum().item() == 0.0
    with pytest.raises(ShapeError, match="no counted token"):
        K.graft_compatibility(lr, torch.zeros(1, 4, dtype=torch.bool), lpp, mp)


def test_graft_row_weight_bounds_borrowed_rows_by_their_compatibility():
    # borrowed rows c = [1.0, 0.5, 0.1, 0.0999, 2.0], threshold 0.1 (inclusive), cap 1:
    #   w = [min(1, 1), min(0.5, 1), 0.1 (kept: 0.1 >= 0.1), 0 (dropped), min(2, 1) = 1]; a native row: 1
    c = torch.tensor([1.0, 0.5, 0.1, 0.0999, 2.0, 0.3], dtype=torch.float64)
    borrowed = torch.tensor([True, True, True, True, True, False])
    w = K.graft_row_weight(c, borrowed, min_compat=0.1, cap=1.0)
    assert w.tolist() == [1.0, 0.5, 0.1, 0.0, 1.0, 1.0]
    assert K.graft_row_weight(c, borrowed, min_compat=0.1, cap=1.5).tolist()[4] == 1.5
    with pytest.raises(PolicylabError, match="finite and > 0"):
        K.graft_row_weight(torch.tensor([0.0]), torch.tensor([True]), min_compat=0.1, cap=1.0)
    with pytest.raises(PolicylabError, match="`cap`"):
        K.graft_row_weight(c, borrowed, min_compat=0.1, cap=0.0)


# ----------------------------------------------------------------------------- ERILS


def test_erils_per_source_vs_pooled_hand_case():
    # native [0.2, 0.4], external [0.9, 1.0], population std:
    # pooled: mean 0.625, std sqrt(((.425)²+(.225)²+(.275)²+(.375)²)/4) = sqrt(0.111875) = 0.33448
    #         native -> (−0.425, −0.225)/0.33448 = [−1.2706, −0.6727]: both negative
    # per source: native mean 0.3, std 0.1 -> [−1, 1]; external mean 0.95, std 0.05 -> [−1, 1]
    r, g = t([0.2, 0.4, 0.9, 1.0]), torch.zeros(4, dtype=torch.long)
    ext = torch.tensor([False, False, True, True])
    pooled = K.erils_advantages(r, g, ext, std="population", eps=0.0, per_source=False)
    per = K.erils_advantages(r, g, ext, std="population", eps=0.0)
    torch.testing.assert_close(pooled[:2], t([-1.2706, -0.6727]), atol=1e-4, rtol=0)
    torch.testing.assert_close(per, t([-1.0, 1.0, -1.0, 1.0]))


def test_erils_statistics_stay_inside_each_group_and_source():
    g = torch.Generator().manual_seed(3)
    r = torch.rand(8, generator=g, dtype=F64)
    group = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    ext = torch.tensor([False, False, True, True, False, True, True, True])
    a = K.erils_advantages(r, group, ext, std="population", eps=1e-6)
    ref = torch.zeros(8, dtype=F64)
    for i in range(8):
        peers = [j for j in range(8) if group[j] == group[i] and ext[j] == ext[i]]
        vals = r[peers]
        ref[i] = (r[i] - vals.mean()) / (vals.std(unbiased=False) + 1e-6)
    torch.testing.assert_close(a, ref)


def test_erils_length_cap_rejects_long_external_rows_only():
    # cap 3, inclusive: an external row of 3 tokens is kept, 4 rejected; native rows are never capped
    keep = K.erils_length_keep(torch.tensor([3, 4, 9, 4]), torch.tensor([True, True, False, True]), 3)
    assert keep.tolist() == [True, False, True, False]
    with pytest.raises(PolicylabError, match="`cap` must be an int >= 1"):
        K.erils_length_keep(torch.tensor([1]), torch.tensor([True]), 0)


# ----------------------------------------------------------------------------- MOPD


def test_mopd_advantage_is_the_negated_per_token_gap_to_the_teacher():
    # student lp −1.0, teacher −0.2: A = −(−1.0 − (−0.2)) = 0.8 (raise that token); masked -> 0
    a = K.mopd_advantages(t([[-1.0, -0.1, 3.0]]), t([[-0.2, -0.5, 0.0]]), torch.tensor([[True, True, False]]),
                          horizon="token")
    torch.testing.assert_close(a, t([[0.8, -0.4, 0.0]]))
