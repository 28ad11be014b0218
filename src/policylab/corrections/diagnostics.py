"""Diagnostics for a pair of log-prob tensors and for importance weights.

`mismatch_stats(logp_a, logp_b, mask)` describes how far distribution a is from the
distribution b that sampled the tokens (typically a = `logp_old`, the training engine, and
b = `logp_behavior`, the rollout engine, at the same weights). With r = lp_a - lp_b on the
counted tokens (samples y ~ b):

    kl_k1          mean(-r)               unbiased estimate of KL(b || a), can be < 0
    kl_k3          mean(e^r - 1 - r)      unbiased, always >= 0, estimate of KL(b || a)
    abs_dlogp_mean mean |r|,  abs_dlogp_max  max |r|
    frac_far       fraction of tokens with |e^r - 1| > `far_threshold` (strict; default 0.2)
    ratio_min / ratio_mean / ratio_max   of e^r, before any clamping (computed in float64,
                   so they can only overflow past ~1e308; log_ratio_min/max are also given)
    n_tokens       number of counted tokens (every statistic is 0 when it is 0)

`ess(weights, mask)`: normalized effective sample size (Σw)² / (n·Σw²) over the n counted
entries, in (0, 1]; 1 = all weights equal, 1/n = one weight carries everything. 0 if every
weight is 0. Weights must be >= 0 and finite.

Healthy engine mismatch: kl_k3 around 1e-4 or less, ratio within [0.5, 2], frac_far ~ 0.
"""

from __future__ import annotations

import math

import torch

from .._checks import check_finite, check_mask
from ..errors import ShapeError
from ._common import check_roles, masked_log_ratio, scalar


def mismatch_stats(
    logp_a: torch.Tensor,
    logp_b: torch.Tensor,
    mask: torch.Tensor,
    *,
    far_threshold: float = 0.2,
) -> dict[str, torch.Tensor]:
    """Mismatch statistics of a against the sampling distribution b (see module doc).

    logp_a, logp_b, mask: [B, T]; returns detached 0-dim tensors in the dtype of logp_a.
    """
    check_roles("mismatch_stats", mask, logp_a=logp_a, logp_b=logp_b)
    # masked reductions, no boolean indexing: r is exactly 0 outside the mask, and so are
    # expm1(r) and |r|, so plain sums over [B, T] are sums over the counted tokens
    r = masked_log_ratio(logp_a.detach(), logp_b.detach(), mask)
    n = int(mask.sum())
    if n == 0:
        keys = ("kl_k1", "kl_k3", "abs_dlogp_mean", "abs_dlogp_max", "frac_far",
                "ratio_min", "ratio_mean", "ratio_max", "log_ratio_min", "log_ratio_max")
        out = {k: scalar(0.0, logp_a) for k in keys}
        out["n_tokens"] = scalar(0.0, logp_a)
        return out
    r64 = r.to(torch.float64)
    e = torch.expm1(r64)  # ratio - 1, accurate near 0 (float64: overflows only past r ~ 709)
    lo = torch.where(mask, r, torch.full((), math.inf, dtype=r.dtype)).min().to(torch.float64)
    hi = torch.where(mask, r, torch.full((), -math.inf, dtype=r.dtype)).max().to(torch.float64)
    return {
        "kl_k1": scalar(-r64.sum() / n, logp_a),
        "kl_k3": scalar((e - r64).sum() / n, logp_a),
        "abs_dlogp_mean": scalar(r64.abs().sum() / n, logp_a),
        "abs_dlogp_max": scalar(torch.maximum(hi.abs(), lo.abs()), logp_a),
        "frac_far": scalar((e.abs() > far_threshold).sum().to(torch.float64) / n, logp_a),
        "ratio_min": scalar(torch.exp(lo), logp_a),
        "ratio_mean": scalar(1.0 + e.sum() / n, logp_a),
        "ratio_max": scalar(torch.exp(hi), logp_a),
        "log_ratio_min": scalar(lo, logp_a),
        "log_ratio_max": scalar(hi, logp_a),
        "n_tokens": scalar(float(n), logp_a),
    }


def ess(weights: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Normalized effective sample size (Σw)² / (n·Σw²) of the counted weights.

    weights: [B, T] with a bool mask [B, T], or [B] (mask optional, [B]). Returns a detached
    0-dim tensor in the dtype of `weights` (0 when nothing counts or every weight is 0).
    """
    if mask is None:
        mask = torch.ones_like(weights, dtype=torch.bool)
    check_mask(mask, "mask")
    if mask.shape != weights.shape:
        raise ShapeError(f"`weights` {tuple(weights.shape)} and `mask` {tuple(mask.shape)} differ")
    check_finite(weights, "weights", mask)
    if bool(((weights < 0) & mask).any()):
        raise ValueError("`weights` must be >= 0 for an effective sample size")
    return ess_unchecked(weights, mask)


def ess_unchecked(weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`ess` without the input checks, for weights a correction has just built (finite,
    >= 0, same shape as the bool mask): masked sums in float64, no boolean indexing."""
    w = torch.where(mask, weights.detach(), torch.zeros((), dtype=weights.dtype)).to(torch.float64)
    n = int(mask.sum())
    sq = (w * w).sum()
    if n == 0 or float(sq) == 0.0:
        return scalar(0.0, weights)
    return scalar(w.sum() ** 2 / (n * sq), weights)
