"""GRPO group-standardized outcome advantages, and the group diagnostics trainers log."""

from __future__ import annotations

import torch

from policylab.errors import PolicylabError
from policylab.kernels.advantages.group import Groups, check_nonneg, check_rewards, std_ddof


def grpo(
    rewards: torch.Tensor,
    group: torch.Tensor,
    *,
    std: str | None = "unbiased",
    eps: float = 1e-6,
    on_singleton: str = "zero",
) -> torch.Tensor:
    """Group-relative advantage per sequence, `[B]` (broadcast it over the tokens of y_i).

        A_i = (r_i − mean_g r) / (std_g r + eps)        std = "unbiased" | "population"
        A_i =  r_i − mean_g r                           std = None (Dr. GRPO's centring)

    Paper: "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language
    Models" (Shao et al., arXiv:2402.03300), §4.1.2 outcome supervision. The paper writes
    std(r) without saying which convention or eps; both are explicit arguments here
    (implementations in the wild differ: population std gives [1.732, −0.577, ...] for
    rewards [1, 0, 0, 0], unbiased gives [1.5, −0.5, ...]).

    Args:
        rewards: `[B]` floating, finite (NaN/inf raises NonFiniteError naming the index).
        group: `[B]` integer prompt ids; arbitrary, non-contiguous, unsorted.
        std: "unbiased" (ddof 1), "population" (ddof 0) or None (no division).
        eps: added to the group std, >= 0.
        on_singleton: what a group with a single sample gets.
            "zero" (default): A = 0 — the sample has no peer to be compared with; it
            shows up in `group_stats(...)["n_singleton_groups"]` so the trainer can flag
            it. "raise": GroupError naming the group ids, whatever `std` is. The
            unbiased convention is undefined at G = 1 (its std is 0/0); the default
            gives zero advantage and flags the group instead (library decision) — pass
            on_singleton="raise" for the strict behaviour.

    Groups whose rewards are all exactly equal get A = 0 exactly (no NaN, no 0/eps
    noise) and are counted as zero-spread by `group_stats`. The result is detached and
    has the dtype of `rewards`.
    """
    check_rewards(rewards)
    groups = Groups.of(group, rewards.shape[0])
    ddof = std_ddof(std)
    check_nonneg(eps, "eps")
    if on_singleton not in ("zero", "raise"):
        raise PolicylabError(f"`on_singleton` must be 'zero' or 'raise', got {on_singleton!r}")
    if on_singleton == "raise":
        groups.refuse_singletons(
            group, "grpo", "on_singleton='raise' refuses them (sample G >= 2 per prompt, "
            "or pass on_singleton='zero' to give them zero advantage)"
        )
    return groups.standardize(rewards.detach(), ddof, eps)


def group_stats(rewards: torch.Tensor, group: torch.Tensor) -> dict[str, torch.Tensor]:
    """Detached 0-dim diagnostics of the group structure of a batch.

        n_groups            number of distinct group ids
        zero_spread_frac    fraction of groups whose rewards are all exactly equal
                            (singletons included): these groups carry no group-relative
                            signal. Healthy: well below 1; near 1 means the task is too
                            easy or too hard for the current policy.
        n_singleton_groups  groups with one sample (zero advantage under `grpo`'s
                            default; refused by `rloo`). Healthy: 0.
        mean_group_size     B / n_groups.
    """
    check_rewards(rewards)
    groups = Groups.of(group, rewards.shape[0])
    flat = groups.flat(rewards.detach())
    dtype = rewards.dtype
    return {
        "n_groups": torch.tensor(groups.n, dtype=torch.long, device=rewards.device),
        "zero_spread_frac": flat.to(dtype).mean(),
        "n_singleton_groups": (groups.sizes == 1).sum(),
        "mean_group_size": torch.tensor(rewards.shape[0] / groups.n, dtype=dtype, device=rewards.device),
    }
