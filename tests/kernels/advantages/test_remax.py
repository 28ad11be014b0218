"""remax (advantages/remax.py)."""

import pytest
import torch
from torch.testing import assert_close

from policylab.kernels.advantages import remax
from policylab.errors import MissingQuantityError, NonFiniteError, ShapeError


def test_hand_cases():
    # r = 0.8 vs greedy 0.5 → 0.3 ; sampled = greedy → 0 ; greedy wrong, sample right → +1
    a = remax(torch.tensor([0.8, 0.4, 1.0], dtype=torch.float64), torch.tensor([0.5, 0.4, 0.0], dtype=torch.float64))
    assert_close(a, torch.tensor([0.3, 0.0, 1.0], dtype=torch.float64), rtol=0, atol=1e-12)


def test_no_autograd_path_from_either_reward():
    r = torch.tensor([0.8, 0.2], requires_grad=True)
    greedy = torch.tensor([0.5, 0.5], requires_grad=True)
    a = remax(r, greedy)
    assert not a.requires_grad and a.grad_fn is None


def test_missing_or_nan_greedy_reward_is_refused():
    with pytest.raises(MissingQuantityError, match="remax needs `greedy_rewards`.*Decode each prompt greedily"):
        remax(torch.tensor([1.0]), None)
    with pytest.raises(NonFiniteError, match=r"`greedy_rewards`.*index \[1\]"):
        remax(torch.tensor([1.0, 0.0]), torch.tensor([0.0, float("nan")]))
    with pytest.raises(NonFiniteError, match=r"`rewards`.*index \[0\]"):
        remax(torch.tensor([float("nan"), 0.0]), torch.tensor([0.0, 0.0]))
    with pytest.raises(ShapeError, match="`greedy_rewards` has shape"):
        remax(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0, 1.0]))
