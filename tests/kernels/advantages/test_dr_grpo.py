"""dr_grpo (advantages/dr_grpo.py)."""

import pytest
import torch
from torch.testing import assert_close

from policylab.kernels.advantages import dr_grpo, grpo
from policylab.errors import NonFiniteError, ShapeError

F64 = torch.float64


def naive_dr_grpo(rewards, group):
    out = torch.zeros_like(rewards)
    for gid in set(group.tolist()):
        idx = [i for i in range(len(group)) if group[i] == gid]
        mean = sum(float(rewards[i]) for i in idx) / len(idx)
        for i in idx:
            out[i] = float(rewards[i]) - mean
    return out


def test_hand_cases():
    # [1,0,0,0]: mean 0.25 → [0.75, −0.25, −0.25, −0.25], sums to 0
    r = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64)
    assert_close(dr_grpo(r, torch.tensor([2, 2, 2, 2])), torch.tensor([0.75, -0.25, -0.25, -0.25], dtype=F64), rtol=0, atol=1e-12)
    # groups [1,0] (mean 0.5) and [0.6,0.4] (mean 0.5): [0.5,−0.5] and [0.1,−0.1]
    # (GRPO would give ±1 to both: it divides by each group's own spread)
    r2 = torch.tensor([1.0, 0.0, 0.6, 0.4], dtype=F64)
    g2 = torch.tensor([11, 11, -4, -4])
    assert_close(dr_grpo(r2, g2), torch.tensor([0.5, -0.5, 0.1, -0.1], dtype=F64), rtol=0, atol=1e-12)
    assert_close(grpo(r2, g2, std="population", eps=0.0).abs(), torch.ones(4, dtype=F64))


def test_scale_and_shift():
    g = torch.Generator().manual_seed(0)
    r = torch.randn(12, generator=g, dtype=F64)
    grp = torch.tensor([5, 9, 5, 1, 9, 1, 5, 9, 1, 1, 9, 5])
    a = dr_grpo(r, grp)
    assert_close(dr_grpo(2.5 * r, grp), 2.5 * a)  # scaling rewards scales A
    assert_close(dr_grpo(r + 4.0, grp), a)  # a constant shift changes nothing
    assert_close(a, naive_dr_grpo(r, grp))


def test_singleton_and_all_equal_are_zero():
    r = torch.tensor([0.3, 0.3, 0.3, 9.0])
    a = dr_grpo(r, torch.tensor([1, 1, 1, 2]))
    assert a.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_bad_inputs():
    with pytest.raises(NonFiniteError, match=r"index \[1\]"):
        dr_grpo(torch.tensor([0.0, float("nan")]), torch.tensor([0, 0]))
    with pytest.raises(ShapeError, match="`group` has 1 entries but there are 2"):
        dr_grpo(torch.tensor([0.0, 1.0]), torch.tensor([0]))
