"""TTPO kernels: the split into self-distillation and RL token sets, the RL advantages,
the distillation NLL, and the method's own loss (both terms) region by region."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from policylab import methods
from policylab.errors import PolicylabError, ShapeError
from policylab.methods.loss import loss_terms, tensor_inputs, term_masks
from policylab.kernels.testtime import self_distill_nll, ttpo_advantages, ttpo_split

LOG = math.log


def _case():
    # one prompt, four replies answering 7, 7, 7, 3: majority 7, reply 3 dissents.
    agree = torch.tensor([True, True, True, False])
    eligible = torch.ones(4, dtype=torch.bool)
    p = torch.tensor([[0.5, 0.995, 0.2],
                      [0.999, 0.4, 0.0],   # last position is padding
                      [0.3, 0.3, 0.3],
                      [0.95, 0.5, 0.1]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1]], dtype=torch.bool)
    lp = torch.where(mask, p.clamp(min=1e-9).log(), torch.full_like(p, float("nan")))  # NaN in the padding
    return agree, eligible, lp, mask


def test_hand_worked_split():
    agree, eligible, lp, mask = _case()
    distill, rl, info = ttpo_split(agree, eligible, lp, mask, tau_conv=0.99, tau_err=0.9, err_level="token")
    # agreeing rows 0-2: tokens with p > 0.99 are converged: (0, 1) p = 0.995 and (1, 0) p = 0.999
    want_distill = torch.tensor([[1, 0, 1], [0, 1, 0], [1, 1, 1], [0, 0, 0]], dtype=torch.bool)
    # dissenting row 3: its token with p = 0.95 > 0.9 is a confident error, filtered
    want_rl = torch.tensor([[0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 1, 1]], dtype=torch.bool)
    assert torch.equal(distill, want_distill) and torch.equal(rl, want_rl)
    assert int(info["converged_tokens"]) == 2 and int(info["filtered_tokens"]) == 1
    assert int(info["dissent_rows"]) == 1 and int(info["agree_rows"]) == 3


def test_response_level_filter_uses_the_geometric_mean_probability():
    agree, eligible, lp, mask = _case()
    # row 3: exp(mean(log .95, log .5, log .1)) = (0.95·0.5·0.1)^(1/3) = 0.0475^(1/3) = 0.3621
    _, rl, _ = ttpo_split(agree, eligible, lp, mask, tau_conv=1.0, tau_err=0.37, err_level="response")
    assert torch.equal(rl[3], mask[3])  # 0.3621 <= 0.37: kept whole
    _, rl, info = ttpo_split(agree, eligible, lp, mask, tau_conv=1.0, tau_err=0.36, err_level="response")
    assert not bool(rl.any()) and int(info["filtered_tokens"]) == 3  # 0.3621 > 0.36: the whole reply leaves


def test_thresholds_are_inclusive_on_the_kept_side_and_one_switches_the_filters_off():
    agree, eligible, lp, mask = _case()
    distill, rl, _ = ttpo_split(agree, eligible, lp, mask, tau_conv=1.0, tau_err=1.0, err_level="token")
    assert torch.equal(distill, mask & agree.unsqueeze(-1))
    assert torch.equal(rl, mask & ~agree.unsqueeze(-1))  # dissenting replies are never deleted
    p = torch.tensor([[0.5, 0.25]], dtype=torch.float64)
    d, _, _ = ttpo_split(torch.tensor([True]), torch.tensor([True]), p.log(), torch.ones(1, 2, dtype=torch.bool),
                         tau_conv=0.5, tau_err=1.0, err_level="token")
    assert d.tolist() == [[True, True]]  # p = 0.5 = tau: kept (p > tau leaves)


def test_ineligible_groups_belong_to_no_set():
    agree, _, lp, mask = _case()
    distill, rl, _ = ttpo_split(agree, torch.zeros(4, dtype=torch.bool), lp, mask, tau_conv=1.0, tau_err=1.0,
                                err_level="token")
    assert not bool(distill.any()) and not bool(rl.any())


def _naive_split(agree, eligible, lp, mask, tau_conv, tau_err, level):
    B, T = mask.shape
    d = torch.zeros(B, T, dtype=torch.bool)
    r = torch.zeros(B, T, dtype=torch.bool)
    for i in range(B):
        if not eligible[i]:
            continue
        toks = [t for t in range(T) if mask[i, t]]
        gm = math.exp(sum(float(lp[i, t]) for t in toks) / max(len(toks), 1))
        for t in toks:
            p = math.exp(float(lp[i, t]))
            if agree[i]:
                d[i, t] = p <= tau_conv
            else:
                r[i, t] = (p <= tau_err) if level == "token" else (gm <= tau_err)
    return d, r


@pytest.mark.parametrize("level", ["token", "response"])
def test_split_matches_a_naive_loop(level):
    g = torch.Generator().manual_seed(3)
    B, T = 12, 7
    lp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 0.3
    mask = torch.rand(B, T, generator=g) < 0.8
    mask[:, 0] = False  # a masked leading position
    agree = torch.rand(B, generator=g) < 0.6
    eligible = torch.rand(B, generator=g) < 0.9
    d, r, _ = ttpo_split(agree, eligible, lp, mask, tau_conv=0.9, tau_err=0.85, err_level=level)
    nd, nr = _naive_split(agree, eligible, lp, mask, 0.9, 0.85, level)
    assert torch.equal(d, nd) and torch.equal(r, nr)


def test_advantages_hand_worked_and_only_on_the_rl_set():
    # agreement rewards [1, 1, 1, 0]: mean 0.75; unbiased std sqrt((3·0.25² + 0.75²)/3) = sqrt(0.25) = 0.5
    # dissenting reply: A = (0 − 0.75)/0.5 = −1.5; population std sqrt(0.1875) = 0.4330: A = −1.7321
    r = torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    g = torch.zeros(4, dtype=torch.long)
    rl = torch.zeros(4, 3, dtype=torch.bool)
    rl[3, 1:] = True
    a = ttpo_advantages(r, g, rl, std="unbiased", eps=0.0, rl_coef=1.0)
    want = torch.zeros(4, 3, dtype=torch.float64)
    want[3, 1:] = -1.5
    torch.testing.assert_close(a, want)
    a = ttpo_advantages(r, g, rl, std="population", eps=0.0, rl_coef=2.0)
    torch.testing.assert_close(a[3, 1], torch.tensor(-2 * 0.75 / math.sqrt(0.1875), dtype=torch.float64))
    assert not a.requires_grad


def test_self_distill_gradient_is_minus_coef_on_the_set_and_zero_elsewhere():
    lp = torch.full((2, 3), -0.5, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 0, 1], [0, 0, 1]], dtype=torch.bool)
    stored = lp.detach().clone()
    stored[1, 0] = float("nan")  # garbage outside the set never reaches the loss
    x = stored.requires_grad_()
    loss = self_distill_nll(x, mask, coef=0.5)
    loss.sum().backward()
    torch.testing.assert_close(x.grad, -0.5 * mask.double())
    assert torch.isfinite(loss).all()


def test_method_loss_regions():
    # the method's own composition: the PPO policy term on the RL set, the distillation term
    # on its own mask with its own normalizer; converged and filtered tokens get exactly 0
    m = methods.get("ttpo")
    agree, eligible, lp_b, mask = _case()
    distill, rl, _ = ttpo_split(agree, eligible, lp_b, mask, tau_conv=0.99, tau_err=0.9, err_level="token")
    r = agree.double()
    adv = ttpo_advantages(r, torch.zeros(4, dtype=torch.long), rl, std="unbiased", eps=0.0, rl_coef=1.0)
    logp = torch.where(mask, lp_b, torch.zeros_like(lp_b)).clone().requires_grad_()
    inp = tensor_inputs(logp, adv, mask, rewards=r, group=torch.zeros(4, dtype=torch.long),
                        extras={"ttpo_distill_mask": distill, "ttpo_rl_mask": rl},
                        outcome={"eligible": eligible})
    mats, _ = loss_terms(m, inp)
    assert set(mats) == {"policy", "self_distill"}
    masks = term_masks(m, inp.batch)
    # normalizers: policy = seq_mean_token_mean over all 4 rows; distillation = its 6 tokens
    total = 0.0
    from policylab.kernels import aggregate as agg

    for name, mat in mats.items():
        mk, mode, L = masks[name]
        total = total + agg.aggregate(mat, mk, mode, normalizer=agg.normalizer(mk, mode, L_norm=L), L_norm=L)
    total.backward()
    grad = logp.grad
    # distillation tokens: −1/6 each (NLL, token mean over the 6 tokens of the set)
    torch.testing.assert_close(grad[distill], torch.full((int(distill.sum()),), -1 / 6, dtype=torch.float64))
    # converged (0,1), (1,0), the padding (1,2) and the filtered dissent token (3,0): exactly 0
    for i, t in ((0, 1), (1, 0), (1, 2), (3, 0)):
        assert grad[i, t] == 0.0, (i, t)
    # dissent tokens (A = −1.5 < 0): ∂L/∂lp = −A/(B·|y_3|) = 1.5/(4·3) = 0.125 > 0 (descent pushes them down)
    torch.testing.assert_close(grad[3, 1:], torch.full((2,), 0.125, dtype=torch.float64))


def test_no_gold_argument_anywhere():
    gold_like = {"gold", "answer", "answers", "label", "labels", "truth", "target"}
    for fn in (ttpo_split, ttpo_advantages, self_distill_nll):
        assert not gold_like & set(inspect.signature(fn).parameters), fn.__name__


def test_bad_input_is_refused():
    agree, eligible, lp, mask = _case()
    with pytest.raises(PolicylabError, match="`tau_conv` must be a probability"):
        ttpo_split(agree, eligible, lp, mask, tau_conv=0.0, tau_err=0.9, err_level="token")
    with pytest.raises(PolicylabError, match="`tau_err` must be a probability"):
        ttpo_split(agree, eligible, lp, mask, tau_conv=0.9, tau_err=1.5, err_level="token")
    with pytest.raises(PolicylabError, match="`err_level` must be one of token, response"):
        ttpo_split(agree, eligible, lp, mask, tau_conv=0.9, tau_err=0.9, err_level="sequence")
    with pytest.raises(ShapeError, match="`agree` must be \\[B\\]"):
        ttpo_split(agree[:3], eligible, lp, mask, tau_conv=0.9, tau_err=0.9, err_level="token")
    with pytest.raises(ShapeError, match="`agree` must be a bool tensor"):
        ttpo_split(agree.long(), eligible, lp, mask, tau_conv=0.9, tau_err=0.9, err_level="token")
    with pytest.raises(ShapeError, match="`rl_mask` must be \\[B, T\\]"):
        ttpo_advantages(torch.ones(4), torch.zeros(4, dtype=torch.long), torch.ones(3, 2, dtype=torch.bool),
                        std="unbiased", eps=0.0, rl_coef=1.0)
    with pytest.raises(PolicylabError, match="`coef` must be a finite number >= 0"):
        self_distill_nll(lp, mask, coef=-1.0)
    with pytest.raises(PolicylabError, match="`coef` must be a finite number >= 0"):
        self_distill_nll(lp, mask, coef=float("inf"))
