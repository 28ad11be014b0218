"""rloo (advantages/rloo.py)."""

import pytest
import torch
from torch.testing import assert_close

from policylab.kernels.advantages import rloo
from policylab.errors import GroupError, NonFiniteError

F64 = torch.float64


def naive_rloo(rewards, group):
    out = torch.zeros_like(rewards)
    for i in range(len(group)):
        peers = [float(rewards[j]) for j in range(len(group)) if j != i and group[j] == group[i]]
        out[i] = float(rewards[i]) - sum(peers) / len(peers)
    return out


def test_hand_cases():
    # [1,0,0,0]: A_0 = 1 − (0+0+0)/3 = 1 ; A_j = 0 − (1+0+0)/3 = −1/3
    r = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64)
    assert_close(rloo(r, torch.tensor([4, 4, 4, 4])), torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3], dtype=F64), rtol=0, atol=1e-12)
    # K = 2: [a, b] → [a − b, b − a]
    assert_close(rloo(torch.tensor([0.9, 0.2], dtype=F64), torch.tensor([1, 1])), torch.tensor([0.7, -0.7], dtype=F64), rtol=0, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_naive_with_different_group_sizes(seed):
    g = torch.Generator().manual_seed(seed)
    sizes = torch.tensor([2, 3, 5, 4])
    group = torch.tensor([90, -7, 12, 3]).repeat_interleave(sizes)
    perm = torch.randperm(len(group), generator=g)
    group = group[perm]
    r = torch.randn(len(group), generator=g, dtype=F64)
    assert_close(rloo(r, group), naive_rloo(r, group))


def test_baseline_does_not_depend_on_own_reward():
    # raising r_i by δ raises A_i by exactly δ and lowers each peer by δ/(K−1)
    r = torch.tensor([0.3, 0.8, 0.1, 0.5, 0.9], dtype=F64)
    group = torch.tensor([1, 1, 1, 2, 2])
    a = rloo(r, group)
    bumped = r.clone()
    bumped[0] += 0.25
    diff = rloo(bumped, group) - a
    assert_close(diff, torch.tensor([0.25, -0.125, -0.125, 0.0, 0.0], dtype=F64), rtol=0, atol=1e-12)


def test_all_equal_group_is_exactly_zero():
    a = rloo(torch.tensor([0.1, 0.1, 0.1, 1.0, 0.0]), torch.tensor([0, 0, 0, 1, 1]))
    assert a[:3].tolist() == [0.0, 0.0, 0.0]


def test_singleton_group_raises_naming_it():
    with pytest.raises(GroupError, match=r"rloo: group id\(s\) \[-5, 77\] have a single sample"):
        rloo(torch.tensor([1.0, 0.0, 1.0, 0.5]), torch.tensor([77, 3, 3, -5]))
    with pytest.raises(ValueError):  # a GroupError is a ValueError, as the public API promises
        rloo(torch.tensor([1.0]), torch.tensor([0]))


def test_bad_inputs_and_detached():
    with pytest.raises(NonFiniteError, match=r"index \[3\]"):
        rloo(torch.tensor([1.0, 0.0, 1.0, float("-inf")]), torch.tensor([0, 0, 1, 1]))
    r = torch.tensor([1.0, 0.0], requires_grad=True)
    assert not rloo(r, torch.tensor([0, 0])).requires_grad
