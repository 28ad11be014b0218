"""The private scatter helpers every group estimator uses (advantages/_group.py)."""

import pytest
import torch
from torch.testing import assert_close

from policylab.kernels.advantages.group import Groups, std_ddof
from policylab.errors import GroupError, PolicylabError, ShapeError


def test_positions_rank_rows_inside_their_group_in_batch_order():
    group = torch.tensor([40, -3, 40, 7, -3, 40])
    g = Groups.of(group, 6)
    pos, g_max = g.positions()
    # unique sorted ids: -3 -> 0, 7 -> 1, 40 -> 2; ranks follow batch order inside a group
    assert g.dense.tolist() == [2, 0, 2, 1, 0, 2]
    assert pos.tolist() == [0, 0, 1, 0, 1, 2]
    assert g_max == 3
    assert g.sizes.tolist() == [2, 1, 3]


def test_flat_is_exact_equality_and_centre_gives_exact_zero():
    # 0.1 three times: the scatter mean 0.3/3 is not exactly 0.1 in floating point,
    # so a plain r - mean would leave ~1e-17 residue that a std division amplifies.
    x = torch.tensor([0.1, 0.1, 0.1, 0.2, 0.3], dtype=torch.float64)
    g = Groups.of(torch.tensor([5, 5, 5, 9, 9]), 5)
    naive_residue = x[:3] - x[:3].sum() / 3
    assert bool((naive_residue != 0).any()), "the case must exercise the rounding"
    c, flat = g.centre(x)
    assert flat.tolist() == [True, False]
    assert c[:3].tolist() == [0.0, 0.0, 0.0]
    assert_close(c[3:], torch.tensor([-0.05, 0.05], dtype=torch.float64))


def test_standardize_handles_a_trailing_dimension_per_column():
    x = torch.tensor([[1.0, 5.0], [0.0, 5.0], [2.0, 1.0], [4.0, 3.0]], dtype=torch.float64)
    g = Groups.of(torch.tensor([0, 0, 1, 1]), 4)
    out = g.standardize(x, ddof=0, eps=0.0)
    # group 0: column 0 -> [1, -1]; column 1 flat -> [0, 0]; group 1: [-1, 1] in both
    expected = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [-1.0, -1.0], [1.0, 1.0]], dtype=torch.float64)
    assert_close(out, expected, rtol=0, atol=1e-12)


def test_bad_conventions_and_group_ids_are_refused():
    with pytest.raises(PolicylabError, match="`std` must be"):
        std_ddof("biased")
    with pytest.raises(GroupError, match="1-D integer"):
        Groups.of(torch.tensor([0.0, 1.0]), 2)
    with pytest.raises(ShapeError, match="2 entries but there are 3"):
        Groups.of(torch.tensor([0, 1]), 3)
    g = Groups.of(torch.tensor([3, 3, 8]), 3)
    with pytest.raises(GroupError, match=r"group id\(s\) \[8\]"):
        g.refuse_singletons(torch.tensor([3, 3, 8]), "m", "why")


def test_group_index_matches_unique_in_both_paths():
    # small id range: the presence-table path; huge or negative-spanning range: torch.unique
    from policylab.kernels.checks import group_index

    g = torch.Generator().manual_seed(0)
    cases = [
        torch.tensor([7, 3, 7, 100, 3, -2]),                           # hand case: ids -2, 3, 7, 100
        (torch.randperm(300, generator=g)[:40] * 3 - 50).repeat_interleave(4),
        torch.tensor([10**12, 5, 10**12, -(10**11)]),                  # range far beyond the batch: unique
        torch.tensor([4]),
    ]
    dense, n = group_index(cases[0])
    assert dense.tolist() == [2, 1, 2, 3, 1, 0] and n == 4
    for ids in cases:
        uniq, ref = torch.unique(ids, return_inverse=True)
        dense, n = group_index(ids)
        assert torch.equal(dense, ref) and n == uniq.numel()


def test_centre_flat_groups_from_the_shifted_sums():
    """Groups.centre subtracts each group's max first, so a flat group is exactly 0 and
    flatness is Σ(x − max) == 0; one ulp of spread is not flat (hand case + naive)."""
    from policylab.kernels.advantages.group import Groups

    one_ulp = torch.nextafter(torch.tensor(1.0), torch.tensor(2.0)).item()
    x = torch.tensor([0.1, 0.1, 0.1, 1.0, one_ulp, 3.0, 5.0, 7.0])
    g = Groups.of(torch.tensor([9, 9, 9, 4, 4, 2, 2, 2]), 8)
    c, flat = g.centre(x)
    # dense ids follow ascending raw id: 2 -> 0, 4 -> 1, 9 -> 2
    assert flat.tolist() == [False, False, True]
    assert c[:3].tolist() == [0.0, 0.0, 0.0]
    assert c[3].item() < 0 < c[4].item()
    assert_close(c[5:], torch.tensor([-2.0, 0.0, 2.0]))
    naive = torch.cat([x[i] - x[i].mean() for i in ([0, 1, 2], [3, 4], [5, 6, 7])])
    assert_close(c, naive, rtol=1e-6, atol=1e-7)
    # eps = 0: the flat group stays 0 (no 0/0), the others are standardized
    a = g.standardize(x, ddof=1, eps=0.0)
    assert a[:3].tolist() == [0.0, 0.0, 0.0] and torch.isfinite(a).all()
    assert_close(a[5:], torch.tensor([-1.0, 0.0, 1.0]))
