"""Rewards: verifiers (is the answer right?), shaping (length), self-labeling (TTRL) and
the combination of several reward functions into one scalar per sample."""

from policylab.kernels.rewards.combine import RewardFn, RewardFnError, combine_rewards
from policylab.kernels.rewards.graded import numeric_interval, reward_vectors
from policylab.kernels.rewards.shaping import overlong_penalty
from policylab.kernels.rewards.ttrl import majority_vote, pseudo_label_agreement, ttrl_rewards
from policylab.kernels.rewards.verifiers import (
    exact_numeric_reward,
    extract_last_number,
    math_verify_reward,
    numeric_match,
)

__all__ = [
    "RewardFn",
    "RewardFnError",
    "combine_rewards",
    "numeric_interval",
    "reward_vectors",
    "overlong_penalty",
    "majority_vote",
    "ttrl_rewards",
    "pseudo_label_agreement",
    "extract_last_number",
    "numeric_match",
    "exact_numeric_reward",
    "math_verify_reward",
]
