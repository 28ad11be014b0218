import math

import pytest
import torch

from policylab.errors import MissingQuantityError, ShapeError
from policylab.kernels.objectives import METRIC_KEYS
from policylab.kernels.objectives.luspo import luspo

F64 = torch.float64


def naive_luspo_rows(lp, lp_old, adv, mask, eps_low, eps_high):
    """ℓ_i = -|y_i|·min(s A, clip(s) A) per sequence."""
    out = []
    for i in range(lp.shape[0]):
        d = [float(lp[i, t] - lp_old[i, t]) for t in range(lp.shape[1]) if mask[i, t]]
        if not d:
            out.append(0.0)
            continue
        s = math.exp(sum(d) / len(d))
        a = float(adv[i])
        out.append(-len(d) * min(s * a, min(max(s, 1 - eps_low), 1 + eps_high) * a))
    return torch.tensor(out, dtype=F64)


def token_mean(loss, mask):
    return loss.sum() / mask.sum()


def seq_mean_token_mean(loss, mask):
    return (loss.sum(-1) / mask.sum(-1)).mean()


def test_hand_worked_row_sum():
    # log ratios [0.1, -0.1, 0.3] -> s = e^(0.3/3) = e^0.1 = 1.1052 (not e^0.3 = 1.3499)
    # A = 1, eps 0.2: inside -> l_i = -3·1.1052 = -3.3155; padding (garbage) ignored
    lp_old = torch.full((1, 4), -1.0, dtype=F64)
    lp = lp_old + torch.tensor([[0.1, -0.1, 0.3, 40.0]], dtype=F64)
    mask = torch.tensor([[True, True, True, False]])
    loss, m = luspo(lp, lp_old, torch.tensor([1.0], dtype=F64), mask, eps_low=0.2, eps_high=0.2)
    assert loss.sum().item() == pytest.approx(-3 * math.exp(0.1))
    assert loss[0, 3].item() == 0.0
    assert m["ratio/mean"].item() == pytest.approx(math.exp(0.1))
    assert set(METRIC_KEYS) <= set(m)


def test_length_2_vs_8_per_token_gradients():
    # equal A = 1, s = 1, lengths 2 and 8 (N_tok = 10):
    # LUSPO (token_mean): every token gets -s·A/N_tok = -0.1
    # GSPO (seq_mean_token_mean of the same sequence values): -1/(2·2) = -0.25 vs -1/(2·8) = -0.0625
    lp_old = torch.full((2, 8), -1.0, dtype=F64)
    mask = torch.zeros(2, 8, dtype=torch.bool)
    mask[0, :2] = True
    mask[1, :] = True
    adv = torch.ones(2, dtype=F64)
    lp = lp_old.clone().requires_grad_(True)
    loss, _ = luspo(lp, lp_old, adv, mask, eps_low=0.2, eps_high=0.2)
    token_mean(loss, mask).backward()
    torch.testing.assert_close(lp.grad[mask], torch.full((10,), -0.1, dtype=F64))
    lp.grad = None
    loss, _ = luspo(lp, lp_old, adv, mask, eps_low=0.2, eps_high=0.2)
    seq_mean_token_mean(loss, mask).backward()
    torch.testing.assert_close(lp.grad[0, :2], torch.full((2,), -0.25, dtype=F64))
    torch.testing.assert_close(lp.grad[1], torch.full((8,), -0.0625, dtype=F64))


def test_clipped_sequence_has_zero_gradient():
    # s = e^0.3 = 1.35 > 1.2 with A > 0 -> all tokens of the sequence get 0;
    # the other sequence (s = 1) gets -s·A = -1 per token before normalization
    lp_old = torch.full((2, 3), -1.0, dtype=F64)
    lp = (lp_old + torch.tensor([[0.3, 0.3, 0.3], [0.0, 0.0, 0.0]], dtype=F64)).requires_grad_(True)
    mask = torch.ones(2, 3, dtype=torch.bool)
    loss, m = luspo(lp, lp_old, torch.ones(2, dtype=F64), mask, eps_low=0.2, eps_high=0.2)
    loss.sum().backward()
    torch.testing.assert_close(lp.grad, torch.tensor([[0.0] * 3, [-1.0] * 3], dtype=F64))
    assert m["clip_frac"].item() == pytest.approx(0.5)


def test_padding_invariance_and_equal_lengths_match_gspo_up_to_constant():
    torch.manual_seed(60)
    lp_old = -torch.rand(3, 5, dtype=F64)
    lp = lp_old + 0.05 * torch.randn(3, 5, dtype=F64)
    adv = torch.randn(3, dtype=F64)
    mask = torch.ones(3, 5, dtype=torch.bool)
    loss, _ = luspo(lp, lp_old, adv, mask, eps_low=0.2, eps_high=0.2)
    # padding: append 3 masked columns with arbitrary values -> same loss on the real columns
    pad = torch.full((3, 3), 7.0, dtype=F64)
    loss_p, _ = luspo(torch.cat([lp, pad], 1), torch.cat([lp_old, -pad], 1), adv,
                      torch.cat([mask, torch.zeros(3, 3, dtype=torch.bool)], 1), eps_low=0.2, eps_high=0.2)
    torch.testing.assert_close(loss_p[:, :5], loss)
    assert bool((loss_p[:, 5:] == 0).all())
    # equal lengths L: token_mean = seq_mean_token_mean (LUSPO default = GSPO objective)
    torch.testing.assert_close(token_mean(loss, mask), seq_mean_token_mean(loss, mask))


def test_matches_naive_loop():
    torch.manual_seed(61)
    lp_old = -torch.rand(4, 9, dtype=F64) * 2
    lp = lp_old + 0.2 * torch.randn(4, 9, dtype=F64)
    adv = torch.randn(4, dtype=F64)
    mask = torch.rand(4, 9) > 0.3
    mask[:, 0] = True
    loss, _ = luspo(lp, lp_old, adv, mask, eps_low=0.1, eps_high=0.15)
    torch.testing.assert_close(loss.sum(-1), naive_luspo_rows(lp, lp_old, adv, mask, 0.1, 0.15))


def test_refusals():
    z = torch.zeros(2, 3, dtype=F64)
    m = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ShapeError, match=r"per sequence \[B\]"):
        luspo(z, z, torch.ones(2, 3, dtype=F64), m, eps_low=0.2, eps_high=0.2)
    with pytest.raises(ValueError, match="eps_low"):
        luspo(z, z, torch.ones(2, dtype=F64), m, eps_low=1.5, eps_high=0.2)
    with pytest.raises(MissingQuantityError, match="logp_old"):
        luspo(z, None, torch.ones(2, dtype=F64), m, eps_low=0.2, eps_high=0.2)
