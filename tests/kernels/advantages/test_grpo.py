"""grpo and group_stats (advantages/grpo.py)."""

import pytest
import torch
from torch.testing import assert_close

from policylab.kernels.advantages import group_stats, grpo
from policylab.errors import GroupError, NonFiniteError, PolicylabError, ShapeError

F64 = torch.float64


def random_groups(seed, n_groups=6, max_size=5, min_size=1):
    """Shuffled, non-contiguous (some negative) group ids with sizes in [min, max]."""
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(min_size, max_size + 1, (n_groups,), generator=g)
    ids = torch.randperm(1000, generator=g)[:n_groups] * 3 - 1500
    group = ids.repeat_interleave(sizes)
    perm = torch.randperm(group.numel(), generator=g)
    rewards = torch.randn(group.numel(), generator=g, dtype=F64)
    return rewards, group[perm]


def naive_grpo(rewards, group, std, eps):
    out = torch.zeros_like(rewards)
    for gid in set(group.tolist()):
        idx = [i for i in range(len(group)) if group[i] == gid]
        vals = [float(rewards[i]) for i in idx]
        mean = sum(vals) / len(vals)
        if len(vals) == 1 or len(set(vals)) == 1:
            continue  # singleton / all-equal -> 0
        for i in idx:
            if std is None:
                out[i] = float(rewards[i]) - mean
            else:
                ddof = 1 if std == "unbiased" else 0
                s = (sum((x - mean) ** 2 for x in vals) / (len(vals) - ddof)) ** 0.5
                out[i] = (float(rewards[i]) - mean) / (s + eps)
    return out


def test_hand_case_one_correct_of_four():
    # four answers to "10 × 10", one correct: r = [1, 0, 0, 0], mean 0.25
    # deviations [0.75, −0.25, −0.25, −0.25]; Σ dev² = 0.5625 + 3·0.0625 = 0.75
    # population std = √(0.75/4) = 0.4330 → [0.75/0.4330, −0.25/0.4330] = [1.7321, −0.5774]
    # unbiased  std = √(0.75/3) = 0.5    → [1.5, −0.5]
    r = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64)
    g = torch.tensor([10, 10, 10, 10])
    assert_close(grpo(r, g, std="population", eps=0.0), torch.tensor([1.7321, -0.5774, -0.5774, -0.5774], dtype=F64), rtol=0, atol=1e-4)
    assert_close(grpo(r, g, std="unbiased", eps=0.0), torch.tensor([1.5, -0.5, -0.5, -0.5], dtype=F64), rtol=0, atol=1e-12)
    assert_close(grpo(r, g, std=None), torch.tensor([0.75, -0.25, -0.25, -0.25], dtype=F64), rtol=0, atol=1e-12)
    # the default eps = 1e-6 shifts the unbiased value only in the 6th digit
    assert_close(grpo(r, g), torch.tensor([1.5, -0.5, -0.5, -0.5], dtype=F64), rtol=0, atol=5e-6)


@pytest.mark.parametrize("std", ["unbiased", "population", None])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_naive_per_group_loop(std, seed):
    rewards, group = random_groups(seed)
    rewards[:3] = rewards[0]  # some ties
    assert_close(grpo(rewards, group, std=std, eps=1e-6), naive_grpo(rewards, group, std, 1e-6))


def test_all_equal_group_is_exactly_zero_and_singleton_zero_by_default():
    # group 3 = three 0.1's (mean 0.3/3 ≠ 0.1 in floating point), group 8 = singleton
    r = torch.tensor([0.1, 0.7, 0.1, 0.1, 0.2, 5.0], dtype=torch.float32)
    g = torch.tensor([3, 4, 3, 3, 4, 8])
    for std in ("unbiased", "population", None):
        a = grpo(r, g, std=std, eps=0.0)
        assert a[[0, 2, 3, 5]].tolist() == [0.0, 0.0, 0.0, 0.0]
        assert torch.isfinite(a).all()
    stats = group_stats(r, g)
    # groups: {3: flat}, {4: 0.7, 0.2}, {8: singleton, flat}
    assert stats["n_groups"].item() == 3
    assert_close(stats["zero_spread_frac"], torch.tensor(2 / 3))
    assert stats["n_singleton_groups"].item() == 1
    assert_close(stats["mean_group_size"], torch.tensor(2.0))


def test_singleton_raise_names_the_group():
    r = torch.tensor([1.0, 0.0, 1.0])
    with pytest.raises(GroupError, match=r"grpo: group id\(s\) \[42\] have a single sample"):
        grpo(r, torch.tensor([7, 7, 42]), on_singleton="raise")
    with pytest.raises(GroupError, match=r"\[42\]"):
        grpo(r, torch.tensor([7, 7, 42]), std="population", on_singleton="raise")
    with pytest.raises(PolicylabError, match="`on_singleton` must be"):
        grpo(r, torch.tensor([7, 7, 42]), on_singleton="nan")


def test_invariances():
    rewards, group = random_groups(5, min_size=2)
    a = grpo(rewards, group, std="population", eps=0.0)
    # positive affine map of the rewards leaves A unchanged (eps = 0)
    assert_close(grpo(3.0 * rewards - 7.0, group, std="population", eps=0.0), a)
    # permuting the batch permutes A
    perm = torch.randperm(len(group), generator=torch.Generator().manual_seed(9))
    assert_close(grpo(rewards[perm], group[perm], std="population", eps=0.0), a[perm])
    # relabelling groups changes nothing
    assert_close(grpo(rewards, group * 5 + 123, std="population", eps=0.0), a)
    # each group sums to 0
    for gid in group.unique():
        assert abs(float(a[group == gid].sum())) < 1e-12


def test_detached_and_dtype():
    r = torch.tensor([1.0, 0.0], requires_grad=True)
    a = grpo(r, torch.tensor([0, 0]))
    assert not a.requires_grad and a.dtype == torch.float32


def test_bad_inputs():
    g = torch.tensor([0, 0, 1, 1])
    with pytest.raises(NonFiniteError, match=r"`rewards`.*index \[2\]"):
        grpo(torch.tensor([1.0, 0.0, float("nan"), 0.0]), g)
    with pytest.raises(NonFiniteError, match=r"index \[0\]"):
        group_stats(torch.tensor([float("inf"), 0.0, 1.0, 0.0]), g)
    with pytest.raises(ShapeError, match="`group` has 3 entries but there are 4"):
        grpo(torch.zeros(4), g[:3])
    with pytest.raises(ShapeError, match=r"`rewards` must be \[B\]"):
        grpo(torch.zeros(4, 1), g)
    with pytest.raises(ShapeError, match="floating point"):
        grpo(torch.tensor([1, 0, 1, 0]), g)
    with pytest.raises(GroupError, match="1-D integer"):
        grpo(torch.zeros(4), g.float())
    with pytest.raises(PolicylabError, match="`std` must be"):
        grpo(torch.zeros(4), g, std="sample")
    with pytest.raises(PolicylabError, match="`eps` must be"):
        grpo(torch.zeros(4), g, eps=float("nan"))
