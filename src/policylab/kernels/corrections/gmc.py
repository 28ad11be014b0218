"""GMC: group-mass capping of trajectory importance weights under asynchronous staleness.

For each same-prompt group g with trajectory weights w_i >= 0:

    S_g = Σ_{i in g} w_i
    κ_g = 1 if S_g <= C else C / S_g          (rescale only when S > C, conventions rule 10)
    w̃_i = sg(κ_g · w_i)                       one multiplier per group

Ratios inside a group are kept ([4, 2, 1, 1], C = 4 -> [2, 1, 0.5, 0.5]; per-trajectory
clipping at 2 would give [2, 2, 1, 1]), Σ_{i in g} w̃_i <= C, and no group's mass ever
affects another group (group ids may be arbitrary, unsorted integers).

The weights are declared by the caller (e.g. exp(Σ_t m·(lp - lp_mu)) from
`seq_ratio_product`, or a geometric variant); GMC does not choose them.

Paper: "Asynchronous LLM Post-Training: Group-Mass Capping and Convergence Analysis" —
title **unconfirmed** (no copy of the paper was checked); no arXiv id.
Unconfirmed: the relation of C to the group size G, so `cap` is required.
Detached: the output. Negative or NaN/inf weights raise.
No equation number: the paper could not be checked. Deviations: none known.
"""

from __future__ import annotations

import math

import torch

from policylab.kernels.checks import check_finite, group_index
from policylab.errors import ShapeError
from policylab.kernels.corrections.common import check_positive, ess_from_sums, prefixed, scalar


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
    w = weights.detach()
    zero = torch.zeros((), dtype=w.dtype, device=w.device)
    w_lo, w_hi = torch.aminmax(w) if w.numel() else (zero, zero)
    if not (math.isfinite(float(w_lo)) and math.isfinite(float(w_hi))):
        check_finite(weights, "weights")  # raises, naming the first NaN/inf
    if float(w_lo) < 0:
        raise ValueError(f"`weights` must be >= 0; got min {float(w_lo)}")
    cap = check_positive("cap", cap)
    dense, n_groups = group_index(group, weights.shape[0])
    mass = torch.zeros(n_groups, dtype=w.dtype, device=w.device).index_add_(0, dense, w)  # S_g
    # κ_g = C / S_g where S_g > C, else 1 (an empty-mass group: C / 0 = inf -> 1)
    kappa = (cap / mass).clamp_(max=1.0)
    capped = torch.index_select(kappa, 0, dense) * w  # w̃_i = sg(κ_g·w_i)
    return capped, gmc_metrics(w, capped, mass, dense, n_groups, cap=cap, w_lo=w_lo, w_hi=w_hi)


def gmc_metrics(w, capped, mass, dense, n_groups: int, *, cap: float, w_lo, w_hi) -> dict[str, torch.Tensor]:
    """Metrics "gmc/<name>": fraction of groups rescaled, the largest group mass before and
    after, the input weights' min / mean / max, and the ESS before and after."""
    capped_mass = torch.zeros_like(mass).index_add_(0, dense, capped)
    metrics = {
        "frac_groups_capped": scalar(torch.count_nonzero(mass > cap).to(torch.float64) / max(n_groups, 1), w),
        "max_group_mass": scalar(mass.max() if n_groups else 0.0, w),
        "max_group_mass_capped": scalar(capped_mass.max() if n_groups else 0.0, w),
        "weight_min": scalar(w_lo, w),
        "weight_mean": scalar(w.mean() if w.numel() else 0.0, w),
        "weight_max": scalar(w_hi, w),
        "ess_before": all_counted_ess(w),  # checked above: finite, >= 0
        "ess_after": all_counted_ess(capped),
    }
    return prefixed("gmc", metrics)


def all_counted_ess(w: torch.Tensor) -> torch.Tensor:
    """Normalized ESS of finite weights >= 0 [B] (every entry counts), in float64."""
    x = w.to(torch.float64)
    return scalar(ess_from_sums(x.sum(), x, x.numel()), w)
