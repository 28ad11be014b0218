"""A minimal PPO clipped surrogate used as the host loss inside corrections (private).

    loss = -min(ρ·A, clip(ρ, lo, hi)·A)

`ratio` carries the gradient; `lo`/`hi` are floats or detached tensors. The full objective
with metrics lives in policylab.objectives; this copy keeps corrections self-contained.
"""

from __future__ import annotations

import torch


def clipped_surrogate(ratio: torch.Tensor, adv: torch.Tensor, lo, hi) -> torch.Tensor:
    clipped = torch.clamp(ratio, lo, hi)
    return -torch.minimum(ratio * adv, clipped * adv)


def clip_active(ratio: torch.Tensor, adv: torch.Tensor, lo, hi) -> torch.Tensor:
    """True where the clipped branch is selected and flat (no gradient): A > 0 and ρ > hi,
    or A < 0 and ρ < lo."""
    return ((adv > 0) & (ratio > hi)) | ((adv < 0) & (ratio < lo))
