"""Group filters: which groups carry a learning signal and go on to the update."""

from __future__ import annotations

import torch

from policylab.kernels.checks import check_finite, group_index
from policylab.errors import PolicylabError, ShapeError


def dynamic_sampling_keep(
    outcome: torch.Tensor, group: torch.Tensor, *, tol: float = 0.0
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DAPO dynamic sampling: keep a group iff its raw outcome is not constant.

        keep_g = (max_{i∈g} o_i − min_{i∈g} o_i) > tol        (strict)

    For binary correctness and tol = 0 this is DAPO's 0 < #correct_g < G, strict on both
    sides: all-correct and all-wrong groups are dropped (their group-relative advantages
    are all zero). Paper: "DAPO: An Open-Source LLM Reinforcement Learning System at
    Scale", arXiv 2503.14476, section "Dynamic Sampling".

    Decide on the RAW outcome (e.g. verifier correctness), never on the shaped reward: a
    group that is all correct but differs in its overlong penalty is still dropped. This
    function takes only the outcome, so it cannot be given the shaped reward by accident
    unless the caller passes it. A group of size 1 is always constant, hence dropped.
    Dropped groups must be replaced by sampling more prompts, never padded with
    zero-advantage data (conventions rule 6); refilling is the trainer's job.

    Args:
        outcome: `[B]` raw outcome per sequence (bool or real; must be finite).
        group: `[B]` group ids, arbitrary integers (non-contiguous, unsorted).
        tol: >= 0; differences up to tol count as constant (for real-valued outcomes).

    Returns:
        keep: `[B]` bool over sequences, True = the sequence's group is kept.
        info: 0-dim detached tensors `n_groups`, `n_kept` (groups), `filtered_fraction`
            (dropped groups / groups).
    """
    if not isinstance(outcome, torch.Tensor) or outcome.dim() != 1:
        got = tuple(outcome.shape) if isinstance(outcome, torch.Tensor) else type(outcome).__name__
        raise ShapeError(f"`outcome` must be a 1-D tensor [B], got {got}")
    if outcome.numel() == 0:
        raise ShapeError("`outcome` is empty")
    if not tol >= 0:
        raise PolicylabError(f"`tol` must be >= 0, got {tol}")
    dense, n_groups = group_index(group, n=outcome.shape[0])
    values = outcome.to(torch.float64)
    check_finite(values, "outcome")
    hi = torch.full((n_groups,), -torch.inf, dtype=torch.float64).scatter_reduce(0, dense, values, "amax")
    lo = torch.full((n_groups,), torch.inf, dtype=torch.float64).scatter_reduce(0, dense, values, "amin")
    keep_group = (hi - lo) > tol
    n_kept = keep_group.sum()
    info = {
        "n_groups": torch.tensor(n_groups),
        "n_kept": n_kept,
        "filtered_fraction": 1.0 - n_kept.to(torch.float64) / n_groups,
    }
    return keep_group[dense], info
