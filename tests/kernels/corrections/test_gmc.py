import pytest
import torch

from policylab.kernels.corrections import gmc
from policylab.errors import GroupError, NonFiniteError, ShapeError

F64 = torch.float64


def naive_gmc(w, group, cap):
    out = w.clone()
    for g in set(group.tolist()):
        idx = [i for i in range(len(w)) if int(group[i]) == g]
        s = sum(float(w[i]) for i in idx)
        if s > cap:
            for i in idx:
                out[i] = w[i] * cap / s
    return out


def test_hand_worked_keeps_ratios():
    # w = [4, 2, 1, 1], C = 4: S = 8 > 4 -> κ = 4/8 = 0.5 -> [2, 1, 0.5, 0.5]
    # (per-trajectory clipping at 2 would give [2, 2, 1, 1] and break the 2:1 ratio)
    w = torch.tensor([4.0, 2.0, 1.0, 1.0], dtype=F64)
    out, m = gmc(w, torch.tensor([0, 0, 0, 0]), cap=4.0)
    torch.testing.assert_close(out, torch.tensor([2.0, 1.0, 0.5, 0.5], dtype=F64))
    assert out.sum().item() == pytest.approx(4.0)
    assert m["gmc/frac_groups_capped"].item() == 1.0
    assert m["gmc/max_group_mass"].item() == 8.0 and m["gmc/max_group_mass_capped"].item() == 4.0


def test_mass_exactly_at_cap_is_unchanged():
    # S = 2 + 1 + 1 = 4 = C: rescaled only when S > C (strict) -> unchanged
    w = torch.tensor([2.0, 1.0, 1.0], dtype=F64)
    out, m = gmc(w, torch.tensor([5, 5, 5]), cap=4.0)
    assert torch.equal(out, w) and m["gmc/frac_groups_capped"].item() == 0.0


def test_groups_never_pooled_with_arbitrary_ids():
    # group 17 has a huge weight (S = 101 > 4); group -3 (S = 3) must be untouched
    w = torch.tensor([1.0, 100.0, 1.0, 2.0], dtype=F64)
    group = torch.tensor([-3, 17, -3, 17])
    out, _ = gmc(w, group, cap=4.0)
    torch.testing.assert_close(out[[0, 2]], torch.tensor([1.0, 1.0], dtype=F64))
    # group 17: κ = 4/102 -> [100·4/102, 2·4/102]
    torch.testing.assert_close(out[[1, 3]], torch.tensor([400 / 102, 8 / 102], dtype=F64))


def test_matches_naive_loop_and_mass_bound():
    torch.manual_seed(9)
    w = torch.rand(40, dtype=F64) * 3
    group = torch.randint(-5, 50, (40,)) * 7
    out, _ = gmc(w, group, cap=2.5)
    torch.testing.assert_close(out, naive_gmc(w, group, 2.5))
    for g in group.unique():
        assert out[group == g].sum().item() <= 2.5 + 1e-12


def test_output_detached():
    w = torch.tensor([3.0, 3.0], dtype=F64, requires_grad=True)
    out, _ = gmc(w, torch.tensor([0, 0]), cap=1.0)
    assert not out.requires_grad


def test_refusals():
    g = torch.tensor([0, 0])
    with pytest.raises(ValueError, match=">= 0"):
        gmc(torch.tensor([1.0, -0.5]), g, cap=2.0)
    with pytest.raises(NonFiniteError, match="weights"):
        gmc(torch.tensor([1.0, float("nan")]), g, cap=2.0)
    with pytest.raises(ValueError, match="cap"):
        gmc(torch.tensor([1.0, 1.0]), g, cap=0.0)
    with pytest.raises(ShapeError, match="1-D"):
        gmc(torch.ones(2, 2), g, cap=1.0)
    with pytest.raises(ShapeError, match="group"):
        gmc(torch.ones(3), g, cap=1.0)
    with pytest.raises(GroupError, match="integer"):
        gmc(torch.ones(2), torch.tensor([0.0, 1.0]), cap=1.0)
