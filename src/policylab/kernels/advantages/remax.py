"""ReMax: REINFORCE with the reward of the greedy decode as baseline."""

from __future__ import annotations

import torch

from policylab.kernels.checks import check_same_shape
from policylab.batch import HOW_TO_PRODUCE
from policylab.errors import MissingQuantityError
from policylab.kernels.advantages.group import check_rewards


def remax(rewards: torch.Tensor, greedy_rewards: torch.Tensor | None) -> torch.Tensor:
    """Greedy-baseline advantage per sequence, `[B]`.

        A_i = r(x, y_i) − r(x, ŷ_i),   ŷ_i = greedy decode of the same prompt

    Paper: "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for
    Aligning Large Language Models" (Li et al., arXiv:2310.10505). The baseline is a
    detached constant: the result is detached, so no autograd path reaches the greedy
    reward (or the sampled one). Greedy tokens never enter any loss.

    Refused: `greedy_rewards` None (MissingQuantityError — there is no default baseline
    of 0) or NaN/inf anywhere (NonFiniteError naming the index; a NaN is how a missing
    greedy score usually shows up), shapes that differ (ShapeError).
    """
    if greedy_rewards is None:
        raise MissingQuantityError("remax", "greedy_rewards", HOW_TO_PRODUCE["greedy_rewards"])
    check_rewards(rewards, "rewards")
    check_rewards(greedy_rewards, "greedy_rewards")
    check_same_shape("rewards", rewards, greedy_rewards=greedy_rewards)
    return (rewards.detach() - greedy_rewards.detach()).to(rewards.dtype)
