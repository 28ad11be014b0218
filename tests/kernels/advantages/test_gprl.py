"""gprl and gprl_stats (advantages/gprl.py)."""

import pytest
import torch
from torch.testing import assert_close

from policylab.kernels.advantages import gprl, gprl_stats, grpo
from policylab.errors import GroupError, NonFiniteError, ShapeError

F64 = torch.float64


def naive_gprl(rewards, group, weights, std, eps):
    B, D = rewards.shape
    w = weights.expand(B, D) if weights.dim() == 1 else weights
    out = torch.zeros(B, dtype=F64)
    for i in range(B):
        peers = [j for j in range(B) if group[j] == group[i]]
        for d in range(D):
            vals = [float(rewards[j, d]) for j in peers]
            if len(set(vals)) == 1:
                continue
            mean = sum(vals) / len(vals)
            ddof = 1 if std == "unbiased" else 0
            s = (sum((v - mean) ** 2 for v in vals) / (len(vals) - ddof)) ** 0.5
            out[i] += float(w[i, d]) * (float(rewards[i, d]) - mean) / (s + eps)
    return out


def hand_rewards():
    # columns: correctness [1,0,1,0] and format score [90,10,50,50]
    return torch.tensor([[1.0, 90.0], [0.0, 10.0], [1.0, 50.0], [0.0, 50.0]], dtype=F64), torch.tensor([3, 3, 3, 3])


def test_hand_case_and_sum_first_differs():
    # correctness: mean 0.5, population std 0.5 → [1, −1, 1, −1]
    # format: mean 50, deviations [40, −40, 0, 0], population std √(3200/4) = 28.284 → [1.414, −1.414, 0, 0]
    # equal weights → [2.414, −2.414, 1, −1]
    r, g = hand_rewards()
    a = gprl(r, g, torch.ones(2, dtype=F64), std="population", eps=0.0)
    assert_close(a, torch.tensor([2.4142, -2.4142, 1.0, -1.0], dtype=F64), rtol=0, atol=1e-4)
    # sum first: [91, 10, 51, 50], mean 50.5, deviations [40.5, −40.5, 0.5, −0.5],
    # std √(820.25) = 28.640 → [1.414, −1.414, 0.0175, −0.0175]: correctness is swamped
    summed = grpo(r.sum(1), g, std="population", eps=0.0)
    assert_close(summed, torch.tensor([1.4141, -1.4141, 0.0175, -0.0175], dtype=F64), rtol=0, atol=1e-4)
    assert (a - summed).abs().max() > 0.9


def test_affine_rescaling_of_one_dimension_changes_nothing():
    r, g = hand_rewards()
    w = torch.tensor([0.7, 0.3], dtype=F64)
    a = gprl(r, g, w, std="unbiased", eps=0.0)
    r2 = r.clone()
    r2[:, 1] = 0.01 * r2[:, 1] + 4.0
    assert_close(gprl(r2, g, w, std="unbiased", eps=0.0), a)


@pytest.mark.parametrize("std", ["unbiased", "population"])
def test_matches_naive_with_per_prompt_weights(std):
    gen = torch.Generator().manual_seed(2)
    group = torch.tensor([8, 1, 8, 1, 8, 20, 20, 1])
    r = torch.randn(8, 3, generator=gen, dtype=F64)
    r[group == 20, 2] = 0.5  # a zero-spread dimension in one group contributes 0
    per_prompt = {8: [1.0, 0.5, 2.0], 1: [0.2, 0.2, 0.2], 20: [3.0, 0.0, 1.0]}
    w = torch.tensor([per_prompt[int(i)] for i in group], dtype=F64)
    assert_close(gprl(r, group, w, std=std), naive_gprl(r, group, w, std, 1e-6))


def test_stats_hand_case():
    r, g = hand_rewards()
    s = gprl_stats(r, g, torch.ones(2, dtype=F64), std="population", eps=0.0)
    # one group: means 0.5 and 50 ; stds 0.5 and 28.284 ; effective weights 1/0.5 = 2, 1/28.284 = 0.03536
    assert_close(s["dim0/mean"], torch.tensor(0.5, dtype=F64))
    assert_close(s["dim1/std"], torch.tensor(800**0.5, dtype=F64))
    assert_close(s["dim0/effective_weight"], torch.tensor(2.0, dtype=F64))
    assert_close(s["dim1/effective_weight"], torch.tensor(1 / 800**0.5, dtype=F64))


def test_bad_inputs():
    r, g = hand_rewards()
    w_rows = torch.ones(4, 2, dtype=F64)
    w_rows[2, 0] = 2.0
    with pytest.raises(GroupError, match=r"`weights` differ between members of group id\(s\) \[3\]"):
        gprl(r, g, w_rows, std="population")
    with pytest.raises(ShapeError, match=r"`weights` must be \[D\]"):
        gprl(r, g, torch.ones(3, dtype=F64), std="population")
    bad = r.clone()
    bad[1, 1] = float("nan")
    with pytest.raises(NonFiniteError, match=r"`rewards`.*index \[1, 1\]"):
        gprl(bad, g, torch.ones(2, dtype=F64), std="population")
    with pytest.raises(ShapeError, match=r"`rewards` must be \[B, D\]"):
        gprl(r[:, 0], g, torch.ones(2, dtype=F64), std="population")
    with pytest.raises(NonFiniteError, match="`weights`"):
        gprl(r, g, torch.tensor([1.0, float("inf")], dtype=F64), std="population")
