"""range_grpo (advantages/range_grpo.py)."""

import pytest
import torch
from torch.testing import assert_close

from policylab.kernels.advantages import dr_grpo, range_grpo
from policylab.errors import NonFiniteError, ShapeError

F64 = torch.float64


def naive_range_grpo(intervals, group):
    B = len(group)
    out = torch.zeros(B, dtype=F64)
    for i in range(B):
        peers = [j for j in range(B) if group[j] == group[i]]
        total = 0.0
        li, ui = float(intervals[i, 0]), float(intervals[i, 1])
        for j in peers:
            lj, uj = float(intervals[j, 0]), float(intervals[j, 1])
            if li > uj:
                total += li - uj
            elif lj > ui:
                total -= lj - ui
        out[i] = total / len(peers)
    return out


def test_hand_case():
    # A=[0.6,0.9], B=[0.1,0.3], C=[0.5,0.7]
    # A ≻ B: 0.6 > 0.3, gap 0.3 ; C ≻ B: 0.5 > 0.3, gap 0.2 ; A vs C overlap → 0
    # A_A = 0.3/3 = 0.1 ; A_B = (−0.3 − 0.2)/3 = −0.1667 ; A_C = 0.2/3 = 0.0667 ; Σ = 0
    x = torch.tensor([[0.6, 0.9], [0.1, 0.3], [0.5, 0.7]], dtype=F64)
    a = range_grpo(x, torch.tensor([4, 4, 4]))
    assert_close(a, torch.tensor([0.1, -0.5 / 3, 0.2 / 3], dtype=F64), rtol=0, atol=1e-12)
    assert abs(float(a.sum())) < 1e-12


def test_touching_intervals_are_undetermined():
    # [0.3, 0.5] vs [0.5, 0.8]: 0.5 > 0.5 is false (strict) → both 0
    a = range_grpo(torch.tensor([[0.3, 0.5], [0.5, 0.8]]), torch.tensor([1, 1]))
    assert a.tolist() == [0.0, 0.0]


def test_broad_interval_overlapping_everyone_gets_zero():
    # [0.0, 1.0] (midpoint 0.5, highest) overlaps [0.1,0.2] and [0.3,0.4]: A = 0;
    # the other two: [0.3,0.4] ≻ [0.1,0.2] by 0.1 → ±0.1/3
    x = torch.tensor([[0.0, 1.0], [0.1, 0.2], [0.3, 0.4]], dtype=F64)
    a = range_grpo(x, torch.tensor([0, 0, 0]))
    assert_close(a, torch.tensor([0.0, -0.1 / 3, 0.1 / 3], dtype=F64), rtol=0, atol=1e-12)


def test_point_limit_is_dr_grpo():
    g = torch.Generator().manual_seed(0)
    r = torch.randn(11, generator=g, dtype=F64)
    group = torch.tensor([7, 3, 7, 3, 3, 12, 7, 12, 12, 12, 40])
    assert_close(range_grpo(torch.stack([r, r], 1), group), dr_grpo(r, group))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_naive_with_shuffled_ids(seed):
    g = torch.Generator().manual_seed(seed)
    group = torch.tensor([5, 5, 5, -9, -9, 100, 100, 100, 100, 2])[torch.randperm(10, generator=g)]
    low = torch.rand(10, generator=g, dtype=F64)
    x = torch.stack([low, low + 0.3 * torch.rand(10, generator=g, dtype=F64)], 1)
    a = range_grpo(x, group)
    assert_close(a, naive_range_grpo(x, group))
    for gid in group.unique():
        assert abs(float(a[group == gid].sum())) < 1e-12
    assert float(a[group == 2]) == 0.0  # singleton


def test_bad_inputs():
    with pytest.raises(ShapeError, match="row 1 has low 0.5 > high 0.2"):
        range_grpo(torch.tensor([[0.1, 0.2], [0.5, 0.2]]), torch.tensor([0, 0]))
    with pytest.raises(NonFiniteError, match=r"index \[0, 1\]"):
        range_grpo(torch.tensor([[0.1, float("nan")], [0.5, 0.6]]), torch.tensor([0, 0]))
    with pytest.raises(ShapeError, match=r"`intervals` must be \[B, 2\]"):
        range_grpo(torch.zeros(2, 3), torch.tensor([0, 0]))
    with pytest.raises(ShapeError, match="`group` has 1 entries but there are 2"):
        range_grpo(torch.zeros(2, 2), torch.tensor([0]))
