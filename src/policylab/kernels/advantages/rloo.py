"""RLOO: REINFORCE with the leave-one-out mean of the other samples as baseline."""

from __future__ import annotations

import torch

from policylab.kernels.advantages.group import Groups, check_rewards


def rloo(rewards: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Leave-one-out advantage per sequence, `[B]`.

        A_i = r_i − (1/(K−1)) Σ_{j∈g, j≠i} r_j = K/(K−1) · (r_i − mean_g r)

    with K the size of i's group (groups may have different sizes). Paper: "Back to
    Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in
    LLMs" (Ahmadian et al., arXiv:2402.14740); the estimator itself is from Kool et al.,
    "Buy 4 REINFORCE Samples, Get a Baseline for Free!" (2019). Optional KL shaping of
    the reward (r ← R − β·Σ_t sg(lp − lp_ref)) is done by the caller before this call.

    A group of size 1 has no peers: GroupError naming its id (never zero-filled). The
    baseline of i does not depend on r_i; all-equal groups give exactly 0. Detached;
    dtype of `rewards`; NaN/inf rewards raise NonFiniteError naming the index.
    """
    check_rewards(rewards)
    groups = Groups.of(group, rewards.shape[0])
    groups.refuse_singletons(group, "rloo", "the leave-one-out baseline needs K >= 2 samples per prompt")
    centred, _ = groups.centre(rewards.detach())
    k = groups.sizes.to(rewards.dtype)
    return centred * groups.rows(k / (k - 1))
