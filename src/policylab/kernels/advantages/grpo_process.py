"""GRPO with process (step) rewards: token advantage = sum of later normalized step rewards."""

from __future__ import annotations

import torch

from policylab.kernels.checks import check_finite, check_mask, check_same_shape
from policylab.errors import MissingQuantityError, PolicylabError, ShapeError
from policylab.kernels.advantages.group import Groups, check_nonneg, std_ddof

_HOW = (
    "Score each reasoning step with the process reward model (or rule) and record the "
    "response-token index where each step ends; every response needs at least one step."
)


def _check_steps(step_rewards, step_ends, step_mask, T) -> None:
    if step_ends is None:
        raise MissingQuantityError("grpo_process", "step_ends", _HOW)
    if step_rewards.dim() != 2 or step_rewards.shape[1] == 0:
        raise ShapeError(f"`step_rewards` must be [B, K] with K >= 1, got {tuple(step_rewards.shape)}")
    if not step_rewards.is_floating_point():
        raise ShapeError(f"`step_rewards` must be floating point, got {step_rewards.dtype}")
    check_mask(step_mask, "step_mask")
    check_same_shape("step_rewards", step_rewards, step_ends=step_ends, step_mask=step_mask)
    if step_ends.is_floating_point() or step_ends.is_complex() or step_ends.dtype == torch.bool:
        raise ShapeError(f"`step_ends` must be an integer tensor, got {step_ends.dtype}")
    if isinstance(T, bool) or not isinstance(T, int) or T < 1:
        raise PolicylabError(f"`T` must be a positive int (response positions), got {T!r}")
    check_finite(step_rewards, "step_rewards", step_mask)
    empty = ~step_mask.any(dim=1)
    if bool(empty.any()):
        rows = empty.nonzero().squeeze(-1).tolist()[:10]
        raise MissingQuantityError(
            "grpo_process", "step_ends", f"Row(s) {rows} have no valid step (step_mask all False). {_HOW}"
        )
    out = step_mask & ((step_ends < 0) | (step_ends >= T))
    if bool(out.any()):
        i, k = out.nonzero()[0].tolist()
        raise ShapeError(f"`step_ends`[{i}, {k}] = {int(step_ends[i, k])} is outside the response [0, {T})")
    # valid ends must increase strictly along k: compare with the largest earlier valid end
    ends = torch.where(step_mask, step_ends.long(), -1)
    prev = torch.cat([ends.new_full((ends.shape[0], 1), -1), ends.cummax(dim=1).values[:, :-1]], dim=1)
    unordered = step_mask & (ends <= prev)
    if bool(unordered.any()):
        i, k = unordered.nonzero()[0].tolist()
        raise ShapeError(
            f"`step_ends` must increase strictly along the valid steps of a row; row {i} step {k} "
            f"ends at {int(step_ends[i, k])}, not after an earlier step"
        )


def grpo_process(
    step_rewards: torch.Tensor,
    step_ends: torch.Tensor,
    step_mask: torch.Tensor,
    group: torch.Tensor,
    *,
    T: int,
    std: str | None = "unbiased",
    eps: float = 1e-6,
    on_singleton: str = "zero",
) -> torch.Tensor:
    """Process-supervision advantages, `[B, T]`.

        pool_g  = every valid step reward of every response in group g
        r̃_i^k  = (r_i^k − mean(pool_g)) / (std(pool_g) + eps)
        A_{i,t} = Σ_{k : end_i^k ≥ t} r̃_i^k       (this step and every later step of y_i)

    Paper: "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language
    Models" (arXiv:2402.03300), §4.1.3 process supervision. The normalization pool is the
    whole group (all steps of all its responses), not one response.

    Args:
        step_rewards: `[B, K]` reward of step k of response i (entries with
            `step_mask` False are ignored and may hold anything).
        step_ends: `[B, K]` integer response-token index (0-based, inclusive) where step k
            ends; valid ends lie in [0, T) and increase strictly along k.
        step_mask: `[B, K]` bool, True = step k exists. Every row needs >= 1 valid step.
        group: `[B]` prompt ids (arbitrary integers).
        T: number of response positions of the output.
        std, eps, on_singleton: as in `grpo`; "singleton" here means a pool with a
            single step (one response with one step), which gets 0 under "zero".

    Library decision: tokens after the last step end get advantage 0 (no step covers
    them). With one step per response ending at the last token this reduces to `grpo`
    broadcast over the tokens, under the same convention. Zero-spread pools give exactly
    0. Refused: missing `step_ends` or a row without any valid step
    (MissingQuantityError), ends outside [0, T) or out of order (ShapeError), NaN step
    rewards (NonFiniteError). Detached; dtype of `step_rewards`.
    """
    _check_steps(step_rewards, step_ends, step_mask, T)
    B, K = step_rewards.shape
    groups = Groups.of(group, B)
    ddof = std_ddof(std)
    check_nonneg(eps, "eps")
    if on_singleton not in ("zero", "raise"):
        raise PolicylabError(f"`on_singleton` must be 'zero' or 'raise', got {on_singleton!r}")

    # flatten the valid steps into one pool per group
    pool = Groups.from_dense(groups.dense.unsqueeze(1).expand(B, K)[step_mask], groups.n)
    if on_singleton == "raise":
        pool.refuse_singletons(
            group.unsqueeze(1).expand(B, K)[step_mask], "grpo_process",
            "its step pool has one reward (on_singleton='raise')",
        )
    normed = pool.standardize(step_rewards.detach()[step_mask], ddof, eps)
    per_step = step_rewards.new_zeros(B, K)
    per_step[step_mask] = normed

    # place each normalized step reward on its end token, then sum from the right
    at_end = per_step.new_zeros(B, T).scatter_add_(1, torch.where(step_mask, step_ends.long(), 0), per_step)
    return at_end.flip(1).cumsum(1).flip(1)
