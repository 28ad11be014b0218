"""Range-GRPO: group advantages from determinate pairwise relations between reward intervals."""

from __future__ import annotations

import torch

from policylab.kernels.checks import check_finite
from policylab.errors import ShapeError
from policylab.kernels.advantages.group import Groups


def range_grpo(intervals: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Interval-relation advantage per sequence, `[B]`.

        i ≻ j  iff  l_i > u_j                        (strict: touching is undetermined)
        d_ij = (l_i − u_j)     if i ≻ j
             = −(l_j − u_i)    if j ≻ i
             = 0               otherwise (overlapping or touching intervals)
        A_i  = (1/G_g) · Σ_{j ∈ g} d_ij              G_g = size of i's group

    Paper: "Range-GRPO: Policy Optimization via Pairwise Relations among Reward
    Intervals" — title, arXiv id and the magnitude rule for a determinate pair (the gap
    between facing endpoints) are **unconfirmed** (no source found). Whatever the rule,
    the point limit holds: intervals [r_i, r_i] give A_i = r_i − mean_g r, i.e. `dr_grpo`.
    d is antisymmetric, so Σ_{i∈g} A_i = 0. The objective on top is Dr. GRPO-style (no
    std). Singleton groups get 0.

    Args:
        intervals: `[B, 2]` floating (low, high) per response, finite, low <= high
            (low > high raises ShapeError naming the row).
        group: `[B]` arbitrary integer prompt ids.

    Vectorized over a padded [n_groups, G_max, G_max] pair tensor (memory B·G_max), no
    loop over groups. Detached; dtype of `intervals`.
    """
    if not isinstance(intervals, torch.Tensor) or intervals.dim() != 2 or intervals.shape[1] != 2:
        raise ShapeError(f"`intervals` must be [B, 2], got {getattr(intervals, 'shape', type(intervals))}")
    if not intervals.is_floating_point() or intervals.shape[0] == 0:
        raise ShapeError(f"`intervals` must be a non-empty floating tensor, got {intervals.dtype} {tuple(intervals.shape)}")
    check_finite(intervals, "intervals")
    inverted = intervals[:, 0] > intervals[:, 1]
    if bool(inverted.any()):
        i = int(inverted.nonzero()[0])
        raise ShapeError(f"`intervals` row {i} has low {intervals[i, 0].item()} > high {intervals[i, 1].item()}")
    groups = Groups.of(group, intervals.shape[0])
    pos, g_max = groups.positions()
    x = intervals.detach()
    low = x.new_full((groups.n, g_max), float("nan"))
    high = low.clone()
    low[groups.dense, pos] = x[:, 0]
    high[groups.dense, pos] = x[:, 1]
    valid = ~torch.isnan(low)

    # gap[g, i, j] = l_i − u_j where i is strictly above j, else 0 (NaN compares False).
    # Touching intervals have gap exactly 0, so with this magnitude rule strict and
    # inclusive determinacy give the same d; the strict test states the spec.
    gap = low.unsqueeze(2) - high.unsqueeze(1)
    above = (gap > 0) & valid.unsqueeze(2) & valid.unsqueeze(1)
    win = torch.where(above, gap, torch.zeros((), dtype=x.dtype, device=x.device))
    d = win - win.transpose(1, 2)
    per_row = d.sum(dim=2) / groups.sizes.to(x.dtype).unsqueeze(1)
    return per_row[groups.dense, pos]
