"""gspo / gspo_token: sequence ratio, one clip per response, padding, loop reference."""

import math

import pytest
import torch
from torch.testing import assert_close

from policylab.kernels.aggregate import aggregate
from policylab.errors import NonFiniteError, ShapeError
from policylab.kernels.objectives import METRIC_KEYS, gspo, gspo_token, ppo_clip

F64 = torch.float64
EPS = dict(eps_low=0.2, eps_high=0.28)


def seq(log_ratios, lp_old=-1.0):
    """One response with the given token log-ratios (lp = lp_old + log-ratio), fp64."""
    old = torch.full((1, len(log_ratios)), lp_old, dtype=F64)
    lp = (old + torch.tensor([log_ratios], dtype=F64)).requires_grad_()
    return lp, old, torch.ones(1, len(log_ratios), dtype=torch.bool)


def grad_of(loss, lp):
    (g,) = torch.autograd.grad(loss.sum(), lp)
    return g


def seq_grad(loss, mask, lp):
    """Gradient of the paper's objective: `seq_mean_token_mean` over the loss matrix."""
    (g,) = torch.autograd.grad(aggregate(loss, mask, "seq_mean_token_mean"), lp)
    return g


def gspo_loop(lp, old, adv, mask, eps_low, eps_high, per_token=False):
    """Naive reference: per sequence, mean log-ratio over valid tokens, then the clip."""
    B, T = lp.shape
    rows = []
    for b in range(B):
        valid = [t for t in range(T) if mask[b, t]]
        total = sum(lp[b, t] - old[b, t] for t in valid)
        s = torch.exp(total / len(valid))
        row = []
        for t in range(T):
            if not mask[b, t]:
                row.append(torch.zeros((), dtype=lp.dtype))
                continue
            a = adv[b] if adv.dim() == 1 else adv[b, t]
            r = s.detach() * torch.exp(lp[b, t] - lp[b, t].detach()) if per_token else s
            row.append(-torch.minimum(r * a, torch.clamp(r, 1 - eps_low, 1 + eps_high) * a))
        rows.append(torch.stack(row))
    return torch.stack(rows)


def test_sequence_ratio_is_the_geometric_mean():
    # log-ratios [0.1, −0.1, 0.3]: mean = 0.3/3 = 0.1 -> s = e^0.1 = 1.1052 (inside [0.8, 1.28]);
    # the product ratio e^0.3 = 1.3499 must not appear (it would even be clipped).
    lp, old, mask = seq([0.1, -0.1, 0.3])
    loss, m = gspo(lp, old, torch.tensor([1.0], dtype=F64), mask, **EPS)
    s = math.exp(0.1)
    assert_close(loss, torch.full((1, 3), -s, dtype=F64), rtol=1e-12, atol=0)  # ℓ = −s·A on each token
    assert m["ratio/mean"].item() == pytest.approx(1.1052, abs=1e-4)
    assert abs(m["ratio/max"].item() - math.exp(0.3)) > 0.2
    # unclipped gradient: −s·A/|y| = −1.1052/3 = −0.36839 on every token
    assert_close(seq_grad(loss, mask, lp), torch.full((1, 3), -s / 3, dtype=F64), rtol=1e-12, atol=0)
    # seq_mean_token_mean turns the per-token copies into (1/B)Σ ℓ_i = −1.1052
    total = aggregate(loss, mask, "seq_mean_token_mean")
    assert total.item() == pytest.approx(-s, rel=1e-12)


def test_padding_does_not_change_s():
    lp, old, mask = seq([0.1, -0.1, 0.3])
    adv = torch.tensor([1.0], dtype=F64)
    loss, m = gspo(lp, old, adv, mask, **EPS)
    # the same response with 3 padding columns holding garbage log-probs
    pad_lp = torch.tensor([[float("nan"), 50.0, -1e4]], dtype=F64)
    lp2 = torch.cat([lp.detach(), pad_lp], dim=1).requires_grad_()
    old2 = torch.cat([old, torch.tensor([[0.0, float("-inf"), 3.0]], dtype=F64)], dim=1)
    mask2 = torch.cat([mask, torch.zeros(1, 3, dtype=torch.bool)], dim=1)
    loss2, m2 = gspo(lp2, old2, adv, mask2, **EPS)
    assert_close(loss2[:, :3], loss, rtol=0, atol=0)
    assert (loss2[:, 3:] == 0).all()
    g2 = grad_of(loss2, lp2)
    assert_close(g2[:, :3], grad_of(loss, lp), rtol=0, atol=0)
    assert (g2[:, 3:] == 0).all()
    assert m2["ratio/mean"].item() == m["ratio/mean"].item()


def test_one_clip_decision_per_sequence():
    # log-ratios [0.5, 0.0, −0.2]: mean 0.1, s = 1.1052 > 1 + 0.05 -> A>0 clipped: every token
    # of the response has zero gradient, including the one whose own ratio e^−0.2 is below 1.
    lp, old, mask = seq([0.5, 0.0, -0.2])
    loss, m = gspo(lp, old, torch.tensor([1.0], dtype=F64), mask, eps_low=0.05, eps_high=0.05)
    assert (grad_of(loss, lp) == 0).all()
    assert_close(loss, torch.full((1, 3), -1.05, dtype=F64), rtol=1e-12, atol=0)  # −(1+ε_high)·A
    assert m["clip_frac"].item() == 1.0 and m["clip_frac/high_pos"].item() == 1.0


def test_tokenwise_ppo_clips_where_gspo_does_not():
    # log-ratios [0.3, −0.3, 0.0], A = +1, ε = 0.2/0.28. Token ratios 1.35, 0.74, 1.0:
    # PPO zeroes token 0 (1.35 > 1.28); GSPO's mean log-ratio is 0 -> s = 1, nothing clipped.
    lp, old, mask = seq([0.3, -0.3, 0.0])
    adv = torch.tensor([1.0], dtype=F64)
    ppo_loss, ppo_m = ppo_clip(lp, old, adv, mask, **EPS)
    g_ppo = grad_of(ppo_loss, lp)
    assert g_ppo[0, 0].item() == 0.0 and ppo_m["clip_frac"].item() == pytest.approx(1 / 3)
    gspo_loss, gspo_m = gspo(lp, old, adv, mask, **EPS)
    assert_close(seq_grad(gspo_loss, mask, lp), torch.full((1, 3), -1 / 3, dtype=F64), rtol=1e-12, atol=0)
    assert gspo_m["clip_frac"].item() == 0.0


def test_paper_clip_range_scale():
    # GSPO paper: ε_low = 3e-4, ε_high = 4e-4. Mean log-ratio 5e-4 -> s = 1.0005 > 1.0004:
    # clipped for A>0 (loss −1.0004, zero gradient); 3e-4 -> s = 1.0003 is inside.
    adv = torch.tensor([1.0], dtype=F64)
    lp, old, mask = seq([5e-4, 5e-4])
    loss, _ = gspo(lp, old, adv, mask, eps_low=3e-4, eps_high=4e-4)
    assert_close(loss, torch.full((1, 2), -1.0004, dtype=F64), rtol=1e-12, atol=0)
    assert (grad_of(loss, lp) == 0).all()
    lp, old, mask = seq([3e-4, 3e-4])
    loss, _ = gspo(lp, old, adv, mask, eps_low=3e-4, eps_high=4e-4)
    assert_close(seq_grad(loss, mask, lp), torch.full((1, 2), -math.exp(3e-4) / 2, dtype=F64), rtol=1e-12, atol=0)


# (A, s, expected ∂ℓ/∂lp per token for |y| = 2): unclipped −s·A/2, clipped 0
REGIONS = [
    (+1.0, 1.1, -0.55),  # inside
    (+1.0, 1.5, 0.0),    # A>0 above 1.28: zero
    (+1.0, 0.5, -0.25),  # A>0 below 0.8: min picks s·A, gradient flows
    (-1.0, 1.1, 0.55),   # inside
    (-1.0, 1.5, 0.75),   # A<0 above: unclipped branch
    (-1.0, 0.5, 0.0),    # A<0 below 0.8: zero
]


@pytest.mark.parametrize("fn", [gspo, gspo_token])
@pytest.mark.parametrize("a, s, expected", REGIONS)
def test_gradient_regions(fn, a, s, expected):
    lp, old, mask = seq([math.log(s)] * 2)
    loss, _ = fn(lp, old, torch.tensor([a], dtype=F64), mask, **EPS)
    # the paper's objective: seq_mean_token_mean (B = 1). gspo: = ℓ_1, ∂s/∂lp_t = s/|y|;
    # gspo_token: = (1/|y|) Σ_t ℓ_t with ∂ℓ_t/∂lp_t = −s·A. Both give −s·A/2 per token.
    assert_close(seq_grad(loss, mask, lp), torch.full((1, 2), expected, dtype=F64), rtol=1e-12, atol=0)


def test_gspo_token_splits_the_clip_by_token_sign():
    # s = 1.5 (both log-ratios log 1.5), A = [+1, −1]: token 0 is (A>0, s>1.28) -> zero;
    # token 1 is (A<0, s>1.28) -> unclipped, ∂(−s·A)/∂lp = −1.5·(−1) = +1.5 (carrier gradient).
    lp, old, mask = seq([math.log(1.5)] * 2)
    loss, _ = gspo_token(lp, old, torch.tensor([[1.0, -1.0]], dtype=F64), mask, **EPS)
    assert_close(grad_of(loss, lp), torch.tensor([[0.0, 1.5]], dtype=F64), rtol=1e-12, atol=0)


def _random_batch(seed, B=5, T=7):
    torch.manual_seed(seed)
    old = torch.randn(B, T, dtype=F64) - 2
    lp = (old + 0.6 * torch.randn(B, T, dtype=F64)).requires_grad_()
    mask = torch.rand(B, T) > 0.3
    mask[:, 0] = True
    return lp, old, mask


def test_gspo_matches_loop_reference():
    lp, old, mask = _random_batch(2)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0], dtype=F64)
    loss, m = gspo(lp, old, adv, mask, eps_low=0.05, eps_high=0.08)
    assert 0 < m["clip_frac"].item() < 1  # some responses clipped, some not
    ref = gspo_loop(lp, old, adv, mask, 0.05, 0.08)
    assert_close(loss, ref, rtol=1e-12, atol=1e-14)
    assert_close(grad_of(loss, lp), grad_of(ref, lp), rtol=1e-12, atol=1e-14)


def test_gspo_token_matches_loop_reference():
    lp, old, mask = _random_batch(3)
    adv = torch.randn(5, 7, dtype=F64)
    loss, m = gspo_token(lp, old, adv, mask, eps_low=0.05, eps_high=0.08)
    assert 0 < m["clip_frac"].item() < 1
    ref = gspo_loop(lp, old, adv, mask, 0.05, 0.08, per_token=True)
    assert_close(loss, ref, rtol=1e-12, atol=1e-14)
    assert_close(grad_of(loss, lp), grad_of(ref, lp), rtol=1e-12, atol=1e-14)


def test_gspo_token_equals_gspo_for_sequence_advantages():
    lp, old, mask = _random_batch(4)
    adv = torch.randn(5, dtype=F64)
    l_seq, m_seq = gspo(lp, old, adv, mask, eps_low=0.05, eps_high=0.08)
    l_tok, m_tok = gspo_token(lp, old, adv.unsqueeze(-1).expand(5, 7), mask, eps_low=0.05, eps_high=0.08)
    assert_close(l_tok, l_seq, rtol=1e-12, atol=1e-14)
    assert_close(seq_grad(l_tok, mask, lp), seq_grad(l_seq, mask, lp), rtol=1e-12, atol=1e-14)
    assert {k: v.item() for k, v in m_seq.items()} == {k: v.item() for k, v in m_tok.items()}


def test_constant_token_advantages_accepted_varying_refused():
    lp, old, mask = seq([0.1, 0.2])
    a_seq = gspo(lp, old, torch.tensor([0.7], dtype=F64), mask, **EPS)[0]
    a_tok = gspo(lp, old, torch.tensor([[0.7, 0.7]], dtype=F64), mask, **EPS)[0]
    assert_close(a_tok, a_seq, rtol=0, atol=0)
    with pytest.raises(ShapeError, match="use gspo_token"):
        gspo(lp, old, torch.tensor([[0.7, 0.6]], dtype=F64), mask, **EPS)


def test_empty_response_contributes_nothing():
    lp = torch.tensor([[-1.0, -2.0], [float("nan"), 7.0]], dtype=F64, requires_grad=True)
    old = torch.tensor([[-1.1, -2.0], [0.0, 0.0]], dtype=F64)
    mask = torch.tensor([[True, True], [False, False]])
    loss, m = gspo(lp, old, torch.tensor([1.0, 5.0], dtype=F64), mask, **EPS)
    g = grad_of(loss, lp)
    assert (loss[1] == 0).all() and (g[1] == 0).all() and torch.isfinite(g).all()
    assert m["ratio/mean"].item() == pytest.approx(math.exp(0.05))  # only the valid response


def test_extreme_sequence_log_ratio_is_guarded():
    lp, old, mask = seq([200.0, 200.0, 200.0])
    for fn in (gspo, gspo_token):
        loss, m = fn(lp, old, torch.tensor([-1.0], dtype=F64), mask, **EPS)
        g = grad_of(loss, lp)
        assert torch.isfinite(loss).all() and torch.isfinite(g).all()
        assert m["log_ratio_clamped"].item() == 3  # the 3 valid tokens of the clamped response
        assert m["ratio/max"].item() == pytest.approx(math.exp(20.0))
        assert set(m) == set(METRIC_KEYS)


@pytest.mark.parametrize("fn", [gspo, gspo_token])
@pytest.mark.parametrize("change, err, match", [
    (dict(mask=torch.ones(2, 4, dtype=torch.bool)), ShapeError, "`mask` has shape"),
    (dict(mask=torch.ones(2, 3, dtype=torch.int64)), ShapeError, "must be a bool tensor"),
    (dict(logp=torch.tensor([[0.0, 0.0, float("nan")], [0.0] * 3])), NonFiniteError, "`logp`"),
    (dict(eps_low=1.5), ValueError, "eps_low"),
    (dict(eps_high=float("inf")), ValueError, "eps_high"),
])
def test_bad_inputs(fn, change, err, match):
    kwargs = dict(logp=torch.zeros(2, 3), logp_old=torch.zeros(2, 3), adv=torch.ones(2),
                  mask=torch.ones(2, 3, dtype=torch.bool), **EPS)
    kwargs.update(change)
    with pytest.raises(err, match=match):
        fn(**kwargs)


def test_eps_is_required():
    lp, old, mask = seq([0.0])
    with pytest.raises(TypeError):
        gspo(lp, old, torch.ones(1, dtype=F64), mask)


@pytest.mark.parametrize("gspo", [gspo, gspo_token])
def test_empty_mask_contributes_exactly_zero(gspo):
    # a micro-batch whose sequences are all masked out: loss all 0 (finite, grad 0), metrics
    # finite counts 0, ratio/min|max = +inf|−inf (identities of min/max), no NaN anywhere.
    lp = torch.tensor([[-1.0, float("nan")]], requires_grad=True)
    mask = torch.zeros(1, 2, dtype=torch.bool)
    loss, m = gspo(lp, torch.zeros(1, 2), torch.ones(1), mask, **EPS)
    (g,) = torch.autograd.grad(loss.sum(), lp)
    assert (loss == 0).all() and (g == 0).all()
    assert m["clip_frac"].item() == 0 and m["log_ratio_clamped"].item() == 0
    assert m["ratio/min"].item() == float("inf") and m["ratio/max"].item() == float("-inf")
    assert not any(torch.isnan(v) for v in m.values())


def test_row_level_metrics_equal_the_token_level_summary():
    # GSPO's metrics come from per-row values (summarize_rows); they must equal the
    # token-level summary of the sequence ratio broadcast over each row's valid tokens
    from policylab.kernels.objectives.common import clip_regions, summarize, summarize_rows

    g = torch.Generator().manual_seed(0)
    B, T = 12, 7
    mask = torch.arange(T)[None, :] < torch.randint(0, T + 1, (B, 1), generator=g)  # some rows empty
    s = torch.exp(0.05 * torch.randn(B, generator=g, dtype=torch.float64))
    s[0] = 1.0 + 0.2  # exactly on no bound; rows spread across all regions
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    adv[1] = 0.0
    hit = torch.zeros(B, dtype=torch.bool)
    hit[2] = True
    eps_low, eps_high = 0.03, 0.04
    s_tok = s.unsqueeze(-1).expand(B, T)
    a_tok = torch.where(mask, adv.unsqueeze(-1).expand(B, T), torch.zeros(()))
    reg = clip_regions(s_tok, a_tok, mask, eps_low, eps_high)
    ref = summarize(s_tok, mask, reg, zeroed=reg.low_neg | reg.high_pos, clamped=hit.unsqueeze(-1).expand(B, T))
    got = summarize_rows(s, mask.sum(-1), adv, eps_low, eps_high, clamped=hit)
    assert got.keys() == ref.keys()
    assert float(ref["clip_frac"]) > 0 and float(ref["clip_frac/high_neg"]) + float(ref["clip_frac/low_pos"]) > 0
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=1e-12, atol=1e-12, msg=k)
