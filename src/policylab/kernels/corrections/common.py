"""Input checks and small tensor helpers shared by the correction kernels (private).

Every public correction validates its inputs with `check_roles` first: a missing role
raises MissingQuantityError naming the method and the role (never zero-filled, never
substituted), shapes must match the mask, values must be finite where the mask counts.
"""

from __future__ import annotations

import math

import torch

from policylab.kernels.checks import check_finite, check_mask, zero_outside_
from policylab.kernels.checks import masked_mean as _masked_mean
from policylab.batch import HOW_TO_PRODUCE
from policylab.errors import MissingQuantityError, ShapeError


def check_roles(method: str, mask: torch.Tensor, **roles: torch.Tensor | None) -> bool:
    """Each role tensor is present, floating point, shaped like the bool `mask` [B, T],
    and finite at the positions the mask counts. Returns True when every entry of every
    role is finite (padding included), so a caller may mask with products."""
    check_mask(mask, "mask")
    if mask.dim() != 2:
        raise ShapeError(f"`mask` must be [B, T], got {tuple(mask.shape)}")
    finite = True
    for name, t in roles.items():
        if t is None:
            how = HOW_TO_PRODUCE.get(name, f"Provide `{name}` explicitly; it is never inferred.")
            raise MissingQuantityError(method, name, how)
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            got = t.dtype if isinstance(t, torch.Tensor) else type(t).__name__
            raise ShapeError(f"`{name}` must be a floating-point tensor, got {got}")
        if t.shape != mask.shape:
            raise ShapeError(
                f"`{name}` has shape {tuple(t.shape)} but `mask` has {tuple(mask.shape)}"
            )
        finite = check_finite(t, name, mask) and finite
    return finite


def check_positive(name: str, value: float, *, allow_inf: bool = False) -> float:
    """A scalar hyper-parameter that must be > 0 (and finite unless `allow_inf`)."""
    v = float(value)
    if math.isnan(v) or v <= 0 or (math.isinf(v) and not allow_inf):
        raise ValueError(f"`{name}` must be > 0{'' if allow_inf else ' and finite'}, got {value}")
    return v


def check_band(low: float, high: float) -> tuple[float, float]:
    """Two-sided band [low, high] on a ratio: 0 <= low < high (high may be inf)."""
    lo, hi = float(low), float(high)
    if math.isnan(lo) or math.isnan(hi) or lo < 0:
        raise ValueError(f"`low` must be >= 0, got low={low}")
    if not lo < hi:
        raise ValueError(f"`low` must be < `high`, got low={low}, high={high}")
    return lo, hi


def masked_log_ratio(num: torch.Tensor, den: torch.Tensor, mask: torch.Tensor, *,
                     finite: bool | None = None) -> torch.Tensor:
    """num - den where the mask counts, exactly 0 elsewhere (so padding garbage, NaN or
    inf, can never reach an exp or a gradient), masked in place: one [B, T] allocation.
    `finite=True` (from `check_roles`) skips the finiteness pass inside a graph.
    Differentiable in num and den (gradient 0 at masked positions)."""
    # NaN/inf at padding become NaN/inf in the difference; the in-place masking (a select,
    # or masked_fill_ inside a graph, whose backward sends 0 there) sets them to 0: no NaN
    # value or gradient either
    return zero_outside_(num - den, mask, finite=finite)


def scalar(x: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor:
    """A detached 0-dim metric in the dtype of `like`."""
    if isinstance(x, torch.Tensor):
        if x.dim() == 0 and x.dtype == like.dtype:
            return x.detach()
        return x.detach().to(like.dtype).reshape(())
    return torch.tensor(float(x), dtype=like.dtype, device=like.device)


def masked_fraction(flag: torch.Tensor, mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Fraction of counted positions where `flag` is True (0 when nothing counts)."""
    n = torch.count_nonzero(mask)  # bool .sum() converts to int64 first: ~15x slower
    hits = torch.count_nonzero(flag & mask)
    frac = hits.to(torch.float64) / n.clamp_min(1).to(torch.float64)
    return scalar(frac, like)


def fraction(count: torch.Tensor | float, n: int, like: torch.Tensor) -> torch.Tensor:
    """count / n as a detached metric (0 when n is 0)."""
    c = count.to(torch.float64) if isinstance(count, torch.Tensor) else float(count)
    return scalar(c / max(n, 1), like)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, like: torch.Tensor, *,
                zero_outside: bool = False) -> torch.Tensor:
    """`_checks.masked_mean` as a detached metric in the dtype of `like`."""
    return scalar(_masked_mean(x, mask, zero_outside=zero_outside), like)


def band_sides(x: torch.Tensor, low: float, high: float, mask: torch.Tensor | None = None, *,
               out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Where a detached `x` [B, T] lies against the band [low, high] (bounds inclusive):
    (side [B, T] = +1 above, −1 below, 0 inside or where the bool `mask` is False; number above;
    number below). No bool [B, T] mask and at most one [B, T] allocation (none with a
    fitting `out` buffer): sign(x − clip(x)), two sums (side² = |side| for values in
    {−1, 0, 1})."""
    if x.dtype not in (torch.float32, torch.float64):
        x = x.float()  # counts in a half-precision sum would be inexact past 256
    fits = out is not None and out.dtype == x.dtype and out.shape == x.shape
    side = torch.clamp(x, low, high, out=out) if fits else x.clamp(low, high)
    torch.sub(x, side, out=side).sign_()
    if mask is not None:
        zero_outside_(side, mask)
    flat = side.view(-1)
    net = flat.sum()  # above − below
    both = torch.dot(flat, flat)  # above + below
    return side, (both + net) * 0.5, (both - net) * 0.5


def prefixed(prefix: str, metrics: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {f"{prefix}/{k}": v for k, v in metrics.items()}
