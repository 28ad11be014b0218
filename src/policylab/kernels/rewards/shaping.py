"""Reward shaping terms added to a correctness reward (never replacing it).

The raw correctness metric stays separate from the shaped reward: filters
(`policylab.kernels.filters.dynamic_sampling_keep`) read the raw outcome, advantages read the
shaped total.
"""

from __future__ import annotations

import torch

from policylab.kernels.checks import check_finite
from policylab.errors import PolicylabError, ShapeError


def overlong_penalty(lengths: torch.Tensor, *, max_len: int, cache_len: int) -> torch.Tensor:
    """DAPO soft overlong punishment, one value per sequence `[B]`.

        R_len(|y|) = 0                                  if |y| <= L_max - L_cache
                   = ((L_max - L_cache) - |y|) / L_cache if L_max - L_cache < |y| <= L_max
                   = -1                                 if |y| > L_max

    Paper: "DAPO: An Open-Source LLM Reinforcement Learning System at Scale", arXiv
    2503.14476, section "Soft Overlong Punishment" (paper defaults L_max = 20480,
    L_cache = 4096). The value is added to the correctness reward by the caller. The
    first knot is inclusive (|y| = L_max - L_cache gives exactly 0, conventions rule 10);
    the ramp reaches -1 at |y| = L_max, so the function is continuous at both knots.
    No deviation from the paper. Nothing here is differentiable (lengths are counts).

    Args:
        lengths: `[B]` number of valid response tokens per sequence (count the loss mask,
            `loss_mask.sum(-1)`, never prompt or padding). Integer or float, >= 0.
        max_len: L_max, the generation budget in tokens.
        cache_len: L_cache, the width of the soft ramp; 0 < L_cache <= L_max.

    Returns:
        `[B]` penalty in [-1, 0]; dtype follows a floating `lengths`, else the default dtype.
    """
    if not isinstance(lengths, torch.Tensor) or lengths.dim() != 1:
        got = tuple(lengths.shape) if isinstance(lengths, torch.Tensor) else type(lengths).__name__
        raise ShapeError(f"`lengths` must be a 1-D tensor [B], got {got}")
    if not (isinstance(cache_len, int) and isinstance(max_len, int)) or not 0 < cache_len <= max_len:
        raise PolicylabError(
            f"need integers 0 < cache_len <= max_len, got max_len={max_len!r}, cache_len={cache_len!r}"
        )
    dtype = lengths.dtype if lengths.is_floating_point() else torch.get_default_dtype()
    y = lengths.to(dtype)
    check_finite(y, "lengths")
    if bool((y < 0).any()):
        raise PolicylabError(f"`lengths` must be >= 0, got min {y.min().item()}")
    start = max_len - cache_len
    ramp = (start - y) / cache_len
    zero = torch.zeros_like(y)
    return torch.where(y <= start, zero, torch.where(y <= max_len, ramp, zero - 1.0))
