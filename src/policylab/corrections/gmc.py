"""GMC: group-mass capping of trajectory importance weights under asynchronous staleness.

For each same-prompt group g with trajectory weights w_i >= 0:

    S_g = Σ_{i in g} w_i
    κ_g = 1 if S_g <= C else C / S_g          (rescale only when S > C, METHODS.md §3.10)
    w̃_i = sg(κ_g · w_i)                       one multiplier per group

Ratios inside a group are kept ([4, 2, 1, 1], C = 4 -> [2, 1, 0.5, 0.5]; per-trajectory
clipping at 2 would give [2, 2, 1, 1]), Σ_{i in g} w̃_i <= C, and no group's mass ever
affects another group (group ids may be arbitrary, unsorted integers).

The weights are declared by the caller (e.g. exp(Σ_t m·(lp - lp_mu)) from
`seq_ratio_product`, or a geometric variant); GMC does not choose them.

Paper: "Asynchronous LLM Post-Training: Group-Mass Capping and Convergence Analysis" —
title from METHODS.md, **not confirmed** by the search tool (no copy found); no arXiv id.
Unconfirmed: the relation of C to the group size G, so `cap` is required.
Detached: the output. Negative or NaN/inf weights raise.
"""

from __future__ import annotations

import torch

from .._checks import check_finite, group_index
from ..errors import ShapeError
from ._common import check_positive, prefixed, scalar
from .diagnostics import ess_unchecked


def gmc(
    weights: torch.Tensor, group: torch.Tensor, *, cap: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Group-mass capped weights.

    weights: [B] trajectory weights >= 0; group: [B] integer group ids; cap > 0
    (**unconfirmed** relation to G). Returns (capped [B] detached; metrics: fraction of
    groups rescaled, max group mass before / after, input weight min / mean / max, ESS
    before / after).
    """
    if not isinstance(weights, torch.Tensor) or weights.dim() != 1 or not weights.is_floating_point():
        got = getattr(weights, "shape", weights)
        raise ShapeError(f"`weights` must be a 1-D floating tensor [B], got {got}")
    check_finite(weights, "weights")
    if bool((weights < 0).any()):
        raise ValueError(f"`weights` must be >= 0; got min {weights.min().item()}")
    cap = check_positive("cap", cap)
    dense, n_groups = group_index(group, weights.shape[0])
    w = weights.detach()
    mass = torch.zeros(n_groups, dtype=w.dtype, device=w.device).index_add_(0, dense, w)
    over = mass > cap
    kappa = torch.where(over, cap / torch.where(over, mass, torch.ones_like(mass)), torch.ones_like(mass))
    capped = (torch.index_select(kappa, 0, dense) * w).detach()
    capped_mass = torch.zeros_like(mass).index_add_(0, dense, capped)
    w_lo, w_hi = torch.aminmax(w) if w.numel() else (0.0, 0.0)
    metrics = {
        "frac_groups_capped": scalar(over.to(torch.float64).mean(), w),
        "max_group_mass": scalar(mass.max() if n_groups else 0.0, w),
        "max_group_mass_capped": scalar(capped_mass.max() if n_groups else 0.0, w),
        "weight_min": scalar(w_lo, w),
        "weight_mean": scalar(w.mean() if w.numel() else 0.0, w),
        "weight_max": scalar(w_hi, w),
        "ess_before": ess_unchecked(w.to(torch.float64)),  # checked above: finite, >= 0
        "ess_after": ess_unchecked(capped.to(torch.float64)),
    }
    return capped, prefixed("gmc", metrics)
