"""Dr. GRPO: group mean-centred rewards, no division by a spread statistic."""

from __future__ import annotations

import torch

from policylab.kernels.advantages.group import Groups, check_rewards


def dr_grpo(rewards: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Mean-centred advantage per sequence, `[B]`.

        A_i = r_i − mean_g r

    Paper: "Understanding R1-Zero-Like Training: A Critical Perspective" (Liu et al.,
    arXiv:2503.20783). The paper's second change — dividing the summed token loss by a
    configured constant instead of the response length — is an aggregation choice
    (`seq_mean_token_sum_norm` with L_norm, computed by the trainer), not part of this
    function.

    Not scale-invariant (scaling rewards by c scales A by c); adding a constant to every
    reward changes nothing. Singleton and all-equal groups get exactly 0. `group`: `[B]`
    arbitrary integer ids. Detached; dtype of `rewards`; NaN/inf rewards raise
    NonFiniteError naming the index.
    """
    check_rewards(rewards)
    return Groups.of(group, rewards.shape[0]).standardize(rewards.detach(), None, 0.0)
