"""Input checks and small tensor helpers shared by the correction kernels: role checks,
the masked log-ratio, metric scalars and fractions, and the pieces of the mismatch
statistics and the ESS that the plain kernels and their fast paths (`corrections.fast`)
share.

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


def prefixed(prefix: str, metrics: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {f"{prefix}/{k}": v for k, v in metrics.items()}


STAT_KEYS = ("kl_k1", "kl_k3", "abs_dlogp_mean", "abs_dlogp_max", "frac_far",
             "ratio_min", "ratio_mean", "ratio_max", "log_ratio_min", "log_ratio_max", "n_tokens")


def stats_dict(k1, k3, abs_mean, frac_far, ratio_mean_minus_1, lo, hi, n: int, like) -> dict[str, torch.Tensor]:
    """The `STAT_KEYS` dict from the float64 means, the log-ratio's min / max and n."""
    return {
        "kl_k1": scalar(k1, like),
        "kl_k3": scalar(k3, like),
        "abs_dlogp_mean": scalar(abs_mean, like),
        "abs_dlogp_max": scalar(torch.maximum(hi.abs(), lo.abs()), like),
        "frac_far": scalar(frac_far, like),
        "ratio_min": scalar(torch.exp(lo), like),
        "ratio_mean": scalar(1.0 + ratio_mean_minus_1, like),
        "ratio_max": scalar(torch.exp(hi), like),
        "log_ratio_min": scalar(lo, like),
        "log_ratio_max": scalar(hi, like),
        "n_tokens": scalar(float(n), like),
    }


def masked_min_max(r: torch.Tensor, mask: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(min, max) of r over the counted entries, as float64 0-dim tensors, for r that is 0
    outside the mask. The plain min/max is right unless it is that padding 0: a min < 0 or
    a max > 0 is attained by a counted entry; only an exact 0 needs the masked pass."""
    lo, hi = torch.aminmax(r)
    if n < r.numel() and (float(lo) == 0.0 or float(hi) == 0.0):
        lo = torch.where(mask, r, torch.full((), math.inf, dtype=r.dtype)).min()
        hi = torch.where(mask, r, torch.full((), -math.inf, dtype=r.dtype)).max()
    return lo.to(torch.float64), hi.to(torch.float64)


def ess_from_sums(total: torch.Tensor, weights: torch.Tensor, n: int) -> torch.Tensor:
    """Normalized ESS (Σw)² / (n·Σw²) from Σw (already computed by the caller) and weights
    that are >= 0, finite and 0 outside the mask, with n counted entries; Σw² as a squared
    2-norm (no overflow)."""
    sq = torch.linalg.vector_norm(weights.detach(), 2).to(torch.float64) ** 2
    if n == 0 or float(sq) == 0.0:
        return scalar(0.0, weights)
    return scalar(total.to(torch.float64) ** 2 / (n * sq), weights)
